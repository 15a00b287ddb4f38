"""``cardbus run --priority`` keeps the run's priority on its ``run.started``."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from cardbus.eventstore import SqliteEventStore
from cardbus.eventstore import events as ev
from cardbus.tools.cli import cli

AGENTS = """
import msgspec
from cardbus import Agent, Capability

class Text(msgspec.Struct):
    text: str = ""

class Echo(Agent):
    agent_id = "echo"
    capabilities = [Capability("echo", Text, Text, "says it back")]

    async def handle(self, task, inputs, ctx):
        return Text(text="back")
"""


def test_run_priority_is_kept_on_run_started(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "prioagents.py").write_text(AGENTS)
    monkeypatch.syspath_prepend(str(tmp_path))
    plan = tmp_path / "plan.json"
    plan.write_text(
        json.dumps(
            {
                "goal": "echo",
                "agents": ["prioagents:Echo"],
                "tasks": [{"id": "a", "capability": "echo"}],
            }
        )
    )
    db = str(tmp_path / "log.db")
    r = CliRunner().invoke(cli, ["run", str(plan), "--store", db, "--priority", "7"])
    assert r.exit_code == 0, r.output
    assert [s.priority for s in asyncio.run(_started(db))] == [7]


async def _started(db: str) -> list[ev.RunStarted]:
    store = await SqliteEventStore.open(db)
    try:
        events = await store.read_all(1, 1000)
    finally:
        await store.close()
    return [e.data for e in events if isinstance(e.data, ev.RunStarted)]


def test_run_limits_file_configures_the_process_pacer(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from cardbus.agents import pacing

    monkeypatch.setattr(pacing, "_process_pacer", None)  # this test's own process pacer
    (tmp_path / "prioagents.py").write_text(AGENTS)
    monkeypatch.syspath_prepend(str(tmp_path))
    plan = tmp_path / "plan.json"
    plan.write_text(
        json.dumps(
            {
                "goal": "echo",
                "agents": ["prioagents:Echo"],
                "tasks": [{"id": "a", "capability": "echo"}],
            }
        )
    )
    limits = tmp_path / "limits.toml"
    limits.write_text('[models."gpt-4o*"]\nrequests_per_minute = 500\n')
    db = str(tmp_path / "log.db")
    r = CliRunner().invoke(cli, ["run", str(plan), "--store", db, "--limits", str(limits)])
    assert r.exit_code == 0, r.output
    key = ("api.openai.com", "gpt-4o-mini", "k")
    assert pacing.process_pacer().limits.limit_for(key) == pacing.Limit(requests_per_minute=500)
    # a bad file is a usage error that names it, from the flag or from CARDBUS_LIMITS
    limits.write_text('[models."gpt-4o*"]\nrequests_per_minute = "lots"\n')
    for args, env in (
        (["--limits", str(limits)], {}),
        ([], {"CARDBUS_LIMITS": str(limits)}),
    ):
        r = CliRunner().invoke(cli, ["run", str(plan), "--store", db, *args], env=env)
        assert r.exit_code == 2 and "requests_per_minute must be a positive number" in r.output
