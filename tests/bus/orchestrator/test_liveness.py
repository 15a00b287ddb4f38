"""Agent liveness (issue 15 items 1 and 5): leases, deregistration, lost attempts, who ran it.

Each test drives the public API (``Orchestrator``, ``EmbeddedRuntime``,
``AgentWorker``, ``InProcessBus``) and checks the events written.
"""

from __future__ import annotations

import asyncio
import dataclasses
import math
import time
from pathlib import Path
from typing import Any

from orchkit import CARDS, FAST, TextOut, is_, make_agent, plan, run_log, task, tid, wait_for

from cardbus.agents.cards import ResultCard, Started
from cardbus.bus import EmbeddedRuntime, InProcessBus, Orchestrator
from cardbus.bus.orchestrator.liveness import Leases
from cardbus.bus.runtime.worker import AgentWorker
from cardbus.eventstore import MemoryEventStore, SqliteEventStore
from cardbus.eventstore import events as ev

GOAL = "summarise the tides of the northern coast"
#: X describes its capability in the goal's words, so selection prefers it to Y
X = make_agent("x", "echo", cap_description=GOAL)
Y = make_agent("y", "echo", cap_description="anything at all")


async def _registered_by_an_earlier_process(db_path: Path, *agents: Any) -> None:
    """An earlier process registered ``agents`` and died: no deregistration in the log."""
    store = await SqliteEventStore.open(db_path)
    orch = Orchestrator(store, InProcessBus(), FAST)
    await orch.start()
    for a in agents:
        await orch.register(a.card())
    await orch.stop()
    await store.close()


async def test_a_stale_agent_is_never_dispatched_to_by_a_plan_without_it(db_path: Path) -> None:
    await _registered_by_an_earlier_process(db_path, X)
    store = await SqliteEventStore.open(db_path, poll_interval=0.01)
    try:
        async with EmbeddedRuntime(store, [Y], FAST) as rt:
            assert "x" in rt.orchestrator.state.agents  # still in the log, and better ranked
            r = await rt.run(plan(task("a", goal=GOAL), task("b", goal=GOAL)), timeout=10)
        assert r.status == "completed"
        log = await run_log(store, r.root_id)
        assert {d.agent_id for d in log.of(ev.TaskDispatched)} == {"y"}
        started = log.of(ev.RunStarted)[0]
        assert "y" in started.agents and "x" not in started.agents
        for d in log.of(ev.TaskDispatched):  # not even considered
            assert "x" not in [c.agent_id for c in d.candidates]
    finally:
        await store.close()


async def test_an_agent_from_the_log_is_unconfirmed_until_it_renews(db_path: Path) -> None:
    """No run's agents named: the lease alone keeps X out; a task only X can do waits for
    X's renewal; X never renewing, its grace ends in agent.deregistered (lease_expired).

    Told from the log's order, not the clock: on a busy machine any step may outlast
    the grace, but the task must not fail before the deregistration that ends it."""
    only_x = make_agent("ox", "only_x")
    await _registered_by_an_earlier_process(db_path, X, only_x)
    store = await SqliteEventStore.open(db_path, poll_interval=0.01)
    bus = InProcessBus()
    orch = Orchestrator(store, bus, FAST, lease_s=1.0)
    await orch.start()
    try:
        # submitted first, while ox (from the log) is registered, unconfirmed
        root = await orch.submit(plan(task("w", "only_x")))
        await orch.register(Y.card())
        worker = AgentWorker(bus, Y)
        await worker.start()
        r = await orch.run(plan(task("a", goal=GOAL)), 10)
        assert r.status == "completed"
        log = await run_log(store, r.root_id)
        assert [d.agent_id for d in log.of(ev.TaskDispatched)] == ["y"]

        r = await orch.wait(root, 10)  # ox never renews: deregistered, then no agent is left
        assert r.status == "failed"
        w_log = await run_log(store, root)
        assert not w_log.of(ev.TaskDispatched), w_log.summary()  # never sent to ox
        failed = w_log.of(ev.TaskFailed)[0]
        assert failed.reason == "no_capable_agent"
        gone = await wait_for(store, is_(ev.AgentDeregistered, "agent-ox"))
        assert gone.data.reason == "lease_expired"
        # it waited out ox's grace: the failure follows the deregistration in the log
        failed_at = next(
            e.position
            for e in await store.read_stream(tid(root, "w"))
            if isinstance(e.data, ev.TaskFailed)
        )
        assert gone.position < failed_at
        await worker.stop(announce=False)
    finally:
        await orch.stop()
        await bus.close()
        await store.close()


