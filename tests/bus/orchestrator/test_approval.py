"""Human approval: a task waits durably, across orchestrator restarts, for an answer."""

from __future__ import annotations

import asyncio

import pytest
from orchkit import CARDS, Runtime, ev, make_agent, plan, run_log, task, tid, wait_for

import cardbus.bus as bus
from cardbus.eventstore import CardbusError, NewEvent, SqliteEventStore, StreamNotFound


async def test_approval_survives_a_restart_and_the_run_completes(db_path):
    agents = [make_agent("echo")]
    store1 = await SqliteEventStore.open(db_path, poll_interval=0.01)
    rt1 = await Runtime(store1, agents).start()
    root = await rt1.orch.submit(
        plan(task("gate", requires_approval=True), task("after", deps=["gate"]))
    )
    gate = tid(root, "gate")
    await wait_for(store1, lambda e: isinstance(e.data, ev.ApprovalRequested))
    await asyncio.sleep(0.05)
    await rt1.stop()
    await store1.close()
    assert "echo" not in CARDS  # nothing ran before the answer

    store2 = await SqliteEventStore.open(db_path, poll_interval=0.01)
    try:
        rt2 = await Runtime(store2, agents).start()
        try:
            await asyncio.sleep(0.1)
            log = await run_log(store2, root)
            assert log.tags(gate) == ["created", "approval_requested"]
            await bus.answer_approval(store2, gate, True, by="alice", note="looks fine")
            r = await rt2.orch.wait(root, 5)
        finally:
            await rt2.stop()
        assert r.status == "completed"
        log = await run_log(store2, root)
        granted = log.first(ev.ApprovalGranted, gate)
        assert (granted.data.by, granted.data.note, granted.actor) == (
            "alice",
            "looks fine",
            "alice",
        )
        assert log.first(ev.TaskDispatched, gate).position > granted.position
        assert len(log.of(ev.ApprovalRequested, gate)) == 1  # not asked again after the restart
        assert [c.task_id for c in CARDS["echo"]] == [gate, tid(root, "after")]
    finally:
        await store2.close()


async def test_deny_cancels_the_task_and_its_dependents(make_runtime, store):
    rt = await make_runtime([make_agent("echo")])
    root = await rt.orch.submit(
        plan(task("gate", requires_approval=True), task("after", deps=["gate"]), task("free"))
    )
    gate = tid(root, "gate")
    await wait_for(store, lambda e: isinstance(e.data, ev.ApprovalRequested))
    await rt.orch.deny(gate, by="bob", note="no")
    r = await rt.orch.wait(root, 5)
    assert r.status == "failed"
    log = await run_log(store, root)
    assert log.tags(gate) == ["created", "approval_requested", "approval_denied"]
    assert log.first(ev.ApprovalDenied, gate).data.by == "bob"
    cancelled = log.first(ev.TaskCancelled, tid(root, "after")).data
    assert cancelled.cause_task_id == gate
    assert log.first(ev.TaskCompleted, tid(root, "free"))  # the rest of the run went on
    assert not log.of(ev.TaskDispatched, gate)


async def test_answering_a_task_that_is_not_waiting_is_refused(make_runtime, store):
    rt = await make_runtime([make_agent("echo")])
    r = await rt.run(plan(task("t")))
    before = await store.last_position()
    with pytest.raises(CardbusError, match="not awaiting approval"):
        await rt.orch.approve(tid(r.root_id, "t"))
    with pytest.raises(StreamNotFound):
        await rt.orch.deny("no-such-task")
    assert await store.last_position() == before


async def test_a_waiter_that_times_out_is_forgotten(make_runtime, store):
    rt = await make_runtime([make_agent("echo")])
    root = await rt.orch.submit(plan(task("gate", requires_approval=True)))
    with pytest.raises(TimeoutError):
        await rt.orch.wait(root, 0.05)
    assert root not in rt.orch._waiters
    await rt.orch.approve(tid(root, "gate"))
    assert (await rt.orch.wait(root, 5)).status == "completed"


async def test_an_approval_racing_another_write_to_the_task_is_written(make_runtime, db_path):
    """The orchestrator writes to the task's stream between the approval's read and its
    append (an attempt's last record): the approval reads that and is written, not refused
    with a conflict."""
    from interleave import Points, instrument

    rt = await make_runtime([make_agent("echo")])
    root = await rt.orch.submit(plan(task("gate", requires_approval=True)))
    gate = tid(root, "gate")
    await wait_for(rt.store, lambda e: isinstance(e.data, ev.ApprovalRequested))
    other = await SqliteEventStore.open(db_path, poll_interval=0.01)
    try:
        raced = ev.TaskResultIgnored(attempt=0, agent_id="late", reason="stale_attempt")

        async def race() -> None:
            version = await rt.store.stream_version(gate)
            await rt.store.append(gate, [NewEvent(data=raced, correlation_id=root)], version)

        points = Points(inject_name="answer_approval>append")
        points.inject = race
        instrument(other, points, ("append",))
        await bus.answer_approval(other, gate, True, by="alice")
        assert points.injected_at == "answer_approval>append"
        r = await rt.orch.wait(root, 10)
    finally:
        await other.close()
    assert r.status == "completed"
    log = await run_log(rt.store, root)
    assert log.tags(gate)[:4] == [
        "created",
        "approval_requested",
        "result_ignored",
        "approval_granted",
    ]
