"""Optional tasks (issue 26 item 6): a failed optional task leaves its output absent,
its dependents run without it, and the run completes "degraded", named so."""

from __future__ import annotations

import asyncio
from typing import Any

import msgspec
import pytest
from orchkit import (
    CARDS,
    Runtime,
    TextOut,
    ev,
    is_,
    make_agent,
    plan,
    run_log,
    task,
    tid,
    wait_for,
)

from cardbus.bus.orchestrator import answer_approval
from cardbus.bus.orchestrator.cancel import cancel_run
from cardbus.bus.orchestrator.optional import DEPENDENCY_ABSENT
from cardbus.bus.orchestrator.plan import resolve_inputs, validate_plan
from cardbus.eventstore import InvalidPlan, SqliteEventStore
from cardbus.projections import ProjectionRunner
from cardbus.projections.replay import build_timeline
from cardbus.projections.runs import Runs
from cardbus.projections.traces import trace_spans


class Loose(msgspec.Struct, frozen=True):
    """Inputs an agent takes whatever was placed: every field may be missing."""

    text: str = ""
    notes: str | None = None
    sources: list[Any] = []


class NeedsNotes(msgspec.Struct, frozen=True):
    notes: str


def _broken(task_card, inputs, ctx):  # type: ignore[no-untyped-def]
    raise RuntimeError("the search index is down")


def _summary(task_card, inputs, ctx):  # type: ignore[no-untyped-def]
    return TextOut(text=f"{inputs.text}|notes={inputs.notes}|sources={len(inputs.sources)}")


BROKEN = make_agent("broken", "research", _broken)
OK_RESEARCH = make_agent("fine", "research", lambda t, i, c: TextOut(text="facts"))
WRITER = make_agent("writer", "write", _summary, input_type=Loose)
STRICT = make_agent(
    "strict", "strict_write", lambda t, i, c: TextOut(text=i.notes), input_type=NeedsNotes
)


def _research_plan(optional: bool) -> Any:
    inputs = {
        "text": "draft",
        "notes": {"$dep": "research", "path": "text"},
        "sources": [{"$dep": "research", "path": "text"}, "the brief"],
    }
    return plan(
        task("research", "research", max_attempts=2, optional=optional),
        task("write", "write", deps=["research"], inputs=inputs),
    )


async def test_an_optional_tasks_failure_leaves_dependents_to_run_and_the_run_degraded(
    make_runtime, store
):
    rt = await make_runtime([BROKEN, WRITER])
    result = await rt.run(_research_plan(optional=True))
    assert (result.status, result.reason, result.degraded) == (
        "completed",
        "degraded",
        ["research"],
    )
    assert "research: failed" in result.detail and "the search index is down" in result.detail
    # the absent output is left out: the key omitted, the list item dropped
    assert result.outputs == {"write": {"text": "draft|notes=None|sources=1"}}
    card = CARDS["writer"][0]
    research = tid(result.root_id, "research")
    assert card.inputs == {"text": "draft", "sources": ["the brief"]}
    assert card.absent == [research]
    log = await run_log(store, result.root_id)
    assert log.of(ev.TaskFailed, research)[0].attempts == 2  # its retries were spent first
    dispatched = log.of(ev.TaskDispatched, tid(result.root_id, "write"))[0]
    assert dispatched.absent == [research] and dispatched.inputs == card.inputs
    (done,) = log.of(ev.RunCompleted)
    assert done.degraded == ["research"] and "research" not in done.outputs


async def test_the_same_plan_without_optional_fails_the_run(make_runtime, store):
    rt = await make_runtime([BROKEN, WRITER])
    result = await rt.run(_research_plan(optional=False))
    assert (result.status, result.reason, result.degraded) == ("failed", "tasks_not_completed", [])
    assert "writer" not in CARDS  # the dependent never ran: it was cancelled
    log = await run_log(store, result.root_id)
    (cancelled,) = log.of(ev.TaskCancelled, tid(result.root_id, "write"))
    assert cancelled.reason == "dependency_failed"
    assert sorted(log.of(ev.RunFailed)[0].failed_tasks) == sorted(
        tid(result.root_id, n) for n in ("research", "write")
    )


