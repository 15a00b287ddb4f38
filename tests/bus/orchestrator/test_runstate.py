"""RunState folds the same state whatever order a run's creating appends were stored in."""

from __future__ import annotations

import itertools

import pytest

from cardbus.bus.orchestrator.runstate import RunState
from cardbus.eventstore import MemoryEventStore, NewEvent
from cardbus.eventstore import events as ev

CREATES: list[tuple[str, ev.Event]] = [
    ("root", ev.RunStarted(goal="g", plan_id="p", task_ids=["a", "b"])),
    ("a", ev.TaskCreated(root_id="root", capability="echo", plan_id="a")),
    ("b", ev.TaskCreated(root_id="root", capability="echo", deps=["a"], plan_id="b")),
    ("x", ev.TaskCreated(root_id="other", capability="echo", plan_id="a")),
]


@pytest.mark.parametrize("order", list(itertools.permutations(range(len(CREATES)))))
async def test_a_run_and_its_tasks_in_any_order(order: tuple[int, ...]) -> None:
    store = MemoryEventStore()  # append_many promises no order between streams
    for i in order:
        stream, data = CREATES[i]
        await store.append(stream, [NewEvent(data=data, correlation_id="root")], 0)
    state = RunState()
    for env in await store.read_all(0, 100):
        assert state.apply(env)
    run = state.runs["root"]
    assert sorted(run.tasks) == ["a", "b"]  # not "x": another root's task
    assert run.names == {"a": "a", "b": "b"}
    assert state.open == {"root": run}


async def test_wakeups_of_finished_runs_do_not_pile_up() -> None:
    store = MemoryEventStore()
    state = RunState()
    far = 10**10  # deadlines that never come during the test
    for i in range(3000):
        root = f"r{i}"
        for stream, data in (
            (root, ev.RunStarted(goal="g", plan_id=f"p{i}", task_ids=[f"t{i}"])),
            (f"t{i}", ev.TaskCreated(root_id=root, capability="echo", plan_id="t")),
            (f"t{i}", ev.TaskDispatched(attempt=1, agent_id="a", deadline=far)),
            (f"t{i}", ev.TaskCompleted(attempt=1, agent_id="a")),
            (root, ev.RunCompleted(outputs={})),
        ):
            version = await store.stream_version(stream)
            for env in await store.append(
                stream, [NewEvent(data=data, correlation_id=root)], version
            ):
                state.apply(env)
    assert state.open == {}
    assert len(state.wakeups) < 1100  # 3000 runs' deadlines, all of finished runs: dropped
    assert state.due(far + 1) == set()


async def test_an_event_the_fold_cannot_use_is_kept_and_logged(caplog) -> None:  # type: ignore[no-untyped-def]
    store = MemoryEventStore()
    state = RunState()
    data = ev.TaskStarted(attempt=1, agent_id="a")
    for env in await store.append("ghost", [NewEvent(data=data, correlation_id="r")], 0):
        with caplog.at_level("WARNING", logger="cardbus.bus.orchestrator.runstate"):
            assert state.apply(env)
    assert len(state.anomalies) == 1 and "unknown task ghost" in state.anomalies[0]
    assert "unknown task ghost" in caplog.text