async def test_a_task_waits_for_an_unconfirmed_agent_that_then_renews(db_path: Path) -> None:
    only_x = make_agent("ox", "only_x")
    await _registered_by_an_earlier_process(db_path, only_x)
    store = await SqliteEventStore.open(db_path, poll_interval=0.01)
    bus = InProcessBus()
    orch = Orchestrator(store, bus, FAST, lease_s=30)
    await orch.start()
    try:
        root = await orch.submit(plan(task("w", "only_x")))
        await asyncio.sleep(0.3)
        assert not (await run_log(store, root)).of((ev.TaskDispatched, ev.TaskFailed))
        worker = AgentWorker(bus, only_x)  # comes back: its announcement confirms it
        await worker.start()
        r = await orch.wait(root, 10)
        assert r.status == "completed"
        assert [d.agent_id for d in (await run_log(store, root)).of(ev.TaskDispatched)] == ["ox"]
        await worker.stop(announce=False)
    finally:
        await orch.stop()
        await bus.close()
        await store.close()


def _hang_on_x(task: Any, inputs: Any, ctx: Any) -> Any:
    if ctx.agent_id == "x":  # X takes the card and never answers
        return asyncio.Event().wait()
    return TextOut(text=inputs.text)


async def _run_with_x_dying(db_path: Path, announce: bool) -> tuple[Any, Any]:
    x = make_agent("x", "echo", _hang_on_x, cap_description=GOAL)
    store = await SqliteEventStore.open(db_path, poll_interval=0.01)
    bus = InProcessBus()
    orch = Orchestrator(store, bus, FAST)
    await orch.start()
    wx = AgentWorker(bus, x, lease_s=0.6)
    wy = AgentWorker(bus, Y)
    try:
        for w in (wx, wy):
            await w.start()  # announced only: live by their leases
        await wait_for(store, is_(ev.AgentRegistered, "agent-y"))
        root = await orch.submit(plan(task("a", timeout_s=60, goal=GOAL)))
        a = tid(root, "a")
        await wait_for(store, is_(ev.TaskStarted, a))
        await wx.stop(announce=announce)  # announce=False: it died without a word
        r = await orch.wait(root, 10)  # long before the attempt's 60 s deadline
        return r, await run_log(store, root)
    finally:
        await wy.stop(announce=False)
        await orch.stop()
        await bus.close()
        await store.close()


async def test_a_stopping_agent_is_deregistered_and_its_attempt_lost_at_once(
    db_path: Path,
) -> None:
    r, log = await _run_with_x_dying(db_path, announce=True)
    assert r.status == "completed"
    a = tid(r.root_id, "a")
    assert [d.agent_id for d in log.of(ev.TaskDispatched, a)] == ["x", "y"]
    timed_out = log.of(ev.TaskTimedOut, a)[0]
    assert (timed_out.attempt, timed_out.agent_id, timed_out.reason) == (1, "x", "agent_lost")
    assert log.of(ev.TaskRetryScheduled, a)[0].reason.startswith("agent_lost")
    store = await SqliteEventStore.open(db_path)
    try:
        (gone,) = [
            e.data for e in await store.read_stream("agent-x") if e.type.startswith("agent.d")
        ]
        assert gone.reason == "stopped"
    finally:
        await store.close()


async def test_an_agent_whose_lease_lapses_mid_attempt_loses_the_attempt(db_path: Path) -> None:
    r, log = await _run_with_x_dying(db_path, announce=False)
    assert r.status == "completed"
    a = tid(r.root_id, "a")
    assert [d.agent_id for d in log.of(ev.TaskDispatched, a)] == ["x", "y"]
    assert log.of(ev.TaskTimedOut, a)[0].reason == "agent_lost"
    store = await SqliteEventStore.open(db_path)
    try:
        kinds = [e.data for e in await store.read_stream("agent-x")]
        assert isinstance(kinds[-1], ev.AgentDeregistered) and kinds[-1].reason == "lease_expired"
    finally:
        await store.close()


class _Gate:
    open = False


def _gated(task: Any, inputs: Any, ctx: Any) -> Any:
    if not _Gate.open:
        return asyncio.Event().wait()  # the first process never answers
    return TextOut(text=inputs.text.upper())


