"""Child runs, run by the orchestrator (issue 32 item 4): a plan task runs a sub-plan as a
run of its own on the same log; the parent's cancel and deadline reach the child; the
child's end settles the parent task.

Real parts: the orchestrator, the in-process bus and agent workers on a SQLite file.
Nothing waits on a clock but the deadline test, whose deadline is the thing tested.
"""

from __future__ import annotations

import asyncio
from typing import Any

import msgspec
import pytest
from orchkit import CARDS, Runtime, TextOut, ev, is_, make_agent, run_log, tid, wait_for

from cardbus.bus.orchestrator import Plan, PlanTask
from cardbus.bus.orchestrator.cancel import cancel_run
from cardbus.bus.orchestrator.child_runs import child_root_id
from cardbus.bus.orchestrator.children import ChildSpec


def _lead(child: dict[str, Any], **kw: Any) -> Plan:
    """A lead's plan: ``brief`` (echo), then ``dept`` (a child run reading the brief),
    then ``report`` (echo of the department's findings)."""
    return Plan(
        goal="lead",
        tasks=[
            PlanTask(id="brief", capability="echo", inputs={"text": "tides"}),
            PlanTask(
                id="dept",
                capability="department",
                deps=["brief"],
                inputs={"topic": {"$dep": "brief", "path": "text"}},
                child=msgspec.convert(child, ChildSpec),
                timeout_s=kw.pop("timeout_s", 30.0),
            ),
            PlanTask(
                id="report",
                capability="echo",
                deps=["dept"],
                inputs={"text": {"$dep": "dept", "path": "find.text"}},
            ),
        ],
        **kw,
    )


def _research(capability: str = "echo") -> dict[str, Any]:
    return {
        "plan": {
            "goal": "research",
            "tasks": [
                {"id": "find", "capability": capability, "inputs": {"text": {"$parent": "topic"}}}
            ],
        }
    }


async def _child_of(store: Any, parent_task: str, attempt: int = 1) -> str:
    started = await wait_for(store, is_(ev.ChildRunStarted, parent_task))
    assert started.data.attempt == attempt
    return str(started.data.child_root)


async def test_a_child_run_completes_and_its_outputs_feed_the_parent(make_runtime, store):
    rt: Runtime = await make_runtime([make_agent("echo", "echo")])
    result = await rt.run(_lead(_research()))
    assert result.status == "completed", result.detail
    root = result.root_id
    dept = tid(root, "dept")
    child_root = child_root_id(dept, 1)
    # the department's output is its child run's outputs, by its plan task ids
    assert result.outputs["dept"] == {"find": {"text": "tides"}}
    assert result.outputs["report"] == {"text": "tides"}
    log = await run_log(store, root)
    assert log.tags(dept) == ["created", "child_started", "completed"]
    child = await run_log(store, child_root)
    (started,) = child.of(ev.RunStarted, child_root)
    assert (started.parent_root, started.parent_task, started.parent_attempt) == (root, dept, 1)
    assert child.of(ev.RunCompleted, child_root)[0].outputs == {"find": {"text": "tides"}}
    # the child's task read the parent task's input through $parent
    assert [c.inputs for c in CARDS["echo"] if c.task_id == tid(child_root, "find")] == [
        {"text": "tides"}
    ]
    # the parent's child_started was written after (never before) the child's run.started
    parent_started = log.first(ev.ChildRunStarted, dept)
    assert child.first(ev.RunStarted, child_root).position < parent_started.position


