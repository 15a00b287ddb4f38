"""Overload: a deadline counts from the start, the queue has its own limit, runs are
admitted in order up to ``max_runs_in_flight`` (and a restart admits the same), and a
memory write after a run's end never turns its result into an exception.

No test here depends on how fast the machine is: waits are on events in the log; a
sleep only gives the orchestrator time to do what it must not do.
"""

from __future__ import annotations

import asyncio
import dataclasses
from typing import Any

from orchkit import FAST, Runtime, TextOut, ev, is_, make_agent, plan, run_log, task, tid, wait_for

from cardbus.agents import Agent
from cardbus.bus.orchestrator.memory import MEMORY_STREAM, LongTermMemory
from cardbus.bus.runtime.embedded import EmbeddedRuntime
from cardbus.eventstore import ConcurrencyError, SqliteEventStore

GATES: dict[str, asyncio.Event] = {}


def gated(agent_id: str) -> type[Agent]:
    """An agent (max_concurrency 1) whose card with text X waits for ``GATES[X]``, if any."""

    async def handle(t: Any, i: Any, c: Any) -> TextOut:
        gate = GATES.get(i.text)
        if gate is not None:
            await gate.wait()
        return TextOut(text=i.text)

    return make_agent(agent_id, "echo", handle)


async def test_a_card_queued_longer_than_its_timeout_still_completes(store) -> None:
    GATES.clear()
    GATES["hold"] = asyncio.Event()
    rt = await Runtime(store, [gated("one")]).start()
    try:
        root = await rt.orch.submit(plan(task("hold", timeout_s=30), task("queued", timeout_s=0.2)))
        queued = tid(root, "queued")
        await wait_for(store, is_(ev.TaskStarted, tid(root, "hold")))
        await wait_for(store, is_(ev.TaskDispatched, queued))
        await asyncio.sleep(1.0)  # five times its timeout_s, waiting behind "hold"
        GATES["hold"].set()
        r = await rt.orch.wait(root, 30)
    finally:
        await rt.stop()
    assert r.status == "completed"
    log = await run_log(store, root)
    assert not log.of(ev.TaskTimedOut) and not log.of(ev.TaskRetryScheduled)
    assert [d.attempt for d in log.of(ev.TaskDispatched, queued)] == [1]


async def test_the_queue_limit_times_out_with_its_own_reason(store) -> None:
    GATES.clear()
    GATES["hold"] = asyncio.Event()
    policy = dataclasses.replace(FAST, queue_timeout_s=0.2)
    rt = await Runtime(store, [gated("one")], policy=policy).start()
    try:
        root = await rt.orch.submit(plan(task("hold", timeout_s=30), task("queued")))
        queued = tid(root, "queued")
        timed_out = await wait_for(store, is_(ev.TaskTimedOut, queued), timeout=30)
        GATES["hold"].set()
        r = await rt.orch.wait(root, 30)
    finally:
        await rt.stop()
    assert timed_out.data.reason == "queue_timeout"
    log = await run_log(store, root)
    assert log.first(ev.TaskRetryScheduled, queued).data.reason.startswith("queue_timeout")
    assert not log.of(ev.TaskTimedOut, tid(root, "hold"))  # started: 30 s from its start
    assert r.status == "completed"


async def test_runs_past_max_in_flight_wait_in_order_and_a_restart_admits_the_same(
    db_path,
) -> None:
    GATES.clear()
    names = [f"r{i}" for i in range(4)]
    for n in names:
        GATES[n] = asyncio.Event()
    policy = dataclasses.replace(FAST, max_runs_in_flight=2)
    store = await SqliteEventStore.open(db_path, poll_interval=0.01)
    rt = await Runtime(store, [gated("one")], policy=policy, concurrency=4).start()
    roots = [await rt.orch.submit(plan(task(n, timeout_s=60), plan_id=n)) for n in names]
    first = [tid(r, n) for r, n in zip(roots, names, strict=True)]
    try:
        for t in first[:2]:
            await wait_for(store, is_(ev.TaskDispatched, t), timeout=30)
        assert rt.orch.admission.queued(rt.orch.state) == roots[2:]
        await asyncio.sleep(0.5)  # time to dispatch what it must not
        assert not [e for e in await store.read_all(1, 10_000) if _dispatch_of(e, first[2:])]
    finally:
        await rt.stop()
        await store.close()

    # the log is the truth: a new process admits the same two, in the same order
    store = await SqliteEventStore.open(db_path, poll_interval=0.01)
    rt = Runtime(store, [gated("one")], policy=policy, concurrency=4)
    rt.orch.attempts_survive_restart = False  # rt's cards died with its in-process bus
    await rt.start()
    try:
        assert rt.orch.admission.queued(rt.orch.state) == roots[2:]
        GATES["r0"].set()  # r0 ends: r2 moves up, r3 still waits
        await wait_for(store, is_(ev.TaskDispatched, first[2]), timeout=30)
        await asyncio.sleep(0.5)
        assert not [e for e in await store.read_all(1, 10_000) if _dispatch_of(e, first[3:])]
        for gate in GATES.values():
            gate.set()
        results = [await rt.orch.wait(r, 30) for r in roots]
        events = await store.read_all(1, 10_000)
    finally:
        await rt.stop()
        await store.close()
    assert [r.status for r in results] == ["completed"] * 4
    starts = [next(e.position for e in events if _dispatch_of(e, [t])) for t in first]
    assert starts == sorted(starts)  # admitted in submission order


def _dispatch_of(env: Any, tasks: list[str]) -> bool:
    return isinstance(env.data, ev.TaskDispatched) and env.stream in tasks


async def test_run_returns_its_result_when_the_memory_write_after_it_conflicts(store) -> None:
    def flaky(t: Any, i: Any, c: Any) -> TextOut:
        if t.attempt == 1:
            raise RuntimeError("first attempt fails: a failure record for memory")
        return TextOut(text=i.text)

    real_append = store.append

    async def append(stream: str, events: Any, expected: int) -> Any:
        if stream == MEMORY_STREAM:  # another writer always got there first
            raise ConcurrencyError(stream, expected, expected + 1)
        return await real_append(stream, events, expected)

    store.append = append  # type: ignore[method-assign]
    async with EmbeddedRuntime(store, [make_agent("flaky", "echo", flaky)], policy=FAST) as rt:
        r = await rt.run(plan(task("t")), timeout=30)
    assert r.status == "completed"


async def test_concurrent_memory_writes_of_one_process_all_land(store) -> None:
    memory = LongTermMemory(store)
    stored = await asyncio.gather(*(memory.remember(f"k{i}", i) for i in range(300)))
    assert len({e.version for e in stored}) == 300
    assert len(await memory.list(prefix="k")) == 300