async def test_an_embedded_resume_times_the_dead_attempt_out_at_once(db_path: Path) -> None:
    agent = make_agent("slow", "echo", _gated)
    _Gate.open = False
    store = await SqliteEventStore.open(db_path, poll_interval=0.01)
    rt = EmbeddedRuntime(store, [agent], FAST)
    await rt.__aenter__()
    root = await rt.orchestrator.submit(plan(task("a", timeout_s=60)))
    a = tid(root, "a")
    await wait_for(store, is_(ev.TaskStarted, a))
    # the process dies: no answer, no deregistration, nothing more written
    await rt.orchestrator.stop(give_back=False)
    await rt.bus.close()
    await store.close()

    _Gate.open = True
    store = await SqliteEventStore.open(db_path, poll_interval=0.01)
    try:
        async with EmbeddedRuntime(store, [agent], FAST) as rt2:
            r = await rt2.orchestrator.wait(root, 10)  # not the 60 s deadline
        assert r.status == "completed" and r.outputs["a"] == {"text": "A"}
        log = await run_log(store, root)
        timed_out = log.of(ev.TaskTimedOut, a)[0]
        # it died with the process, not through the agent's fault (``hostloss``)
        assert (timed_out.attempt, timed_out.reason) == (1, "host_lost")
        assert log.of(ev.TaskRetryScheduled, a)[0].reason.startswith("host_lost")
        assert [d.attempt for d in log.of(ev.TaskDispatched, a)] == [1, 2]
        assert [c.attempt for c in CARDS["slow"]] == [1, 2]
        starts = [e.data for e in await store.read_all(0, 10_000) if e.type.startswith("orch")]
        assert len(starts) == 2 and starts[0].resumed == []
        assert starts[1].resumed == [root] and starts[1].lost_attempts == [f"{a}#1"]
    finally:
        await store.close()


async def test_who_ran_each_attempt_and_each_redelivery_is_recorded(store: Any) -> None:
    bus = InProcessBus()
    orch = Orchestrator(store, bus, FAST)
    await orch.start()
    try:
        await orch.register(make_agent("a").card())  # no worker: the test answers for it
        root = await orch.submit(plan(task("t", timeout_s=60)))
        t = tid(root, "t")
        await wait_for(store, is_(ev.TaskDispatched, t))
        one = {"replica_id": "r1", "host": "h1", "pid": 11}
        two = {"replica_id": "r2", "host": "h2", "pid": 22}
        await bus.reply(Started(task_id=t, attempt=1, agent_id="a", **one))
        await wait_for(store, is_(ev.TaskStarted, t))
        # r1 died holding it; the transport gave the card to r2 (its second delivery)
        await bus.reply(Started(task_id=t, attempt=1, agent_id="a", delivery=2, **two))
        await wait_for(store, is_(ev.TaskRedelivered, t))
        await bus.reply(
            ResultCard(
                task_id=t,
                attempt=1,
                agent_id="a",
                status="completed",
                output={"text": "t"},
                delivery=2,
                **two,
            )
        )
        r = await orch.wait(root, 10)
        assert r.status == "completed"
        log = await run_log(store, root)
        tags = ["created", "dispatched", "started", "redelivered", "result_submitted", "completed"]
        assert log.tags(t) == tags
        started = log.of(ev.TaskStarted, t)[0]
        assert (started.replica_id, started.host, started.pid, started.delivery) == (
            "r1",
            "h1",
            11,
            1,
        )
        again = log.of(ev.TaskRedelivered, t)[0]
        assert (again.attempt, again.delivery, again.replica_id, again.pid) == (1, 2, "r2", 22)
        result = log.of(ev.TaskResultSubmitted, t)[0]
        assert (result.replica_id, result.delivery) == ("r2", 2)
    finally:
        await orch.stop()
        await bus.close()


async def test_a_refused_announcement_is_recorded_once_not_on_every_renewal(store: Any) -> None:
    """Closed registration: an ungranted agent renews its lease every lease/3; the refusal
    is one reply.refused, not one per renewal."""
    bus = InProcessBus()
    orch = Orchestrator(store, bus, FAST, agents=[Y.card()])  # only y is granted
    await orch.start()
    worker = AgentWorker(bus, X, lease_s=0.15)
    try:
        await worker.start()
        await wait_for(store, is_(ev.ReplyRefused, "agent-x"))
        await asyncio.sleep(0.5)  # several renewals
        refused = [e for e in await store.read_stream("agent-x") if e.type == "reply.refused.v1"]
        assert len(refused) == 1 and "not granted" in refused[0].data.reason
        assert "x" not in orch.state.agents
    finally:
        await worker.stop(announce=False)
        await orch.stop()
        await bus.close()


