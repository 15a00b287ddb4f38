"""The rule planner asks for what only the user can say (issue 26, item 3).

It never copies the goal into an input not declared to take free text; an
input nobody provides is named in the refusal with how to give it (``--input``
on ``cardbus plan`` and ``cardbus run --goal``); a whole output feeds a named
input when the types fit; one capability is used twice when the inputs differ;
the LLM planner's failure names the model's problem.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

import msgspec
from click.testing import CliRunner
from sales_agents import SALES_AGENTS, SALES_PATHS

from cardbus.agents.agent import Agent, Capability, Reject, TaskContext
from cardbus.agents.cards import TaskCard
from cardbus.agents.llm import MockLLM
from cardbus.agents.planning import (
    LLMPlanner,
    PlanProposal,
    plan_request,
    rule_plan,
)
from cardbus.bus.runtime.embedded import plan_goal
from cardbus.tools.cli import cli

GOAL = "query last month's East-region sales and generate a report"
CARDS = [a.card() for a in SALES_AGENTS]
AGENTS = [arg for path in SALES_PATHS for arg in ("--agent", path)]


def plan(**kw: Any) -> PlanProposal:
    return rule_plan(plan_request(kw.pop("goal", GOAL), kw.pop("cards", CARDS), **kw))


def refusal(**kw: Any) -> str:
    try:
        plan(**kw)
    except Reject as e:
        assert e.reason == "cannot_plan"
        return e.detail
    raise AssertionError("planned")


def test_inputs_nobody_provides_are_named_with_how_to_give_them() -> None:
    detail = refusal()
    assert "'period'" in detail and "'region'" in detail
    assert "--input period=..." in detail and "--input region=..." in detail
    assert GOAL not in detail  # the goal was never copied into region or period


def test_given_inputs_are_planned_and_a_whole_output_feeds_a_named_input() -> None:
    proposal = plan(session={"region": "East", "period": "2026-10"})
    query, report = proposal.tasks
    assert (query.capability, query.inputs) == (
        "sales_query",
        {"region": "East", "period": "2026-10"},
    )
    assert report.capability == "sales_report"
    assert report.inputs == {"sales": {"$dep": "sales_query"}}  # the whole output, no path
    assert report.deps == ["sales_query"]


def test_one_capability_twice_when_the_inputs_differ() -> None:
    session = {"region": "East", "current.period": "2026-10", "previous.period": "2025-10"}
    asked = "compare the East region's sales with last year"
    proposal = plan(goal=asked, session=session)
    by_id = {t.id: t for t in proposal.tasks}
    assert len(by_id) == 3
    assert by_id["sales_query_current"].inputs == {"region": "East", "period": "2026-10"}
    assert by_id["sales_query_previous"].inputs == {"region": "East", "period": "2025-10"}
    compare = by_id["compare_sales"]
    assert compare.inputs == {
        "current": {"$dep": "sales_query_current"},
        "previous": {"$dep": "sales_query_previous"},
    }
    # nothing tells the two apart: one task would be read by both inputs, a comparison of
    # a period with itself; refused, naming the inputs and the flags that tell them apart
    detail = refusal(goal=asked, session={"region": "East", "period": "2026-10"})
    assert "'compare_sales' takes 'current' and 'previous' (Sales)" in detail
    assert "--input current.period=... --input previous.period=..." in detail


class Note(msgspec.Struct, frozen=True):
    body: Annotated[str, msgspec.Meta(extra_json_schema={"x-free-text": True})]
    prompt: str
    label: Annotated[str, msgspec.Meta(extra_json_schema={"x-free-text": False})] = "none"


class Noted(msgspec.Struct, frozen=True):
    ok: bool


class NoteTaker(Agent):
    agent_id = "note-taker"
    capabilities = [Capability("note", Note, Noted, "take a note")]

    async def handle(self, task: TaskCard, inputs: Note, ctx: TaskContext) -> Noted:
        return Noted(True)


def test_inputs_declared_free_text_take_the_goal() -> None:
    (task,) = plan(goal="note the tide tables", cards=[NoteTaker.card()]).tasks
    assert task.inputs == {"body": "note the tide tables", "prompt": "note the tide tables"}


def test_cli_plan_refuses_then_plans_with_inputs(tmp_path: Path) -> None:
    runner = CliRunner()
    refused = runner.invoke(cli, ["plan", GOAL, *AGENTS])
    assert refused.exit_code == 1
    assert "'region'" in refused.output and "'period'" in refused.output
    assert "--input region=" in refused.output
    planned = runner.invoke(
        cli, ["plan", GOAL, *AGENTS, "--input", "region=East", "--input", "period=2026-10"]
    )
    assert planned.exit_code == 0, planned.output
    assert 'period="2026-10", region="East"' in planned.output
    assert "sales=<sales_query>" in planned.output
    bad = runner.invoke(cli, ["plan", GOAL, *AGENTS, "--input", "region"])
    assert bad.exit_code == 2 and "NAME=VALUE" in bad.output


def test_cli_run_goal_with_inputs_completes(tmp_path: Path) -> None:
    ran = CliRunner().invoke(
        cli,
        [
            "run",
            "--goal",
            GOAL,
            *AGENTS,
            "--input",
            "region=East",
            "--input",
            "period=2026-10",
            "--db",
            str(tmp_path / "c.db"),
            "--json",
        ],
    )
    assert ran.exit_code == 0, ran.output
    result = json.loads(ran.output.strip().splitlines()[-1])
    assert result["status"] == "completed"
    assert result["outputs"]["sales_report"]["text"].startswith("Sales in East for 2026-10")


async def test_the_llm_planners_failure_names_the_models_problem() -> None:
    mock = MockLLM(respond=lambda prompt: "Sorry, I cannot plan that.")
    planned = await plan_goal({"goal": GOAL}, [*SALES_AGENTS, LLMPlanner], llm=mock, timeout=30)
    assert planned.plan is None and planned.reason == "planning_failed"
    assert planned.detail.startswith("llm_bad_output: "), planned.detail
    assert "no usable answer" in planned.detail and "no JSON object" in planned.detail
