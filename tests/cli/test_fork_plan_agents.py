"""A fork of a finished run runs on the plan's agents by default (issue 26, item 4)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

from click.testing import CliRunner, Result
from sales_agents import SALES_PATHS

from cardbus.agents.demo import DEMO_AGENTS
from cardbus.bus.runtime.embedded import EmbeddedRuntime
from cardbus.eventstore import SqliteEventStore
from cardbus.eventstore import events as ev
from cardbus.tools.cli import cli

GOAL = "query last month's East-region sales and generate a report"
INPUTS = ["--input", "region=East", "--input", "period=2026-10"]


def invoke(*args: str) -> Result:
    return CliRunner().invoke(cli, list(args))


async def _first_completion(db: str, root: str) -> str:
    store = await SqliteEventStore.open(db, create=False)
    try:
        events = await store.read_correlation(root)
    finally:
        await store.close()
    return next(
        e.event_id
        for e in events
        if isinstance(e.data, ev.TaskCompleted) and "~plan" not in e.stream
    )


def test_a_fork_of_a_finished_run_with_no_agent_completes(tmp_path: Path) -> None:
    db = str(tmp_path / "c.db")
    agents = [a for p in SALES_PATHS for a in ("--agent", p)]
    ran = invoke("run", "--goal", GOAL, *agents, *INPUTS, "--db", db, "--json")
    assert ran.exit_code == 0, ran.output
    root = json.loads(ran.output.strip().splitlines()[-1])["root_id"]
    at = asyncio.run(_first_completion(db, root))
    forked = invoke("fork", root, "--at", at, "--db", db, "--json")
    assert forked.exit_code == 0, forked.output
    out = json.loads(forked.stdout)
    assert out["status"] == "completed", out
    assert out["reused"] and out["rerun"]


def test_a_fork_whose_agents_are_unknown_says_why_in_one_line(tmp_path: Path) -> None:
    db = str(tmp_path / "c.db")
    agents = [a for p in SALES_PATHS for a in ("--agent", p)]
    ran = invoke("run", "--goal", GOAL, *agents, *INPUTS, "--db", db, "--json")
    root = json.loads(ran.output.strip().splitlines()[-1])["root_id"]
    at = asyncio.run(_first_completion(db, root))
    # on agents that cannot do the work: the failure line says why
    forked = invoke(
        "fork", root, "--at", at, "--db", db, "--agent", "cardbus.agents.demo:Researcher"
    )
    assert forked.exit_code == 1
    (line,) = [x for x in forked.stdout.splitlines() if x.startswith("run ")]
    assert "failed" in line and "sales_report" in line, line


async def test_a_runtime_registers_its_agents_before_it_resumes_open_runs(
    tmp_path: Path,
) -> None:
    """A run left open by a process that died resumes on the next runtime's agents."""
    db = tmp_path / "c.db"
    store = await SqliteEventStore.open(db)
    try:
        rt = EmbeddedRuntime(store, DEMO_AGENTS)
        # the first process wrote the run and died before any agent answered
        await rt.orchestrator.start(agents=[a.card() for a in DEMO_AGENTS])
        root = await rt.orchestrator.submit(
            {
                "goal": "g",
                "tasks": [{"id": "r", "capability": "research", "inputs": {"topic": "x"}}],
            },
            agents=[a.agent_id for a in DEMO_AGENTS],
        )
        await rt.orchestrator.stop()
        await rt.bus.close()
        async with EmbeddedRuntime(store, DEMO_AGENTS) as again:
            result = await again.orchestrator.wait(root, 30)
        assert result.status == "completed", result
    finally:
        await store.close()
