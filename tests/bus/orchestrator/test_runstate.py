"""RunState folds the same state whatever order a run's creating appends were stored in."""

from __future__ import annotations

import contextlib
import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cardbus.bus.orchestrator.runstate import RunState
from cardbus.eventstore import Envelope, MemoryEventStore, NewEvent, TaskState
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


# -- RunState.tentatively: a run folded for one decision, then forgotten ---------


def _draft(stream: str, data: ev.Event, root: str) -> Envelope:
    return Envelope(
        event_id="", stream=stream, version=1, recorded_at=0.0, correlation_id=root, data=data
    )


def _drafts(root: str, deps: list[list[int]], claim: bool) -> list[Envelope]:
    ids = [f"t{i}-{root}" for i in range(len(deps))]
    out = [_draft(root, ev.RunStarted(goal="g", plan_id=f"p-{root}", task_ids=ids), root)]
    if claim:
        claimed = ev.PlanSubmitted(plan_id=f"p-{root}", root_id=root, plan_digest="d")
        out.insert(0, _draft(f"plan-{root}", claimed, root))
    for i, d in enumerate(deps):
        created = ev.TaskCreated(
            root_id=root, capability="echo", plan_id=f"t{i}", deps=[ids[j] for j in d]
        )
        out.append(_draft(ids[i], created, root))
    return out


def _fingerprint(state: RunState) -> str:
    runs = {r: (v.tasks, v.names, v.finished) for r, v in state.runs.items()}
    tasks = {t: (v.state, v.attempt, v.assigned) for t, v in state.tasks.items()}
    return repr(
        (
            state.versions,
            runs,
            list(state.open),
            tasks,
            state.plans,
            state.plan_digests,
            state._plan_streams,
            state.position,
            state.wakeups,
            state._stats.model["proj_agent_ctx"].data,
        )
    )


async def _state_with_a_run() -> RunState:
    store = MemoryEventStore()
    state = RunState()
    for stream, data in CREATES[:3]:
        for env in await store.append(stream, [NewEvent(data=data, correlation_id="root")], 0):
            state.apply(env)
    return state


@settings(max_examples=60, deadline=None)
@given(
    deps=st.lists(st.lists(st.integers(0, 5), max_size=3), min_size=1, max_size=6),
    claim=st.booleans(),
    fail=st.booleans(),
)
async def test_a_tentative_run_is_folded_then_forgotten(
    deps: list[list[int]], claim: bool, fail: bool
) -> None:
    state = await _state_with_a_run()
    deps = [sorted({j for j in d if j < i}) for i, d in enumerate(deps)]  # earlier tasks only
    drafts = _drafts("new", deps, claim)
    before = _fingerprint(state)
    with contextlib.suppress(RuntimeError), state.tentatively(drafts):
        run = state.open["new"]
        assert run.tasks == [f"t{i}-new" for i in range(len(deps))]
        assert all(state.tasks[t].state is TaskState.PENDING for t in run.tasks)
        assert state.runs["root"].tasks == ["a", "b"]  # the run already there: untouched
        if fail:
            raise RuntimeError("a decision that blew up")
    assert _fingerprint(state) == before


async def test_only_a_new_streams_creation_is_folded_tentatively() -> None:
    state = await _state_with_a_run()
    before = _fingerprint(state)
    known = _drafts("root", [[]], claim=False)  # "root" is a stream the state has
    dispatched = [_draft("t", ev.TaskDispatched(attempt=1, agent_id="a", deadline=1.0), "r")]
    other_root = [_draft("t", ev.TaskCreated(root_id="root", capability="echo"), "root")]
    twice = _drafts("new", [[]], claim=False) * 2
    for drafts in (known, dispatched, other_root, twice):
        with pytest.raises(ValueError), state.tentatively(drafts):
            pass
    assert _fingerprint(state) == before
