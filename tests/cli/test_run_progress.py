"""``cardbus run`` and ``cardbus demo`` talk while they work (tools/progress.py).

Without a terminal (CliRunner) ``run`` prints plain lines: the root id first, one
line per task state change, the approve command for a task that waits for
approval, the result last; ``--json`` prints the result alone. ``demo`` prints the
root id, then sums the run up on one screen.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from cardbus.bus.orchestrator.core import answer_approval
from cardbus.eventstore import SqliteEventStore
from cardbus.eventstore import events as ev
from cardbus.tools.cli import cli

PLAN = {
    "goal": "Research tides, once a human agrees",
    "agents": ["cardbus.agents.demo:Researcher"],
    "tasks": [
        {
            "id": "research",
            "capability": "research",
            "inputs": {"topic": "tides"},
            "requires_approval": True,
        }
    ],
}


async def _approve_when_asked(db: Path, deadline: float) -> str:
    """Wait for the approval request in the log, then grant it (as another process would)."""
    while time.monotonic() < deadline:
        if db.exists():
            store = await SqliteEventStore.open(db)
            try:
                for env in await store.read_all(1, 10_000):
                    if isinstance(env.data, ev.ApprovalRequested):
                        await answer_approval(store, env.stream, True, "test")
                        return env.stream
            finally:
                await store.close()
        await asyncio.sleep(0.05)
    raise AssertionError("no approval was requested")


def _run_and_approve(args: list[str], db: Path) -> tuple[Any, str]:
    """``cardbus run`` in a thread; this thread answers the approval it asks for."""
    out: list[Any] = []
    t = threading.Thread(target=lambda: out.append(CliRunner().invoke(cli, args)))
    t.start()
    try:
        task_id = asyncio.run(_approve_when_asked(db, time.monotonic() + 60))
    finally:
        t.join(90)
    assert out, "cardbus run did not finish"
    return out[0], task_id


def test_run_prints_the_root_id_first_then_progress_and_the_approve_command(
    tmp_path: Path,
) -> None:
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps(PLAN))
    db = tmp_path / "log.db"
    result, task_id = _run_and_approve(["run", str(plan), "--store", str(db)], db)
    assert result.exit_code == 0, result.output
    lines = [line for line in result.stdout.splitlines() if not line.startswith("LLM:")]
    root_id = lines[0].split()[1].rstrip(":")  # the first line names the run
    assert lines[0] == f"run {root_id}: started (follow it: cardbus replay {root_id} --store {db})"
    waiting = [line for line in lines if "awaiting_approval" in line]
    assert len(waiting) == 1
    assert f"cardbus approve {task_id} --store {db}" in waiting[0]
    mine = [line for line in lines if line.startswith("  [") and task_id in line]
    states = [line.split()[3].rstrip(";") for line in mine]
    assert states[0] == "pending" and states[-1] == "completed"
    assert states.index("awaiting_approval") < states.index("completed")
    assert lines[-1] == f"run {root_id}: completed"


def test_run_json_prints_the_result_alone(tmp_path: Path) -> None:
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps(PLAN))
    db = tmp_path / "log.db"
    result, _ = _run_and_approve(["run", str(plan), "--store", str(db), "--json"], db)
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)  # the whole of stdout is one JSON document
    assert doc["status"] == "completed" and "research" in doc["outputs"]
    assert "cardbus approve" not in result.stdout


def test_demo_prints_the_root_id_first_then_sums_the_run_up_on_one_screen(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The demo fits a screen: about 40 lines of at most 100 columns (the default store,
    as ``make demo`` runs it), no line per state change off a terminal (it sums the run
    up from the log after), and it ends with where to go next."""
    monkeypatch.chdir(tmp_path)  # the default store, ./cardbus.db, in a folder of its own
    for name in ("CARDBUS_STORE", "CARDBUS_DB", "OPENAI_BASE_URL", "CARDBUS_MODEL"):
        monkeypatch.delenv(name, raising=False)
    result = CliRunner().invoke(cli, ["demo"])
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()  # stdout and stderr (the LLM line), as a screen
    assert len(lines) <= 40, len(lines)
    too_wide = [line for line in lines if len(line) > 100]
    assert not too_wide, too_wide
    out = result.stdout.splitlines()
    assert out[0].startswith("run ") and out[0].split()[2] == "started"
    root_id = out[0].split()[1].rstrip(":")
    assert out[1].startswith(f"run {root_id}: completed in ")
    assert not [line for line in out if line.startswith("  [")]  # no per-change lines
    story = out[out.index(next(x for x in out if x.startswith("The run, read back"))) :]
    assert any("research-" in x and "researcher" in x and "1 tool call" in x for x in story)
    assert any("needs input: figures about ocean tides" in x for x in story)
    assert any("revised after review (round 1)" in x for x in story)
    assert out[-4] == "Where next:"
    assert out[-3].split()[:3] == ["cardbus", "replay", root_id]
    assert out[-2].split()[:2] == ["cardbus", "ui"] and "first-agent.md" in out[-1]

    as_json = CliRunner().invoke(cli, ["demo", "--store", str(tmp_path / "j.db"), "--json"])
    assert as_json.exit_code == 0, as_json.output
    assert json.loads(as_json.stdout)["status"] == "completed"
