"""Schedules on the runtimes (issue 32 item 3): the embedded runtime on a SQLite file
fires a schedule's runs, each naming its schedule, and its ``skip`` overlap policy skips a
due time while the previous run still runs (the log says so, with the reason)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path

import msgspec

from cardbus import Agent, Capability, TaskCard, TaskContext
from cardbus.bus.orchestrator.scheduler import create_schedule
from cardbus.bus.orchestrator.schedules import stream_of
from cardbus.bus.runtime.embedded import EmbeddedRuntime
from cardbus.eventstore import EventStore
from cardbus.eventstore import events as ev
from cardbus.eventstore.sqlite import SqliteEventStore


class Text(msgspec.Struct):
    text: str


RELEASE: list[asyncio.Event] = []


class Held(Agent):
    """Answers once the test lets it: a run that is still running when the next is due."""

    agent_id = "held"
    capabilities = [Capability("hold", Text, Text, "answer when released")]

    async def handle(self, task: TaskCard, inputs: Text, ctx: TaskContext) -> Text:
        await RELEASE[0].wait()
        return Text(text=inputs.text)


PLAN = {
    "goal": "hourly triage",
    "tasks": [{"id": "h", "capability": "hold", "inputs": {"text": "x"}}],
}


async def until(
    store: EventStore, stream: str, done: Callable[[list[ev.Event]], bool], timeout: float = 30
) -> list[ev.Event]:
    """The stream's events once ``done`` says so (a condition on the log, not a sleep)."""
    loop = asyncio.get_running_loop()
    end = loop.time() + timeout
    while True:
        events = [e.data for e in await store.read_stream(stream)]
        if done(events) or loop.time() > end:
            return events
        await asyncio.sleep(0.05)


async def test_skip_overlap_on_the_embedded_runtime(tmp_path: Path) -> None:
    RELEASE[:] = [asyncio.Event()]
    store = await SqliteEventStore.open(tmp_path / "log.db")
    try:
        rt = EmbeddedRuntime(store, [Held])
        rt.scheduler.tick = 0.05
        async with rt:
            sid = await create_schedule(store, PLAN, interval_seconds=0.5, overlap="skip")

            def overlapped(events: list[ev.Event]) -> bool:
                return any(isinstance(e, ev.ScheduleSkipped) for e in events)

            events = await until(store, stream_of(sid), overlapped)
            first = [e for e in events if isinstance(e, ev.ScheduleFired)]
            skip = [e for e in events if isinstance(e, ev.ScheduleSkipped)]
            assert len(first) == 1, events
            assert skip[0].reason == "overlap" and first[0].plan_id in skip[0].detail
            assert skip[0].due > first[0].due
            RELEASE[0].set()
            claim = (await store.read_stream(f"plan-{first[0].plan_id}"))[0].data
            assert isinstance(claim, ev.PlanSubmitted)
            root = await rt.orchestrator.wait(claim.root_id, timeout=30)
            assert root.status == "completed"
            started = (await store.read_stream(root.root_id))[0].data
            assert isinstance(started, ev.RunStarted) and started.schedule == sid

            def fired_again(events: list[ev.Event]) -> bool:  # the run ended: it fires again
                return sum(isinstance(e, ev.ScheduleFired) for e in events) >= 2

            events = await until(store, stream_of(sid), fired_again)
            assert sum(isinstance(e, ev.ScheduleFired) for e in events) >= 2
        # the scheduler stops with its runtime: no loop left behind
        assert not [t for t in asyncio.all_tasks() if t.get_name().startswith("scheduler-")]
    finally:
        await store.close()
