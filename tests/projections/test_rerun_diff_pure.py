"""``plan_rerun`` and ``diff_runs`` are pure over a run's events (tests/lifecycle_log.py)."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from lifecycle_log import RunIds, write_run

from cardbus.eventstore import MemoryEventStore
from cardbus.eventstore import events as ev
from cardbus.eventstore.errors import ValidationError
from cardbus.projections.diff import diff_runs, request_diff
from cardbus.projections.rerun import plan_rerun


def _run() -> tuple[list, RunIds]:  # type: ignore[type-arg]
    async def go() -> tuple[list, RunIds]:  # type: ignore[type-arg]
        store = MemoryEventStore()
        ids = await write_run(store)
        return await store.read_correlation(ids.root), ids

    return asyncio.run(go())


def test_offline_every_plan_task_runs_again_from_its_origin_strictly() -> None:
    events, ids = _run()
    plan = plan_rerun(events, "new-root-000000000001")
    assert plan.offline and plan.reused == [] and plan.source_root_id == ids.root
    streams = dict(plan.streams)
    [started] = streams["new-root-000000000001"]
    assert isinstance(started, ev.RunStarted)
    assert (started.rerun_of, started.offline, started.forked_from) == (ids.root, True, None)
    for old, new in plan.ids.items():
        [created] = streams[new]
        assert isinstance(created, ev.TaskCreated)
        assert (created.origin, created.replay_strict, created.forked_from) == (old, True, None)
    assert plan_rerun(events, "new-root-000000000001") == plan  # nothing else decides it


def test_live_the_chosen_task_and_its_dependents_run_again_the_rest_reused() -> None:
    events, ids = _run()
    plan = plan_rerun(events, "new-root-000000000002", tasks=[ids.research], model="m2")
    streams = dict(plan.streams)
    new_research = plan.ids[ids.research]
    [created] = streams[new_research]
    assert isinstance(created, ev.TaskCreated)
    assert created.constraints["model"] == "m2" and created.origin is None
    assert new_research in plan.rerun
    # write depends on research: it runs again too, with its own constraints
    [write] = streams[plan.ids[ids.write]]
    assert isinstance(write, ev.TaskCreated) and "model" not in write.constraints
    with pytest.raises(ValidationError, match="not a task of the run"):
        plan_rerun(events, "x", tasks=["nope"])


def test_a_run_diffed_with_itself_does_not_diverge() -> None:
    events, ids = _run()
    d = diff_runs(events, events)
    assert d.first_divergence is None
    assert all(p.differs == [] for p in d.tasks)
    assert d.a.root_id == d.b.root_id == ids.root


def test_a_run_and_a_rerun_that_only_started_diverge_at_its_first_task() -> None:
    events, _ = _run()
    plan = plan_rerun(events, "new-root-000000000003")

    async def written() -> list:  # type: ignore[type-arg]
        from cardbus.eventstore import NewEvent

        store = MemoryEventStore()
        for stream, datas in plan.streams:
            await store.append(
                stream, [NewEvent(data=x, correlation_id=plan.root_id) for x in datas], 0
            )
        return await store.read_correlation(plan.root_id)

    d = diff_runs(events, asyncio.run(written()))
    first = d.first_divergence
    assert first is not None and first.task == d.tasks[0].key
    assert d.b.rerun_of == d.a.root_id and d.b.offline


def test_request_diff_shows_messages_line_by_line() -> None:
    a = {"model": "m", "messages": [{"role": "system", "content": "one\ntwo"}]}
    b = {"model": "m", "messages": [{"role": "system", "content": "one\nthree"}]}
    lines = request_diff(a, b)
    assert "-  two" in lines and "+  three" in lines and lines[0] == "--- recorded"