async def test_cancelling_the_parent_cancels_the_child(make_runtime, store):
    gate = asyncio.Event()
    running = asyncio.Event()

    async def _waits(card, inputs, ctx):  # type: ignore[no-untyped-def]
        running.set()
        await gate.wait()
        return TextOut(text="late")

    rt: Runtime = await make_runtime(
        [make_agent("echo", "echo"), make_agent("slow", "slow", _waits)]
    )
    root = await rt.orch.submit(_lead(_research("slow")))
    child_root = await _child_of(store, tid(root, "dept"))
    await asyncio.wait_for(running.wait(), 10)  # the child's task is in its handler
    assert await cancel_run(store, root, by="ops", reason="cancelled_by_user") == [
        tid(root, "dept"),
        tid(root, "report"),
    ]
    parent = await rt.orch.wait(root, timeout=10)
    child = await rt.orch.wait(child_root, timeout=10)
    gate.set()
    assert parent.status == "cancelled"
    assert child.status == "cancelled", child.detail
    log = await run_log(store, child_root)
    (cancel,) = log.of(ev.TaskCancelled, tid(child_root, "find"))
    assert cancel.reason == "parent_closed" and cancel.whole_run
    assert f"parent task {tid(root, 'dept')}" in cancel.note and "terminate" in cancel.note
    # the handler still running was told to stop (a late result is ignored, not recorded)
    assert not log.of(ev.TaskCompleted)


async def test_abandon_leaves_the_child_running_after_the_parent_is_cancelled(make_runtime, store):
    gate = asyncio.Event()

    async def _waits(card, inputs, ctx):  # type: ignore[no-untyped-def]
        await gate.wait()
        return TextOut(text="done anyway")

    rt: Runtime = await make_runtime(
        [make_agent("echo", "echo"), make_agent("slow", "slow", _waits)]
    )
    root = await rt.orch.submit(_lead({**_research("slow"), "parent_close": "abandon"}))
    child_root = await _child_of(store, tid(root, "dept"))
    await wait_for(store, is_(ev.TaskDispatched, tid(child_root, "find")))
    await cancel_run(store, root, by="ops")
    assert (await rt.orch.wait(root, timeout=10)).status == "cancelled"
    gate.set()
    child = await rt.orch.wait(child_root, timeout=10)
    assert child.status == "completed" and child.outputs == {"find": {"text": "done anyway"}}


async def test_the_parent_tasks_deadline_closes_the_child_and_the_attempt_is_retried(
    make_runtime, store
):
    gate = asyncio.Event()
    calls: list[str] = []

    async def _first_hangs(card, inputs, ctx):  # type: ignore[no-untyped-def]
        calls.append(card.task_id)
        if len(calls) == 1:
            await gate.wait()
        return TextOut(text=f"try {len(calls)}")

    rt: Runtime = await make_runtime(
        [make_agent("echo", "echo"), make_agent("slow", "slow", _first_hangs)]
    )
    result = await rt.run(_lead(_research("slow"), timeout_s=0.5), timeout=20)
    gate.set()
    assert result.status == "completed", result.detail
    dept = tid(result.root_id, "dept")
    first, second = child_root_id(dept, 1), child_root_id(dept, 2)
    log = await run_log(store, result.root_id)
    assert log.tags(dept) == [
        "created",
        "child_started",
        "timed_out",
        "retry_scheduled",
        "child_started",
        "completed",
    ]
    assert result.outputs["dept"] == {"find": {"text": "try 2"}}
    assert (await rt.orch.wait(first, timeout=10)).status == "cancelled"  # closed: terminate
    assert (await rt.orch.wait(second, timeout=10)).status == "completed"


async def test_a_failed_child_fails_the_parent_task_attempt(make_runtime, store):
    def _fails(card, inputs, ctx):  # type: ignore[no-untyped-def]
        raise RuntimeError("no sources found")

    rt: Runtime = await make_runtime([make_agent("echo", "echo"), make_agent("bad", "bad", _fails)])
    lead = _lead(_research("bad"))
    lead = Plan(
        goal=lead.goal,
        tasks=[
            lead.tasks[0],
            PlanTask(**{**_fields(lead.tasks[1]), "max_attempts": 1}),
            lead.tasks[2],
        ],
    )
    result = await rt.run(lead, timeout=20)
    assert result.status == "failed"
    dept = tid(result.root_id, "dept")
    log = await run_log(store, result.root_id)
    (failed,) = log.of(ev.TaskFailed, dept)
    assert failed.reason == "child_run_failed"
    assert child_root_id(dept, 1) in failed.error and "find" in failed.error


