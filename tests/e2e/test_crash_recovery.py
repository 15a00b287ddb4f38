"""Kill the orchestrator process with SIGKILL mid-run; a new one finishes the run from the log."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import msgspec

from cardbus.eventstore import SqliteEventStore
from cardbus.eventstore import events as ev

AGENTS = """
import asyncio
import msgspec
from cardbus.agents import Agent, Capability


class N(msgspec.Struct):
    n: int


class Quick(Agent):
    agent_id = "quick"
    description = "adds one"
    capabilities = [Capability("quick", N, N, "add one")]

    async def handle(self, task, inputs, ctx):
        return N(n=inputs.n + 1)


class Slow(Agent):
    agent_id = "slow"
    description = "adds ten, slowly"
    capabilities = [Capability("slow", N, N, "add ten slowly")]

    async def handle(self, task, inputs, ctx):
        await asyncio.sleep(1.0)
        return N(n=inputs.n + 10)
"""

PLAN = {
    "plan_id": "crash-test-1",
    "goal": "survive a SIGKILL",
    "agents": ["crash_agents:Quick", "crash_agents:Slow"],
    "tasks": [
        {"id": "a", "capability": "quick", "inputs": {"n": 1}},
        {
            "id": "b",
            "capability": "slow",
            "deps": ["a"],
            "timeout_s": 2.0,
            "inputs": {"n": {"$dep": "a", "path": "n"}},
        },
        {
            "id": "c",
            "capability": "quick",
            "deps": ["b"],
            "inputs": {"n": {"$dep": "b", "path": "n"}},
        },
    ],
}


def _types(db: Path) -> list[tuple[str, str]]:
    if not db.exists():
        return []
    con = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    try:
        return con.execute("SELECT stream, type FROM events ORDER BY position").fetchall()
    except sqlite3.OperationalError:
        return []
    finally:
        con.close()


async def test_sigkill_orchestrator_mid_run_then_resume(tmp_path: Path) -> None:
    (tmp_path / "crash_agents.py").write_text(AGENTS)
    (tmp_path / "plan.json").write_text(json.dumps(PLAN))
    db = tmp_path / "run.db"
    cmd = [sys.executable, "-m", "cardbus.tools", "run", "plan.json", "--db", str(db), "--json"]
    env = {**os.environ, "PYTHONPATH": str(tmp_path)}  # crash_agents.py; cardbus is installed

    # (its output: nowhere, not the suite's stderr; killed whatever happens)
    first = subprocess.Popen(
        cmd,
        cwd=tmp_path,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 30
        while not any(s.startswith("b-") and t == "task.started.v1" for s, t in _types(db)):
            assert first.poll() is None, "the run ended before it could be killed"
            assert time.monotonic() < deadline, "task b never started"
            time.sleep(0.02)
    finally:
        if first.poll() is None:
            os.kill(first.pid, signal.SIGKILL)
        first.wait(10)
    assert first.returncode == -signal.SIGKILL
    before = _types(db)
    assert not any(t == "run.completed.v1" for _, t in before)

    second = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, timeout=60)
    assert second.returncode == 0, second.stderr.decode()
    result = json.loads(second.stdout)
    assert result["status"] == "completed"
    assert result["outputs"]["c"] == {"n": 13}

    store = await SqliteEventStore.open(db, create=False)
    try:
        events = await store.read_correlation(result["root_id"])
        assert await store.verify() == []
    finally:
        await store.close()
    by_task: dict[str, list[ev.Event]] = {}
    for e in events:
        if e.stream.split("-")[0] in ("a", "b", "c"):
            by_task.setdefault(e.stream.split("-")[0], []).append(e.data)
    completed = {k: sum(isinstance(d, ev.TaskCompleted) for d in v) for k, v in by_task.items()}
    assert completed == {"a": 1, "b": 1, "c": 1}, completed
    # finished work is not redone: a was dispatched once, before the crash
    assert sum(isinstance(d, ev.TaskDispatched) for d in by_task["a"]) == 1
    # b's first attempt died with the process: it timed out, then ran again
    assert any(isinstance(d, ev.TaskTimedOut) for d in by_task["b"])
    assert sum(isinstance(d, ev.TaskDispatched) for d in by_task["b"]) == 2
    assert sum(isinstance(e.data, ev.RunCompleted) for e in events) == 1
    assert msgspec.to_builtins(events[-1].data)["outputs"]["c"] == {"n": 13}
