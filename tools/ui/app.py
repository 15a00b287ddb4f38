"""The web console's ASGI app (starlette): JSON views of the library, events as SSE.

Every view is a library call: the runs list and task table are the ``runs``
and ``tasks`` projections (folded into memory from the store, brought up to
date on each request), a run's timeline is :func:`projections.replay`, a
task's steps are its stream (with its model and tool calls folded by
:func:`projections.journal_calls`), and approve/deny is
:func:`bus.orchestrator.core.answer_approval`, the function behind ``cardbus
approve``; start a run, fork from a task and re-run a task are
:mod:`cardbus.tools.ui.actions` (on agents the console hosts, or on NATS by
writing the new run to the log), each a ``POST`` like the others, each
event's actor the identity the request authenticated as (the name of its
token; ``local:<user>`` on a loopback console without one): a ``by`` the
request gives is kept as words in the event's note, never as its actor.
``/api/events`` streams the
store's :meth:`subscribe` as server-sent events: the page refetches what
changed.

Access (:class:`cardbus.bus.http_guard.HttpGuard`, the A2A gateway's lock too):
the server refuses requests whose ``Host`` is not one it was bound to (DNS
rebinding); with tokens every request must carry one (``?token=``,
``Authorization: Bearer``, or ``X-Cardbus-Token``); a POST must be JSON from
the same origin (a cross-site form cannot approve anything), its body whole
within the body deadline (408) and no deeper than the guard allows.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import Any

import msgspec

from cardbus.agents.agent import Agent
from cardbus.agents.mcp_config import MCPServer
from cardbus.bus.http_guard import (
    DEFAULT_BODY_TIMEOUT_S,
    DEFAULT_TOKEN_NAME,
    LOOPBACK_NAMES,
    HttpGuard,
    Tokens,
    identity_of,
    is_loopback,
    local_identity,
)
from cardbus.bus.orchestrator.cancel import cancel_run
from cardbus.bus.orchestrator.loop_pause import answer_word
from cardbus.bus.orchestrator.reviews import Review, answer_review, open_reviews
from cardbus.bus.transport.interface import Bus
from cardbus.eventstore import SqliteEventStore
from cardbus.eventstore import events as ev
from cardbus.eventstore.errors import (
    AccessDenied,
    CardbusError,
    DecodeError,
    MissingExtra,
    StreamNotFound,
    ValidationError,
)
from cardbus.eventstore.store import EventStore
from cardbus.projections import (
    ProjectionRunner,
    Runs,
    Spend,
    TaskTable,
    build_timeline,
    event_reason,
    journal_calls,
    replay,
    resolve_id,
    run_duration,
)
from cardbus.projections.diff import diff_runs
from cardbus.projections.lineage import read_tree
from cardbus.projections.pricing import Money, PriceTable
from cardbus.projections.replay_html import render_html
from cardbus.projections.replay_origin import fill_replayed, origin_of, origin_sources
from cardbus.projections.spend import priced
from cardbus.projections.traces import agent_names_from, trace_spans
from cardbus.tools.ui.actions import Actions, HostedAgents, LogActions, NoAgents, NoAgentsHere
from cardbus.tools.ui.chunks import chunk_frames
from cardbus.tools.ui.page import PAGE
from cardbus.tools.ui.questions import question_routes
from cardbus.tools.ui.schedules import schedule_routes

try:
    from starlette.applications import Starlette
    from starlette.middleware import Middleware
    from starlette.requests import Request
    from starlette.responses import HTMLResponse, JSONResponse, Response, StreamingResponse
    from starlette.routing import Route
except ImportError as e:  # pragma: no cover - depends on the extra
    raise MissingExtra("ui", "the web console") from e

__all__ = ["create_app", "is_loopback"]

log = logging.getLogger(__name__)
_encode = msgspec.json.Encoder().encode
HEARTBEAT_S = 15.0
TASK_PAGE = 50  # tasks per page of a run's view
#: the run view's task filters: the statuses each shows (None: all)
TASK_FILTERS: dict[str, tuple[str, ...] | None] = {
    "all": None,
    "failed": ("failed", "halted", "cancelled"),
    "waiting": ("pending", "awaiting_approval", "needs_input", "needs_revision"),
    "running": ("dispatched", "running"),
}


def _json(obj: Any, status: int = 200) -> Response:
    return Response(_encode(obj), status_code=status, media_type="application/json")


def cost_json(m: Money | None) -> dict[str, Any]:
    """A cost as the API shows it: ``usd`` the known part (None when no part has a price:
    never 0 for unknown), ``complete`` False when some part has none, and the text."""
    m = m or Money()
    usd = None if m.unknown and not m.priced else round(m.usd, 10)
    return {"usd": usd, "complete": m.known, "text": m.text()}


def _error(e: Exception) -> Response:
    status = 409  # a state the request does not fit (a task not awaiting approval)
    if isinstance(e, StreamNotFound):
        status = 404
    elif isinstance(e, ValidationError | DecodeError | ValueError):  # ConfigError: ValueError
        status = 400
    elif isinstance(e, AccessDenied):  # an approval escalated to others (NotAnApprover)
        status = 403
    elif isinstance(e, NoAgentsHere):
        status = 409  # the console runs no agents: the reason says how to give it some
    return JSONResponse({"error": str(e), "type": type(e).__name__}, status_code=status)


class Console:
    """The state behind the app: one store, one in-memory read model of runs and tasks."""

    def __init__(
        self,
        store: EventStore,
        prices: PriceTable | None = None,
        actions: Actions | None = None,
        chunks: Bus | None = None,
    ) -> None:
        self.store = store
        #: where the runs' model answers are heard as they are written (``tools.ui.chunks``)
        self.chunks = chunks
        self.actions = actions or NoAgents()  # start, fork, re-run (tools.ui.actions)
        self.prices = prices if prices is not None else PriceTable()
        self.runner = ProjectionRunner.open(store, ":memory:", [Runs(), TaskTable(), Spend()])
        self._lock = asyncio.Lock()
        self.stopping = asyncio.Event()  # set when the server stops: event streams end

    async def fresh(self) -> ProjectionRunner:
        async with self._lock:
            await self.runner.catch_up()
        return self.runner

    async def runs(self, q: dict[str, Any]) -> dict[str, Any]:
        """The runs list: filters (status, goal text, plan, agent, started since/until)
        and a page of it (``offset``, ``limit``), with the count of all that match."""
        runner = await self.fresh()
        limit = int(q["limit"]) if q.get("limit") else None
        offset = int(q.get("offset") or 0)
        if (limit is not None and limit < 1) or offset < 0:
            raise ValidationError("limit must be >= 1 and offset >= 0")
        filters: dict[str, Any] = {
            "status": q.get("status") or None,
            "text": q.get("q") or None,
            "plan": q.get("plan") or None,
            "agent": q.get("agent") or None,
            "since": float(q["since"]) if q.get("since") else None,
            "until": float(q["until"]) if q.get("until") else None,
        }
        runs = Runs()
        rows = runs.list(runner.conn, limit=limit, offset=offset, **filters)
        now = time.time()
        spent = Spend().rows(runner.conn, roots=[r["root_id"] for r in rows])
        money = {m["root_id"]: m["money"] for m in priced(spent, self.prices, "root_id")}
        for r in rows:
            r["duration_s"] = run_duration(r, now)
            r["cost"] = cost_json(money.get(r["root_id"]))
        total = runs.count(runner.conn, **filters)
        return {
            "runs": rows,
            "total": total,
            "prices": self.prices.describe(),
            "offset": offset,
            "position": runner.position,
            "now": now,
        }

    def _tasks(
        self,
        runner: ProjectionRunner,
        root: str,
        statuses: Sequence[str] | None = None,
        offset: int = 0,
        limit: int | None = None,
    ) -> list[dict[str, Any]]:
        rows = TaskTable().list(
            runner.conn, root=root, statuses=statuses, offset=offset, limit=limit
        )
        for r in rows:
            for col in ("input", "output"):
                if r[col] is not None:
                    r[col] = msgspec.json.decode(r[col])
        return rows

    async def run(
        self, text: str, show: str = "all", offset: int = 0, limit: int = TASK_PAGE
    ) -> dict[str, Any]:
        """A run: its summary, one page of its tasks (``show``: all, failed or waiting)
        and the replay timeline of that page's tasks (:func:`build_timeline` over their
        streams and the run's own: the projection ``replay --html`` draws), so a run of
        thousands of tasks costs what one page of them does."""
        if show not in TASK_FILTERS:
            raise ValidationError(f"show must be one of {', '.join(TASK_FILTERS)}")
        if limit < 1 or offset < 0:
            raise ValidationError("limit must be >= 1 and offset >= 0")
        root = await resolve_id(self.store, text)
        runner = await self.fresh()
        row = Runs().get(runner.conn, root)
        if row is None:
            own = await self.store.read_stream(root)
            if not own:
                raise StreamNotFound(root)
            root = own[0].correlation_id  # a task id: its run
            row = Runs().get(runner.conn, root)
        now = time.time()
        if row is not None:
            row["duration_s"] = run_duration(row, now)
        statuses = TASK_FILTERS[show]
        tasks = self._tasks(runner, root, statuses, offset, limit)
        counts = TaskTable().count(runner.conn, root=root)
        shown = TaskTable().count(runner.conn, root=root, statuses=statuses)
        events = list(await self.store.read_stream(root))
        for t in tasks:
            if t["task_id"] != root:
                events.extend(await self.store.read_stream(t["task_id"]))
        events.sort(key=lambda e: e.position)
        timeline = build_timeline(events, root, root) if events else None
        return {
            "run": row,
            "root_id": root,
            # the tree: the child runs its tasks started (a child's parent is in ``run``),
            # and what the run and every run below it spent
            "children": Runs().children(runner.conn, root),
            "tree": self._tree_spend(runner, root),
            **self._costs(runner, root),
            "timeline": timeline,
            "tasks": tasks,
            "counts": counts,
            "total": sum(shown.values()),
            "offset": offset,
            "limit": limit,
            "show": show,
            "position": runner.position,
            "now": now,
        }

    def _tree_spend(self, runner: ProjectionRunner, root: str) -> dict[str, Any]:
        """The tokens and cost of a run with every run below it (child runs, theirs...)."""
        roots, todo = [root], [root]
        while todo and len(roots) < 1000:
            below = [c["root_id"] for c in Runs().children(runner.conn, todo.pop())]
            roots += [c for c in below if c not in roots]
            todo += below
        total = Money()
        for r in priced(Spend().rows(runner.conn, roots=roots), self.prices, "root_id"):
            total += r["money"]
        tokens = sum(
            (row["input_tokens"] or 0) + (row["output_tokens"] or 0)
            for row in (Runs().get(runner.conn, r) for r in roots)
            if row is not None
        )
        return {"runs": len(roots), "tokens": tokens, "cost": cost_json(total)}

    def _costs(self, runner: ProjectionRunner, root: str) -> dict[str, Any]:
        """A run's cost, and its cost per task and per model (tokens and calls with each)."""
        spent = Spend().rows(runner.conn, root_id=root)
        total = Money()
        for r in priced(spent, self.prices, "root_id"):
            total += r["money"]

        def rows(by: str) -> list[dict[str, Any]]:
            out = []
            for r in priced(spent, self.prices, by):
                r["cost"] = cost_json(r.pop("money"))
                out.append(r)
            return out

        return {
            "cost": cost_json(total),
            "cost_by_task": rows("task_id"),
            "cost_by_model": rows("model"),
            "prices": self.prices.describe(),
        }

    async def diff(self, a: str, b: str) -> dict[str, Any]:
        """``cardbus diff A B`` as JSON: :func:`projections.diff.diff_runs` of the two runs."""
        from cardbus.projections.ids import read_run

        if not a or not b:
            raise ValidationError("give two runs: ?a=ROOT&b=ROOT")
        d = diff_runs(await read_run(self.store, a), await read_run(self.store, b))
        return msgspec.to_builtins(d)

    async def cancel(self, text: str, by: str, note: str, said: str = "") -> dict[str, Any]:
        """Cancel a run by ``by`` (the request's identity); ``said``: the words of the note
        the request gave besides the reason (the name it claims)."""
        root = await resolve_id(self.store, text)
        reason = "cancelled_by_user" + (f": {note}" if note else "")
        cancelled = await cancel_run(self.store, root, by=by, reason=reason, note=said)
        return {"root_id": root, "cancelled": cancelled, "by": by}

    async def traces(self, text: str) -> dict[str, Any]:
        """The run's spans as ``cardbus export`` sends them (ids in hex), as one JSON file."""
        root = await resolve_id(self.store, text)
        own = await self.store.read_stream(root)
        root = own[0].correlation_id if own else root
        events = await read_tree(self.store, root)  # with its child runs: one tree
        if not events:
            raise StreamNotFound(root)
        agents = {e.data.agent_id for e in events if isinstance(e.data, ev.TaskDispatched)}
        cards: list[Any] = []
        for agent_id in sorted(agents):
            cards.extend(await self.store.read_stream(f"agent-{agent_id}"))
        spans = []
        for s in trace_spans(events, agent_names_from(cards)):
            span = msgspec.to_builtins(s)
            span["trace_id"] = f"{s.trace_id:032x}"
            span["span_id"] = f"{s.span_id:016x}"
            if s.parent_span_id is not None:
                span["parent_span_id"] = f"{s.parent_span_id:016x}"
            spans.append(span)
        return {"root_id": root, "spans": spans}

    async def replay_html(self, text: str) -> str:
        return render_html(await replay(self.store, await resolve_id(self.store, text)))

    async def task(self, text: str) -> dict[str, Any]:
        task_id = await resolve_id(self.store, text)
        runner = await self.fresh()
        row = TaskTable().get(runner.conn, task_id)
        if row is None:
            raise StreamNotFound(task_id)
        for col in ("input", "output"):
            if row[col] is not None:
                row[col] = msgspec.json.decode(row[col])
        steps = []
        received: list[dict[str, Any]] = []  # what each dispatch sent, as the log keeps it
        trimmed: set[int] = set()
        stream = await self.store.read_stream(task_id)
        for env in stream:
            if isinstance(env.data, ev.TaskDispatched):
                d = env.data
                received.append(
                    {
                        "attempt": d.attempt,
                        "agent_id": d.agent_id,
                        "inputs": d.inputs,
                        "digest": d.inputs_digest,
                        "bytes": d.inputs_bytes,
                    }
                )
            elif isinstance(env.data, ev.ContextTrimmed):
                trimmed.add(env.data.attempt)
            data = msgspec.to_builtins(env.data)
            data.pop("type", None)
            steps.append(
                {
                    "position": env.position,
                    "time": env.recorded_at,
                    "type": env.type,
                    "actor": env.actor,
                    "attempt": data.get("attempt"),
                    "agent_id": data.get("agent_id"),
                    "reason": event_reason(env.data),
                    "data": data,
                }
            )
        # what its attempts asked models and tools (the journal), replays resolved
        calls = journal_calls(stream)
        origin = origin_of(stream)  # a re-run's task: its replays are the recorded run's calls
        if origin is not None:
            fill_replayed(calls, await origin_sources(self.store, origin))
        for r in received:
            r["trimmed"] = r["attempt"] in trimmed
        run = Runs().get(runner.conn, row["root_id"]) if row["root_id"] else None
        return {
            "task": row,
            "run_goal": run["goal"] if run else "",
            "received": received,
            "steps": steps,
            "calls": calls,
            "position": runner.position,
            "now": time.time(),
        }

    async def events(
        self, root: str | None, start: int, heartbeat_s: float = HEARTBEAT_S
    ) -> AsyncIterator[bytes]:
        """SSE frames: one per appended event (of run ``root``, if given), plus heartbeats.

        One ``anext`` of the subscription stays pending across heartbeats: a quiet
        interval sends a comment and waits on the same call again. (Cancelling it, as
        ``wait_for`` does on a timeout, would close the subscription's generator and
        end the stream with a traceback at its first quiet interval.)
        """
        yield b"retry: 1000\n: connected\n\n"
        events = aiter(self.store.subscribe(start))
        pending: asyncio.Task[Any] | None = None
        stop = asyncio.ensure_future(self.stopping.wait())
        try:
            while True:
                if pending is None:
                    pending = asyncio.ensure_future(anext(events))
                done, _ = await asyncio.wait(
                    {pending, stop}, timeout=heartbeat_s, return_when=asyncio.FIRST_COMPLETED
                )
                if stop in done:
                    return  # the server is stopping: end the stream, the page reconnects
                if not done:
                    yield b": heartbeat\n\n"
                    continue
                try:
                    env = pending.result()
                except StopAsyncIteration:
                    return
                finally:
                    pending = None
                if root is not None and env.correlation_id != root and env.stream != root:
                    continue
                body = _encode(
                    {
                        "position": env.position,
                        "stream": env.stream,
                        "type": env.type,
                        "root": env.correlation_id,
                    }
                )
                yield b"id: %d\nevent: append\ndata: %s\n\n" % (env.position, body)
        finally:
            stop.cancel()
            if pending is not None:
                pending.cancel()
                with contextlib.suppress(BaseException):
                    await pending
            with contextlib.suppress(Exception):
                await events.aclose()  # type: ignore[attr-defined]