async def test_a_completed_optional_task_is_no_degradation(make_runtime, store):
    rt = await make_runtime([OK_RESEARCH, WRITER])
    result = await rt.run(_research_plan(optional=True))
    assert (result.status, result.reason, result.degraded) == ("completed", "", [])
    assert CARDS["writer"][0].inputs["notes"] == "facts" and CARDS["writer"][0].absent == []


@pytest.mark.parametrize("dependent_optional", [False, True])
async def test_a_dependent_that_requires_the_absent_output_fails_with_a_reason(
    make_runtime, store, dependent_optional
):
    rt = await make_runtime([BROKEN, STRICT])
    result = await rt.run(
        plan(
            task("research", "research", max_attempts=1, optional=True),
            task(
                "write",
                "strict_write",
                deps=["research"],
                inputs={"notes": {"$dep": "research", "path": "text"}},
                optional=dependent_optional,
            ),
        )
    )
    log = await run_log(store, result.root_id)
    (failed,) = log.of(ev.TaskFailed, tid(result.root_id, "write"))
    assert failed.reason == DEPENDENCY_ABSENT
    assert "'research'" in failed.error and "notes" in failed.error  # what is absent, and why
    assert "strict" not in CARDS  # never dispatched
    if dependent_optional:  # both optional: the run did without both
        assert (result.status, result.degraded) == ("completed", ["research", "write"])
    else:
        assert result.status == "failed" and "write: dependency_absent" in result.detail


async def test_a_user_cancel_of_the_run_is_no_degraded_completion(make_runtime, store):
    gate = asyncio.Event()

    async def _waits(task_card, inputs, ctx):  # type: ignore[no-untyped-def]
        await gate.wait()
        return TextOut(text="late")

    slow = make_agent("slow", "slow", _waits)
    rt = await make_runtime([slow, make_agent("echo", "echo")])
    submitted = asyncio.create_task(
        rt.run(plan(task("main", "echo"), task("extra", "slow", optional=True, timeout_s=30)))
    )
    started = await wait_for(store, is_(ev.TaskStarted))
    await wait_for(store, is_(ev.TaskCompleted))  # only the optional task is left running
    assert await cancel_run(store, started.correlation_id, by="test") == [started.stream]
    result = await submitted
    gate.set()
    # the run did not complete: it was cancelled (its own status), not failed or degraded
    assert (result.status, result.reason, result.degraded) == ("cancelled", "cancelled", [])
    assert result.detail == "by test: cancelled_by_user"
    log = await run_log(store, result.root_id)
    assert log.of(ev.TaskCancelled, started.stream)[0].whole_run
    (end,) = log.of(ev.RunFailed)
    assert end.failed_tasks == [started.stream] and (end.cancelled, end.cancelled_by) == (
        True,
        "test",
    )


async def test_a_restart_mid_run_ends_the_same_degraded_way(store, db_path):
    """The orchestrator stops (writing its snapshot) while the dependent waits for
    approval; a new one resumes from the snapshot and the run ends degraded all the same."""
    the_plan = plan(
        task("research", "research", max_attempts=1, optional=True),
        task(
            "write",
            "write",
            deps=["research"],
            inputs={"text": "t", "notes": {"$dep": "research", "path": "text"}},
            requires_approval=True,
        ),
    )
    first = await Runtime(store, [BROKEN, WRITER]).start()
    submitted = asyncio.create_task(first.run(the_plan))
    asked = await wait_for(store, is_(ev.ApprovalRequested))
    await first.stop()
    submitted.cancel()
    assert db_path.with_name(db_path.name + ".snap").exists()
    second = await Runtime(store, [BROKEN, WRITER]).start()
    try:
        assert second.orch.snapshot_position > 0  # it started from the snapshot
        await answer_approval(store, asked.stream, True, by="test")
        result = await second.orch.wait(asked.correlation_id, 10)
    finally:
        await second.stop()
    assert (result.status, result.reason, result.degraded) == (
        "completed",
        "degraded",
        ["research"],
    )
    assert result.outputs == {"write": {"text": "t|notes=None|sources=0"}}
    # a fold of the log from scratch names the same outcome (the runs read model too)
    runner = ProjectionRunner.open(store, ":memory:", [Runs()])
    await runner.catch_up()
    row = Runs().get(runner.conn, result.root_id)
    runner.close()
    assert row is not None and (row["status"], row["reason"], row["degraded"]) == (
        "completed",
        "degraded",
        ["research"],
    )


