"""The orchestrator's statistics keep no row for a task not dispatched yet (issue 34, RSS per
waiting run), and count the same as the projection's fold over every event."""

from __future__ import annotations

from typing import Any

from orchkit import ev

from cardbus.bus.orchestrator.runstate import RunState
from cardbus.eventstore import NewEvent
from cardbus.eventstore.envelope import Envelope
from cardbus.projections.agent_stats import AgentStatsFold

ROOT = "r1"


class Log:
    def __init__(self) -> None:
        self.envs: list[Envelope] = []
        self.versions: dict[str, int] = {}

    def add(self, stream: str, data: Any, at: float) -> None:
        version = self.versions[stream] = self.versions.get(stream, 0) + 1
        new = NewEvent(data=data, correlation_id=ROOT, recorded_at=at)
        self.envs.append(
            Envelope(
                event_id=new.event_id,
                stream=stream,
                version=version,
                position=len(self.envs) + 1,
                recorded_at=at,
                correlation_id=ROOT,
                data=data,
            )
        )


def _log() -> Log:
    log = Log()
    tasks = ["waits", "done", "rejected", "late", "timed"]
    log.add(ROOT, ev.RunStarted(goal="g", plan_id="p", task_ids=[f"t-{t}" for t in tasks]), 1.0)
    for t in tasks:
        log.add(f"t-{t}", ev.TaskCreated(root_id=ROOT, capability=f"cap-{t}"), 1.0)
    # t-waits is never dispatched: a waiting run's later step
    log.add("t-done", ev.TaskDispatched(attempt=1, agent_id="a", deadline=99.0), 2.0)
    log.add("t-done", ev.TaskResultSubmitted(attempt=1, agent_id="a", status="completed"), 3.5)
    log.add("t-done", ev.TaskCompleted(attempt=1, agent_id="a"), 3.5)
    log.add("t-rejected", ev.TaskDispatched(attempt=1, agent_id="a", deadline=99.0), 2.0)
    log.add("t-rejected", ev.TaskRejected(attempt=1, agent_id="a", reason="busy"), 2.5)
    log.add("t-rejected", ev.TaskDispatched(attempt=2, agent_id="b", deadline=99.0), 3.0)
    log.add("t-rejected", ev.TaskResultSubmitted(attempt=2, agent_id="b", status="completed"), 4.0)
    log.add("t-rejected", ev.TaskCompleted(attempt=2, agent_id="b"), 4.0)
    # a result after the task finished: the fold dropped the task's row, so not counted
    log.add("t-rejected", ev.TaskResultSubmitted(attempt=2, agent_id="b", status="completed"), 5.0)
    # t-late: a result and a rejection with no dispatch seen (the row is made for them too)
    log.add("t-late", ev.TaskRejected(attempt=1, agent_id="b", reason="busy"), 2.0)
    log.add("t-late", ev.TaskResultSubmitted(attempt=1, agent_id="b", status="completed"), 2.0)
    log.add("t-timed", ev.TaskDispatched(attempt=1, agent_id="a", deadline=5.0), 2.0)
    log.add("t-timed", ev.TaskTimedOut(attempt=1, agent_id="a", deadline=5.0), 6.0)
    log.add("t-timed", ev.TaskRetryScheduled(attempt=2, delay_s=0.0, reason="timeout"), 6.0)
    log.add("t-timed", ev.TaskDispatched(attempt=2, agent_id="b", deadline=99.0), 7.0)
    return log


def test_a_task_not_dispatched_has_no_statistics_row_and_the_numbers_are_the_same() -> None:
    log = _log()
    state = RunState(retain_finished=10)  # bounded, as the orchestrator's
    old_way = AgentStatsFold(latency_window=1000, forget_finished=True)  # a row per task
    exact = AgentStatsFold()
    rows_after_creation = None
    for env in log.envs:
        assert state.apply(env)
        old_way.apply(env)
        exact.apply(env)
        if env.position == 6:  # the run and its five tasks created, nothing dispatched
            rows_after_creation = dict(state._stats.model["proj_agent_ctx"].data)
    assert len(state.anomalies) == 3  # the odd events on purpose: folded by the statistics
    assert rows_after_creation == {}  # old_way: one row per task from its creation
    assert len(old_way.model["proj_agent_ctx"].data) == 3  # waits, late, timed (open)
    # open tasks that had an event past their creation only: late and timed
    assert set(state._stats.model["proj_agent_ctx"].data) == {("t-late",), ("t-timed",)}
    assert state._stats.all() == old_way.all()
    for stat in exact.all():  # the exact fold counts the result after the end too
        bounded = state._stats.get(stat.agent_id, stat.capability)
        late_result = int(stat.agent_id == "b" and stat.capability == "cap-rejected")
        assert bounded.results == stat.results - late_result
        assert (bounded.successes, bounded.failures, bounded.timeouts, bounded.rejections) == (
            stat.successes,
            stat.failures,
            stat.timeouts,
            stat.rejections,
        )
        assert bounded.p50_s == stat.p50_s
