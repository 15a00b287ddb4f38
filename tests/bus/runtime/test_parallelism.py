"""A worker runs up to ``max_concurrency`` cards at once; a sync handler runs in a thread.

Issue 15, item 2, through the public API (``EmbeddedRuntime.run``) and the
events it wrote. Timing is checked only as a ratio to a serial run measured
in the same test, with generous margins: three 0.3 s tasks take about 0.9 s
one at a time and about 0.3 s three at a time; the test asks for under two
thirds of the serial time (the issue's "three 1 s tasks in under 2 s").
"""

from __future__ import annotations

import asyncio
import itertools
import threading
import time
from typing import Any

import msgspec
import pytest

import cardbus
from cardbus import Agent, Capability, EmbeddedRuntime, MemoryEventStore, TaskCard, TaskContext
from cardbus.agents.cards import AgentConstraints
from cardbus.bus.runtime.worker import AgentWorker
from cardbus.bus.transport.inprocess import InProcessBus
from cardbus.eventstore.envelope import Envelope
from cardbus.eventstore.events import TaskCompleted, TaskDispatched, TaskStarted

WORK_S = 0.3


class Job(msgspec.Struct):
    n: int


class Done(msgspec.Struct):
    n: int
    thread: str = ""


def make_agent(
    agent_id: str, capability: str, concurrency: int, sync: bool, work_s: float = WORK_S
) -> type[Agent]:
    """An agent whose handler takes ``work_s``: ``await asyncio.sleep`` or a blocking sleep."""
    attrs: dict[str, Any] = {
        "agent_id": agent_id,
        "description": f"{capability} slowly",
        "capabilities": [Capability(capability, Job, Done, f"{capability} a job")],
        "constraints": AgentConstraints(max_concurrency=concurrency),
    }
    if sync:

        def handle(self: Agent, task: TaskCard, inputs: Job, ctx: TaskContext) -> Done:
            time.sleep(work_s)  # blocks its thread, not the event loop
            return Done(n=inputs.n, thread=threading.current_thread().name)

    else:

        async def handle(self: Agent, task: TaskCard, inputs: Job, ctx: TaskContext) -> Done:
            await asyncio.sleep(work_s)
            return Done(n=inputs.n, thread=threading.current_thread().name)

    attrs["handle"] = handle
    return type(f"Agent_{agent_id}", (Agent,), attrs)


def three_jobs(capability: str, plan_id: str) -> dict[str, Any]:
    return {
        "plan_id": plan_id,
        "goal": "three independent jobs",
        "tasks": [
            {"id": f"j{i}", "capability": capability, "inputs": {"n": i}, "timeout_s": 10}
            for i in range(3)
        ],
    }


def spans(events: list[Envelope]) -> dict[str, tuple[float, float]]:
    """Per task: when its attempt started and when it completed (recorded_at); a fast
    answer has no TaskStarted before it, and then its dispatch dates the start."""
    sent = {e.stream: e.recorded_at for e in events if isinstance(e.data, TaskDispatched)}
    started = {e.stream: e.recorded_at for e in events if isinstance(e.data, TaskStarted)}
    started = {**sent, **started}
    done = {e.stream: e.recorded_at for e in events if isinstance(e.data, TaskCompleted)}
    assert started.keys() == done.keys()
    return {t: (started[t], done[t]) for t in started}


def all_overlap(intervals: list[tuple[float, float]]) -> bool:
    return max(s for s, _ in intervals) < min(e for _, e in intervals)


async def timed_run(agent: type[Agent], plan: dict[str, Any]) -> tuple[float, list[Envelope]]:
    store = MemoryEventStore()
    async with EmbeddedRuntime(store, [agent]) as rt:
        began = time.perf_counter()
        result = await rt.run(plan, timeout=30)
        took = time.perf_counter() - began
        assert result.status == "completed", result.reason
        return took, await store.read_correlation(result.root_id)


@pytest.mark.parametrize("sync", [False, True], ids=["async-handler", "sync-handler"])
async def test_three_tasks_on_one_agent_run_at_once_up_to_max_concurrency(sync: bool) -> None:
    _, serial_events = await timed_run(
        make_agent("slow1", "work", 1, sync), three_jobs("work", "serial")
    )
    _, parallel_events = await timed_run(
        make_agent("slow3", "work", 3, sync), three_jobs("work", "parallel")
    )
    # the log says so: with max_concurrency 3 the three attempts overlap, with 1 none do
    parallel = list(spans(parallel_events).values())
    serial = sorted(spans(serial_events).values())
    assert len(parallel) == len(serial) == 3
    assert all_overlap(parallel), parallel
    assert all(a[1] <= b[0] + 0.005 for a, b in itertools.pairwise(serial)), serial
    assert all(not e.data.implied for e in parallel_events if isinstance(e.data, TaskStarted))
    # (no wall-clock ratio: on a busy machine it measures the machine; the overlap of the
    # attempts in the log is the claim, and bench/concurrency_bench.py prints the times)


