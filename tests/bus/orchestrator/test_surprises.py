"""No silent surprises: a plan id names one plan body, the loop guard counts what one step
decides, and recorded failure reasons reach selection."""

from __future__ import annotations

import asyncio
import time

import pytest
from orchkit import (
    CARDS,
    FAST,
    TableEmbedder,
    ev,
    make_agent,
    plan,
    run_log,
    task,
)

from cardbus.bus.orchestrator.memory import MemoryKeeper
from cardbus.bus.orchestrator.selection import rank
from cardbus.eventstore.errors import InvalidPlan, PlanConflict
from cardbus.projections.loops import LoopCounter


async def test_a_plan_id_reused_with_another_body_is_refused(make_runtime, store):
    rt = await make_runtime([make_agent("echo")])
    first = await rt.run(plan(task("a", text="one"), plan_id="weekly"))
    assert first.status == "completed"
    before = await store.last_position()
    with pytest.raises(PlanConflict) as refused:
        await rt.orch.submit(plan(task("a", text="edited"), plan_id="weekly"))
    assert isinstance(refused.value, InvalidPlan)  # caught where a bad plan is
    text = str(refused.value)
    assert "'weekly'" in text and first.root_id in text and "new plan_id" in text
    assert refused.value.plan_id == "weekly" and refused.value.root_id == first.root_id
    assert await store.last_position() == before  # nothing written
    # the same body (built anew, defaults spelt out or not) resumes the same run
    again = plan(task("a", text="one", fanout=1), plan_id="weekly")
    assert await rt.orch.submit(again) == first.root_id
    submitted = [e.data for e in await store.read_stream("plan-weekly")]
    assert len(submitted) == 1 and len(submitted[0].plan_digest) == 64


async def test_a_restarted_orchestrator_refuses_the_edited_plan_too(make_runtime, store):
    rt = await make_runtime([make_agent("echo")])
    await rt.run(plan(task("a", text="one"), plan_id="p"))
    await rt.stop()
    rt2 = await make_runtime([make_agent("echo")])
    with pytest.raises(PlanConflict):
        await rt2.orch.submit(plan(task("a", text="two"), plan_id="p"))


async def test_identical_tasks_decided_in_one_step_count_for_the_loop_guard(make_runtime, store):
    rt = await make_runtime([make_agent("echo")])
    n = FAST.loop_threshold + 1
    r = await rt.run(plan(*(task(f"t{i}", text="the same") for i in range(n))))
    assert r.status == "halted" and r.reason == "loop_detected"
    log = await run_log(store, r.root_id)
    assert f"on {n} tasks" in log.first(ev.RunHalted).data.detail
    assert not log.of(ev.TaskDispatched)  # none of them ran: they were decided together
    assert [x.reason for x in log.of(ev.TaskHalted)] == ["loop_detected"] * n
    assert "echo" not in CARDS
    # below the threshold the same tasks run, and the loops projection sees each
    r2 = await rt.run(plan(*(task(f"t{i}", text="the same") for i in range(n - 1))))
    assert r2.status == "completed"
    counter = LoopCounter()
    for env in (await run_log(store, r2.root_id)).envs:
        counter.apply(env)
    assert list(counter.hashes(r2.root_id).values()) == [n - 1]


async def test_an_agent_that_timed_out_recently_ranks_lower(make_runtime, store):
    async def hang(t, i, c):  # type: ignore[no-untyped-def]
        await asyncio.sleep(3)

    # "slowpoke" is the better match by similarity; "steady" the fallback
    agents = [make_agent("slowpoke", handler=hang), make_agent("steady")]
    embedder = TableEmbedder({"slowpoke": 0.9, "steady": 0.55})
    rt = await make_runtime(agents, embedder=embedder)
    failed = await rt.run(plan(task("a", timeout_s=0.3, max_attempts=1)))
    assert failed.status == "failed"
    # the memory keeper records the failure reason (what EmbeddedRuntime does after a run)
    written = await MemoryKeeper(store).settle(failed.root_id)
    assert any(w.data.kind == "failure" and "timeout" in w.data.value["reason"] for w in written)
    # the same state without the failure weight prefers the better match: it is the penalty
    state = rt.orch.state
    for _ in range(500):  # the orchestrator follows the log: the memory record comes in
        if state.failures:
            break
        await asyncio.sleep(0.01)
    args = (state.agents.values(), "echo", "test goal", {"text": "b"}, {}, 5.0)
    blind = rank(*args, stats=state, embedder=embedder)
    assert blind[0].agent_id == "slowpoke"
    penalised = rank(
        *args,
        stats=state,
        embedder=embedder,
        penalty=lambda a: state.failure_penalty(a, "echo", time.time(), 3600.0),
    )
    assert penalised[0].agent_id == "steady"
    r = await rt.run(plan(task("b")))
    assert r.status == "completed"
    dispatched = (await run_log(store, r.root_id)).first(ev.TaskDispatched).data
    assert dispatched.agent_id == "steady"
    by_id = {c.agent_id: c for c in dispatched.candidates}
    assert by_id["slowpoke"].recent_failures == pytest.approx(1.0, abs=0.01)
    assert by_id["steady"].recent_failures == 0.0
    assert by_id["slowpoke"].similarity > by_id["steady"].similarity