async def test_replay_names_a_degraded_run(make_runtime, store):
    rt = await make_runtime([BROKEN, WRITER])
    result = await rt.run(_research_plan(optional=True))
    events = await store.read_correlation(result.root_id)
    timeline = build_timeline(events, result.root_id, result.root_id)
    (end,) = [s for s in timeline.run if s.kind == "run.completed"]
    assert end.reason == "degraded: without research"
    assert end.detail is not None and "research: failed" in end.detail
    # the exported trace's run span names it too
    (workflow,) = [s for s in trace_spans(events) if s.name == "invoke_workflow"]
    assert workflow.attributes["cardbus.run.status"] == "completed"
    assert workflow.attributes["cardbus.run.degraded"] == ["research"]


def test_resolve_inputs_leaves_absent_placeholders_out() -> None:
    inputs = {
        "a": {"$dep": "x", "path": "v"},
        "b": [{"$dep": "x"}, {"$dep": "y", "path": "v"}, 3],
        "c": {"deep": {"$dep": "x"}, "kept": {"$dep": "y"}},
        "d": "literal",
    }
    outputs = {"x": None, "y": {"v": 1}}
    assert resolve_inputs(inputs, outputs, {}, frozenset({"x"})) == {
        "b": [1, 3],
        "c": {"kept": {"v": 1}},
        "d": "literal",
    }
    # nothing absent: exactly what it was (a missing path is None, not left out)
    assert resolve_inputs(inputs, outputs, {}) == {
        "a": None,
        "b": [None, 1, 3],
        "c": {"deep": None, "kept": {"v": 1}},
        "d": "literal",
    }
    assert resolve_inputs({"$dep": "x"}, outputs, {}, {"x"}) is None


def test_plan_json_naming_a_bad_optional_is_refused_naming_the_field() -> None:
    from cardbus.bus.orchestrator.plan import decode_plan

    body = b'{"goal": "g", "tasks": [{"id": "a", "capability": "c", "optional": "yes"}]}'
    with pytest.raises(InvalidPlan, match=r"optional"):
        decode_plan(body)
    built = plan(task("a", "echo", optional="yes"))  # built in Python: not type-checked
    with pytest.raises(InvalidPlan, match=r"task 'a': optional must be true or false"):
        validate_plan(built)
    assert decode_plan(body.replace(b'"yes"', b"true")).tasks[0].optional is True


async def test_a_sqlite_file_keeps_the_optional_flag(store: SqliteEventStore, make_runtime):
    rt = await make_runtime([BROKEN, WRITER])
    result = await rt.run(_research_plan(optional=True))
    log = await run_log(store, result.root_id)
    flags = {e.plan_id: e.optional for e in log.of(ev.TaskCreated)}
    assert flags == {"research": True, "write": False}


async def test_a_degraded_run_is_a_completed_a2a_task_saying_degraded(make_runtime, store):
    pytest.importorskip("a2a")
    from a2a.types import TaskState as A2AState

    from cardbus.bus.a2a.fold import TaskFold

    rt = await make_runtime([BROKEN, WRITER])
    degraded = await rt.run(_research_plan(optional=True))
    failed = await rt.run(_research_plan(optional=False))
    states = {}
    for result in (degraded, failed):
        fold = TaskFold(result.root_id)
        for env in await store.read_correlation(result.root_id):
            fold.apply(env)
        task = fold.task()
        states[result.status] = (task.status.state, task.status.message.parts[0].text)
    state, text = states["completed"]
    assert state == A2AState.TASK_STATE_COMPLETED
    assert text.startswith("run completed, degraded: without research (research: failed:")
    assert states["failed"][0] == A2AState.TASK_STATE_FAILED
    assert "degraded" not in states["failed"][1]


