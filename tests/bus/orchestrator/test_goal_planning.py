"""Goal decomposition: a plan that is a goal alone, planned by an agent offering ``plan``.

A scripted planner answers each planning card with the next proposal of its
script; every test checks the rounds in the log (``plan.proposed``,
``plan.refused``, ``plan.accepted``) and what the planner was shown.
"""

from __future__ import annotations

import asyncio
from typing import Any

import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from orchkit import CARDS, FAST, Runtime, TextOut, ev, make_agent, run_log, tid, wait_for

from cardbus.agents.agent import Agent, Capability, TaskContext
from cardbus.agents.cards import TaskCard
from cardbus.agents.planning import PlanRequest
from cardbus.bus import Plan, Policy
from cardbus.bus.orchestrator import RetryPolicy
from cardbus.eventstore import MemoryEventStore, SqliteEventStore
from cardbus.eventstore.errors import ConfigError, InvalidPlan
from cardbus.projections.replay import replay

#: proposals the scripted planner gives, in order (the last one repeats)
SCRIPT: list[Any] = []


class Proposal(msgspec.Struct):
    """A loose output type: the orchestrator, not the schema, must catch bad plans."""

    tasks: Any = None
    goal: str = ""


class ScriptedPlanner(Agent):
    agent_id = "scripted-planner"
    description = "Plans goals from a script."
    capabilities = [Capability("plan", PlanRequest, dict[str, Any], "plan a goal")]

    async def handle(self, task: TaskCard, inputs: PlanRequest, ctx: TaskContext) -> Any:
        CARDS.setdefault(self.agent_id, []).append(task)
        step = len(CARDS[self.agent_id]) - 1
        return SCRIPT[min(step, len(SCRIPT) - 1)]


def echo_task(id: str, text: str = "x", **kw: Any) -> dict[str, Any]:
    return {"id": id, "capability": "echo", "inputs": {"text": text}, **kw}


def upper(t: TaskCard, i: Any, c: TaskContext) -> TextOut:
    return TextOut(text=i.text.upper())


AGENTS = [ScriptedPlanner, make_agent("echo"), make_agent("upper", "upper", upper)]


@pytest.fixture(autouse=True)
def _script() -> Any:
    SCRIPT.clear()
    yield
    SCRIPT.clear()


def planning_cards() -> list[PlanRequest]:
    return [msgspec.convert(c.inputs, PlanRequest) for c in CARDS.get("scripted-planner", [])]


async def test_a_goal_is_planned_and_run_like_a_hand_written_plan(make_runtime, store) -> None:
    SCRIPT.append(
        {
            "goal": "g",
            "tasks": [
                echo_task("a", "hello"),
                {
                    "id": "b",
                    "capability": "upper",
                    "deps": ["a"],
                    "inputs": {"text": {"$dep": "a", "path": "text"}},
                },
            ],
        }
    )
    rt = await make_runtime(AGENTS)
    r = await rt.run(Plan(goal="shout hello", tasks=[]))
    assert r.status == "completed", r
    assert r.outputs == {"a": {"text": "hello"}, "b": {"text": "HELLO"}}
    log = await run_log(store, r.root_id)
    assert [e.type for e in log.e(stream=r.root_id)] == [
        "run.started.v1",
        "plan.proposed.v1",
        "plan.accepted.v1",
        "run.completed.v1",
    ]
    accepted = log.first(ev.PlanAccepted).data
    assert accepted.task_ids == {"a": tid(r.root_id, "a"), "b": tid(r.root_id, "b")}
    # the acceptance is written before its tasks exist
    accepted_at = log.first(ev.PlanAccepted).position
    assert all(e.position > accepted_at for e in log.e(ev.TaskCreated) if e.data.plan_id)
    # the tasks are created as a hand-written plan's would be
    hand = await rt.run(
        Plan(goal="shout hello", tasks=[msgspec.convert(t, rt_task()) for t in SCRIPT[0]["tasks"]])
    )
    hand_log = await run_log(store, hand.root_id)
    for name in ("a", "b"):
        planned = log.first(ev.TaskCreated, tid(r.root_id, name)).data
        written = hand_log.first(ev.TaskCreated, tid(hand.root_id, name)).data
        assert msgspec.structs.replace(planned, root_id="", deps=[], inputs={}) == (
            msgspec.structs.replace(written, root_id="", deps=[], inputs={})
        )


