"""Child runs: a plan task's child spec is checked with the plan (a clear ``InvalidPlan``),
and a child's lineage rides on its ``run.started`` through a real SQLite log."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import msgspec
import pytest
from lifecycle_log import Writer

from cardbus.bus.orchestrator.children import ChildSpec, check_child, lineage_of
from cardbus.bus.orchestrator.plan import as_plan, validate_plan
from cardbus.eventstore import events as ev
from cardbus.eventstore.errors import InvalidPlan
from cardbus.eventstore.sqlite import SqliteEventStore
from cardbus.projections import ProjectionRunner, Runs
from cardbus.projections.replay import replay
from cardbus.projections.traces import task_span_id, trace_spans

SUB_PLAN: dict[str, Any] = {
    "goal": "research the market",
    "tasks": [{"id": "search", "capability": "search"}],
}


def _plan(child: dict[str, Any]) -> dict[str, Any]:
    return {"goal": "lead", "tasks": [{"id": "dept", "capability": "research", "child": child}]}


@pytest.mark.parametrize(
    ("child", "words"),
    [
        ({}, "exactly one of 'plan' or 'goal' (got neither)"),
        ({"goal": "g", "plan": SUB_PLAN}, "exactly one of 'plan' or 'goal' (got both)"),
        ({"goal": "g", "parent_close": "linger"}, "parent_close must be one of"),
        ({"goal": "  "}, "child goal is empty"),
        (
            {"plan": {"goal": "x", "tasks": [{"id": "a", "capability": "c", "deps": ["zz"]}]}},
            "child plan: task 'a' depends on unknown task 'zz'",
        ),
    ],
)
def test_a_bad_child_spec_is_refused_naming_the_task(child: dict[str, Any], words: str) -> None:
    with pytest.raises(InvalidPlan) as caught:
        validate_plan(as_plan(_plan(child)))
    assert "task 'dept'" in str(caught.value) and words in str(caught.value)


def test_a_child_run_task_is_not_fanned_out() -> None:
    plan = _plan({"goal": "g"})
    plan["tasks"][0]["fanout"] = 2
    with pytest.raises(InvalidPlan, match="task 'dept': a child-run task runs one child"):
        validate_plan(as_plan(plan))


def test_a_misspelt_child_field_is_refused() -> None:
    with pytest.raises(InvalidPlan, match="parent_clos"):
        as_plan(_plan({"goal": "g", "parent_clos": "abandon"}))


def test_a_sound_child_is_accepted_with_its_plan() -> None:
    for child in ({"goal": "find three sources"}, {"plan": SUB_PLAN, "parent_close": "abandon"}):
        check_child("dept", as_plan(_plan(child)).tasks[0].child or ChildSpec())
        validate_plan(as_plan(_plan(child)))


def test_a_child_plan_needs_its_agents_when_the_plan_is_checked_against_them() -> None:
    from cardbus.agents.cards import AgentCard, CapabilitySpec

    cards = [AgentCard(agent_id="s", name="s", capabilities=[CapabilitySpec(name="search")])]
    validate_plan(as_plan(_plan({"plan": SUB_PLAN})), cards)  # the label 'research' is none's
    with pytest.raises(InvalidPlan, match="child plan: task 'x': no registered agent offers"):
        other = {"goal": "g", "tasks": [{"id": "x", "capability": "translate"}]}
        validate_plan(as_plan(_plan({"plan": other})), cards)
    with pytest.raises(InvalidPlan, match="child plan: a plan without tasks needs a planner"):
        validate_plan(as_plan(_plan({"goal": "find three sources"})), cards)


async def test_lineage_rides_on_the_childs_run_started(tmp_path: Path) -> None:
    spec = ChildSpec(goal="find three sources", parent_close="request_cancel")
    async with await SqliteEventStore.open(tmp_path / "log.db") as store:
        w = Writer(store, "child-root")
        await w.emit(
            "child-root",
            ev.RunStarted(goal="g", plan_id="p", **lineage_of("parent-root", "dept", 2, spec)),
        )
        await Writer(store, "plain-root").emit("plain-root", ev.RunStarted(goal="g", plan_id="q"))
        child = (await store.read_stream("child-root"))[0].data
        plain = (await store.read_stream("plain-root"))[0].data
    assert isinstance(child, ev.RunStarted) and isinstance(plain, ev.RunStarted)
    assert (child.parent_root, child.parent_task, child.parent_attempt, child.parent_close) == (
        "parent-root",
        "dept",
        2,
        "request_cancel",
    )
    assert (plain.parent_root, plain.parent_task, plain.parent_attempt) == (None, None, None)


async def test_replay_of_a_child_names_the_parent_task_that_started_it(tmp_path: Path) -> None:
    spec = ChildSpec(goal="find three sources", parent_close="abandon")
    async with await SqliteEventStore.open(tmp_path / "log.db") as store:
        await Writer(store, "child-root").emit(
            "child-root",
            ev.RunStarted(goal="g", plan_id="p", **lineage_of("parent-root", "dept", 1, spec)),
        )
        timeline = await replay(store, "child-root")
    details = [s.detail for s in timeline.run if s.type.startswith("run.started")]
    assert details == [
        "goal: g (child of parent-root, task dept attempt 1; on parent close: abandon)"
    ]


async def test_the_exported_trace_of_a_parent_and_its_child_is_one_tree(tmp_path: Path) -> None:
    spec = ChildSpec(goal="find three sources")
    async with await SqliteEventStore.open(tmp_path / "log.db") as store:
        parent = Writer(store, "parent-root")
        await parent.emit("parent-root", ev.RunStarted(goal="lead", plan_id="p"))
        await parent.emit("dept", ev.TaskCreated(root_id="parent-root", capability="research"))
        child = Writer(store, "child-root")
        await child.emit(
            "child-root",
            ev.RunStarted(goal="g", plan_id="c", **lineage_of("parent-root", "dept", 1, spec)),
        )
        await child.emit("search", ev.TaskCreated(root_id="child-root", capability="search"))
        spans = trace_spans(await store.read_all())
    assert len({s.trace_id for s in spans}) == 1  # one trace, the parent's
    by_id = {s.span_id: s for s in spans}
    tops = [s for s in spans if s.parent_span_id is None]
    assert [s.attributes["cardbus.root_id"] for s in tops] == ["parent-root"]
    child_run = next(s for s in spans if s.attributes.get("cardbus.root_id") == "child-root")
    assert child_run.parent_span_id == task_span_id("dept")
    assert all(s.parent_span_id is None or s.parent_span_id in by_id for s in spans)


async def test_runs_lists_a_child_with_the_run_and_task_that_started_it(tmp_path: Path) -> None:
    spec = ChildSpec(goal="find three sources")
    async with await SqliteEventStore.open(tmp_path / "log.db") as store:
        await Writer(store, "parent-root").emit(
            "parent-root", ev.RunStarted(goal="lead", plan_id="p")
        )
        await Writer(store, "child-root").emit(
            "child-root",
            ev.RunStarted(goal="g", plan_id="c", **lineage_of("parent-root", "dept", 1, spec)),
        )
        with ProjectionRunner.open(store, str(tmp_path / "proj.db"), [Runs()]) as runner:
            await runner.catch_up()
            rows = {r["root_id"]: r for r in Runs().list(runner.conn)}
    assert (rows["child-root"]["parent_root"], rows["child-root"]["parent_task"]) == (
        "parent-root",
        "dept",
    )
    assert (rows["parent-root"]["parent_root"], rows["parent-root"]["parent_task"]) == (None, None)


def _env(position: int, root: str, stream: str, version: int, data: ev.Event) -> Any:
    from cardbus.eventstore.envelope import Envelope

    return Envelope(
        position=position,
        event_id=f"e{position}",
        stream=stream,
        version=version,
        correlation_id=root,
        recorded_at=float(position),
        data=data,
    )


def test_a_child_whose_parent_has_not_recorded_it_yet_is_not_closed() -> None:
    """The child's run.started is stored, its parent task's task.child_started not yet (a
    crash between two appends on NATS): the child waits for it, it is no orphan; once
    the parent task ends without it, its parent_close applies."""
    from cardbus.bus.orchestrator.decisions import Decider
    from cardbus.bus.orchestrator.policy import Policy
    from cardbus.bus.orchestrator.runstate import RunState

    spec = ChildSpec(goal="g")
    state = RunState()
    for env in [
        _env(1, "p", "p", 1, ev.RunStarted(goal="lead", plan_id="p", task_ids=["dept"])),
        _env(2, "p", "dept", 1, ev.TaskCreated(root_id="p", capability="research")),
        _env(
            3,
            "c",
            "c",
            1,
            ev.RunStarted(
                goal="g", plan_id="c", task_ids=["x"], **lineage_of("p", "dept", 1, spec)
            ),
        ),
        _env(4, "c", "x", 1, ev.TaskCreated(root_id="c", capability="search")),
    ]:
        state.apply(env)
    d = Decider(state, Policy(), now=10.0, dispatching=False)
    d.advance(state.runs["c"])
    assert not any(isinstance(e, ev.TaskCancelled) for e in d.d.events.get("x", []))
    state.apply(
        _env(5, "p", "dept", 2, ev.TaskCancelled(reason="cancelled_by_user", whole_run=True))
    )
    d = Decider(state, Policy(), now=11.0, dispatching=False)
    d.advance(state.runs["c"])
    (cancel,) = d.d.events["x"]
    assert isinstance(cancel, ev.TaskCancelled) and cancel.reason == "parent_closed"
    assert cancel.note == "parent task dept cancelled; parent_close terminate"


def test_a_child_retired_from_memory_still_settles_its_parent_task() -> None:
    """A state that keeps no finished run (``retain_finished=0``; or a snapshot, which
    keeps open runs only): the child is dropped as it ends, and its parent task, which
    kept how it ended (``TaskView.child_end``), completes with the child's outputs."""
    from cardbus.bus.orchestrator.decisions import Decider
    from cardbus.bus.orchestrator.policy import Policy
    from cardbus.bus.orchestrator.runstate import RunState

    spec = ChildSpec(goal="g")
    state = RunState(retain_finished=0)
    lineage = lineage_of("p", "dept", 1, spec)
    for env in [
        _env(1, "p", "p", 1, ev.RunStarted(goal="lead", plan_id="p", task_ids=["dept"])),
        _env(2, "p", "dept", 1, ev.TaskCreated(root_id="p", capability="research")),
        _env(3, "c", "x", 1, ev.TaskCreated(root_id="c", capability="search")),
        _env(4, "c", "c", 1, ev.RunStarted(goal="g", plan_id="c", task_ids=["x"], **lineage)),
        _env(5, "p", "dept", 2, ev.ChildRunStarted(attempt=1, child_root="c", deadline=99.0)),
        _env(6, "c", "c", 2, ev.RunCompleted(outputs={"x": {"found": 3}})),
    ]:
        state.apply(env)
    assert "c" not in state.runs  # retired as it ended
    assert state.tasks["dept"].child_end == ("completed", {"x": {"found": 3}}, "")
    d = Decider(state, Policy(), now=10.0)
    d.advance(state.runs["p"])
    (done,) = d.d.events["dept"]
    assert isinstance(done, ev.TaskCompleted) and done.output == {"x": {"found": 3}}


