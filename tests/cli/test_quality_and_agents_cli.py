"""Issue 15: a review never passed shows in ``cardbus run``, ``replay`` and ``tasks``
(item 4); ``cardbus agents`` lists the agents of the log (item 1). Each through the CLI
on a real SQLite log, checked against the events written."""

from __future__ import annotations

import asyncio
import json
import logging
from pathlib import Path
from typing import Any

import msgspec
import pytest
from click.testing import CliRunner, Result

from cardbus.agents import Agent, Capability, TaskCard, TaskContext
from cardbus.agents.cards import Review
from cardbus.bus import InProcessBus, Orchestrator
from cardbus.bus.runtime.worker import AgentWorker
from cardbus.eventstore import SqliteEventStore
from cardbus.eventstore import events as ev
from cardbus.tools.cli import cli

ISSUE = ev.ReviewIssue(
    issue_type="missing_section", section="End", severity="high", suggestion="add an end"
)


class Text(msgspec.Struct, frozen=True):
    text: str


class Draft(msgspec.Struct, frozen=True):
    draft: Any
    goal: str = ""
    checklist: list[str] = []


class Drafter(Agent):
    agent_id = "drafter"
    description = "drafts a text"
    capabilities = [Capability("draft", Text, Text, "draft a text")]

    async def handle(self, task: TaskCard, inputs: Text, ctx: TaskContext) -> Text:
        return Text(text=inputs.text.upper())


class Picky(Agent):
    agent_id = "picky"
    description = "never satisfied"
    capabilities = [Capability("check", Draft, Review, "check a draft")]

    async def handle(self, task: TaskCard, inputs: Draft, ctx: TaskContext) -> Review:
        return Review(passed=False, issues=[ISSUE])


PLAN = {
    "goal": "a text that never passes its review",
    "agents": [f"{__name__}:Drafter", f"{__name__}:Picky"],
    "tasks": [
        {
            "id": "d",
            "capability": "draft",
            "inputs": {"text": "hi"},
            "review_by": "check",
            "max_review_rounds": 0,
        }
    ],
}


def invoke(*args: str) -> Result:
    return CliRunner().invoke(cli, list(args), catch_exceptions=False)


async def _events(db: Path) -> list[Any]:
    store = await SqliteEventStore.open(db)
    try:
        return await store.read_all(0, 100_000)
    finally:
        await store.close()


def test_quality_not_met_in_run_replay_and_tasks(tmp_path: Path) -> None:
    db = tmp_path / "q.db"
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps(PLAN))
    r = invoke("run", str(plan), "--store", str(db), "--json")
    assert r.exit_code == 0, r.output
    out = json.loads(r.stdout.splitlines()[-1])
    assert out["status"] == "completed" and out["quality_met"] is False
    assert out["open_issues"] == {"d": [msgspec.to_builtins(ISSUE)]}
    completed = [e for e in asyncio.run(_events(db)) if isinstance(e.data, ev.TaskCompleted)]
    (task_done,) = [e for e in completed if e.stream.startswith("d-") and "~" not in e.stream]
    assert task_done.data.quality_met is False and task_done.data.open_issues == [ISSUE]

    text = invoke("run", str(plan), "--store", str(db))  # the same plan id: the same result
    assert text.exit_code == 0
    assert "quality not met" in text.stdout and "add an end" in text.stdout

    root = out["root_id"]
    replayed = json.loads(invoke("replay", root, "--store", str(db), "--json").stdout)
    (node,) = [t for t in replayed["tasks"] if t["task_id"] == task_done.stream]
    assert node["quality_met"] is False and node["open_issues"][0]["suggestion"] == "add an end"
    (step,) = [s for s in node["steps"] if s["type"] == "task.completed.v1"]
    assert step["payload"]["quality_met"] is False
    tree = invoke("replay", root, "--store", str(db)).stdout
    assert "quality not met" in tree

    rows = json.loads(invoke("tasks", "--store", str(db), "--json").stdout)
    (row,) = [x for x in rows if x["task_id"] == task_done.stream]
    assert row["quality_met"] is False and row["open_issues"][0]["section"] == "End"
    assert "quality not met" in row["reason"]
    assert "quality not met" in invoke("tasks", "--store", str(db), "--wide").stdout


class Twin(Drafter):
    agent_id = "twin"  # the same capabilities as drafter: an overlap


async def _agents_log(db: Path) -> None:
    store = await SqliteEventStore.open(db)
    bus = InProcessBus()
    orch = Orchestrator(store, bus)
    await orch.start()
    try:
        for a in (Drafter, Twin, Picky):
            await orch.register(a.card())
        worker = AgentWorker(bus, Drafter)
        await worker.start()
        plan = {"goal": "g", "tasks": [{"id": "x", "capability": "draft", "inputs": {"text": "a"}}]}
        r = await orch.run(plan, 10, agents=["drafter"])
        assert r.status == "completed"
        await worker.stop(announce=False)
        await orch.deregister("picky", "stopped")
    finally:
        await orch.stop()
        await bus.close()
        await store.close()


def test_agents_lists_status_capabilities_and_overlaps(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    db = tmp_path / "a.db"
    with caplog.at_level(logging.WARNING):
        asyncio.run(_agents_log(db))
    # the overlap is logged when the second of the two registers
    assert any("twin" in m and "drafter" in m for m in caplog.messages), caplog.messages
    kinds = [type(e.data).__name__ for e in asyncio.run(_events(db)) if e.stream == "agent-picky"]
    assert kinds == ["AgentRegistered", "AgentDeregistered"]

    r = invoke("agents", "--store", str(db), "--json")
    assert r.exit_code == 0, r.output
    rows = {x["agent_id"]: x for x in json.loads(r.stdout)}
    assert set(rows) == {"drafter", "twin", "picky"}
    assert rows["picky"]["status"] == "deregistered" and rows["picky"]["reason"] == "stopped"
    assert rows["drafter"]["status"] == "live"  # registered a moment ago, within its lease
    assert rows["drafter"]["capabilities"] == ["draft"]
    assert rows["twin"]["overlaps"] == ["drafter (100%)"]
    assert rows["drafter"]["overlaps"] == ["twin (100%)"]
    assert rows["picky"]["overlaps"] == []
    assert (rows["drafter"]["runs"], rows["drafter"]["success_rate"]) == (1, 1.0)
    assert rows["twin"]["success_rate"] is None  # never ran

    table = invoke("agents", "--store", str(db)).stdout
    # (a narrow output folds cells over lines: only whole short words are certain)
    assert all(a in table for a in ("drafter", "twin", "picky", "live")), table
