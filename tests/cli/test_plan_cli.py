"""``cardbus plan "GOAL"`` and ``cardbus run --goal``, as a new user runs them."""

from __future__ import annotations

import json
from pathlib import Path

from click.testing import CliRunner

from cardbus.agents.demo import DEMO_AGENTS
from cardbus.tools.cli import cli

GOAL = "Write a short report on tides"
DEMO_CAPABILITIES = {c.name for a in DEMO_AGENTS for c in a.capabilities}


def test_plan_prints_a_checked_plan_of_three_tasks_on_registered_capabilities() -> None:
    result = CliRunner().invoke(cli, ["plan", GOAL])
    assert result.exit_code == 0, result.output
    assert "3 tasks, checked" in result.output
    for name in ("research", "outline", "write"):
        assert f"  {name}" in result.output
    assert "reviewed by review" in result.output


def test_plan_json_is_a_plan_file_that_cardbus_run_runs(tmp_path: Path) -> None:
    runner = CliRunner()
    out = tmp_path / "plan.json"
    result = runner.invoke(cli, ["plan", GOAL, "--json", "-o", str(out)])
    assert result.exit_code == 0, result.output
    plan = json.loads(out.read_text())
    assert plan["goal"] == GOAL
    assert len(plan["tasks"]) >= 3
    assert {t["capability"] for t in plan["tasks"]} <= DEMO_CAPABILITIES
    assert plan["agents"] and all(":" in a for a in plan["agents"])
    ran = runner.invoke(cli, ["run", str(out), "--db", str(tmp_path / "c.db"), "--json"])
    assert ran.exit_code == 0, ran.output
    assert json.loads(ran.output.strip().splitlines()[-1])["status"] == "completed"


def test_run_goal_completes_and_replay_shows_the_proposal_and_the_acceptance(
    tmp_path: Path,
) -> None:
    runner = CliRunner()
    db = str(tmp_path / "c.db")
    ran = runner.invoke(cli, ["run", "--goal", GOAL, "--db", db, "--json"])
    assert ran.exit_code == 0, ran.output
    result = json.loads(ran.output.strip().splitlines()[-1])
    assert result["status"] == "completed"
    assert {"research", "outline", "write"} <= set(result["outputs"])
    shown = runner.invoke(cli, ["replay", result["root_id"], "--db", db])
    assert shown.exit_code == 0, shown.output
    assert "plan.proposed" in shown.output and "plan.accepted" in shown.output
    timeline = json.loads(
        runner.invoke(cli, ["replay", result["root_id"], "--db", db, "--json"]).output
    )
    assert [r["outcome"] for r in timeline["planning"]] == ["accepted"]
    kinds = [s["kind"] for s in timeline["run"]]
    assert (
        kinds.index("plan.proposed") < kinds.index("plan.accepted") < kinds.index("run.completed")
    )


def test_a_goal_that_cannot_be_planned_is_exit_1_naming_why(tmp_path: Path) -> None:
    result = CliRunner().invoke(cli, ["plan", GOAL, "--final-capability", "telepathy"])
    assert result.exit_code == 1
    assert "telepathy" in result.output


def test_run_needs_a_plan_file_or_a_goal(tmp_path: Path) -> None:
    result = CliRunner().invoke(cli, ["run", "--db", str(tmp_path / "c.db")])
    assert result.exit_code == 2
    assert "--goal" in result.output