def rt_task() -> type:
    from cardbus.bus import PlanTask

    return PlanTask


async def test_an_unknown_capability_is_refused_re_proposed_and_replay_shows_both_rounds(
    make_runtime, store
) -> None:
    bad = {"goal": "g", "tasks": [{"id": "a", "capability": "telepathy", "inputs": {"text": "x"}}]}
    good = {"goal": "g", "tasks": [echo_task("a")]}
    SCRIPT.extend([bad, good])
    rt = await make_runtime(AGENTS)
    r = await rt.run(Plan(goal="read minds", tasks=[]))
    assert r.status == "completed", r
    log = await run_log(store, r.root_id)
    refused = log.first(ev.PlanRefused).data
    assert refused.round == 1
    assert refused.errors == ["task 'a': no registered agent offers capability 'telepathy'"]
    # the second card: the errors and the refused proposal are its only extra inputs
    first, second = planning_cards()
    assert first.errors == [] and first.previous is None
    assert second.errors == refused.errors
    assert msgspec.to_builtins(second.previous) == bad
    assert msgspec.structs.replace(second, errors=[], previous=None) == first
    timeline = await replay(store, r.root_id)
    assert [(p.round, p.outcome) for p in timeline.planning] == [(1, "refused"), (2, "accepted")]
    assert timeline.planning[0].errors == refused.errors
    assert timeline.planning[1].tasks == ["a (echo)"]
    kinds = [s.kind for s in timeline.run]
    assert kinds == [
        "plan.submitted",
        "run.started",
        "plan.proposed",
        "plan.refused",
        "plan.proposed",
        "plan.accepted",
        "run.completed",
    ]
    refusal_step = timeline.run[3]
    assert refusal_step.reason is not None and "telepathy" in refusal_step.reason
    planners = [n.task_id for n in timeline.tasks if n.capability == "plan"]
    assert planners == [f"{r.root_id}~plan1", f"{r.root_id}~plan2"]


async def test_refused_max_plan_rounds_times_the_run_fails_with_plan_invalid(
    make_runtime, store
) -> None:
    SCRIPT.append({"goal": "g", "tasks": [{"id": "a", "capability": "nope"}]})
    rt = await make_runtime(AGENTS)
    r = await rt.run(Plan(goal="g", tasks=[], max_plan_rounds=2))
    assert (r.status, r.reason) == ("failed", "plan_invalid")
    assert "capability 'nope'" in r.detail
    log = await run_log(store, r.root_id)
    assert len(log.of(ev.PlanRefused)) == 2
    assert not log.of(ev.PlanAccepted)
    assert len(CARDS["scripted-planner"]) == 2
    failed = log.first(ev.RunFailed).data
    assert failed.reason == "plan_invalid" and "nope" in failed.detail


async def test_the_policy_default_of_three_rounds(make_runtime, store) -> None:
    SCRIPT.append({"goal": "g", "tasks": []})
    rt = await make_runtime(AGENTS)
    r = await rt.run(Plan(goal="g", tasks=[]))
    assert (r.status, r.reason) == ("failed", "plan_invalid")
    assert len(CARDS["scripted-planner"]) == 3
    assert "the plan has no tasks" in r.detail


@pytest.mark.parametrize("bad", [0, -1, 1.5, True])
def test_max_plan_rounds_is_checked_on_the_policy(bad: Any) -> None:
    with pytest.raises(ConfigError, match="max_plan_rounds"):
        Policy(max_plan_rounds=bad)


