"""Planners as agents: the rule planner chains schemas, the LLM planner asks a model."""

from __future__ import annotations

import json
import random
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgspec
import pytest
from openai_stub import OpenAIStub

from cardbus.agents.demo import DEMO_AGENTS
from cardbus.agents.llm import OpenAIChatLLM
from cardbus.agents.planning import (
    PLAN_CAPABILITY,
    LLMPlanner,
    PlanLimits,
    PlanProposal,
    PlanRequest,
    ProposedTask,
    RulePlanner,
    check_plan,
    goal_subject,
    plan_json_schema,
    plan_request,
)
from cardbus.agents.tool_loop import object_root
from cardbus.bus.orchestrator.plan import Plan, as_plan, validate_plan
from cardbus.bus.runtime.embedded import EmbeddedRuntime
from cardbus.eventstore import MemoryEventStore
from cardbus.eventstore.errors import InvalidPlan

GOAL = "Write a short report on tides"
CARDS = [a.card() for a in DEMO_AGENTS]
FIXTURE = json.loads((Path(__file__).parent / "fixtures" / "planner_round_trip.json").read_text())


def planning_card(request: PlanRequest) -> Any:
    from cardbus.agents.cards import TaskCard

    return TaskCard(
        task_id="plan-1",
        root_id="run-1",
        capability=PLAN_CAPABILITY,
        goal=f"Plan: {request.goal}",
        inputs=msgspec.to_builtins(request),
    )


async def rule_plan(**kw: Any) -> Any:
    request = plan_request(kw.pop("goal", GOAL), kw.pop("cards", CARDS), **kw)
    return await RulePlanner.run(planning_card(request))


def plan_of(result: Any) -> Plan:
    assert result.status == "completed", result
    return as_plan(result.output)


# -- the rule planner ----------------------------------------------------------------------


async def test_rule_planner_plans_the_demo_pipeline_from_a_goal() -> None:
    result = await rule_plan(session={"user": "demo", "request": "a report"})
    plan = plan_of(result)
    validate_plan(plan, CARDS)  # as the orchestrator checks a hand-written plan
    assert len(plan.tasks) >= 3
    assert [(t.id, t.capability, t.deps) for t in plan.tasks] == [
        ("research", "research", []),
        ("outline", "outline", ["research"]),
        ("write", "write", ["outline", "research"]),
    ]
    research, outline, write = plan.tasks
    assert research.inputs == {"topic": "tides"}  # the goal's subject
    assert outline.inputs["facts"] == {"$dep": "research", "path": "facts"}  # by field name
    assert write.inputs == {
        "topic": "tides",
        "outline": {"$dep": "outline", "path": "sections"},  # the capability named "outline"
        "facts": {"$dep": "research", "path": "facts"},
        "figures": {"$dep": "outline", "path": "figures"},  # optional: from a planned output
        "user": "demo",  # a session field of that name
    }
    assert write.goal == GOAL and write.review_by == "review"
    assert (result.usage.input_tokens, result.usage.output_tokens) == (0, 0)  # no model


async def test_the_rule_planners_plan_runs_to_completion() -> None:
    plan = plan_of(await rule_plan(session={"user": "demo"}))
    store = MemoryEventStore()
    async with EmbeddedRuntime(store, DEMO_AGENTS) as rt:
        result = await rt.run(plan, timeout=30)
    assert result.status == "completed", result
    draft = result.outputs["write"]
    assert draft["title"] == "Report: tides"
    assert "Conclusion" in [s["heading"] for s in draft["sections"]]  # reviewed and revised


async def test_the_rule_planner_is_deterministic() -> None:
    first = await rule_plan()
    shuffled = list(CARDS)
    random.Random(7).shuffle(shuffled)
    second = await rule_plan(cards=shuffled)
    assert first.output == second.output


async def test_limits_choose_the_end_of_the_chain() -> None:
    outline = plan_of(await rule_plan(limits=PlanLimits(final_capability="outline")))
    assert [t.capability for t in outline.tasks] == ["research", "outline"]
    facts = plan_of(await rule_plan(limits=PlanLimits(final_output="Facts")))
    assert [t.capability for t in facts.tasks] == ["research"]  # merge cannot be fed
    review = plan_of(await rule_plan(limits=PlanLimits(final_output="draft")))
    assert review.tasks[-1].capability == "write"


