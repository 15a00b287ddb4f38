"""Two processes, one SQLite log: a second ``cardbus run`` waits its turn and then works.

Both orchestrators follow the same log and decide on every open run they see;
appends carry the expected version, so a race is a ``ConcurrencyError``
(read again, decided again), never a duplicate. Checked with two real
``cardbus run`` subprocesses started together on one file, three times.
"""

from __future__ import annotations

import asyncio
import json
import sqlite3
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from cardbus.eventstore import SqliteEventStore
from cardbus.eventstore import events as ev

AGENTS = ["cardbus.agents.demo:Researcher", "cardbus.agents.demo:Writer"]


def plan_file(tmp_path: Path, name: str) -> Path:
    tasks = [
        {"id": f"r{i}", "capability": "research", "inputs": {"topic": f"tides {i}"}}
        for i in range(3)
    ]
    path = tmp_path / f"{name}.json"
    path.write_text(json.dumps({"plan_id": name, "goal": name, "agents": AGENTS, "tasks": tasks}))
    return path


def cardbus(*args: str | Path) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "cardbus.tools", *map(str, args)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


async def _story(db: Path) -> list[str]:
    """The log as one line per event (position, seconds since the first event, stream,
    type, attempt, agent, reason, orchestrator, actor): what a failure message needs to
    tell which process left which attempt where."""
    store = await SqliteEventStore.open(db)
    try:
        envs = await store.read_all(0, 1_000_000)
    finally:
        await store.close()
    t0 = envs[0].recorded_at if envs else 0.0
    return [
        " ".join(
            str(x)
            for x in (
                e.position,
                f"+{e.recorded_at - t0:.2f}s",
                e.stream[-12:],
                type(e.data).__name__,
                getattr(e.data, "attempt", ""),
                getattr(e.data, "agent_id", ""),
                getattr(e.data, "replica_id", ""),
                getattr(e.data, "reason", ""),
                getattr(e.data, "orchestrator_id", ""),
                getattr(e.data, "pid", ""),
                f"by={e.actor}",
            )
        )
        for e in envs
    ]


async def _why(db: Path, procs: list[subprocess.Popen[str]], outs: list[tuple[str, str]]) -> str:
    """Why a run did not complete, in full (pytest cuts a long assertion message): each
    process's exit, orchestrator (its ``orchestrator.started`` carries its pid), stdout and
    stderr tails; the tasks not completed and who dispatched their attempts; the log's tail."""
    store = await SqliteEventStore.open(db)
    try:
        envs = await store.read_all(0, 1_000_000)
    finally:
        await store.close()
    started = {
        e.data.pid: e.data.orchestrator_id
        for e in envs
        if isinstance(e.data, ev.OrchestratorStarted)
    }
    lines = []
    for i, (p, (out, err)) in enumerate(zip(procs, outs, strict=True)):
        lines += [
            f"--- process p{i} pid={p.pid} exit={p.returncode} "
            f"orchestrator={started.get(p.pid, '?')}",
            f"stdout tail: {out[-1500:]}",
            f"stderr tail:\n{err[-3000:]}",
        ]
    done = {e.stream for e in envs if isinstance(e.data, ev.TaskCompleted)}
    created = [e for e in envs if isinstance(e.data, ev.TaskCreated)]
    lines.append("--- tasks not completed (stream: last event; dispatches by whom to whom)")
    for c in created:
        if c.stream in done:
            continue
        mine = [e for e in envs if e.stream == c.stream]
        sent = [
            f"#{e.data.attempt} by={e.actor} to={e.data.agent_id}"
            for e in mine
            if isinstance(e.data, ev.TaskDispatched)
        ]
        lines.append(f"{c.stream}: {type(mine[-1].data).__name__} by={mine[-1].actor}; {sent}")
    story = await _story(db)
    lines += ["--- the log's last 80 events", *story[-80:]]
    return "\n".join(lines)


@pytest.mark.parametrize("round_", range(3))
async def test_two_cardbus_runs_on_one_file_both_complete_without_duplicates(
    tmp_path: Path, round_: int
) -> None:
    db = tmp_path / "shared.db"
    procs = [
        cardbus("run", plan_file(tmp_path, f"p{i}"), "--store", db, "--timeout", "60", "--json")
        for i in range(2)
    ]
    outs = []
    for p in procs:
        try:
            outs.append(p.communicate(timeout=120))
        except subprocess.TimeoutExpired:
            p.kill()  # hung past its own --timeout: what the log says is the reason
            outs.append(p.communicate())
    for p, (out, err) in zip(procs, outs, strict=True):
        last = out.splitlines()[-1] if out.strip() else "{}"
        if p.returncode != 0 or json.loads(last).get("status") != "completed":
            pytest.fail(await _why(db, procs, outs), pytrace=False)
        assert "Traceback" not in err and "locked" not in err, err[-2000:]
    verify = subprocess.run(
        [sys.executable, "-m", "cardbus.tools", "verify", "--store", str(db)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert verify.returncode == 0, verify.stdout + verify.stderr
    store = await SqliteEventStore.open(db)
    try:
        envs = await store.read_all(0, 1_000_000)
    finally:
        await store.close()
    versions = Counter((e.stream, e.version) for e in envs)
    assert [k for k, n in versions.items() if n > 1] == []
    assert [e.position for e in envs] == list(range(1, len(envs) + 1))
    completions = Counter(e.stream for e in envs if isinstance(e.data, ev.TaskCompleted))
    assert len(completions) == 6 and set(completions.values()) == {1}  # each task once
    dispatches = Counter(
        (e.stream, e.data.attempt) for e in envs if isinstance(e.data, ev.TaskDispatched)
    )
    assert set(dispatches.values()) == {1}  # no attempt decided twice
    runs = [e for e in envs if isinstance(e.data, (ev.RunCompleted, ev.RunFailed))]
    assert sorted(type(e.data).__name__ for e in runs) == ["RunCompleted", "RunCompleted"]


async def test_a_run_waits_for_another_process_holding_the_write_lock(tmp_path: Path) -> None:
    db = tmp_path / "locked.db"
    store = await SqliteEventStore.open(db)  # create the log
    await store.close()
    holder = sqlite3.connect(db, isolation_level=None)
    holder.execute("BEGIN IMMEDIATE")  # another process in the middle of a write
    run = cardbus("run", plan_file(tmp_path, "waits"), "--store", db, "--timeout", "60", "--json")
    await asyncio.sleep(1.5)
    assert run.poll() is None  # still waiting its turn: not "database is locked" at once
    holder.execute("COMMIT")
    holder.close()
    out, err = run.communicate(timeout=120)
    assert run.returncode == 0, (out, err[-2000:])
    assert json.loads(out.splitlines()[-1])["status"] == "completed"
