"""Idempotency: a plan id runs once; a duplicate result for a settled attempt is ignored."""

from __future__ import annotations

import asyncio

import msgspec
from orchkit import CARDS, Runtime, TextOut, ev, is_, make_agent, plan, run_log, task, tid, wait_for

from cardbus.agents.cards import ResultCard, Started


async def test_the_same_plan_id_twice_runs_once(make_runtime, store):
    rt = await make_runtime([make_agent("echo")])
    p = plan(task("a"), task("b", deps=["a"]), plan_id="weekly-report")
    r1 = await rt.run(p)
    r2 = await rt.run(p)
    assert r1.root_id == r2.root_id and r2.status == "completed"
    # at the same time, too
    roots = await asyncio.gather(*(rt.orch.submit(p) for _ in range(3)))
    assert set(roots) == {r1.root_id}
    everything = await store.read_all(0, 10_000)
    assert sum(isinstance(e.data, ev.PlanSubmitted) for e in everything) == 1
    assert sum(isinstance(e.data, ev.RunStarted) for e in everything) == 1
    assert sum(isinstance(e.data, ev.TaskCreated) for e in everything) == 2
    assert len(CARDS["echo"]) == 2


async def test_the_same_plan_id_on_a_restarted_orchestrator(store):
    p = plan(task("a"), plan_id="once")
    rt1 = await Runtime(store, [make_agent("echo")]).start()
    r1 = await rt1.run(p)
    await rt1.stop()
    rt2 = await Runtime(store, [make_agent("echo")]).start()
    try:
        before = await store.last_position()
        r2 = await rt2.run(p)
        assert (r2.root_id, r2.status, r2.outputs) == (r1.root_id, "completed", r1.outputs)
        assert await store.last_position() == before
    finally:
        await rt2.stop()


async def test_a_duplicate_result_for_a_settled_attempt_is_ignored(make_runtime, store):
    rt = await make_runtime([make_agent("echo")])
    r = await rt.run(plan(task("t", text="once")))
    t = tid(r.root_id, "t")
    dup = ResultCard(
        task_id=t, attempt=1, agent_id="echo", status="completed", output={"text": "twice"}
    )
    await rt.bus.reply(dup)
    await rt.bus.reply(Started(task_id=t, attempt=1, agent_id="echo"))
    await rt.bus.reply(ResultCard(task_id=t, attempt=7, agent_id="echo", status="failed"))
    for _ in range(100):
        log = await run_log(store, r.root_id)
        if len(log.of(ev.TaskResultIgnored, t)) == 2:
            break
        await asyncio.sleep(0.01)
    ignored = log.of(ev.TaskResultIgnored, t)
    assert [(x.attempt, x.agent_id, x.reason) for x in ignored] == [
        (1, "echo", "duplicate"),
        (7, "echo", "stale_attempt"),
    ]
    assert len(log.of(ev.TaskCompleted, t)) == 1
    assert log.first(ev.TaskCompleted, t).data.output == {"text": "once"}
    assert len(log.of(ev.TaskResultSubmitted, t)) == 1
    assert not log.of(ev.TaskStarted, t)  # a fast answer implies its start: none written


async def test_a_result_from_an_agent_never_dispatched_is_refused(make_runtime, store):
    async def slow(t, i, c):  # type: ignore[no-untyped-def]
        await asyncio.sleep(0.2)
        return TextOut(text="real")

    rt = await make_runtime([make_agent("slow", handler=slow)])
    root = await rt.orch.submit(plan(task("t")))
    t = tid(root, "t")
    await wait_for(store, is_(ev.TaskDispatched, t))
    fake = ResultCard(
        task_id=t, attempt=1, agent_id="impostor", status="completed", output={"text": "fake"}
    )
    await rt.bus.reply(fake)
    r = await rt.orch.wait(root, 5)
    assert r.outputs["t"] == {"text": "real"}
    log = await run_log(store, root)
    assert log.of(ev.TaskResultIgnored, t) == []
    assert [(x.claimed_agent_id, x.kind) for x in log.of(ev.ReplyRefused, t)] == [
        ("impostor", "result")
    ]
    assert [x.agent_id for x in log.of(ev.TaskResultSubmitted, t)] == ["slow"]


async def test_redelivered_card_is_answered_without_running_twice(make_runtime, store):
    rt = await make_runtime([make_agent("echo")])
    r = await rt.run(plan(task("t")))
    card = CARDS["echo"][0]
    # at-least-once delivery: the same card again (a redelivery counts up its delivery)
    await rt.bus.send_task("echo", msgspec.structs.replace(card, delivery=card.delivery + 1))
    t = tid(r.root_id, "t")
    for _ in range(100):
        log = await run_log(store, r.root_id)
        if log.of(ev.TaskResultIgnored, t):
            break
        await asyncio.sleep(0.01)
    assert len(CARDS["echo"]) == 1
    assert [x.reason for x in log.of(ev.TaskResultIgnored, t)] == ["duplicate"]


async def test_a_submit_interrupted_after_claiming_the_plan_id_is_finished_by_the_next(
    make_runtime, store
):
    from cardbus.eventstore import NewEvent, new_id

    root = new_id()  # a submitter died right after writing PlanSubmitted
    claim = ev.PlanSubmitted(plan_id="half", root_id=root)
    await store.append("plan-half", [NewEvent(data=claim, correlation_id=root)], 0)
    rt = await make_runtime([make_agent("echo")])
    p = plan(task("a"), task("b", deps=["a"]), plan_id="half")
    r = await rt.run(p)
    assert r.root_id == root and r.status == "completed"
    everything = await store.read_all(0, 10_000)
    assert sum(isinstance(e.data, ev.PlanSubmitted) for e in everything) == 1
    assert sum(isinstance(e.data, ev.RunStarted) for e in everything) == 1


async def test_the_recorded_reply_delivered_again_writes_nothing(make_runtime, store):
    """At-least-once delivery (a partition's new holder reads what the last one did not
    ack; orchestrators without partitions each read every reply): the very reply the log
    records, delivered again, is no news: no task.result_ignored for it."""
    rt = await make_runtime([make_agent("echo")])
    r = await rt.run(plan(task("t", text="once")))
    t = tid(r.root_id, "t")
    (recorded,) = (await run_log(store, r.root_id)).of(ev.TaskResultSubmitted, t)
    assert recorded.replica_id  # the worker says where it ran
    again = ResultCard(
        task_id=t,
        attempt=recorded.attempt,
        agent_id=recorded.agent_id,
        status=recorded.status,
        output=recorded.output,
        replica_id=recorded.replica_id,
        delivery=recorded.delivery,
    )
    await rt.bus.reply(again)
    # another answer of the attempt (another replica ran it): news, recorded as a
    # duplicate; replies are decided in order, so once it is in, the first was decided
    await rt.bus.reply(msgspec.structs.replace(again, replica_id="another-replica"))
    for _ in range(500):
        log = await run_log(store, r.root_id)
        if log.of(ev.TaskResultIgnored, t):
            break
        await asyncio.sleep(0.01)
    assert [(x.attempt, x.reason) for x in log.of(ev.TaskResultIgnored, t)] == [(1, "duplicate")]
    assert len(log.of(ev.TaskResultSubmitted, t)) == 1
    assert rt.orch.bad_messages == []