async def test_the_planner_sees_the_goal_the_session_let_through_and_the_cards(
    make_runtime, store
) -> None:
    SCRIPT.append({"goal": "g", "tasks": [echo_task("a")]})
    rt = await make_runtime(AGENTS)
    r = await rt.run(
        Plan(
            goal="echo things",
            tasks=[],
            session={"user": "ann", "secret": "s3cr3t"},
            session_fields=["user"],
            limits={"capabilities": ["echo"], "max_tasks": 4},  # type: ignore[arg-type]
        )
    )
    assert r.status == "completed", r
    (card,) = CARDS["scripted-planner"]
    assert set(card.inputs) == {
        "goal",
        "session",
        "capabilities",
        "limits",
        "errors",
        "previous",
    }
    assert "s3cr3t" not in msgspec.json.encode(card.inputs).decode()
    (request,) = planning_cards()
    assert request.goal == "echo things"
    assert request.session == {"user": "ann"}
    assert {c.name for c in request.capabilities} == {"echo", "upper"}  # not "plan"
    echo = next(c for c in request.capabilities if c.name == "echo")
    assert echo.input_schema == rt.workers[1].agent.card().capabilities[0].input_schema
    assert request.limits.capabilities == ["echo"] and request.limits.max_tasks == 4


@pytest.mark.parametrize(
    ("limits", "proposal", "error"),
    [
        ({"capabilities": ["echo"]}, [echo_task("a"), {"id": "b", "capability": "upper",
          "inputs": {"text": "y"}}], "capability 'upper' is not allowed"),
        ({"max_tasks": 1}, [echo_task("a"), echo_task("b")], "at most 1 are allowed"),
        ({"final_capability": "upper"}, [echo_task("a")], "must end with capability 'upper'"),
        ({"final_output": "Summary"}, [echo_task("a")], "output is 'Summary'"),
    ],
)  # fmt: skip
async def test_the_limits_refuse_a_proposal(make_runtime, store, limits, proposal, error) -> None:
    SCRIPT.append({"goal": "g", "tasks": proposal})
    rt = await make_runtime(AGENTS)
    r = await rt.run(Plan(goal="g", tasks=[], limits=limits, max_plan_rounds=1))
    assert (r.status, r.reason) == ("failed", "plan_invalid")
    log = await run_log(store, r.root_id)
    assert any(error in e for e in log.first(ev.PlanRefused).data.errors), log.of(ev.PlanRefused)


BAD_PROPOSALS = {
    "a cycle": [
        {"id": "a", "capability": "echo", "deps": ["b"], "inputs": {"text": "x"}},
        {"id": "b", "capability": "echo", "deps": ["a"], "inputs": {"text": "x"}},
    ],
    "an undeclared dep": [
        echo_task("a"),
        {"id": "b", "capability": "echo", "inputs": {"text": {"$dep": "a", "path": "text"}}},
    ],
    "missing inputs": [{"id": "a", "capability": "echo"}],
    "wrong input type": [{"id": "a", "capability": "echo", "inputs": {"text": 5}}],
    "10,000 tasks": [echo_task(f"t{i}") for i in range(10_000)],
    "unknown fields": [{"id": "a", "capability": "echo", "inputs": {"text": "x"}, "evil": 1}],
    "not a list": "research then write",
    "a bad id": [echo_task("a.b")],
    "duplicate ids": [echo_task("a"), echo_task("a")],
}


@pytest.mark.parametrize("name", sorted(BAD_PROPOSALS))
async def test_bad_proposals_become_refusals_with_a_reason(make_runtime, store, name) -> None:
    SCRIPT.extend([{"goal": "g", "tasks": BAD_PROPOSALS[name]}, {"tasks": [echo_task("ok")]}])
    rt = await make_runtime(AGENTS)
    r = await rt.run(Plan(goal="g", tasks=[]))
    assert r.status == "completed", r
    assert r.outputs == {"ok": {"text": "x"}}
    log = await run_log(store, r.root_id)
    (refused,) = log.of(ev.PlanRefused)
    assert refused.errors and all(isinstance(e, str) and e for e in refused.errors)