@pytest.mark.parametrize(
    ("limits", "detail"),
    [
        (PlanLimits(max_tasks=2), "takes 3 tasks, max 2"),
        (PlanLimits(capabilities=["outline", "write"]), "nothing provides its required input"),
        (PlanLimits(final_capability="translate"), "'translate' is not offered"),
        (PlanLimits(final_output="Poem"), "no capability outputs 'Poem'"),
    ],
)
async def test_the_rule_planner_declines_what_it_cannot_plan(
    limits: PlanLimits, detail: str
) -> None:
    result = await rule_plan(limits=limits)
    assert result.status == "rejected"
    assert result.reason == "cannot_plan"
    assert detail in result.notes


async def test_a_re_proposal_leaves_out_the_capabilities_the_errors_name() -> None:
    first = plan_of(await rule_plan())
    errors = ["task 'outline': no registered agent offers capability 'outline'"]
    previous = msgspec.convert(msgspec.to_builtins(first), PlanProposal)
    again = await rule_plan(errors=errors, previous=previous)
    # without an outliner nothing feeds write's outline: it declines rather than repeat itself
    assert again.status == "rejected" and "outline" in again.notes


def test_the_goals_subject() -> None:
    assert goal_subject("Write a short report on tides") == "tides"
    assert goal_subject("Tell me about the moon and the sea.") == "the moon and the sea"
    assert goal_subject("Summarise everything") == "Summarise everything"


# -- the plan format -------------------------------------------------------------------------


def test_the_plan_format_is_a_subset_of_the_orchestrators() -> None:
    """Every field a planner proposes is a PlanTask / Plan field with the same JSON Schema."""
    ours = plan_json_schema()["$defs"]
    theirs = msgspec.json.schema(Plan)["$defs"]
    for mine, bus in (("PlanProposal", "Plan"), ("ProposedTask", "PlanTask")):
        for name, schema in ours[mine]["properties"].items():
            assert name in theirs[bus]["properties"], f"{bus} has no field {name!r}"
            other = dict(theirs[bus]["properties"][name])
            if name == "tasks":
                other["items"] = {"$ref": "#/$defs/ProposedTask"}
                other.pop("default", None)  # a Plan may be a goal alone (no tasks)
            assert schema == other, name
        assert set(ours[mine].get("required", [])) <= set(theirs[bus]["properties"])


def test_a_proposal_encodes_to_the_documented_plan_json() -> None:
    plan = PlanProposal(goal="g", tasks=[ProposedTask(id="a", capability="c")])
    assert msgspec.json.decode(msgspec.json.encode(plan)) == {
        "goal": "g",
        "tasks": [{"id": "a", "capability": "c"}],  # defaults are left out
    }


@pytest.mark.parametrize(
    ("tasks", "error"),
    [
        ([], "no tasks"),
        ([{"id": "a", "capability": "poem"}], "no registered agent offers capability 'poem'"),
        ([{"id": "a b", "capability": "research", "inputs": {"topic": "x"}}], "without spaces"),
        ([{"id": "a", "capability": "research"}], "required inputs ['topic'] are missing"),
        (
            [{"id": "a", "capability": "research", "inputs": {"topic": 3}}],
            "inputs $.topic",
        ),
        (
            [
                {"id": "r", "capability": "research", "inputs": {"topic": "x"}},
                {
                    "id": "o",
                    "capability": "outline",
                    "inputs": {"topic": "x", "facts": {"$dep": "r", "path": "facts"}},
                },
            ],
            "reads the output of 'r' without declaring it",
        ),
        (
            [{"id": "r", "capability": "research", "inputs": {"topic": "x"}, "deps": ["z"]}],
            "unknown task 'z'",
        ),
        (
            [
                {"id": "a", "capability": "research", "inputs": {"topic": "x"}, "deps": ["b"]},
                {"id": "b", "capability": "research", "inputs": {"topic": "x"}, "deps": ["a"]},
            ],
            "cycle",
        ),
    ],
)
def test_check_plan_names_what_cannot_run(tasks: list[dict[str, Any]], error: str) -> None:
    plan = msgspec.convert({"goal": GOAL, "tasks": tasks}, PlanProposal)
    errors = check_plan(plan, plan_request(GOAL, CARDS))
    assert any(error in e for e in errors), errors


def test_check_plan_applies_the_limits() -> None:
    plan = msgspec.convert(FIXTURE["rounds"][1]["proposal"], PlanProposal)
    assert check_plan(plan, plan_request(GOAL, CARDS)) == []
    limited = plan_request(GOAL, CARDS, limits=PlanLimits(max_tasks=2, capabilities=["research"]))
    errors = check_plan(plan, limited)
    assert "the plan has 3 tasks, at most 2 are allowed" in errors
    assert "task 'outline': capability 'outline' is not allowed" in errors