def _fields(t: PlanTask) -> dict[str, Any]:
    return {f: getattr(t, f) for f in t.__struct_fields__}


@pytest.mark.parametrize("policy", ["terminate", "request_cancel"])
async def test_request_cancel_lets_the_attempt_in_flight_finish(make_runtime, store, policy):
    gate = asyncio.Event()

    async def _waits(card, inputs, ctx):  # type: ignore[no-untyped-def]
        await gate.wait()
        return TextOut(text="finished")

    rt: Runtime = await make_runtime(
        [make_agent("echo", "echo"), make_agent("slow", "slow", _waits)]
    )
    sub = {
        "plan": {
            "goal": "research",
            "tasks": [
                {"id": "find", "capability": "slow", "inputs": {"text": "x"}},
                {"id": "after", "capability": "echo", "deps": ["find"], "inputs": {"text": "y"}},
            ],
        },
        "parent_close": policy,
    }
    root = await rt.orch.submit(_lead(sub))
    child_root = await _child_of(store, tid(root, "dept"))
    await wait_for(store, is_(ev.TaskStarted, tid(child_root, "find")))
    await cancel_run(store, root, by="ops")
    after = await wait_for(store, is_(ev.TaskCancelled, tid(child_root, "after")))
    assert after.data.reason == "parent_closed"
    gate.set()
    child = await rt.orch.wait(child_root, timeout=10)
    assert child.status == "cancelled"
    log = await run_log(store, child_root)
    find = tid(child_root, "find")
    if policy == "terminate":  # cancelled at once; its late result is recorded, ignored
        assert "cancelled" in log.tags(find) and "completed" not in log.tags(find)
    else:  # the attempt in flight finished; nothing after it ran
        assert log.tags(find)[-1] == "completed"
    assert not log.of(ev.TaskDispatched, tid(child_root, "after"))  # never ran


def _run_lead(db: Any) -> str:
    """A completed lead run with its department's child run, on a SQLite file."""
    from cardbus.eventstore.sqlite import SqliteEventStore

    async def go() -> str:
        async with await SqliteEventStore.open(db, poll_interval=0.01) as store:
            rt = await Runtime(store, [make_agent("echo", "echo")]).start()
            try:
                result = await rt.run(_lead(_research()))
            finally:
                await rt.stop()
            assert result.status == "completed", result.detail
            return result.root_id

    return asyncio.run(go())


def test_replay_of_the_parent_shows_the_childs_tasks_beneath_the_task_that_started_it(
    tmp_path: Any,
) -> None:
    from click.testing import CliRunner

    from cardbus.tools.cli import cli

    db = tmp_path / "log.db"
    root = _run_lead(db)
    dept = tid(root, "dept")
    child_root = child_root_id(dept, 1)
    out = CliRunner().invoke(cli, ["replay", root, "--db", str(db)], terminal_width=400)
    assert out.exit_code == 0, out.output
    lines = out.output.splitlines()
    at = next(i for i, line in enumerate(lines) if f"department {dept}" in line)
    assert "attempts 1" in lines[at]
    below = lines[at + 1 : next(i for i, ln in enumerate(lines) if f"report-{root[-12:]}" in ln)]
    # the child's run events among the task's steps, its task a node beneath the task
    assert any(f"child run {child_root}" in line for line in below)
    assert any("run.started" in line and f"child of {root}, task {dept}" in line for line in below)
    assert any(line.startswith("│   └── echo find-") for line in below)

    async def walk() -> list[tuple[int, str]]:
        from cardbus.eventstore.sqlite import SqliteEventStore
        from cardbus.projections.replay import replay

        async with await SqliteEventStore.open(db) as store:
            return [(d, n.task_id) for d, n in (await replay(store, root)).walk()]

    assert (1, tid(child_root, "find")) in asyncio.run(walk())
    assert (0, dept) in asyncio.run(walk())


