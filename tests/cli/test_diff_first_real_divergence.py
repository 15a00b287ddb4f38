"""``cardbus diff`` of a goal-planned run and its re-run names the first real divergence
(issue 30 item 10): not the planning task, which the re-run takes from the recorded run,
nor the subtasks of a result it reuses; and ``rerun --task write --model mock-1``, the
incident tutorial's step, runs (the demo's writer offers the mock by name).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from click.testing import CliRunner

from cardbus.tools.cli import cli


def _cli(*args: str) -> Any:
    return CliRunner().invoke(cli, list(args))


def test_a_rerun_of_the_demo_diverges_where_the_writer_asked_something_else(
    tmp_path: Path,
) -> None:
    db = str(tmp_path / "demo.db")
    demo = _cli("demo", "--db", db, "--json")
    assert demo.exit_code == 0, demo.output
    root = json.loads(demo.stdout)["root_id"]

    rerun = _cli("rerun", root, "--task", "write", "--model", "mock-1", "--db", db, "--json")
    assert rerun.exit_code == 0, rerun.output  # not no_capable_agent (writer: over_constraint)
    again = json.loads(rerun.stdout)
    assert again["status"] == "completed"
    diff = again["diff"]
    pairs = {p["key"]: p for p in diff["tasks"]}

    # the re-run took the recorded plan and outline's result: not run in B, not divergences
    assert pairs["~plan1"]["reused_in"] == "B" and pairs["~plan1"]["b"] is None
    assert pairs["outline/supplement#1"]["reused_in"] == "B"
    assert pairs["outline"]["b"]["reused_from"] is not None
    first = diff["first_divergence"]
    assert first["task"] == "write", first
    assert first["what"] == "request" and first["kind"] == "model"
    assert any('"format": "markdown"' in line for line in first["diff"])  # memory taught it

    text = _cli("diff", root, again["root_id"], "--db", db)
    assert text.exit_code == 1  # they diverge
    assert "first divergence: task write: model call #0 (mock-1) asked something else" in (
        text.stdout
    )
    assert "task ~plan1: not run in B, which reused the other run's result" in text.stdout


def test_two_planned_runs_match_their_planning_tasks_by_place(tmp_path: Path) -> None:
    db = str(tmp_path / "demo.db")
    roots = []
    for _ in range(2):
        r = _cli("demo", "--db", db, "--json")
        assert r.exit_code == 0, r.output
        roots.append(json.loads(r.stdout)["root_id"])
    r = _cli("diff", *roots, "--db", db, "--json")
    d = json.loads(r.stdout)
    pairs = {p["key"]: p for p in d["tasks"]}
    plan = pairs["~plan1"]  # one key for both runs' planning (its ids hold each root)
    assert plan["a"]["task_id"].startswith(roots[0]) and plan["b"]["task_id"].startswith(roots[1])
    assert plan["differs"] == [] and plan["reused_in"] == ""
    assert d["first_divergence"]["task"] != "~plan1"


def test_a_rerun_asking_a_model_no_agent_offers_is_refused_before_it_runs(
    tmp_path: Path,
) -> None:
    db = str(tmp_path / "demo.db")
    demo = _cli("demo", "--db", db, "--json")
    assert demo.exit_code == 0, demo.output
    root = json.loads(demo.stdout)["root_id"]
    r = _cli("rerun", root, "--task", "write", "--model", "gpt-x", "--db", db)
    assert r.exit_code == 1
    assert "no agent offering 'write' takes it (model='gpt-x' not in ['mock-1'])" in r.output
    runs = json.loads(_cli("runs", "--db", db, "--json").stdout)
    assert [x["root_id"] for x in runs] == [root]  # nothing written: no failed run
