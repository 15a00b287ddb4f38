"""``cardbus fork``: a new run reuses the results recorded before the fork point."""

from __future__ import annotations

import asyncio
import json
import re
from pathlib import Path

from click.testing import CliRunner
from lifecycle_log import RunIds

from cardbus.eventstore import SqliteEventStore
from cardbus.eventstore import events as ev
from cardbus.projections.fork import fork_task_id, plan_fork
from cardbus.tools.cli import cli


def invoke(*args: str) -> tuple[int, str, str]:
    r = CliRunner().invoke(cli, list(args), catch_exceptions=False)
    return r.exit_code, r.stdout, r.stderr


async def _events(db: str, root: str) -> list:  # type: ignore[type-arg]
    store = await SqliteEventStore.open(db, create=False)
    try:
        return await store.read_correlation(root)
    finally:
        await store.close()


def test_plan_fork_is_pure_and_renames(run_db: tuple[str, RunIds]) -> None:
    db, ids = run_db
    events = asyncio.run(_events(db, ids.root))
    rejected = next(
        e for e in events if e.stream == ids.write and isinstance(e.data, ev.TaskRejected)
    )
    plan = plan_fork(events, rejected.event_id, "new-root-000000000001")
    assert plan.forked_from == f"{ids.root}@{rejected.event_id}"
    new = {old: plan.ids[old] for old in (ids.research, ids.write, ids.code, ids.loop)}
    assert plan.reused == [new[ids.research]]
    assert plan.rerun == [new[ids.write], new[ids.code], new[ids.loop]]
    assert ids.review not in plan.ids  # subtasks are not copied
    streams = dict(plan.streams)
    [started] = streams["new-root-000000000001"]
    assert isinstance(started, ev.RunStarted) and started.forked_from == plan.forked_from
    assert started.task_ids == list(new.values())
    created, completed = streams[new[ids.research]]
    assert isinstance(created, ev.TaskCreated) and created.root_id == "new-root-000000000001"
    assert created.forked_from == rejected.event_id
    assert isinstance(completed, ev.TaskCompleted) and completed.output == {"facts": ["purr"]}
    research_done = next(
        e for e in events if e.stream == ids.research and isinstance(e.data, ev.TaskCompleted)
    )
    assert completed.reused_from == research_done.event_id
    [write_created] = streams[new[ids.write]]
    assert isinstance(write_created, ev.TaskCreated)
    assert write_created.deps == [new[ids.research]]
    # the same call gives the same plan: nothing but the events decides it
    assert plan_fork(events, rejected.event_id, "new-root-000000000001") == plan
    # by position too
    assert plan_fork(events, str(rejected.position), "new-root-000000000001") == plan


def test_fork_task_ids_keep_the_orchestrator_shape() -> None:
    old_root, new_root = "01a2-aaaaaaaaaaaa", "01a3-bbbbbbbbbbbb"
    assert fork_task_id("draft-aaaaaaaaaaaa", old_root, new_root) == "draft-bbbbbbbbbbbb"
    assert fork_task_id("task-x", old_root, new_root) == "task-x~bbbbbbbbbbbb"


def test_fork_no_run_writes_a_replayable_run(run_db: tuple[str, RunIds]) -> None:
    db, ids = run_db
    events = asyncio.run(_events(db, ids.root))
    at = next(e for e in events if e.stream == ids.code and isinstance(e.data, ev.TaskFailed))
    code, out, _ = invoke("fork", ids.code, "--at", at.event_id, "--db", db, "--no-run", "--json")
    assert code == 0
    data = json.loads(out)
    assert data["forked_from"] == f"{ids.root}@{at.event_id}" and data["status"] is None
    assert len(data["reused"]) == 2 and len(data["rerun"]) == 2  # research, write reused
    code, out, _ = invoke("replay", data["root_id"], "--db", db, "--json")
    t = json.loads(out)
    statuses = {n["task_id"]: n["status"] for n in t["tasks"]}
    assert sorted(statuses.values()) == ["completed", "completed", "pending", "pending"]
    assert "forked from" in t["run"][0]["detail"]
    assert invoke("verify", "--db", db)[0] == 0


def test_fork_errors_are_one_line(run_db: tuple[str, RunIds]) -> None:
    db, ids = run_db
    code, _, err = invoke("fork", ids.write, "--at", "no-such-event", "--db", db, "--no-run")
    assert code == 1 and len(err.strip().splitlines()) == 1 and "no-such-event" in err
    code, _, err = invoke("fork", "no-such-task", "--at", "x", "--db", db, "--no-run")
    assert code == 1 and "no-such-task" in err


def test_fork_the_demo_run_reuses_research(tmp_path: Path) -> None:
    db = str(tmp_path / "demo.db")
    code, out, _ = invoke("demo", "--db", db)
    assert code == 0, out
    root = re.search(r"cardbus replay (\S+)", out)
    assert root is not None
    old_root = root.group(1)
    events = asyncio.run(_events(db, old_root))
    research_done = next(
        e
        for e in events
        if e.stream.startswith("research-") and isinstance(e.data, ev.TaskCompleted)
    )
    code, out, err = invoke("fork", old_root, "--at", research_done.event_id, "--db", db, "--json")
    assert code == 0, err
    data = json.loads(out)
    assert data["status"] == "completed"
    new_root = data["root_id"]
    new_events = asyncio.run(_events(db, new_root))
    [new_research] = [s for s in data["reused"] if s.startswith("research-")]
    kinds = [e.type for e in new_events if e.stream == new_research]
    # reused, never dispatched again
    assert kinds == ["task.created.v1", "task.completed.v1"]
    # the tasks after the fork point ran again on the current agents
    # the demo is planned from a goal: the writing task is the rule planner's "write"
    draft = next(s for s in data["rerun"] if s.startswith("write-"))
    assert any(e.stream == draft and e.type == "task.dispatched.v1" for e in new_events)
    started = next(e for e in new_events if isinstance(e.data, ev.RunStarted))
    assert isinstance(started.data, ev.RunStarted)
    assert started.data.forked_from == f"{old_root}@{research_done.event_id}"
    code, out, _ = invoke("replay", new_root, "--db", db)
    assert "reused from" in out and "revision_requested" in out
