"""A cancel reaches the handler on the embedded runtime: the attempt's handler is
cancelled (it sees ``CancelledError``), the tool call it was in is recorded as cut off,
no handler completes after the cancel, and the run ends ``cancelled``; a lost cancel
notice is made up by the worker's ``attempt.live`` check."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgspec
from click.testing import CliRunner

from cardbus.agents import Agent, Capability, ResultCard, TaskCard, TaskContext
from cardbus.agents.cards import CancelNotice
from cardbus.agents.llm import Completion
from cardbus.bus.a2a.fold import TaskFold
from cardbus.bus.orchestrator.cancel import cancel_run
from cardbus.bus.orchestrator.core import Orchestrator
from cardbus.bus.orchestrator.plan import Plan, PlanTask
from cardbus.bus.runtime.embedded import EmbeddedRuntime
from cardbus.bus.runtime.worker import AgentWorker
from cardbus.bus.transport.inprocess import InProcessBus
from cardbus.eventstore import Envelope, EventStore, SqliteEventStore
from cardbus.eventstore import events as ev
from cardbus.tools.cli import cli


class N(msgspec.Struct):
    n: int


#: what each handler run did, in order: "began", "cancelled", "effect done", "completed"
RECORD: list[str] = []
#: set by a handler that saw the cancel (made per test: an Event is bound to its loop)
CANCELLED: list[asyncio.Event] = []


def fresh() -> asyncio.Event:
    RECORD.clear()
    CANCELLED[:] = [asyncio.Event()]
    return CANCELLED[0]


class Slow(Agent):
    """Runs a 5 s effect of its own (journaled as a local tool), then answers."""

    agent_id = "slow"
    description = "adds ten after a slow effect"
    capabilities = [Capability("slow", N, N, "add ten slowly")]

    async def handle(self, task: TaskCard, inputs: N, ctx: TaskContext) -> N:
        RECORD.append("began")

        async def effect(_key: str) -> Any:
            await asyncio.sleep(5)
            RECORD.append("effect done")
            return {"done": True}

        try:
            await ctx.journal.tool_call("slow_effect", {"n": inputs.n}, effect)
        except asyncio.CancelledError:
            RECORD.append("cancelled")
            CANCELLED[0].set()
            raise
        RECORD.append("completed")
        return N(n=inputs.n + 10)


def one_slow_task() -> Plan:
    return Plan(
        goal="be cancelled",
        tasks=[PlanTask(id="b", capability="slow", inputs={"n": 1}, timeout_s=30)],
    )


async def until(store: EventStore, pred: Callable[[Envelope], bool]) -> Envelope:
    """The first event of the log matching ``pred``, once there (a bound against a hang)."""
    deadline = time.monotonic() + 30
    while True:
        for env in await store.read_all(0, 100_000):
            if pred(env):
                return env
        assert time.monotonic() < deadline, "no such event in the log"
        await asyncio.sleep(0.02)


def of(kind: type, reason: str = "") -> Callable[[Envelope], bool]:
    return lambda e: isinstance(e.data, kind) and (not reason or e.data.reason == reason)


async def test_embedded_cancel_stops_the_handler_and_the_run_says_cancelled(
    tmp_path: Path,
) -> None:
    cancelled_seen = fresh()
    db = tmp_path / "cardbus.db"
    store = await SqliteEventStore.open(db, poll_interval=0.01)
    try:
        async with EmbeddedRuntime(store, [Slow]) as rt:
            root = await rt.submit(one_slow_task())
            # the handler is inside its effect: the tool call is recorded as begun
            await until(store, of(ev.ToolRequested))
            cancelled = await cancel_run(store, root, by="ops-alice", reason="cancelled_by_user")
            result = await rt.orchestrator.wait(root, timeout=30)
            await asyncio.wait_for(cancelled_seen.wait(), 30)
            ignored = await until(store, of(ev.TaskResultIgnored, "handler_cancelled"))
        events = await store.read_correlation(root)
    finally:
        await store.close()
    assert len(cancelled) == 1 and ignored.stream == cancelled[0]
    # the handler saw the cancel inside its effect; neither the effect nor it completed
    assert RECORD == ["began", "cancelled"]
    assert (result.status, result.reason) == ("cancelled", "cancelled")
    assert result.detail == "by ops-alice: cancelled_by_user"
    data = [e.data for e in events]
    assert not [d for d in data if isinstance(d, (ev.TaskCompleted, ev.TaskResultSubmitted))]
    # the interrupted tool call is recorded as cut off, not left with its effect unknown
    (called,) = [d for d in data if isinstance(d, ev.ToolCalled)]
    assert (called.tool, called.error_type) == ("slow_effect", "cancelled")
    (end,) = [d for d in data if isinstance(d, ev.RunFailed)]
    assert (end.reason, end.cancelled, end.cancelled_by) == ("cancelled", True, "ops-alice")
    # A2A reads the run as canceled, saying who cancelled it
    from a2a.types import TaskState as A2AState

    fold = TaskFold(root)
    for e in events:
        fold.apply(e)
    task = fold.task()
    assert task.status.state == A2AState.TASK_STATE_CANCELED
    assert task.status.message.parts[0].text == "run cancelled by ops-alice"

    runs = await cardbus("runs", "--store", str(db), "--json")
    (row,) = json.loads(runs)
    assert (row["status"], row["reason"]) == ("cancelled", "by ops-alice: cancelled_by_user")
    only = await cardbus("runs", "--store", str(db), "--json", "--status", "cancelled")
    assert [r["root_id"] for r in json.loads(only)] == [root]
    table = await cardbus("runs", "--store", str(db))
    assert "cancelled: by ops-alice: cancelled_by_user" in " ".join(table.split())
    # the console's run list says so too
    shown = await asyncio.to_thread(console_runs, db, "cancelled")
    assert [(r["root_id"], r["status"]) for r in shown] == [(root, "cancelled")]


def console_runs(db: Path, status: str) -> list[dict[str, Any]]:
    from starlette.testclient import TestClient

    from cardbus.tools.ui import create_app

    with TestClient(create_app(str(db)), base_url="http://127.0.0.1") as c:
        got = c.get(f"/api/runs?status={status}")
        assert got.status_code == 200, got.text
        runs: list[dict[str, Any]] = got.json()["runs"]
        return runs


async def cardbus(*args: str) -> str:
    """``cardbus ARGS`` (in a thread: the command runs its own event loop); its stdout."""
    done = await asyncio.to_thread(CliRunner().invoke, cli, list(args), catch_exceptions=False)
    assert done.exit_code == 0, done.output
    return done.stdout


class Deaf(InProcessBus):
    """An in-process bus that loses every cancel notice (a replica reconnecting on NATS)."""

    lost: list[CancelNotice]

    async def cancel_attempt(self, notice: CancelNotice) -> None:
        self.lost.append(notice)


class Sleepy(Agent):
    agent_id = "sleepy"
    description = "sleeps, unless stopped"
    capabilities = [Capability("sleepy", N, N, "sleep on it")]

    async def handle(self, task: TaskCard, inputs: N, ctx: TaskContext) -> N:
        RECORD.append("began")
        try:
            await asyncio.sleep(60)
        except asyncio.CancelledError:
            RECORD.append("cancelled")
            CANCELLED[0].set()
            raise
        RECORD.append("completed")
        return N(n=inputs.n)


async def test_a_lost_notice_is_made_up_by_the_attempt_live_check(tmp_path: Path) -> None:
    cancelled_seen = fresh()
    store = await SqliteEventStore.open(tmp_path / "cardbus.db", poll_interval=0.01)
    bus = Deaf()
    bus.lost = []
    orchestrator = Orchestrator(store, bus, serve_requests=True)
    worker = AgentWorker(bus, Sleepy, cancel_check_s=0.1)
    try:
        await orchestrator.start(agents=[Sleepy.card()])
        await worker.start()
        plan = Plan(goal="x", tasks=[PlanTask(id="s", capability="sleepy", inputs={"n": 1})])
        root = await orchestrator.submit(plan)
        await until(store, of(ev.TaskStarted))
        await cancel_run(store, root, by="ops")
        result = await orchestrator.wait(root, timeout=30)
        await asyncio.wait_for(cancelled_seen.wait(), 30)
        await until(store, of(ev.TaskResultIgnored, "handler_cancelled"))
    finally:
        await worker.stop()
        await orchestrator.stop()
        await bus.close()
        await store.close()
    # the notice was sent and lost; the worker asked, heard "cancelled by ops", stopped it
    assert [(n.agent_id, n.by) for n in bus.lost] == [("sleepy", "ops")]
    assert RECORD == ["began", "cancelled"] and worker.stopped == 1
    assert result.status == "cancelled"


class SlowModel:
    """A model that takes 5 s to answer."""

    model = "slow-model"

    async def complete(self, prompt: str, *, system: str = "") -> Completion:
        await asyncio.sleep(5)
        RECORD.append("answered")
        return Completion(text="late", model=self.model)


class Asker(Agent):
    agent_id = "asker"
    description = "asks a slow model"
    capabilities = [Capability("ask", N, N, "ask the model")]

    async def handle(self, task: TaskCard, inputs: N, ctx: TaskContext) -> N:
        RECORD.append("began")
        try:
            await ctx.llm.complete("what is n?")
        except asyncio.CancelledError:
            RECORD.append("cancelled")
            CANCELLED[0].set()
            raise
        RECORD.append("completed")
        return N(n=inputs.n)


async def test_a_model_call_cut_off_by_a_cancel_is_recorded(tmp_path: Path) -> None:
    cancelled_seen = fresh()
    store = await SqliteEventStore.open(tmp_path / "cardbus.db", poll_interval=0.01)
    try:
        async with EmbeddedRuntime(store, [Asker], llm=SlowModel()) as rt:
            plan = Plan(goal="x", tasks=[PlanTask(id="q", capability="ask", inputs={"n": 1})])
            root = await rt.submit(plan)
            await until(store, of(ev.ModelRequested))
            await cancel_run(store, root, by="ops")
            result = await rt.orchestrator.wait(root, timeout=30)
            await asyncio.wait_for(cancelled_seen.wait(), 30)
            await until(store, of(ev.TaskResultIgnored, "handler_cancelled"))
            # the cut-off call's record is written as the handler unwinds
            await until(store, lambda e: isinstance(e.data, ev.ModelAnswered))
        events = await store.read_correlation(root)
    finally:
        await store.close()
    assert RECORD == ["began", "cancelled"] and result.status == "cancelled"
    (answered,) = [e.data for e in events if isinstance(e.data, ev.ModelAnswered)]
    assert (answered.error_type, answered.answer) == ("cancelled", None)
    assert answered.output_tokens == 0


async def test_a_card_that_comes_after_its_cancel_is_stopped_as_it_begins() -> None:
    """A notice for an attempt not running here is remembered: its card, arriving later
    (still queued, or redelivered), is answered cancelled and its handler runs no further
    than its first await."""
    fresh()
    bus = InProcessBus()
    worker = AgentWorker(bus, Sleepy, started_after_s=1.0)
    try:
        await worker.start()
        notice = CancelNotice(task_id="t1", attempt=1, agent_id="sleepy", reason="why", by="ops")
        await bus.cancel_attempt(notice)
        await bus.send_task(
            "sleepy", TaskCard(task_id="t1", root_id="r", capability="sleepy", inputs={"n": 1})
        )
        replies = bus.replies()
        answer = await asyncio.wait_for(anext(replies), 30)  # the announcement
        while not isinstance(answer, ResultCard):
            answer = await asyncio.wait_for(anext(replies), 30)
    finally:
        await worker.stop()
        await bus.close()
    assert (answer.task_id, answer.status, answer.reason) == ("t1", "failed", "cancelled")
    assert answer.error is not None and "why by ops" in answer.error
    assert RECORD in ([], ["began", "cancelled"]) and "completed" not in RECORD
    assert worker.stopped == 1