async def chunk_bus(store: EventStore, actions: Actions) -> Bus | None:
    """The bus the console hears model answers on as they are written: its hosted
    runtime's, else, on a NATS log, one of its own on the log's connection."""
    if isinstance(actions, HostedAgents):
        return actions.runtime.bus
    nc = getattr(store, "nc", None)
    if nc is None:
        return None  # SQLite, run by another process: nothing to hear
    from cardbus.bus.transport.nats import NatsBus

    return NatsBus(nc)


def review_json(r: Review) -> dict[str, Any]:
    """A tool call under review as the API shows it."""
    return {"call": r.call, "tool": r.tool, "arguments": r.arguments, "text": r.text}


async def _review(store: EventStore, text: str, body: dict[str, Any], by: str) -> Response:
    """``POST /api/tasks/{id}/review`` ``{"decision": "approve" | "edit" | "refuse",
    "arguments": {...}, "reason": "...", "call": "..."}``: the actor is who authenticated."""
    arguments = body.get("arguments")
    try:
        task_id = await resolve_id(store, text)
        answered = await answer_review(
            store,
            task_id,
            str(body.get("decision") or ""),
            by=by,
            call=str(body.get("call") or ""),
            arguments=arguments if isinstance(arguments, dict) else None,
            reason=str(body.get("reason") or ""),
        )
    except CardbusError as e:
        return _error(e)
    out = {"task_id": task_id, "decision": body.get("decision"), "by": by}
    return _json(out | {"calls": [review_json(r) for r in answered]})