async def test_a_blocking_sync_handler_does_not_delay_another_agents_task() -> None:
    """A ``def handle`` that blocks for WORK_S runs in a thread; an async agent is not held up."""
    blocker = make_agent("blocker", "block", 1, sync=True)
    quick = make_agent("quick", "quick", 1, sync=False, work_s=WORK_S / 3)

    class Instant(Agent):
        agent_id = "instant"
        capabilities = [Capability("instant", Job, Done, "answer at once")]

        async def handle(self, task: TaskCard, inputs: Job, ctx: TaskContext) -> Done:
            return Done(n=inputs.n)

    store = MemoryEventStore()
    async with EmbeddedRuntime(store, [blocker, quick, Instant]) as rt:
        # the blocker holds a thread for 3 * WORK_S; the quick and instant tasks run meanwhile
        beside = await rt.run(
            {
                "goal": "blocking tasks beside a quick one",
                "tasks": [
                    {"id": "b", "capability": "block", "inputs": {"n": 1}},
                    {"id": "b2", "capability": "block", "inputs": {"n": 2}, "deps": ["b"]},
                    {"id": "b3", "capability": "block", "inputs": {"n": 3}, "deps": ["b2"]},
                    {"id": "q", "capability": "quick", "inputs": {"n": 4}},
                    {"id": "i", "capability": "instant", "inputs": {"n": 5}},
                ],
            },
            timeout=30,
        )
        assert beside.status == "completed", beside.reason
        assert beside.outputs["b"]["thread"].startswith("cardbus-blocker")  # its own pool
        assert beside.outputs["q"]["thread"] == threading.current_thread().name  # the loop
        events = await store.read_correlation(beside.root_id)
    done = {
        (e.data.agent_id, e.data.output["n"]): e.recorded_at
        for e in events
        if isinstance(e.data, TaskCompleted)
    }
    # the quick and the instant task finished while the first blocking task still held
    # its thread: nothing waited for the blocked handler
    assert done["quick", 4] < done["blocker", 1]
    assert done["instant", 5] < done["blocker", 1]
    # (no ratio of the quick attempt's time beside the blocker to its time alone, once
    # asserted here: on a busy machine a wall-clock ratio measures the machine; the order
    # above is the claim, and bench/concurrency_bench.py prints the times)
    blocked = sorted(v for k, v in spans(events).items() if _agent_of(events, k) == "blocker")
    assert blocked[-1][1] - blocked[0][0] > 3 * WORK_S * 0.9  # the three really blocked


def _agent_of(events: list[Envelope], task_id: str) -> str:
    return next(
        e.data.agent_id
        for e in events
        if isinstance(e.data, TaskDispatched) and e.stream == task_id
    )


async def test_worker_concurrency_follows_max_concurrency_and_is_checked() -> None:
    bus = InProcessBus()
    try:
        assert AgentWorker(bus, make_agent("a", "w", 4, sync=False)).concurrency == 4
        assert AgentWorker(bus, make_agent("b", "w", 4, sync=False), concurrency=2).concurrency == 2
        with pytest.raises(cardbus.ConfigError, match="max_concurrency"):
            AgentWorker(bus, make_agent("c", "w", 0, sync=False))
    finally:
        await bus.close()


async def test_on_nats_a_worker_takes_up_to_max_concurrency_cards_at_once(nats_url: str) -> None:
    """The same through NatsRuntime: the agent's worker fetches and acks each card."""
    from cardbus.bus.runtime.nats import NatsRuntime
    from cardbus.eventstore.nats.connection import NatsOptions

    overlap: dict[int, bool] = {}
    for concurrency in (1, 3):
        agent = make_agent(f"nslow{concurrency}", f"nwork{concurrency}", concurrency, sync=True)
        async with NatsRuntime(NatsOptions(url=nats_url), [agent]) as rt:
            plan = three_jobs(f"nwork{concurrency}", f"nats-{concurrency}")
            await rt.wait_for_capabilities([f"nwork{concurrency}"], 10)
            result = await rt.run(plan, timeout=30)
            assert result.status == "completed", result.reason
            events = await rt.store.read_correlation(result.root_id)
        overlap[concurrency] = all_overlap(list(spans(events).values()))
    # the attempts' spans in the log are the claim (a wall-clock ratio, once asserted
    # here, failed on a busy machine: it measured the machine, not the worker)
    assert overlap == {1: False, 3: True}