def test_the_planners_cards() -> None:
    for planner in (RulePlanner, LLMPlanner):
        card = planner.card()
        (spec,) = card.capabilities
        assert spec.name == PLAN_CAPABILITY
        assert "goal" in spec.input_schema["$defs"]["PlanRequest"]["required"]
    assert RulePlanner.agent_id != LLMPlanner.agent_id
    # the planning card never lists the planners themselves
    names = [c.name for c in plan_request(GOAL, [*CARDS, RulePlanner.card()]).capabilities]
    assert PLAN_CAPABILITY not in names and "research" in names


# -- the LLM planner against the stub server, and the recorded round trip -------------------


@pytest.fixture
def stub() -> Iterator[OpenAIStub]:
    with OpenAIStub() as s:
        yield s


def test_the_recorded_round_trip_is_what_the_orchestrator_decides() -> None:
    """The fixture's refusal is exactly validate_plan's error; its second round passes."""
    assert FIXTURE["agents"] == [f"cardbus.agents.demo:{a.__name__}" for a in DEMO_AGENTS]
    first, second = FIXTURE["rounds"]
    with pytest.raises(InvalidPlan) as refused:
        validate_plan(as_plan(first["proposal"]), CARDS)
    assert [str(refused.value)] == first["refused_with"]
    validate_plan(as_plan(second["proposal"]), CARDS)
    assert second["refused_with"] == []
    # the re-proposal's card: the errors and the refused plan are its only extra inputs
    again = plan_request(
        FIXTURE["goal"],
        CARDS,
        session=FIXTURE["session"],
        errors=first["refused_with"],
        previous=msgspec.convert(first["proposal"], PlanProposal),
    )
    fresh = plan_request(FIXTURE["goal"], CARDS, session=FIXTURE["session"])
    assert msgspec.structs.replace(again, errors=[], previous=None) == fresh


async def test_llm_planner_returns_a_plan(stub: OpenAIStub) -> None:
    stub.script(json.dumps(FIXTURE["rounds"][1]["proposal"]))
    request = plan_request(GOAL, CARDS, session={"user": "demo"})
    async with OpenAIChatLLM(stub.url, "planner-model", api_key="k", max_retries=0) as llm:
        result = await LLMPlanner.run(planning_card(request), llm)
    plan = plan_of(result)
    validate_plan(plan, CARDS)
    assert len(plan.tasks) == 3
    (body,) = stub.bodies()
    fmt = body["response_format"]["json_schema"]
    assert fmt["name"] == "PlanProposal"
    # the exported plan schema, its root object inlined (strict servers want an object there)
    assert fmt["schema"] == object_root(plan_json_schema())
    assert fmt["schema"]["type"] == "object" and "$defs" in fmt["schema"]
    assert fmt["strict"] is False  # free-form inputs cannot be a strict schema
    prompt = body["messages"][1]["content"]
    assert '"research"' in prompt and '"input_schema"' in prompt and GOAL in prompt
    assert result.usage.input_tokens == 11


async def test_llm_planner_corrects_an_unknown_capability_before_proposing(
    stub: OpenAIStub,
) -> None:
    first, second = FIXTURE["rounds"]
    stub.script(json.dumps(first["proposal"]), json.dumps(second["proposal"]))
    request = plan_request(GOAL, CARDS, session={"user": "demo"})
    async with OpenAIChatLLM(stub.url, "planner-model", api_key="k", max_retries=0) as llm:
        result = await LLMPlanner.run(planning_card(request), llm)
    assert result.output == second["proposal"]
    repair = stub.bodies()[1]["messages"][-1]["content"]
    assert first["refused_with"][0] in repair  # the same words the orchestrator would use


async def test_llm_planner_sees_the_errors_of_a_refused_proposal(stub: OpenAIStub) -> None:
    first, second = FIXTURE["rounds"]
    stub.script(json.dumps(second["proposal"]))
    request = plan_request(
        GOAL,
        CARDS,
        errors=first["refused_with"],
        previous=msgspec.convert(first["proposal"], PlanProposal),
    )
    async with OpenAIChatLLM(stub.url, "planner-model", api_key="k", max_retries=0) as llm:
        result = await LLMPlanner.run(planning_card(request), llm)
    assert result.status == "completed"
    prompt = stub.bodies()[0]["messages"][1]["content"]
    assert first["refused_with"][0] in prompt and '"summarize"' in prompt
