"""``cardbus runs`` and ids by prefix or plan id in the commands that take one."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest
from click.testing import CliRunner, Result
from lifecycle_log import RunIds

from cardbus.agents.demo import DEMO_AGENTS, report_plan
from cardbus.bus.runtime.embedded import EmbeddedRuntime
from cardbus.eventstore import SqliteEventStore
from cardbus.tools.cli import cli


def invoke(*args: str) -> Result:
    return CliRunner().invoke(cli, list(args))


def test_runs_table_and_json(run_db: tuple[str, RunIds]) -> None:
    db, ids = run_db
    r = invoke("runs", "--db", db)
    assert r.exit_code == 0, r.output
    assert "1 run" in r.stdout
    assert ids.root in r.stdout and "write a report" in r.stdout and "plan-1" in r.stdout
    assert "failed: tasks failed" in r.stdout
    assert "3/5 (2 failed)" in r.stdout
    assert "1,235" in r.stdout  # tokens: 590 in + 645 out
    assert "75.00s" in r.stdout  # from run.started to run.failed
    rows = json.loads(invoke("runs", "--db", db, "--json").stdout)
    assert [(x["root_id"], x["status"], x["tokens"]) for x in rows] == [(ids.root, "failed", 1235)]
    assert rows[0]["duration_s"] == pytest.approx(75.0)
    assert json.loads(invoke("runs", "--db", db, "--json", "--status", "completed").stdout) == []
    since = invoke("runs", "--db", db, "--json", "--since", "2027-01-15T07:59:00Z")
    assert len(json.loads(since.stdout)) == 1
    later = invoke("runs", "--db", db, "--json", "--since", "2027-01-15T08:30:00")
    assert json.loads(later.stdout) == []
    as_of = json.loads(invoke("runs", "--db", db, "--json", "--as-of", "3").stdout)
    assert [(x["status"], x["tasks_total"]) for x in as_of] == [("running", 1)]


def test_runs_refuses_bad_options(run_db: tuple[str, RunIds]) -> None:
    db, _ = run_db
    bad = invoke("runs", "--db", db, "--status", "bogus")
    assert bad.exit_code == 2 and "awaiting_approval" in bad.output
    since = invoke("runs", "--db", db, "--since", "yesterday")
    assert since.exit_code == 2 and "30m, 2h" in since.output
    assert invoke("runs", "--db", db, "--limit", "0").exit_code == 2


def test_ids_by_prefix_in_replay_tasks_tail(run_db: tuple[str, RunIds]) -> None:
    db, ids = run_db
    r = invoke("replay", "run-", "--db", db)
    assert r.exit_code == 0, r.output
    assert f"replay of run {ids.root}" in r.stdout
    r = invoke("replay", "plan-1", "--db", db, "--json")  # by plan id
    assert json.loads(r.stdout)["root_id"] == ids.root
    r = invoke("replay", "task-", "--db", db)
    assert r.exit_code == 1 and "matches 5 ids" in r.output and ids.write in r.output
    rows = json.loads(invoke("tasks", "--db", db, "--root", "run", "--json").stdout)
    assert len(rows) == 5
    assert json.loads(invoke("tasks", "--db", db, "--root", "nope", "--json").stdout) == []
    r = invoke("tail", "--db", db, "--task", "task-wr", "-n", "100")
    assert r.exit_code == 0 and len(r.stdout.splitlines()) == 12
    assert all(f" {ids.write} " in line for line in r.stdout.splitlines())  # full ids


def _demo(db: Path, plan_id: str) -> str:
    async def go() -> str:
        store = await SqliteEventStore.open(db)
        try:
            async with EmbeddedRuntime(store, DEMO_AGENTS) as rt:
                result = await rt.run(report_plan("ocean tides", plan_id=plan_id), timeout=60)
                assert result.status == "completed"
                return result.root_id
        finally:
            await store.close()

    return asyncio.run(go())


def test_runs_and_an_8_character_prefix_on_the_demo(tmp_path: Path) -> None:
    db = tmp_path / "demo.db"
    root = _demo(db, "demo-1")
    r = invoke("runs", "--db", str(db))
    assert r.exit_code == 0, r.output
    assert root in r.stdout and "completed" in r.stdout and "6/6" in r.stdout
    r = invoke("replay", root[:8], "--db", str(db))
    assert r.exit_code == 0, r.output
    assert f"replay of run {root}" in r.stdout
    second = _demo(db, "demo-2")
    rows = json.loads(invoke("runs", "--db", str(db), "--json").stdout)
    assert [x["root_id"] for x in rows] == [second, root]  # newest first
    assert [x["plan_id"] for x in rows] == ["demo-2", "demo-1"]
    # the random end of a UUIDv7 (its start is the time, shared within a minute)
    r = invoke("replay", second[-8:], "--db", str(db), "--json")
    assert json.loads(r.stdout)["root_id"] == second
    r = invoke("replay", "demo-1", "--db", str(db), "--json")
    assert json.loads(r.stdout)["root_id"] == root