def test_the_exported_trace_of_the_parent_is_one_tree_with_the_child_under_its_task(
    tmp_path: Any,
) -> None:
    from cardbus.eventstore.sqlite import SqliteEventStore
    from cardbus.projections.traces import task_span_id
    from cardbus.tools.cmd_export import collect_spans

    db = tmp_path / "log.db"
    root = _run_lead(db)
    dept = tid(root, "dept")
    child_root = child_root_id(dept, 1)

    async def spans() -> list[Any]:
        async with await SqliteEventStore.open(db) as store:
            return await collect_spans(store, root)  # what `cardbus export <root>` sends

    found = asyncio.run(spans())
    by_id = {s.span_id: s for s in found}
    assert len({s.trace_id for s in found}) == 1  # one trace
    tops = [s for s in found if s.parent_span_id is None]
    assert len(tops) == 1 and tops[0].attributes["cardbus.root_id"] == root  # one root span
    assert all(s.parent_span_id is None or s.parent_span_id in by_id for s in found)
    child_run = next(
        s
        for s in found
        if s.attributes.get("cardbus.root_id") == child_root
        and s.parent_span_id == task_span_id(dept)
    )
    find = next(s for s in found if s.span_id == task_span_id(tid(child_root, "find")))

    def ancestors(span: Any) -> list[int]:
        out = []
        while span.parent_span_id is not None:
            out.append(span.parent_span_id)
            span = by_id[span.parent_span_id]
        return out

    # the child's task span descends from the child's run span, under the parent's task
    assert child_run.span_id in ancestors(find) and task_span_id(dept) in ancestors(find)


def test_runs_lists_the_child_beneath_its_parent_with_the_trees_tokens(tmp_path: Any) -> None:
    import json

    from click.testing import CliRunner

    from cardbus.tools.cli import cli

    db = tmp_path / "log.db"
    root = _run_lead(db)
    child_root = child_root_id(tid(root, "dept"), 1)
    out = CliRunner().invoke(cli, ["runs", "--db", str(db)], terminal_width=400)
    assert out.exit_code == 0, out.output
    lines = out.output.splitlines()
    parent_at = lines.index(root)  # each run a record: its root, then its fields indented
    after_parent = [line for line in lines[parent_at + 1 :] if not line.startswith(" ")]
    assert after_parent[0] == f"└ {child_root}"  # the child right beneath its parent
    rows = json.loads(
        CliRunner().invoke(cli, ["runs", "--db", str(db), "--json"], terminal_width=400).output
    )
    by_root = {r["root_id"]: r for r in rows}
    assert by_root[child_root]["parent_root"] == root
    assert by_root[root]["tree_tokens"] == by_root[root]["tokens"] + by_root[child_root]["tokens"]


@pytest.mark.parametrize("how", ["fork", "rerun"])
async def test_a_fork_or_rerun_of_the_parent_reuses_its_completed_child(make_runtime, store, how):
    from cardbus.bus.orchestrator.forks import check_agents, write_run
    from cardbus.eventstore import new_id
    from cardbus.projections.fork import plan_fork
    from cardbus.projections.rerun import plan_rerun

    rt: Runtime = await make_runtime([make_agent("echo", "echo")])
    first = await rt.run(_lead(_research()))
    assert first.status == "completed", first.detail
    events = await store.read_correlation(first.root_id)
    if how == "fork":  # at the run's last event: every completed task is reused
        made: Any = plan_fork(events, events[-1].event_id, new_id())
    else:  # offline: every task runs again from the journal, but a completed child's
        made = plan_rerun(events, new_id())
    check_agents(made.streams, list(rt.orch.state.agents.values()))
    await write_run(store, made.streams, made.root_id, events[-1].event_id, "test")
    again = await rt.orch.wait(made.root_id, timeout=10)
    assert again.status == "completed", again.detail
    assert again.outputs["dept"] == first.outputs["dept"]
    log = await run_log(store, made.root_id)
    dept = tid(made.root_id, "dept")
    assert not log.of(ev.ChildRunStarted)  # no new child run: the completed one is reused
    assert log.of(ev.TaskCompleted, dept)[0].reused_from is not None
    children = [
        e
        for e in await store.read_all()
        if isinstance(e.data, ev.RunStarted) and e.data.parent_root
    ]
    assert len(children) == 1  # the first run's child, alone