def test_a_parent_halted_in_the_step_that_starts_its_child_starts_none() -> None:
    """The step decides ``dept``'s child run, then the next task's dispatch halts the run
    (a loop, here at once: ``loop_threshold`` 0): the child's creation is taken back with
    the rest, so no orphan is written only to be closed."""
    from cardbus.agents.cards import AgentCard, CapabilitySpec
    from cardbus.bus.orchestrator.decisions import Decider
    from cardbus.bus.orchestrator.policy import Policy
    from cardbus.bus.orchestrator.runstate import RunState

    card = AgentCard(agent_id="a", name="a", capabilities=[CapabilitySpec(name="search")])
    child = msgspec.to_builtins(ChildSpec(plan=SUB_PLAN))
    state = RunState()
    for env in [
        _env(
            1, "a", "agent-a", 1, ev.AgentRegistered(agent_id="a", card=msgspec.to_builtins(card))
        ),
        _env(2, "p", "p", 1, ev.RunStarted(goal="lead", plan_id="p", task_ids=["dept", "t"])),
        _env(3, "p", "dept", 1, ev.TaskCreated(root_id="p", capability="research", child=child)),
        _env(4, "p", "t", 1, ev.TaskCreated(root_id="p", capability="search", inputs={"q": 1})),
    ]:
        state.apply(env)
    d = Decider(state, Policy(loop_threshold=0), now=10.0)
    d.advance(state.runs["p"])
    assert any(isinstance(e, ev.RunHalted) for e in d.d.events["p"])
    assert not [
        s for s, es in d.d.events.items() if isinstance(es[0], (ev.RunStarted, ev.TaskCreated))
    ]
    assert [type(e) for e in d.d.events["dept"]] == [ev.TaskHalted]