async def test_a_reply_from_a_replica_confirms_its_agent_like_a_renewal(db_path: Path) -> None:
    """After a restart an agent's Started or result (it is working on a card from before)
    proves it alive: it is selected again without waiting for its next announcement."""
    await _registered_by_an_earlier_process(db_path, X)
    store = await SqliteEventStore.open(db_path, poll_interval=0.01)
    bus = InProcessBus()
    orch = Orchestrator(store, bus, FAST, lease_s=30)
    await orch.start()
    try:
        assert not orch.leases.live("x", time.time())  # unconfirmed
        await bus.reply(Started(task_id="gone", attempt=1, agent_id="x", replica_id="r9"))
        for _ in range(200):
            if orch.leases.live("x", time.time()):
                break
            await asyncio.sleep(0.01)
        assert orch.leases.live("x", time.time())
        root = await orch.submit(plan(task("a", goal=GOAL, timeout_s=0.5, max_attempts=1)))
        await wait_for(store, is_(ev.TaskDispatched, tid(root, "a")))
        log = await run_log(store, root)
        assert [d.agent_id for d in log.of(ev.TaskDispatched)] == ["x"]
    finally:
        await orch.stop()
        await bus.close()
        await store.close()


def test_the_clock_sleeps_until_the_soonest_lease_can_lapse() -> None:
    # Leases.next_lapse is what the orchestrator's clock sleeps until (with wakeups
    # and the sweep): a pinned agent never lapses, a replica's lease and a grace do
    leases = Leases(default_lease_s=10.0)
    assert leases.next_lapse() == math.inf
    leases.pin("mine", 100.0)
    assert leases.next_lapse() == math.inf
    leases.renew("far", "r1", 30.0, 100.0)
    leases.renew("far", "r2", 5.0, 100.0)  # the agent lapses with its last replica
    assert leases.next_lapse() == 130.0
    leases.unconfirm("logged", 8.0, 100.0)
    assert leases.next_lapse() == 108.0
    leases.forget("logged")
    assert leases.next_lapse() == 130.0


async def test_a_new_wakeup_wakes_a_sleeping_clock() -> None:
    """A backoff due sooner than the clock's sleep is noticed at its time, not the sweep's."""
    orch = Orchestrator(MemoryEventStore(), InProcessBus(), FAST)
    orch.clock.due = time.time() + 60
    orch.state._wake(time.time() + 0.05, "root")
    assert orch.clock._event.is_set()
    orch.clock._event.clear()
    orch.state._wake(time.time() + 120, "root")  # later than the sleep: no need
    assert not orch.clock._event.is_set()


async def test_with_no_run_open_the_clock_sleeps_until_a_run_opens() -> None:
    """No open run, no wakeup, no lease that can lapse: nothing can come due, so the
    clock sleeps (it swept every second with nothing open); a run opening wakes it."""
    orch = Orchestrator(MemoryEventStore(), InProcessBus(), FAST)
    assert orch.clock.delay(time.monotonic()) == math.inf
    orch.clock.due = math.inf
    orch.clock.run_opened()
    assert orch.clock._event.is_set()
    orch.state.open["root"] = None  # type: ignore[assignment]
    assert orch.clock.delay(time.monotonic()) <= FAST.sweep_s


async def test_the_last_run_ending_puts_the_clock_to_sleep_at_once() -> None:
    """Once the last open run ends, the clock sleeps until something can come due (here
    nothing: the runtime's agents are pinned), at once rather than after the sweep that
    run had set: an idle process woke a sweep after its work for nothing. The deadlines
    the run's tasks left behind are not slept until either."""
    store = MemoryEventStore()
    slow_sweep = dataclasses.replace(FAST, sweep_s=60.0)
    async with EmbeddedRuntime(store, [X], slow_sweep) as rt:
        clock = rt.orchestrator.clock
        tasks = [task(n, goal=GOAL, timeout_s=30.0) for n in ("a", "b")]
        r = await rt.run(plan(*tasks), timeout=10)
        assert r.status == "completed"
        deadline = time.monotonic() + 2.0  # (the sweep is a minute away, the deadlines 30 s)
        while clock.due != math.inf and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        assert clock.due == math.inf
        assert not rt.orchestrator.state.wakeups


async def test_a_lease_given_while_the_clock_sleeps_wakes_it() -> None:
    """With nothing open the clock may sleep for good; an agent's lease (or a grace)
    that ends sooner wakes it, so a dead agent is still deregistered when its lease ends."""
    orch = Orchestrator(MemoryEventStore(), InProcessBus(), FAST)
    orch.clock.due = math.inf
    orch.leases.renew("remote", "r1", 10.0, time.time())
    assert orch.clock._event.is_set()
    orch.clock._event.clear()
    orch.clock.due = time.time() + 5
    orch.leases.renew("remote", "r1", 10.0, time.time())  # ends after the sleep: no need
    assert not orch.clock._event.is_set()
    orch.leases.unconfirm("logged", 1.0, time.time())  # a grace that ends sooner
    assert orch.clock._event.is_set()