def test_a_sub_goal_is_planned_by_the_childs_planner(tmp_path: Any) -> None:
    """A child given a goal alone: its own planning task splits it (the demo's rule
    planner), and the parent task gets the planned tasks' outputs."""
    from cardbus.agents.demo import DEMO_AGENTS
    from cardbus.bus.runtime.embedded import EmbeddedRuntime
    from cardbus.eventstore.sqlite import SqliteEventStore

    lead = {
        "goal": "lead",
        "tasks": [
            {
                "id": "dept",
                "capability": "department",
                "timeout_s": 60,
                "inputs": {"audience": "students"},
                "child": {"goal": "Write a short report on ocean tides"},
            }
        ],
    }

    async def go() -> tuple[Any, Any, Any]:
        async with (
            await SqliteEventStore.open(tmp_path / "log.db", poll_interval=0.01) as store,
            EmbeddedRuntime(store, DEMO_AGENTS) as rt,
        ):
            root = await rt.orchestrator.submit(lead)
            parent = await rt.orchestrator.wait(root, timeout=60)
            child_root = child_root_id(f"dept-{root[-12:]}", 1)
            child = await rt.orchestrator.wait(child_root, timeout=60)
            return parent, child, await store.read_correlation(child_root)

    parent, child, events = asyncio.run(go())
    assert child.status == "completed", child.detail
    assert parent.status == "completed", parent.detail
    started = next(e.data for e in events if isinstance(e.data, ev.RunStarted))
    assert started.planning is not None and "ocean tides" in started.goal
    assert '"audience":"students"' in started.goal  # the parent task's inputs, after the words
    assert any(isinstance(e.data, ev.PlanAccepted) for e in events)
    assert parent.outputs["dept"] == child.outputs and child.outputs


async def test_a_restart_resumes_the_parent_and_its_child_from_the_snapshot(store, db_path):
    """The orchestrator stops (its snapshot saved) while the child waits for approval; a
    new one resumes both from the snapshot and the log: the approval completes the child,
    then the parent."""
    from cardbus.bus.orchestrator import answer_approval

    gated = {
        "plan": {
            "goal": "research",
            "tasks": [
                {
                    "id": "gate",
                    "capability": "echo",
                    "inputs": {"text": "g"},
                    "requires_approval": True,
                },
                {
                    "id": "find",
                    "capability": "echo",
                    "deps": ["gate"],
                    "inputs": {"text": {"$parent": "topic"}},
                },
            ],
        }
    }
    first = await Runtime(store, [make_agent("echo", "echo")]).start()
    root = await first.orch.submit(_lead(gated))
    asked = await wait_for(store, is_(ev.ApprovalRequested))
    await first.stop()
    assert db_path.with_suffix(".db.snap").exists()
    second = await Runtime(store, [make_agent("echo", "echo")]).start()
    try:
        assert second.orch.snapshot_position > 0  # resumed from the snapshot
        child_root = child_root_id(tid(root, "dept"), 1)
        assert second.orch.state.tasks[tid(root, "dept")].child_root == child_root
        await answer_approval(store, asked.stream, True, by="ops")
        result = await second.orch.wait(root, timeout=10)
    finally:
        await second.stop()
    assert result.status == "completed", result.detail
    assert result.outputs["dept"]["find"] == {"text": "tides"}
