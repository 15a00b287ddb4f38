"""The host's crash is not the agent's fault: `cardbus run` killed with SIGKILL while a task
is in flight, again and again, costs the task none of its attempts (``hostloss``), and a
separate bound (``max_host_losses``) ends a run that loses its host every time."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

from cardbus.eventstore import SqliteEventStore
from cardbus.eventstore import events as ev

# The agent answers only once a file named "go" is in its working directory: until then
# each process is killed with the task in its hands.
AGENTS = """
import asyncio
from pathlib import Path

import msgspec
from cardbus.agents import Agent, Capability


class N(msgspec.Struct):
    n: int


class Held(Agent):
    agent_id = "held"
    description = "adds one, once allowed to"
    capabilities = [Capability("held", N, N, "add one when allowed")]

    async def handle(self, task, inputs, ctx):
        while not Path("go").exists():
            await asyncio.sleep(0.05)
        return N(n=inputs.n + 1)
"""


def _plan(retry: dict[str, int]) -> dict[str, object]:
    return {
        "plan_id": "host-loss",
        "goal": "survive the host",
        "agents": ["held_agents:Held"],
        "tasks": [
            {"id": "t", "capability": "held", "inputs": {"n": 1}, "timeout_s": 600, "retry": retry}
        ],
    }


def _started(db: Path) -> int:
    """How many attempts of task t an agent has taken (its task.started events)."""
    if not db.exists():
        return 0
    con = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    try:
        (n,) = con.execute(
            "SELECT count(*) FROM events WHERE stream LIKE 't-%' AND type = 'task.started.v1'"
        ).fetchone()
        return int(n)
    except sqlite3.OperationalError:  # not created yet
        return 0
    finally:
        con.close()


def _kill_in_flight(tmp_path: Path, cmd: list[str], env: dict[str, str], times: int) -> None:
    """Start `cardbus run` and SIGKILL it once its agent holds the task, ``times`` times."""
    db = tmp_path / "run.db"
    for k in range(1, times + 1):
        # its output goes nowhere: a run left behind (its agent waits for "go" forever)
        # must not hold the suite's stderr, and it is killed whatever happens
        proc = subprocess.Popen(
            cmd,
            cwd=tmp_path,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        try:
            deadline = time.monotonic() + 60
            while _started(db) < k:  # this process's attempt is in the agent's hands
                assert proc.poll() is None, f"run {k} ended before it could be killed"
                assert time.monotonic() < deadline, f"run {k}: the task never started"
                time.sleep(0.02)
        finally:
            if proc.poll() is None:
                os.kill(proc.pid, signal.SIGKILL)
            proc.wait(10)
        assert proc.returncode == -signal.SIGKILL


def _setup(tmp_path: Path, retry: dict[str, int]) -> tuple[list[str], dict[str, str]]:
    (tmp_path / "held_agents.py").write_text(AGENTS)
    (tmp_path / "plan.json").write_text(json.dumps(_plan(retry)))
    db = tmp_path / "run.db"
    cmd = [sys.executable, "-m", "cardbus.tools", "run", "plan.json", "--db", str(db), "--json"]
    return cmd, {**os.environ, "PYTHONPATH": str(tmp_path)}


async def _task_events(db: Path, root_id: str) -> list[ev.Event]:
    store = await SqliteEventStore.open(db, create=False)
    try:
        assert await store.verify() == []
        return [e.data for e in await store.read_correlation(root_id) if e.stream[:2] == "t-"]
    finally:
        await store.close()


async def test_three_host_crashes_spend_none_of_the_tasks_attempts(tmp_path: Path) -> None:
    # two attempts allowed, three processes killed with the task in flight
    cmd, env = _setup(tmp_path, {"max_attempts": 2})
    _kill_in_flight(tmp_path, cmd, env, times=3)

    (tmp_path / "go").touch()
    last = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, timeout=120)
    assert last.returncode == 0, last.stderr.decode()
    result = json.loads(last.stdout)
    assert result["status"] == "completed" and result["outputs"]["t"] == {"n": 2}

    events = await _task_events(tmp_path / "run.db", result["root_id"])
    timed_out = [d for d in events if isinstance(d, ev.TaskTimedOut)]
    assert [(d.attempt, d.reason) for d in timed_out] == [
        (1, "host_lost"),
        (2, "host_lost"),
        (3, "host_lost"),
    ]
    retries = [d.reason for d in events if isinstance(d, ev.TaskRetryScheduled)]
    assert len(retries) == 3 and all(r.startswith("host_lost: ") for r in retries), retries
    assert "host loss 3 of 5" in retries[-1]
    assert [d.attempt for d in events if isinstance(d, ev.TaskDispatched)] == [1, 2, 3, 4]
    completed = [d for d in events if isinstance(d, ev.TaskCompleted)]
    assert [(d.attempt, d.agent_id) for d in completed] == [(4, "held")]

    # replay says the host was lost, and blames no agent
    replay = subprocess.run(
        [sys.executable, "-m", "cardbus.tools", "replay", result["root_id"], "--db", "run.db"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert replay.returncode == 0, replay.stderr
    assert replay.stdout.count("lost with its host") == 3, replay.stdout
    assert replay.stdout.count("retry as attempt") == 3
    assert "agent_error" not in replay.stdout and "agent_lost" not in replay.stdout


async def test_a_run_that_loses_its_host_every_time_ends_with_the_reason(tmp_path: Path) -> None:
    # one host loss is retried; the second fails the task, whatever max_attempts says
    cmd, env = _setup(tmp_path, {"max_attempts": 5, "max_host_losses": 1})
    _kill_in_flight(tmp_path, cmd, env, times=2)

    last = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, timeout=120)
    assert last.returncode != 0
    result = json.loads(last.stdout)
    assert result["status"] == "failed"

    events = await _task_events(tmp_path / "run.db", result["root_id"])
    assert [d.reason for d in events if isinstance(d, ev.TaskTimedOut)] == ["host_lost"] * 2
    (failed,) = [d for d in events if isinstance(d, ev.TaskFailed)]
    assert (failed.reason, failed.attempts) == ("host_lost", 2)
    assert "2 times" in failed.error and "max_host_losses is 1" in failed.error
    # the task was not dispatched again after its second host loss
    assert [d.attempt for d in events if isinstance(d, ev.TaskDispatched)] == [1, 2]
