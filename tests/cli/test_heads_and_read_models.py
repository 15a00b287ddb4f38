"""``verify --head`` says whether the signature was checked; a stale read model is
rebuilt with one line, never served silently (issue 26, item 2)."""

from __future__ import annotations

import asyncio
import json
import sqlite3
from pathlib import Path

from click.testing import CliRunner, Result
from lifecycle_log import RunIds

from cardbus.eventstore import SqliteEventStore
from cardbus.projections import ProjectionRunner, TaskTable
from cardbus.projections.runner import projection_path
from cardbus.tools.cli import cli


def invoke(*args: str) -> Result:
    return CliRunner().invoke(cli, list(args), catch_exceptions=False)


def test_a_signed_head_without_the_key_is_refused_saying_it_was_not_checked(
    run_db: tuple[str, RunIds], tmp_path: Path
) -> None:
    db, _ = run_db
    key = tmp_path / "key"
    key.write_text("s3cret\n")
    kept = tmp_path / "head.json"
    kept.write_text(invoke("head", "--db", db, "--key-file", str(key)).stdout)
    r = invoke("verify", "--db", db, "--head", str(kept))
    assert r.exit_code == 1
    assert "signature was not checked" in r.stderr and "--key-file" in r.stderr
    assert "OK" not in r.stdout
    ok = invoke("verify", "--db", db, "--head", str(kept), "--key-file", str(key))
    assert ok.exit_code == 0 and "its signature checked" in ok.stdout
    out = json.loads(
        invoke("verify", "--db", db, "--head", str(kept), "--key-file", str(key), "--json").stdout
    )
    assert out["signature"] == "checked"


def test_an_unsigned_head_is_accepted_only_with_a_warning(
    run_db: tuple[str, RunIds], tmp_path: Path
) -> None:
    db, _ = run_db
    kept = tmp_path / "head.json"
    kept.write_text(invoke("head", "--db", db).stdout)
    r = invoke("verify", "--db", db, "--head", str(kept))
    assert r.exit_code == 0
    assert "unsigned, not checked" in r.stdout
    assert r.stderr.count("warning:") == 1 and "unsigned" in r.stderr
    out = json.loads(invoke("verify", "--db", db, "--head", str(kept), "--json").stdout)
    assert out["signature"] == "unsigned"


def _completed_task(db: str, ids: RunIds) -> tuple[str, int]:
    """A task that completed, and the position of its task.completed."""
    with sqlite3.connect(db) as c:
        rows = c.execute(
            "SELECT stream, position FROM events WHERE type = 'task.completed.v1'"
            " ORDER BY position DESC"
        ).fetchall()
    stream, position = rows[0]
    return str(stream), int(position)


def test_after_the_tail_is_cut_tasks_does_not_show_the_cut_off_task_completed(
    run_db: tuple[str, RunIds],
) -> None:
    db, ids = run_db
    shown = invoke("tasks", "--db", db, "--json")
    assert shown.exit_code == 0, shown.output
    task, position = _completed_task(db, ids)
    before = {t["task_id"]: t for t in json.loads(shown.stdout)}
    assert before[task]["status"] == "completed"
    with sqlite3.connect(db) as c:  # the tail cut, from that task's completion on
        c.execute("DELETE FROM events WHERE position >= ?", (position,))
    again = invoke("tasks", "--db", db, "--json")
    assert again.exit_code == 0
    after = {t["task_id"]: t for t in json.loads(again.stdout)}
    assert after[task]["status"] != "completed"
    assert again.stderr.count("\n") == 1 and "beyond the log's end" in again.stderr
    assert "rebuilt" in again.stderr
    quiet = invoke("tasks", "--db", db, "--json")
    assert quiet.stderr == ""  # said once: the model is current now


def test_a_checkpoint_at_another_event_is_rebuilt(tmp_path: Path) -> None:
    """The log replaced by another of the same length: the hash tells them apart."""
    from cardbus.eventstore import NewEvent
    from cardbus.eventstore import events as ev

    async def fill(path: Path, goal: str) -> None:
        store = await SqliteEventStore.open(path)
        try:
            created = ev.TaskCreated(root_id="t1", capability="c", goal=goal, inputs={})
            await store.append("t1", [NewEvent(data=created, correlation_id="t1")], 0)
        finally:
            await store.close()

    async def fold(path: Path) -> tuple[list[str], str]:
        store = await SqliteEventStore.open(path)
        try:
            with ProjectionRunner.open(store, projection_path(path), [TaskTable()]) as runner:
                await runner.catch_up()
                (goal,) = [r[0] for r in runner.conn.execute("SELECT goal FROM proj_tasks")]
                return runner.notices, goal
        finally:
            await store.close()

    db = tmp_path / "c.db"
    asyncio.run(fill(db, "first"))
    assert asyncio.run(fold(db)) == ([], "first")
    db.unlink()
    asyncio.run(fill(db, "second"))
    notices, goal = asyncio.run(fold(db))
    assert goal == "second"
    assert len(notices) == 1 and "not the one it folded" in notices[0]