async def _body(request: Request) -> dict[str, Any] | None:
    """A POST's JSON object ({} if empty or not an object; None if not JSON). (The guard
    let through only UTF-8 JSON no deeper than it allows.)"""
    try:
        body = msgspec.json.decode(await request.body() or b"{}")
    except (msgspec.DecodeError, RecursionError):
        return None
    return body if isinstance(body, dict) else {}


def actor_of(request: Request) -> str:
    """Who the request is (``HttpGuard``'s identity): the actor of what it does."""
    who = identity_of(request.scope)
    return (who or local_identity()).name


def said_by(body: dict[str, Any]) -> str:
    """The name a request gives itself (``by``), as a note: ``"by alice"``; "" for none.
    Kept as words, never taken as the actor (anyone holding a token could write any)."""
    claimed = str(body.get("by") or "").strip()[:200]
    return f"by {claimed}" if claimed else ""


def _joined(*notes: str) -> str:
    return "; ".join(n for n in notes if n)


def create_app(
    db: str | None = None,
    *,
    store: EventStore | None = None,
    opener: Callable[[], Awaitable[EventStore]] | None = None,
    token: str | None = None,
    token_name: str = DEFAULT_TOKEN_NAME,
    tokens: Tokens | None = None,
    body_timeout_s: float | None = DEFAULT_BODY_TIMEOUT_S,
    hosts: list[str] | None = None,
    heartbeat_s: float | None = None,
    prices: PriceTable | None = None,
    agents: Sequence[type[Agent]] = (),
    llm: Callable[[], Any] | None = None,
    submit_to_log: bool = False,
    mcp_servers: Sequence[MCPServer] = (),
) -> Starlette:
    """The console over the SQLite log ``db``, a log ``opener`` opens at start-up, or ``store``.

    ``hosts`` are the names the ``Host`` header may carry (default: loopback
    names); ``token`` (named ``token_name``) and ``tokens`` (token -> name, as
    :func:`~cardbus.bus.http_guard.load_tokens` reads a token file): with any, one is
    required on every request, and the actions a request takes are signed with its
    token's name (without: ``local:<user>``, the account the console runs as).
    ``body_timeout_s``: the time a request's body may take to arrive (408 after it).
    ``heartbeat_s``: the
    events stream's quiet interval before a heartbeat comment (default 15 s, or
    ``CARDBUS_UI_HEARTBEAT_S``). ``prices``: the price table costs are shown with
    (default: genai-prices' bundled data alone; a model without a price is shown as
    "unknown price", never as $0). ``agents``: the classes the console hosts an
    embedded runtime with, to start, fork and re-run runs (``tools.ui.actions``; none:
    those actions are refused, saying how to enable them); ``llm``: makes, at start-up
    in the server's loop, the LLM they get (default: the environment's, else the mock);
    ``mcp_servers``: mounted as tools for the hosted agents while the console runs.
    ``submit_to_log`` (a NATS log, whose orchestrators and agents run elsewhere): those
    actions write the new runs to the log, for the running orchestrators to decide.
    """
    if agents and submit_to_log:
        raise ValidationError("give agents to host, or submit_to_log, not both")
    if heartbeat_s is None:
        heartbeat_s = float(os.environ.get("CARDBUS_UI_HEARTBEAT_S") or HEARTBEAT_S)
    if not heartbeat_s > 0:
        raise ValidationError(f"heartbeat_s must be > 0, not {heartbeat_s}")
    if [db, store, opener].count(None) != 2:
        raise ValidationError("create_app needs exactly one of db, opener and store")
    state: dict[str, Console] = {}

    def console() -> Console:
        return state["console"]

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        own = store is None
        if store is not None:
            opened = store
        elif opener is not None:
            opened = await opener()  # cardbus ui --store: SQLite or NATS
        else:
            opened = await SqliteEventStore.open(db or "")
        model = llm() if agents and llm is not None else None
        actions: Actions = (
            HostedAgents(opened, agents, model, mcp_servers)
            if agents
            else LogActions(opened)
            if submit_to_log
            else NoAgents()
        )
        try:
            await actions.__aenter__()
        except BaseException:
            if own:
                await opened.close()
            raise
        hearing = await chunk_bus(opened, actions)
        state["console"] = Console(opened, prices, actions, hearing)
        app.state.stop_streams = state["console"].stopping.set
        try:
            yield
        finally:
            try:
                await actions.__aexit__(None, None, None)
            finally:
                state["console"].runner.close()
                if hearing is not None and not isinstance(actions, HostedAgents):
                    await hearing.close()  # its own: the hosted runtime closes its bus
                close = getattr(model, "aclose", None)
                if close is not None:
                    await close()
                if own:
                    await opened.close()

    async def page(request: Request) -> Response:
        return HTMLResponse(PAGE, headers={"Cache-Control": "no-store"})

    async def runs(request: Request) -> Response:
        try:
            return _json(await console().runs(dict(request.query_params)))
        except (CardbusError, ValueError) as e:
            return _error(e)

    async def run(request: Request) -> Response:
        q = request.query_params
        try:
            return _json(
                await console().run(
                    request.path_params["id"],
                    q.get("show") or "all",
                    int(q.get("offset") or 0),
                    int(q.get("limit") or TASK_PAGE),
                )
            )
        except (CardbusError, ValueError) as e:
            return _error(e)

    async def diff(request: Request) -> Response:
        q = request.query_params
        try:
            return _json(await console().diff(q.get("a") or "", q.get("b") or ""))
        except (CardbusError, ValueError) as e:
            return _error(e)

    async def replay_page(request: Request) -> Response:
        try:
            page = await console().replay_html(request.path_params["id"])
        except CardbusError as e:
            return _error(e)
        name = request.path_params["id"].replace('"', "")
        return HTMLResponse(
            page,
            headers={"Content-Disposition": f'attachment; filename="replay-{name}.html"'},
        )

    async def traces(request: Request) -> Response:
        try:
            body = await console().traces(request.path_params["id"])
        except CardbusError as e:
            return _error(e)
        name = body["root_id"].replace('"', "")
        return Response(
            _encode(body),
            media_type="application/json",
            headers={"Content-Disposition": f'attachment; filename="traces-{name}.json"'},
        )

    async def run_action(request: Request) -> Response:
        body = await _body(request)
        if body is None:
            return JSONResponse({"error": "the body is not JSON"}, status_code=400)
        if request.path_params["action"] != "cancel":
            return JSONResponse({"error": "no such action"}, status_code=404)
        try:
            done = await console().cancel(
                request.path_params["id"],
                actor_of(request),
                str(body.get("note") or ""),
                said_by(body),
            )
        except CardbusError as e:
            return _error(e)
        return _json(done)

    async def about(request: Request) -> Response:
        """What the page needs to know of the console: whether its actions can run, and
        whose name they are signed with (the request's identity), and whether it hears
        model answers as they are written (``streaming``)."""
        return _json(
            {
                "actions": await console().actions.describe(),
                "you": actor_of(request),
                "streaming": console().chunks is not None,
            }
        )

    async def act(
        work: Callable[[Actions, str, dict[str, Any]], Awaitable[Any]], request: Request
    ) -> Response:
        """A run-making action (start, fork, re-run): the request's identity (the actor)
        and the body to it (a ``by`` it gives becomes the run's ``note``); a refusal is a
        4xx with the reason, an unexpected error a 500 with its type (logged), never a
        traceback on the page."""
        body = await _body(request)
        if body is None:
            return JSONResponse({"error": "the body is not JSON"}, status_code=400)
        by = actor_of(request)
        body = {**body, "note": _joined(str(body.get("note") or "").strip(), said_by(body))}
        try:
            return _json(await work(console().actions, by, body))
        except (CardbusError, ValueError) as e:
            return _error(e)
        except Exception as e:
            log.exception("console action %s failed", request.url.path)
            return JSONResponse(
                {"error": f"{type(e).__name__}: {e}", "type": type(e).__name__}, status_code=500
            )

    async def start(request: Request) -> Response:
        return await act(lambda a, by, body: a.start(body, by), request)

    async def task(request: Request) -> Response:
        try:
            return _json(await console().task(request.path_params["id"]))
        except CardbusError as e:
            return _error(e)

    async def answer(request: Request) -> Response:
        body = await _body(request)
        if body is None:
            return JSONResponse({"error": "the body is not JSON"}, status_code=400)
        action = request.path_params["action"]
        task_id = request.path_params["id"]
        if action == "fork":
            return await act(lambda a, by, body: a.fork(task_id, body, by), request)
        if action == "rerun":
            return await act(lambda a, by, body: a.rerun(task_id, body, by), request)
        if action == "review":  # a tool call held for review: approve, edit or refuse
            return await _review(console().store, task_id, body, actor_of(request))
        if action not in ("approve", "deny"):
            return JSONResponse({"error": f"no action {action!r}"}, status_code=404)
        granted = action == "approve"
        by = actor_of(request)
        note = _joined(str(body.get("note") or ""), said_by(body))
        inputs = body.get("inputs")
        try:
            task_id = await resolve_id(console().store, request.path_params["id"])
            # a task's approval, or a run's pause (resumed, with inputs, or stopped)
            await answer_word(
                console().store,
                task_id,
                granted,
                by,
                note,
                inputs if isinstance(inputs, dict) else None,
            )
        except CardbusError as e:
            return _error(e)
        return _json({"task_id": task_id, "approved": granted, "by": by})

    async def reviews(request: Request) -> Response:
        try:
            task_id = await resolve_id(console().store, request.path_params["id"])
            held = await open_reviews(console().store, task_id)
        except CardbusError as e:
            return _error(e)
        return _json({"task_id": task_id, "reviews": [review_json(r) for r in held]})

    async def events(request: Request) -> Response:
        root = request.query_params.get("root") or None
        last = request.headers.get("last-event-id") or request.query_params.get("from")
        try:
            start = int(last) + 1 if last else await console().store.last_position() + 1
            if root is not None:
                root = await resolve_id(console().store, root)
        except (CardbusError, ValueError) as e:
            return _error(e)
        return StreamingResponse(
            console().events(root, start, heartbeat_s),
            media_type="text/event-stream",
            headers={"Cache-Control": "no-store", "X-Accel-Buffering": "no"},
        )

    async def chunks(request: Request) -> Response:
        root = request.query_params.get("root") or ""
        try:
            root = await resolve_id(console().store, root)
        except (CardbusError, ValueError) as e:
            return _error(e)
        return StreamingResponse(
            chunk_frames(console().chunks, root, console().stopping, heartbeat_s),
            media_type="text/event-stream",
            headers={"Cache-Control": "no-store", "X-Accel-Buffering": "no"},
        )

    routes = [
        Route("/", page),
        Route("/api/chunks", chunks),
        Route("/api/console", about),
        Route("/api/runs", runs),
        Route("/api/runs", start, methods=["POST"]),
        Route("/api/runs/{id:path}/replay.html", replay_page),
        Route("/api/runs/{id:path}/traces.json", traces),
        Route("/api/runs/{id:path}/{action:str}", run_action, methods=["POST"]),
        Route("/api/runs/{id:path}", run),
        Route("/api/tasks/{id:path}/reviews", reviews),
        # tools.ui.questions: a question's open form and its answer (before the actions)
        *question_routes(lambda: console().store, actor_of, _json, _error, _body),
        Route("/api/tasks/{id:path}/{action:str}", answer, methods=["POST"]),
        Route("/api/tasks/{id:path}", task),
        Route("/api/diff", diff),
        Route("/api/events", events),
        # tools.ui.schedules: create, list, pause, resume, trigger, delete
        *schedule_routes(lambda: console().store, actor_of, _json, _error, _body),
    ]
    named = dict(tokens or {})
    if token:
        named[token] = token_name
    # Host allow-list, same-origin JSON posts, the tokens, the body's deadline
    # (bus/http_guard.py); the guard names who each request is
    guard = Middleware(
        HttpGuard,
        hosts=hosts or LOOPBACK_NAMES,
        tokens=named,
        token_query=True,  # the page's own links carry ?token=
        body_timeout_s=body_timeout_s,
    )
    return Starlette(routes=routes, middleware=[guard], lifespan=lifespan)
