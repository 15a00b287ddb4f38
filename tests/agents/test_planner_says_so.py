"""The rule planner never guesses silently (issue 30, item 5).

A value it takes from the goal's words is said so (``PlanProposal.from_goal``);
one capability needed twice is planned twice from the inputs that tell the two
apart, or refused naming them and the ``--input`` that does; a step the goal
names is in the plan, or the refusal names it.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import msgspec
from click.testing import CliRunner
from sales_agents import SALES_AGENTS, YOY_AGENTS, YOY_PATHS, Report
from wording_agents import Translator

from cardbus.agents.agent import Agent, Capability, Reject, TaskContext
from cardbus.agents.cards import TaskCard
from cardbus.agents.planning import PlanLimits, PlanProposal, plan_request, rule_plan
from cardbus.tools.cli import cli

GOAL = "query last month's East-region sales, do a year-over-year analysis and generate a report"
CARDS = [a.card() for a in YOY_AGENTS]
AGENTS = [arg for path in YOY_PATHS for arg in ("--agent", path)]
SCOPED = {"region": "East", "current.period": "2026-11", "previous.period": "2025-11"}


def plan(goal: str = GOAL, cards: Any = CARDS, **kw: Any) -> PlanProposal:
    return rule_plan(plan_request(goal, cards, **kw))


def refusal(goal: str = GOAL, cards: Any = CARDS, **kw: Any) -> str:
    try:
        planned = plan(goal, cards, **kw)
    except Reject as e:
        assert e.reason == "cannot_plan"
        return e.detail
    raise AssertionError(f"planned: {planned}")


def test_one_query_for_both_periods_is_refused_naming_the_inputs_and_the_report() -> None:
    detail = refusal(session={"region": "East", "period": "2026-11"})
    assert "'yoy' takes 'current' and 'previous' (SalesRows)" in detail
    assert "one 'sales_rows' task would feed both the same value" in detail
    assert "--input current.period=... --input previous.period=..." in detail
    assert "'generate a report' ('yoy_report')" in detail  # the step the goal names


def test_the_periods_told_apart_plan_two_queries_the_analysis_and_the_report() -> None:
    proposal = plan(session=SCOPED)
    by_id = {t.id: t for t in proposal.tasks}
    assert list(by_id) == ["sales_rows_current", "sales_rows_previous", "yoy", "yoy_report"]
    assert by_id["sales_rows_current"].inputs == {"region": "East", "period": "2026-11"}
    assert by_id["sales_rows_previous"].inputs == {"region": "East", "period": "2025-11"}
    assert by_id["yoy"].inputs == {
        "current": {"$dep": "sales_rows_current"},
        "previous": {"$dep": "sales_rows_previous"},
    }
    report = by_id["yoy_report"]
    assert (report.inputs, report.deps, report.goal) == (
        {"analysis": {"$dep": "yoy"}},
        ["yoy"],
        "generate a report",
    )
    assert proposal.from_goal == {}  # every value was given


class MailIn(msgspec.Struct, frozen=True):
    recipient: str
    report: Report


class Sent(msgspec.Struct, frozen=True):
    ok: bool


class Mailer(Agent):
    agent_id = "mailer"
    capabilities = [Capability("email", MailIn, Sent, "send an email of a report")]

    async def handle(self, task: TaskCard, inputs: MailIn, ctx: TaskContext) -> Sent:
        return Sent(True)


def test_a_step_the_goal_names_that_cannot_be_planned_is_named_in_the_refusal() -> None:
    goal = "do a year-over-year analysis, generate a report and send an email of it"
    detail = refusal(goal, [*CARDS, Mailer.card()], session=SCOPED)
    assert "the goal's step 'send an email of it' (capability 'email')" in detail
    assert "--input recipient=..." in detail
    # given the recipient, the step is planned: the report, then the email of it
    planned = plan(goal, [*CARDS, Mailer.card()], session={**SCOPED, "recipient": "ana"})
    email = next(t for t in planned.tasks if t.capability == "email")
    assert email.inputs == {"recipient": "ana", "report": {"$dep": "yoy_report"}}


def test_a_field_given_per_task_is_never_copied_from_one_of_them() -> None:
    """The report of which period? ``period`` is given for ``current`` and ``previous``
    alone: the report's query is refused asking for it, not fed the current one's."""
    goal = "query last month's East-region sales and generate a report"
    cards = [a.card() for a in SALES_AGENTS]
    limits = PlanLimits(final_capability="compare_sales")
    detail = refusal(goal, cards, session=SCOPED, limits=limits)
    assert "the goal's step 'generate a report' (capability 'sales_report')" in detail
    assert "--input period=..." in detail


def test_a_goal_of_one_step_plans_as_before() -> None:
    (task,) = plan("translate 'good morning' into French", [Translator.card()]).tasks
    assert task.capability == "translate"


def test_the_goals_words_in_a_free_text_input_are_said_so() -> None:
    goal = "translate 'good morning' into French"
    proposal = plan(goal, [Translator.card()])
    assert proposal.tasks[0].inputs == {"text": goal}
    assert proposal.from_goal == {"translate": ["text"]}


def test_cardbus_run_goal_refuses_rather_than_compare_a_period_with_itself(
    tmp_path: Path,
) -> None:
    args = ["run", "--goal", GOAL, *AGENTS, "--input", "region=East", "--db"]
    ran = CliRunner().invoke(
        cli, [*args, str(tmp_path / "a.db"), "--input", "period=2026-11", "--json"]
    )
    assert ran.exit_code == 1, ran.output
    result = json.loads(ran.output.strip().splitlines()[-1])
    assert result["status"] == "failed" and result["outputs"] == {}
    said = json.dumps(result)
    assert "'current' and 'previous'" in said and "--input current.period=" in said
    assert "'generate a report'" in said
    told = CliRunner().invoke(
        cli,
        [
            *args,
            str(tmp_path / "b.db"),
            "--input",
            "current.period=2026-11",
            "--input",
            "previous.period=2025-11",
            "--json",
        ],
    )
    assert told.exit_code == 0, told.output
    result = json.loads(told.output.strip().splitlines()[-1])
    yoy = result["outputs"]["yoy"]
    assert yoy["current_total"] != yoy["previous_total"] and yoy["change_pct"] != 0.0
    assert result["outputs"]["yoy_report"]["text"].endswith(f"{yoy['change_pct']:+}%")


def test_cardbus_plan_and_replay_mark_the_goals_words(tmp_path: Path) -> None:
    goal = "translate 'good morning' into French"
    runner = CliRunner()
    planned = runner.invoke(cli, ["plan", goal, "--agent", "wording_agents:Translator"])
    assert planned.exit_code == 0, planned.output
    assert f"text={json.dumps(goal)} (taken from the goal)" in planned.output
    db = str(tmp_path / "t.db")
    ran = runner.invoke(
        cli, ["run", "--goal", goal, "--agent", "wording_agents:Translator", "--db", db]
    )
    assert ran.exit_code == 0, ran.output
    assert "plan round 1; taken from the goal: translate.text" in ran.output
    root = ran.output.split("run ", 1)[1].split(":", 1)[0]
    shown = runner.invoke(cli, ["replay", root, "--db", db])
    assert shown.exit_code == 0, shown.output
    assert "taken from the goal: translate.text" in shown.output
