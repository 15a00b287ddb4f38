"""What the MCP server's tools and resources do: the console's library calls, by an actor.

Each tool is a call the command line and the web console make too: the runs
list, a run's tasks and cost are the console's read model
(:class:`cardbus.tools.ui.app.Console`: the ``runs``, ``tasks`` and ``spend``
projections); start, fork and re-run are :mod:`cardbus.tools.ui.actions`
(agents hosted in this process on a SQLite log, or the new run written to a
NATS log for the running orchestrators); approve and deny are
:func:`~cardbus.bus.orchestrator.core.answer_approval` (``cardbus approve``),
cancel :func:`~cardbus.bus.orchestrator.cancel.cancel_run` (``cardbus
cancel``), a replay :func:`~cardbus.projections.replay` drawn as ``cardbus
replay`` prints it. Every event written is signed with the caller's actor
(:mod:`.who`). Bad input is a ``CardbusError`` with the reason, and nothing
is written.
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import msgspec

from cardbus.agents.agent import Agent
from cardbus.bus.orchestrator.core import answer_approval
from cardbus.bus.orchestrator.questions import answer_question, open_questions
from cardbus.bus.orchestrator.reviews import DECISIONS, answer_review, open_reviews
from cardbus.eventstore.errors import CardbusError, ValidationError
from cardbus.eventstore.store import EventStore
from cardbus.projections import TaskTable, Timeline, replay, resolve_id
from cardbus.projections.pricing import PriceTable
from cardbus.tools.ui.actions import Actions, HostedAgents, LogActions
from cardbus.tools.ui.app import Console

__all__ = ["ENDED", "WAITING", "RunService"]

#: a run's statuses once it is over
ENDED = ("completed", "failed", "halted")
#: what the runs list shows of each run
RUN_FIELDS = (
    "root_id",
    "goal",
    "status",
    "reason",
    "started_at",
    "ended_at",
    "duration_s",
    "tasks_total",
    "tasks_done",
    "tasks_failed",
    "waiting",
    "cost",
)
#: the task statuses a person answers
WAITING = ("awaiting_approval",)


class RunService:
    """One log and what runs on it, for the MCP tools (an async context manager).

    ``opener`` opens the log (at start-up, in the server's loop); ``agents`` the
    classes hosted to run new runs on a SQLite log; ``llm`` makes their model;
    ``submit_to_log`` (a NATS log): new runs are written for the running
    orchestrators instead; ``render`` draws a timeline (``cardbus replay``'s tree).
    """

    def __init__(
        self,
        opener: Callable[[], Awaitable[EventStore]],
        agents: Sequence[type[Agent]] = (),
        llm: Callable[[], Any] | None = None,
        prices: PriceTable | None = None,
        submit_to_log: bool = False,
        render: Callable[[Timeline, PriceTable], Any] | None = None,
    ) -> None:
        self._opener = opener
        # how a timeline is drawn: `cardbus replay`'s tree (the command passes it in)
        self._render = render
        self._agents = list(agents)
        self._llm = llm
        self._prices = prices
        self._submit_to_log = submit_to_log
        self._stack = contextlib.AsyncExitStack()
        self.console: Console | None = None

    async def __aenter__(self) -> RunService:
        try:
            store = await self._opener()
            self._stack.push_async_callback(store.close)
            model = self._llm() if self._llm is not None and self._agents else None
            close = getattr(model, "aclose", None)
            if close is not None:
                self._stack.push_async_callback(close)
            actions: Actions = (
                LogActions(store)
                if self._submit_to_log
                else HostedAgents(store, self._agents, model)
            )
            await self._stack.enter_async_context(actions)
            self.console = Console(store, self._prices, actions)
            self._stack.callback(self.console.runner.close)
        except BaseException:
            await self._stack.aclose()
            raise
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self._stack.aclose()

    @property
    def c(self) -> Console:
        if self.console is None:
            raise CardbusError("the MCP server's log is not open")
        return self.console

    # -- runs ----------------------------------------------------------------

    async def start(self, by: str, goal: str | None, plan: Any) -> dict[str, Any]:
        """A new run from a goal (planned) or a plan (JSON text or object)."""
        return await self.c.actions.start({"goal": goal, "plan": plan}, by)

    async def runs(
        self,
        status: str | None = None,
        text: str | None = None,
        plan: str | None = None,
        agent: str | None = None,
        limit: int = 20,
        offset: int = 0,
    ) -> dict[str, Any]:
        body = await self.c.runs(
            {
                "status": status,
                "q": text,
                "plan": plan,
                "agent": agent,
                "limit": limit,
                "offset": offset,
            }
        )
        return {
            "runs": [{k: r.get(k) for k in RUN_FIELDS} for r in body["runs"]],
            "total": body["total"],
            "offset": body["offset"],
        }

    async def status(self, run: str, wait_s: float = 0.0) -> dict[str, Any]:
        """A run's status, result (each completed task's output) and cost; with ``wait_s``,
        first waits that long at most for it to stop running (to end, or to wait for a
        person), woken by the log's appends."""
        if not 0 <= wait_s <= 600:
            raise ValidationError("wait_s must be between 0 and 600 seconds")
        if wait_s:
            await self._until_settled(run, wait_s)
        body = await self.c.run(run)
        row = body["run"] or {}
        outputs = {
            t["task_id"]: t["output"]
            for t in body["tasks"]
            if t["status"] == "completed" and t["output"] is not None
        }
        return {
            "root_id": body["root_id"],
            "goal": row.get("goal"),
            "status": row.get("status", "unknown"),
            "reason": row.get("reason"),
            "duration_s": row.get("duration_s"),
            "tasks": body["counts"],
            "waiting": row.get("waiting") or [],
            "outputs": outputs,
            "cost": body["cost"],
            "cost_by_model": [
                {k: m.get(k) for k in ("model", "input_tokens", "output_tokens", "cost")}
                for m in body["cost_by_model"]
            ],
        }

    async def _status_of(self, run: str) -> str:
        row = (await self.c.run(run, limit=1))["run"] or {}
        return str(row.get("status") or "")

    async def _until_settled(self, run: str, wait_s: float) -> None:
        store = self.c.store
        loop = asyncio.get_running_loop()
        deadline = loop.time() + wait_s
        start = await store.last_position() + 1  # before the look: no append is missed
        if await self._status_of(run) not in ("running", ""):
            return
        events = aiter(store.subscribe(start))
        try:
            while (left := deadline - loop.time()) > 0:
                try:
                    await asyncio.wait_for(anext(events), left)
                except (TimeoutError, StopAsyncIteration):
                    return
                if await self._status_of(run) not in ("running", ""):
                    return
        finally:
            with contextlib.suppress(Exception):
                await events.aclose()  # type: ignore[attr-defined]

    async def replay_text(self, task: str, width: int = 200) -> str:
        """The timeline of a task or a run as ``cardbus replay`` prints it off a terminal
        (no colours, 200 columns)."""
        from rich.console import Console as RichConsole

        store = self.c.store
        timeline = await replay(store, await resolve_id(store, task))
        buf = io.StringIO()
        out = RichConsole(file=buf, width=width, no_color=True, highlight=False, soft_wrap=False)
        if self._render is None:
            raise CardbusError("this server was not given a way to draw a timeline")
        out.print(self._render(timeline, self.c.prices))
        return buf.getvalue()

    async def task(self, task: str) -> dict[str, Any]:
        return await self.c.task(task)

    # -- what waits for a person ---------------------------------------------

    async def waiting(self, run: str | None = None) -> dict[str, Any]:
        """The tasks waiting for a person's answer (of one run, if given)."""
        runner = await self.c.fresh()
        root = None
        if run:
            root = (await self.c.run(run, limit=1))["root_id"]
        rows = TaskTable().list(runner.conn, root=root, statuses=WAITING)
        keep = ("task_id", "root_id", "goal", "capability", "status", "reason", "updated_at")
        shown = []
        for r in rows:
            row = {
                **{k: r.get(k) for k in keep},
                # what the person is asked to let run: the task's inputs
                "input": msgspec.json.decode(r["input"]) if r.get("input") else None,
                "answers": ["approve", "deny"],
            }
            # a tool call held for review: the call, its arguments, the model's words
            held = await open_reviews(self.c.store, str(r["task_id"]))
            asked = await open_questions(self.c.store, str(r["task_id"]))
            if asked and asked[0].task_id == r["task_id"]:  # a question: answer_question
                row["answers"] = ["answer", "deny"]
                row["question"] = asked[0].as_dict()
            if held:
                row["answers"] = list(DECISIONS)
                row["reviews"] = [
                    {"call": h.call, "tool": h.tool, "arguments": h.arguments, "text": h.text}
                    for h in held
                ]
            shown.append(row)
        return {"waiting": shown, "now": time.time()}

    async def review(
        self,
        by: str,
        task: str,
        decision: str,
        arguments: dict[str, Any] | None = None,
        reason: str = "",
        call: str = "",
    ) -> dict[str, Any]:
        """A person's word on a tool call held for review (``answer_review``)."""
        task_id = await resolve_id(self.c.store, task)
        answered = await answer_review(
            self.c.store, task_id, decision, by=by, call=call, arguments=arguments, reason=reason
        )
        calls = [{"call": r.call, "tool": r.tool, "proposed": r.arguments} for r in answered]
        return {"task_id": task_id, "decision": decision, "by": by, "calls": calls}

    async def answer_question(
        self, by: str, task: str, answer: Any = None, use_default: bool = False
    ) -> dict[str, Any]:
        """A person's answer to a question an agent asked (``answer_question``): checked
        against its schema, refused naming the field when it does not fit."""
        ident = await resolve_id(self.c.store, task)
        q, given = await answer_question(
            self.c.store, ident, answer, by=by, door="mcp", use_default=use_default
        )
        return {"task_id": q.task_id, "answer": given, "by": by}

    async def answer(self, by: str, task: str, granted: bool, note: str = "") -> dict[str, Any]:
        task_id = await resolve_id(self.c.store, task)
        await answer_approval(self.c.store, task_id, granted, by, note)
        return {"task_id": task_id, "answer": "approved" if granted else "denied", "by": by}

    async def cancel(self, by: str, run: str, note: str = "") -> dict[str, Any]:
        return await self.c.cancel(run, by, note)

    async def fork(
        self,
        by: str,
        task: str,
        at: str | None = None,
        inputs: Any = None,
        model: str | None = None,
    ) -> dict[str, Any]:
        return await self.c.actions.fork(task, {"at": at, "inputs": inputs, "model": model}, by)

    async def rerun(self, by: str, task: str, model: str | None = None) -> dict[str, Any]:
        return await self.c.actions.rerun(task, {"model": model}, by)
