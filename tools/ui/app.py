"""The web console's ASGI app (starlette): JSON views of the library, events as SSE.

Every view is a library call: the runs list and task table are the ``runs``
and ``tasks`` projections (folded into memory from the store, brought up to
date on each request), a run's timeline is :func:`projections.replay`, a
task's steps are its stream (with its model and tool calls folded by
:func:`projections.journal_calls`), and approve/deny is
:func:`bus.orchestrator.core.answer_approval`, the function behind ``cardbus
approve``. ``/api/events`` streams the store's :meth:`subscribe` as
server-sent events: the page refetches what changed.

Access (:class:`cardbus.bus.http_guard.HttpGuard`, the A2A gateway's lock too):
the server refuses requests whose ``Host`` is not one it was bound to (DNS
rebinding); with a token every request must carry it (``?token=``,
``Authorization: Bearer``, or ``X-Cardbus-Token``); a POST must be JSON from
the same origin (a cross-site form cannot approve anything).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import msgspec

from cardbus.bus.http_guard import LOOPBACK_NAMES, HttpGuard, is_loopback
from cardbus.bus.orchestrator.core import answer_approval
from cardbus.eventstore import SqliteEventStore
from cardbus.eventstore.errors import (
    CardbusError,
    StreamNotFound,
    ValidationError,
)
from cardbus.eventstore.store import EventStore
from cardbus.projections import (
    ProjectionRunner,
    Runs,
    TaskTable,
    event_reason,
    journal_calls,
    replay,
    resolve_id,
    run_duration,
)
from cardbus.tools.ui.page import PAGE

try:
    from starlette.applications import Starlette
    from starlette.middleware import Middleware
    from starlette.requests import Request
    from starlette.responses import HTMLResponse, JSONResponse, Response, StreamingResponse
    from starlette.routing import Route
except ImportError as e:  # pragma: no cover - depends on the extra
    raise ImportError(
        "the web console needs starlette and uvicorn: pip install 'cardbus[ui]'"
    ) from e

__all__ = ["create_app", "is_loopback"]

_encode = msgspec.json.Encoder().encode
HEARTBEAT_S = 15.0


def _json(obj: Any, status: int = 200) -> Response:
    return Response(_encode(obj), status_code=status, media_type="application/json")


def _error(e: Exception) -> Response:
    status = 409  # a state the request does not fit (a task not awaiting approval)
    if isinstance(e, StreamNotFound):
        status = 404
    elif isinstance(e, ValidationError | ValueError):  # ConfigError is a ValueError
        status = 400
    return JSONResponse({"error": str(e), "type": type(e).__name__}, status_code=status)


class Console:
    """The state behind the app: one store, one in-memory read model of runs and tasks."""

    def __init__(self, store: EventStore) -> None:
        self.store = store
        self.runner = ProjectionRunner.open(store, ":memory:", [Runs(), TaskTable()])
        self._lock = asyncio.Lock()

    async def fresh(self) -> ProjectionRunner:
        async with self._lock:
            await self.runner.catch_up()
        return self.runner

    async def runs(self, status: str | None, limit: int | None) -> dict[str, Any]:
        runner = await self.fresh()
        rows = Runs().list(runner.conn, status=status, limit=limit)
        now = time.time()
        for r in rows:
            r["duration_s"] = run_duration(r, now)
        return {"runs": rows, "position": runner.position}

    def _tasks(self, runner: ProjectionRunner, root: str) -> list[dict[str, Any]]:
        rows = TaskTable().list(runner.conn, root=root)
        for r in rows:
            for col in ("input", "output"):
                if r[col] is not None:
                    r[col] = msgspec.json.decode(r[col])
        return rows

    async def run(self, text: str) -> dict[str, Any]:
        root = await resolve_id(self.store, text)
        runner = await self.fresh()
        row = Runs().get(runner.conn, root)
        if row is not None:
            row["duration_s"] = run_duration(row)
        timeline = await replay(self.store, root)
        return {
            "run": row,
            "timeline": timeline,
            "tasks": self._tasks(runner, timeline.root_id),
            "position": runner.position,
        }

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
        stream = await self.store.read_stream(task_id)
        for env in stream:
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
        return {"task": row, "steps": steps, "calls": calls, "position": runner.position}

    async def events(self, root: str | None, start: int) -> AsyncIterator[bytes]:
        """SSE frames: one per appended event (of run ``root``, if given), plus heartbeats."""
        yield b"retry: 1000\n: connected\n\n"
        events = self.store.subscribe(start)
        try:
            while True:
                try:
                    env = await asyncio.wait_for(anext(events), HEARTBEAT_S)
                except TimeoutError:
                    yield b": heartbeat\n\n"
                    continue
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
            with contextlib.suppress(Exception):
                await events.aclose()  # type: ignore[attr-defined]


def create_app(
    db: str | None = None,
    *,
    store: EventStore | None = None,
    opener: Callable[[], Awaitable[EventStore]] | None = None,
    token: str | None = None,
    hosts: list[str] | None = None,
) -> Starlette:
    """The console over the SQLite log ``db``, a log ``opener`` opens at start-up, or ``store``.

    ``hosts`` are the names the ``Host`` header may carry (default: loopback
    names); ``token``, if given, is required on every request.
    """
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
        state["console"] = Console(opened)
        try:
            yield
        finally:
            state["console"].runner.close()
            if own:
                await opened.close()

    async def page(request: Request) -> Response:
        return HTMLResponse(PAGE, headers={"Cache-Control": "no-store"})

    async def runs(request: Request) -> Response:
        q = request.query_params
        try:
            limit = int(q["limit"]) if q.get("limit") else None
            return _json(await console().runs(q.get("status") or None, limit))
        except (CardbusError, ValueError) as e:
            return _error(e)

    async def run(request: Request) -> Response:
        try:
            return _json(await console().run(request.path_params["id"]))
        except CardbusError as e:
            return _error(e)

    async def task(request: Request) -> Response:
        try:
            return _json(await console().task(request.path_params["id"]))
        except CardbusError as e:
            return _error(e)

    async def answer(request: Request) -> Response:
        try:
            body = msgspec.json.decode(await request.body() or b"{}")
        except msgspec.DecodeError:
            return JSONResponse({"error": "the body is not JSON"}, status_code=400)
        if not isinstance(body, dict):
            body = {}
        action = request.path_params["action"]
        if action not in ("approve", "deny"):
            return JSONResponse({"error": f"no action {action!r}"}, status_code=404)
        granted = action == "approve"
        by = str(body.get("by") or "ui")
        note = str(body.get("note") or "")
        try:
            task_id = await resolve_id(console().store, request.path_params["id"])
            await answer_approval(console().store, task_id, granted, by, note)
        except CardbusError as e:
            return _error(e)
        return _json({"task_id": task_id, "approved": granted, "by": by})

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
            console().events(root, start),
            media_type="text/event-stream",
            headers={"Cache-Control": "no-store", "X-Accel-Buffering": "no"},
        )

    routes = [
        Route("/", page),
        Route("/api/runs", runs),
        Route("/api/runs/{id:path}", run),
        Route("/api/tasks/{id:path}/{action:str}", answer, methods=["POST"]),
        Route("/api/tasks/{id:path}", task),
        Route("/api/events", events),
    ]
    # Host allow-list, same-origin JSON posts, the token (bus/http_guard.py)
    guard = Middleware(
        HttpGuard,
        hosts=hosts or LOOPBACK_NAMES,
        tokens=[token] if token else [],
        token_query=True,  # the page's own links carry ?token=
    )
    return Starlette(routes=routes, middleware=[guard], lifespan=lifespan)
