"""``cardbus run`` and ``cardbus demo`` talk while they work (tools/progress.py).

Without a terminal (CliRunner) they print plain lines: the root id first, one
line per task state change, the approve command for a task that waits for
approval, the result last; ``--json`` prints the result alone.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import threading
import time
from pathlib import Path
from typing import Any

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


def test_demo_prints_the_root_id_first_and_one_line_per_state_change(tmp_path: Path) -> None:
    db = tmp_path / "demo.db"
    result = CliRunner().invoke(cli, ["demo", "--store", str(db)])
    assert result.exit_code == 0, result.output
    lines = [line for line in result.stdout.splitlines() if not line.startswith("LLM:")]
    assert lines[0].startswith("run ") and lines[0].split()[2] == "started"
    root_id = lines[0].split()[1].rstrip(":")
    progress = [line for line in lines if line.startswith("  [")]
    assert any("research-" in line and line.endswith("completed") for line in progress)
    done, total = progress[-1].split("]")[0].strip(" [").split("/")
    assert done == total  # the last change completes the last task
    # one line per change: no two identical lines in a row
    assert all(a != b for a, b in itertools.pairwise(progress))
    assert f"Timeline of run {root_id}" in result.stdout

    as_json = CliRunner().invoke(cli, ["demo", "--store", str(tmp_path / "j.db"), "--json"])
    assert as_json.exit_code == 0, as_json.output
    assert json.loads(as_json.stdout)["status"] == "completed"
