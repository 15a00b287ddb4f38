"""A degraded run (an optional task failed, its dependents ran without it) is named so
by ``cardbus run``, ``cardbus runs`` and ``cardbus replay`` (text and ``--json``)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from cardbus.tools.cli import cli

AGENTS = """
import msgspec
from cardbus import Agent, Capability

class Text(msgspec.Struct):
    text: str = ""

class Search(Agent):
    agent_id = "search"
    capabilities = [Capability("search", Text, Text, "the index is down")]

    async def handle(self, task, inputs, ctx):
        raise RuntimeError("index down")

class GoodSearch(Agent):
    agent_id = "good-search"
    capabilities = [Capability("search", Text, Text, "its index is up")]

    async def handle(self, task, inputs, ctx):
        return Text(text="tides")

class Write(Agent):
    agent_id = "write"
    capabilities = [Capability("write", Text, Text, "writes with or without facts")]

    async def handle(self, task, inputs, ctx):
        return Text(text="report" + (" with " + inputs.text if inputs.text else ""))
"""


def _plan(tmp_path: Path, optional: bool) -> Path:
    plan = {
        "goal": "a report",
        "agents": ["optagents:Search", "optagents:Write"],
        "tasks": [
            {"id": "facts", "capability": "search", "max_attempts": 2, "optional": optional},
            {
                "id": "report",
                "capability": "write",
                "deps": ["facts"],
                "inputs": {"text": {"$dep": "facts", "path": "text"}},
            },
        ],
    }
    path = tmp_path / f"plan-{optional}.json"
    path.write_text(json.dumps(plan))
    return path


@pytest.fixture
def agents(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    (tmp_path / "optagents.py").write_text(AGENTS)
    monkeypatch.syspath_prepend(str(tmp_path))
    return tmp_path


def test_a_degraded_run_is_named_in_run_runs_and_replay(agents: Path) -> None:
    db = str(agents / "log.db")
    r = CliRunner().invoke(cli, ["run", str(_plan(agents, True)), "--store", db])
    assert r.exit_code == 0, r.output  # completed: degraded is no failure
    line = r.stdout.splitlines()[-1]  # the run's line, after its progress
    root = line.split()[1].rstrip(":")
    assert line == f"run {root}: completed degraded (facts: failed: agent_error" + (
        " (RuntimeError: index down))"
    )

    out = CliRunner().invoke(cli, ["run", str(_plan(agents, True)), "--store", db, "--json"])
    body = json.loads(out.stdout.strip().splitlines()[-1])
    assert (body["status"], body["reason"], body["degraded"]) == (
        "completed",
        "degraded",
        ["facts"],
    )
    assert body["outputs"] == {"report": {"text": "report"}}  # written without the facts

    runs = CliRunner().invoke(cli, ["runs", "--store", db])
    assert runs.exit_code == 0, runs.output
    assert "completed: degraded (facts)" in runs.stdout
    rows = json.loads(CliRunner().invoke(cli, ["runs", "--store", db, "--json"]).stdout)
    assert {(x["status"], x["reason"], tuple(x["degraded"])) for x in rows} == {
        ("completed", "degraded", ("facts",))
    }

    replay = CliRunner().invoke(cli, ["replay", root, "--store", db, "--json"])
    assert replay.exit_code == 0, replay.output
    (end,) = [s for s in json.loads(replay.stdout)["run"] if s["kind"] == "run.completed"]
    assert end["reason"] == "degraded: without facts"
    assert end["detail"] == "facts: failed: agent_error (RuntimeError: index down)"
    text = CliRunner().invoke(cli, ["replay", root, "--store", db])
    assert "degraded: without facts" in text.stdout


def test_the_same_plan_without_optional_fails_and_says_so(agents: Path) -> None:
    db = str(agents / "log.db")
    r = CliRunner().invoke(cli, ["run", str(_plan(agents, False)), "--store", db])
    assert r.exit_code == 1, r.output
    line = r.stdout.splitlines()[-1]
    # the failed task first, with its reason (tools.outcome), and no word of degraded
    assert " failed: task facts-" in line and "agent_error" in line, line
    assert "degraded" not in line
    rows = json.loads(CliRunner().invoke(cli, ["runs", "--store", db, "--json"]).stdout)
    assert [(x["status"], x["degraded"]) for x in rows] == [("failed", [])]


def test_a_fork_of_a_degraded_run_runs_the_optional_task_again(agents: Path) -> None:
    """Forked at its end, the report is reused and the optional task runs again: on the
    same broken agent the fork is degraded too; on a working one it is not."""
    db = str(agents / "log.db")
    r = CliRunner().invoke(cli, ["run", str(_plan(agents, True)), "--store", db, "--json"])
    root = json.loads(r.stdout.strip().splitlines()[-1])["root_id"]
    steps = json.loads(CliRunner().invoke(cli, ["replay", root, "--store", db, "--json"]).stdout)
    (end,) = [s for s in steps["run"] if s["kind"] == "run.completed"]
    at = ["--at", str(end["position"]), "--store", db, "--json"]
    again = CliRunner().invoke(cli, ["fork", root, *at])
    assert again.exit_code == 0, again.output
    body = json.loads(again.stdout)
    assert (len(body["reused"]), len(body["rerun"]), body["reason"]) == (1, 1, "degraded")
    agents_now = ["--agent", "optagents:GoodSearch", "--agent", "optagents:Write"]
    fixed = CliRunner().invoke(cli, ["fork", root, *at, *agents_now])
    assert fixed.exit_code == 0, fixed.output
    assert (json.loads(fixed.stdout)["status"], json.loads(fixed.stdout)["reason"]) == (
        "completed",
        "",
    )
