"""A long-lived orchestrator keeps a bounded number of finished runs; the log has the rest."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from interleave import FoldLedger, check_folded_once
from orchkit import FAST, ev, make_agent, plan, run_log, task, tid

from cardbus.agents.cards import ResultCard
from cardbus.eventstore import Envelope, SqliteEventStore
from cardbus.eventstore.errors import PlanConflict
from cardbus.projections.agent_stats import AgentStatsFold


async def test_with_no_finished_run_kept_a_waiter_still_gets_its_result(make_runtime):
    """retain_finished_runs=0 retires a run in the fold that finishes it: whoever waits on
    it is answered from the log, not left waiting."""
    rt = await make_runtime([make_agent("echo")], policy=replace(FAST, retain_finished_runs=0))
    result = await rt.run(plan(task("a", text="x"), task("b", deps=["a"], text="y")), 10)
    assert result.status == "completed"
    assert set(result.outputs) == {"a", "b"}
    assert await rt.orch.caught_up(30)  # retired once the log follower has passed its end
    assert result.root_id not in rt.orch.state.runs  # it was retired, yet answered


async def test_a_run_finished_ahead_of_the_log_follower_is_not_folded_again(
    make_runtime, store: SqliteEventStore
) -> None:
    """A run is retired only once the log follower has passed its end: the follower hands
    on our own appends too, and a run retired before they came back (their versions
    dropped with it) had them folded again as news: the run open again with no tasks,
    each of its tasks' events an anomaly (the agent latency bench at 1,000 runs in
    flight: 9,000 to 13,000 anomalies, its follower 26,000 positions behind). Here the
    follower is held back until both runs ended, then let go."""
    held = asyncio.Event()
    subscribe = store.subscribe

    async def behind(from_position: int = 0) -> AsyncIterator[Envelope]:
        async for env in subscribe(from_position):
            await held.wait()
            yield env

    store.subscribe = behind  # type: ignore[method-assign]
    rt = await make_runtime([make_agent("echo")], policy=replace(FAST, retain_finished_runs=0))
    ledger = FoldLedger()
    ledger.watch(rt.orch.state)
    results = [
        await rt.run(
            plan(task("a", text=f"x{i}"), task("b", deps=["a"], text="y"), plan_id=f"p{i}")
        )
        for i in range(2)
    ]
    assert [r.status for r in results] == ["completed", "completed"]
    held.set()
    assert await rt.orch.caught_up(30)
    state = rt.orch.state
    assert not state.anomalies, list(state.anomalies)[:3]
    assert not state.open and not state.runs and not state.tasks  # retired, not reopened
    log = [e for r in results for e in await store.read_correlation(r.root_id)]
    assert check_folded_once(ledger, log) == []


async def test_finished_runs_past_the_limit_leave_memory_not_the_log(make_runtime, store):
    policy = replace(FAST, retain_finished_runs=3)
    rt = await make_runtime([make_agent("echo")], policy=policy)
    results = [
        await rt.run(
            plan(task("a", text=f"x{i}"), task("b", deps=["a"], text="y"), plan_id=f"p{i}")
        )
        for i in range(8)
    ]
    assert await rt.orch.caught_up(30)  # (runs leave once the log follower has passed their end)
    state = rt.orch.state
    assert [r.status for r in results] == ["completed"] * 8
    kept = {r.root_id for r in results[-3:]}
    assert set(state.runs) == kept  # the oldest five were let go...
    assert {t.created.root_id for t in state.tasks.values()} == kept
    assert not any(r.root_id in v for r in results[:5] for v in state.versions)
    assert set(state.plans) == {"p5", "p6", "p7"}
    # ...but everything about them is still answered from the log
    first = results[0]
    assert await rt.orch.wait(first.root_id, 1) == first
    before = await store.last_position()
    same = plan(task("a", text="x0"), task("b", deps=["a"], text="y"), plan_id="p0")
    assert await rt.orch.submit(same) == first.root_id
    assert await store.last_position() == before  # the same plan id does not run again
    with pytest.raises(PlanConflict, match="p0"):  # nor does another plan under its id
        await rt.orch.submit(plan(task("a", text="x0"), plan_id="p0"))
    # a late answer for a task of a forgotten run is reported, not acted on
    old_task = tid(first.root_id, "a")
    await rt.bus.reply(
        ResultCard(task_id=old_task, attempt=1, agent_id="echo", status="completed", output={})
    )
    await rt.run(plan(task("a", text="later"), plan_id="p-later"))
    assert any(old_task in reason for _, reason in rt.orch.bad_messages)
    assert len((await run_log(store, first.root_id)).of(ev.TaskResultIgnored)) == 0


def test_a_bounded_stats_fold_keeps_the_latest_latencies() -> None:
    from cardbus.eventstore import NewEvent
    from cardbus.eventstore.envelope import Envelope

    def env(stream: str, version: int, data: ev.Event, at: float) -> Envelope:
        new = NewEvent(data=data, correlation_id="r", recorded_at=at)
        return Envelope(
            event_id=new.event_id,
            stream=stream,
            version=version,
            position=0,
            recorded_at=at,
            correlation_id="r",
            data=data,
        )

    fold = AgentStatsFold(latency_window=3, forget_finished=True)
    exact = AgentStatsFold()
    for i in range(10):  # task i takes i seconds from dispatch to result
        t = f"t{i}"
        for f in (fold, exact):
            f.apply(env(t, 1, ev.TaskCreated(root_id="r", capability="c"), 0.0))
            f.apply(env(t, 2, ev.TaskDispatched(attempt=1, agent_id="a"), 100.0))
            f.apply(
                env(
                    t,
                    3,
                    ev.TaskResultSubmitted(attempt=1, agent_id="a", status="completed"),
                    100.0 + i,
                )
            )
            f.apply(env(t, 4, ev.TaskCompleted(attempt=1, agent_id="a"), 100.0 + i))
    assert exact.get("a", "c").p50_s == 4.5  # every sample
    assert fold.get("a", "c").p50_s == 8.0  # the latest three: 7, 8, 9
    assert fold.get("a", "c").runs == exact.get("a", "c").runs == 10
    assert fold.model["proj_agent_ctx"].data == {}  # nothing kept of finished tasks
    assert len(exact.model["proj_agent_ctx"].data) == 10


@settings(max_examples=80, deadline=None)
@given(
    window=st.integers(1, 6),
    latencies=st.lists(st.sampled_from([0.0, 0.5, 1.0, 1.5, 2.0, 7.25]), max_size=30),
)
def test_a_bounded_window_s_percentiles_are_those_of_its_latest_samples(
    window: int, latencies: list[float]
) -> None:
    # repeated values on purpose: the sorted copy must drop exactly the one pushed out
    from cardbus.eventstore.envelope import Envelope
    from cardbus.projections.agent_stats import percentile

    fold = AgentStatsFold(latency_window=window)
    for i, x in enumerate(latencies):
        t = f"t{i}"
        for version, data, at in (
            (1, ev.TaskCreated(root_id="r", capability="c"), 0.0),
            (2, ev.TaskDispatched(attempt=1, agent_id="a"), 100.0),
            (3, ev.TaskResultSubmitted(attempt=1, agent_id="a", status="completed"), 100.0 + x),
        ):
            fold.apply(
                Envelope(
                    event_id=f"{t}-{version}",
                    stream=t,
                    version=version,
                    recorded_at=at,
                    correlation_id="r",
                    data=data,
                )
            )
        latest = latencies[max(0, i + 1 - window) : i + 1]
        expected = (percentile(sorted(latest), 0.5), percentile(sorted(latest), 0.95))
        got = fold.get("a", "c")
        assert (got.p50_s, got.p95_s) == expected
        restored = AgentStatsFold(latency_window=window)  # as a snapshot loads it
        restored.restore_latencies("a", "c", latest)
        got = restored.get("a", "c")
        assert (got.p50_s, got.p95_s) == expected


@settings(max_examples=60, deadline=None)
@given(
    outcomes=st.lists(
        st.tuples(st.sampled_from(["a", "b"]), st.sampled_from(["ok", "failed", "silent"])),
        max_size=20,
    )
)
def test_the_numbers_selection_reads_are_those_of_get(
    outcomes: list[tuple[str, str]],
) -> None:
    """``for_selection`` (read on every dispatch) answers what ``get`` does, for agents with
    outcomes, with results but no outcome yet, and never seen."""
    from cardbus.eventstore.envelope import Envelope

    fold = AgentStatsFold()
    for i, (agent, outcome) in enumerate(outcomes):
        t = f"t{i}"
        events: list[tuple[ev.Event, float]] = [
            (ev.TaskCreated(root_id="r", capability="c"), 0.0),
            (ev.TaskDispatched(attempt=1, agent_id=agent), 10.0),
            (ev.TaskResultSubmitted(attempt=1, agent_id=agent, status="completed"), 10.0 + i),
        ]
        if outcome == "ok":
            events.append((ev.TaskCompleted(attempt=1, agent_id=agent), 10.0 + i))
        elif outcome == "failed":
            events.append((ev.TaskFailed(reason="agent_error"), 10.0 + i))
        for version, (data, at) in enumerate(events, 1):
            fold.apply(
                Envelope(
                    event_id=f"{t}-{version}",
                    stream=t,
                    version=version,
                    recorded_at=at,
                    correlation_id="r",
                    data=data,
                )
            )
    for agent, capability in (("a", "c"), ("b", "c"), ("a", "other"), ("nobody", "c")):
        full = fold.get(agent, capability)
        assert fold.for_selection(agent, capability) == (
            full.runs,
            full.success_rate,
            full.p50_s,
        )