async def test_a_planner_answer_that_is_not_an_object_fails_the_planning_task(
    make_runtime, store
) -> None:
    SCRIPT.append(["not", "an", "object"])
    rt = await make_runtime(AGENTS)
    r = await rt.run(Plan(goal="g", tasks=[]))
    assert (r.status, r.reason) == ("failed", "planning_failed")
    assert "output_schema_mismatch" in r.detail


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=5),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=5), inner, max_size=4)
    ),
    max_leaves=20,
)
proposals = st.dictionaries(
    st.sampled_from(["goal", "tasks", "x"]),
    json_values
    | st.lists(
        st.fixed_dictionaries(
            {"id": st.sampled_from(["a", "b", "", "c d"]),
             "capability": st.sampled_from(["echo", "upper", "nope", "plan"])},
            optional={"deps": st.lists(st.sampled_from(["a", "b", "z"]), max_size=3),
                      "inputs": st.dictionaries(st.sampled_from(["text", "y"]), json_values,
                                                max_size=2),
                      "timeout_s": st.floats(allow_nan=True, allow_infinity=True)},
        ),
        max_size=4,
    ),
)  # fmt: skip


@settings(
    max_examples=25,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(proposal=proposals)
async def test_any_proposal_ends_the_run_with_a_verdict_in_the_log(proposal: Any) -> None:
    SCRIPT[:] = [proposal]
    CARDS.clear()
    store = MemoryEventStore()
    rt = await Runtime(store, AGENTS).start()
    try:
        r = await rt.run(Plan(goal="g", tasks=[], max_plan_rounds=1), timeout=10)
    finally:
        await rt.stop()
    log = await run_log(store, r.root_id)
    if r.status == "completed":
        assert log.of(ev.PlanAccepted)
    else:
        assert r.reason in ("plan_invalid", "planning_failed", "tasks_not_completed"), r
        if r.reason == "plan_invalid":
            assert log.first(ev.PlanRefused).data.errors


async def test_restart_mid_planning_resumes(db_path) -> None:
    gate = asyncio.Event()

    class SlowPlanner(ScriptedPlanner):
        async def handle(self, task: TaskCard, inputs: PlanRequest, ctx: TaskContext) -> Any:
            if task.attempt == 1:
                await gate.wait()
            return {"tasks": [echo_task("a", "after the crash")]}

    policy = Policy(retry=RetryPolicy(initial_interval_s=0.01), tick_s=0.01, plan_timeout_s=0.3)
    store1 = await SqliteEventStore.open(db_path, poll_interval=0.01)
    rt1 = await Runtime(store1, [SlowPlanner, make_agent("echo")], policy).start()
    root = await rt1.orch.submit(Plan(goal="g", tasks=[]))
    await wait_for(store1, lambda e: isinstance(e.data, ev.TaskStarted) and "~plan1" in e.stream)
    await rt1.stop()  # the orchestrator "crashes" while the planner works
    await store1.close()
    gate.set()

    store2 = await SqliteEventStore.open(db_path, poll_interval=0.01)
    rt2 = await Runtime(store2, [SlowPlanner, make_agent("echo")], policy).start()
    try:
        r = await rt2.orch.wait(root, 10)
        log = await run_log(store2, root)
    finally:
        await rt2.stop()
        await store2.close()
    assert r.status == "completed", r
    assert r.outputs == {"a": {"text": "after the crash"}}
    planner = f"{root}~plan1"
    assert [d.attempt for d in log.of(ev.TaskDispatched, planner)] == [1, 2]
    assert len(log.of(ev.PlanAccepted)) == 1
    assert len(log.of(ev.RunStarted)) == 1


async def test_restart_after_acceptance_runs_the_accepted_tasks_once(db_path) -> None:
    SCRIPT.append({"tasks": [echo_task("a", timeout_s=0.3), echo_task("b", timeout_s=0.3)]})
    store1 = await SqliteEventStore.open(db_path, poll_interval=0.01)
    # no echo agent answers yet: the plan is accepted and its tasks wait
    silent = make_agent("echo", handler=lambda t, i, c: asyncio.sleep(3600))
    rt1 = await Runtime(store1, [ScriptedPlanner, silent]).start()
    root = await rt1.orch.submit(Plan(goal="g", tasks=[]))
    await wait_for(
        store1, lambda e: isinstance(e.data, ev.TaskDispatched) and e.stream.startswith("a-")
    )
    await rt1.stop()
    await store1.close()

    store2 = await SqliteEventStore.open(db_path, poll_interval=0.01)
    rt2 = Runtime(store2, AGENTS)
    # the cards rt1 sent died with its in-process bus: its attempts time out at once on
    # resume (host_lost), as in EmbeddedRuntime; a deadline counts from an agent's start
    rt2.orch.attempts_survive_restart = False
    await rt2.start()
    try:
        r = await rt2.orch.wait(root, 10)
        log = await run_log(store2, root)
    finally:
        await rt2.stop()
        await store2.close()
    assert r.status == "completed", r
    assert len(CARDS["scripted-planner"]) == 1  # not planned again
    assert len(log.of(ev.TaskCreated, tid(root, "a"))) == 1


async def test_replan_on_failure_proposes_the_rest(make_runtime, store) -> None:
    def broken(t: TaskCard, i: Any, c: TaskContext) -> Any:
        raise RuntimeError("the upper agent is broken")

    SCRIPT.extend(
        [
            {
                "tasks": [
                    echo_task("a", "hi"),
                    {
                        "id": "b",
                        "capability": "upper",
                        "deps": ["a"],
                        "max_attempts": 1,
                        "inputs": {"text": {"$dep": "a", "path": "text"}},
                    },
                ]
            },
            {  # the rest: b again on another capability, reading the completed a
                "tasks": [
                    echo_task("a", "hi"),  # the completed task: reused, not re-run
                    {
                        "id": "b",
                        "capability": "echo",
                        "deps": ["a"],
                        "inputs": {"text": {"$dep": "a", "path": "text"}},
                    },
                ]
            },
        ]
    )
    agents = [ScriptedPlanner, make_agent("echo"), make_agent("upper", "upper", broken)]
    rt = await make_runtime(agents)
    r = await rt.run(Plan(goal="g", tasks=[], replan_on_failure=1))
    assert r.status == "completed", r
    assert r.outputs == {"a": {"text": "hi"}, "b": {"text": "hi"}}
    log = await run_log(store, r.root_id)
    _first, second = log.of(ev.PlanAccepted)
    assert second.task_ids == {"b": f"b-{r.root_id[-12:]}~p2"}
    assert second.superseded == [tid(r.root_id, "b")]
    assert len(log.of(ev.TaskCompleted, tid(r.root_id, "a"))) == 1  # a ran once
    replan = planning_cards()[1]
    assert any("'b'" in e and "failed" in e for e in replan.errors), replan.errors
    card = CARDS["scripted-planner"][1]
    assert card.inputs["completed"] == {"a": {"text": "hi"}}


async def test_without_replan_a_failed_task_fails_the_run(make_runtime, store) -> None:
    def broken(t: TaskCard, i: Any, c: TaskContext) -> Any:
        raise RuntimeError("broken")

    SCRIPT.append({"tasks": [{"id": "b", "capability": "upper", "max_attempts": 1,
                              "inputs": {"text": "x"}}]})  # fmt: skip
    rt = await make_runtime([ScriptedPlanner, make_agent("upper", "upper", broken)])
    r = await rt.run(Plan(goal="g", tasks=[]))
    assert (r.status, r.reason) == ("failed", "tasks_not_completed")
    assert len(CARDS["scripted-planner"]) == 1


async def test_a_goal_without_a_planner_is_refused_before_anything_is_written(
    make_runtime, store
) -> None:
    rt = await make_runtime([make_agent("echo")])
    before = await store.last_position()
    with pytest.raises(InvalidPlan, match="capability 'plan'"):
        await rt.orch.submit({"goal": "g"})
    assert await store.last_position() == before


async def test_the_planning_tokens_count_toward_the_budget(make_runtime, store) -> None:
    class CostlyPlanner(ScriptedPlanner):
        async def handle(self, task: TaskCard, inputs: PlanRequest, ctx: TaskContext) -> Any:
            ctx.usage(input_tokens=500, output_tokens=500)
            return {"tasks": [echo_task("a")]}

    rt = await make_runtime([CostlyPlanner, make_agent("echo")], policy=FAST)
    r = await rt.run(Plan(goal="g", tasks=[], budget_tokens=100))
    assert (r.status, r.reason) == ("halted", "budget_exceeded")


class RegionIn(msgspec.Struct, frozen=True):
    region: str


def region_of(t: TaskCard, i: Any, c: TaskContext) -> TextOut:
    return TextOut(text=i.region)


REGIONAL = [*AGENTS, make_agent("regional", "regional", region_of, input_type=RegionIn)]


async def test_the_goals_words_in_an_input_are_recorded_as_such(make_runtime, store) -> None:
    """A planner that copies the goal into a free-text input without saying so is found
    out: ``plan.proposed`` names the input, and replay says so."""
    goal = "echo 'good morning' back"
    SCRIPT.append({"goal": goal, "tasks": [echo_task("a", "good morning"), echo_task("b")]})
    rt = await make_runtime(AGENTS)
    r = await rt.run(Plan(goal=goal, tasks=[], session={"user": "x"}))
    assert r.status == "completed", r
    log = await run_log(store, r.root_id)
    assert log.first(ev.PlanProposed).data.from_goal == {"a": ["text"]}
    timeline = await replay(store, r.root_id)
    assert timeline.planning[0].from_goal == {"a": ["text"]}
    step = next(s for s in timeline.run if s.kind == "plan.proposed")
    assert step.detail is not None and step.detail.endswith("taken from the goal: a.text")


async def test_the_goals_words_where_free_text_is_not_taken_are_refused(
    make_runtime, store
) -> None:
    """``region`` does not take free text: "East" copied from the goal is a guess, refused
    with the flag that gives it; the same value given in the session is no guess."""
    goal = "sum up the East region"
    guess = {"id": "a", "capability": "regional", "inputs": {"region": "East"}}
    SCRIPT.append({"goal": goal, "tasks": [guess], "from_goal": {}})
    rt = await make_runtime(REGIONAL)
    r = await rt.run(Plan(goal=goal, tasks=[], max_plan_rounds=1))
    assert (r.status, r.reason) == ("failed", "plan_invalid")
    log = await run_log(store, r.root_id)
    assert log.first(ev.PlanProposed).data.from_goal == {"a": ["region"]}
    (error,) = log.first(ev.PlanRefused).data.errors
    assert error.startswith("task 'a': input 'region' is given the goal's words (\"East\")")
    assert "--input region=..." in error
    given = await rt.run(
        Plan(goal=goal, tasks=[], session={"region": "East"}, session_fields=["region"])
    )
    assert given.status == "completed", given
    log = await run_log(store, given.root_id)
    assert log.first(ev.PlanProposed).data.from_goal == {}


@pytest.mark.parametrize(
    "said",
    [{"a": [["text"], {"x": 1}, 3, "nope"]}, {"a": "text"}, ["a"], {"zz": ["text"]}, None],
)
async def test_what_a_planner_says_it_took_from_the_goal_is_kept_only_where_true(
    make_runtime, store, said: Any
) -> None:
    """A planner's ``from_goal`` naming no input of its own task is dropped, never a crash."""
    SCRIPT.append({"goal": "g", "tasks": [echo_task("a", "hello")], "from_goal": said})
    rt = await make_runtime(AGENTS)
    r = await rt.run(Plan(goal="say hi", tasks=[]))
    assert r.status == "completed", r
    log = await run_log(store, r.root_id)
    assert log.first(ev.PlanProposed).data.from_goal == {}


async def test_what_a_planner_says_it_took_from_the_goal_is_recorded(make_runtime, store) -> None:
    """A paraphrase is not found word for word: the planner's own say is recorded."""
    SCRIPT.append({"goal": "g", "tasks": [echo_task("a", "hi")], "from_goal": {"a": ["text"]}})
    rt = await make_runtime(AGENTS)
    r = await rt.run(Plan(goal="say hello", tasks=[]))
    assert r.status == "completed", r
    log = await run_log(store, r.root_id)
    assert log.first(ev.PlanProposed).data.from_goal == {"a": ["text"]}