async def test_the_diff_of_two_runs_names_the_degraded_one(make_runtime, store, tmp_path):
    from cardbus.projections.diff import diff_runs

    one = plan(task("research", "research", optional=True, max_attempts=1))
    degraded = await (await make_runtime([BROKEN])).run(one)
    other = await SqliteEventStore.open(tmp_path / "other.db", poll_interval=0.01)
    rt = await make_runtime([OK_RESEARCH], store=other)
    try:
        fine = await rt.run(one)
        diff = diff_runs(
            await store.read_correlation(degraded.root_id),
            await other.read_correlation(fine.root_id),
        )
    finally:
        await rt.stop()
        await other.close()
    assert (degraded.reason, fine.reason) == ("degraded", "")
    assert diff.a.status == "completed: degraded (without research)"
    assert diff.b.status == "completed"


def test_a_planner_may_propose_an_optional_task() -> None:
    from cardbus.agents.planning import plan_json_schema
    from cardbus.bus.orchestrator.plan import task_created
    from cardbus.bus.orchestrator.planning import proposal_plan
    from cardbus.bus.orchestrator.retry import RetryPolicy

    schema = plan_json_schema()
    assert schema["$defs"]["ProposedTask"]["properties"]["optional"] == {
        "type": "boolean",
        "default": False,
    }
    proposed = {"tasks": [{"id": "extra", "capability": "c", "optional": True}]}
    (t,) = proposal_plan(proposed, "g").tasks
    assert t.optional is True
    assert task_created(t, "root", {"extra": "extra-1"}, RetryPolicy()).optional is True


async def test_a_denied_optional_task_is_done_without(make_runtime, store):
    rt = await make_runtime([OK_RESEARCH, WRITER])
    the_plan = _research_plan(optional=True)
    gated = msgspec.structs.replace(the_plan.tasks[0], requires_approval=True)
    submitted = asyncio.create_task(
        rt.run(msgspec.structs.replace(the_plan, tasks=[gated, the_plan.tasks[1]]))
    )
    asked = await wait_for(store, is_(ev.ApprovalRequested))
    await answer_approval(store, asked.stream, False, by="test", note="not today")
    result = await submitted
    assert (result.status, result.degraded) == ("completed", ["research"])
    assert result.detail == "research: cancelled: approval_denied (by test: not today)"
    assert "fine" not in CARDS and CARDS["writer"][0].absent == [asked.stream]


def test_cardbus_plan_shows_which_tasks_are_optional() -> None:
    from cardbus.tools.cmd_plan import describe

    shown = describe(_research_plan(optional=True)).splitlines()
    assert shown[0].endswith("research  (optional)")
    assert "optional" not in "\n".join(shown[1:])


async def test_an_optional_task_over_its_budget_is_done_without(make_runtime, store):
    """A cap on a part of the run stops the optional task (budget_exceeded): an absence;
    the run's own cap is spent: the run is halted, never degraded."""
    rt = await make_runtime([OK_RESEARCH, WRITER])
    capped = msgspec.structs.replace(
        _research_plan(optional=True), budgets={"capability:research": ev.BudgetLimit(tokens=0)}
    )
    result = await rt.run(capped)
    assert (result.status, result.degraded) == ("completed", ["research"])
    assert result.detail.startswith("research: failed: budget_exceeded (capability:research")
    assert "fine" not in CARDS and CARDS["writer"][0].absent
    whole = msgspec.structs.replace(_research_plan(optional=True), budget_usd=0.0)
    halted = await rt.run(whole)
    assert (halted.status, halted.degraded) == ("halted", [])
