"""``cardbus tasks``: one line per task at 80, 100 and 120 columns, ``COLUMNS`` honoured
when piped (whole rows without it), short ids that ``replay`` takes back, ``--wide`` for
full ids. (pytest-xdist's workers set ``COLUMNS=80``: each test sets or unsets it.)"""

from __future__ import annotations

import asyncio
import json

import pytest
from click.testing import CliRunner
from lifecycle_log import write_run

from cardbus.eventstore import SqliteEventStore
from cardbus.tools.cli import cli


@pytest.fixture(scope="module")
def demo_db(tmp_path_factory: pytest.TempPathFactory) -> str:
    db = str(tmp_path_factory.mktemp("tasks") / "demo.db")
    out = CliRunner().invoke(cli, ["demo", "--store", db, "--json"])
    assert out.exit_code == 0, out.output
    return db


def _tasks(db: str, columns: str | None, *args: str) -> list[str]:
    r = CliRunner(env={"COLUMNS": columns}).invoke(cli, ["tasks", "--store", db, *args])
    assert r.exit_code == 0, r.output
    return r.stdout.splitlines()


@pytest.mark.parametrize("columns", ["80", "100", "120"])
def test_one_line_per_task_within_columns(demo_db: str, columns: str) -> None:
    rows = json.loads(CliRunner().invoke(cli, ["tasks", "--store", demo_db, "--json"]).stdout)
    lines = _tasks(demo_db, columns)
    assert len(lines) == len(rows) + 2, lines  # title, header, one line per task
    assert all(len(line) <= int(columns) for line in lines), lines
    # the run's id in full in the title; each task's short id resolves to it
    assert rows[0]["root_id"] in lines[0]
    for line, row in zip(lines[2:], rows, strict=True):
        short = line.split()[0]
        assert row["task_id"].endswith(short) or row["task_id"] == short
        r = CliRunner().invoke(cli, ["replay", short, "--store", demo_db, "--json"])
        assert r.exit_code == 0, r.output
        assert json.loads(r.stdout)["id"] == row["task_id"]


def test_columns_is_honoured_when_piped_and_wide_keeps_full_ids(demo_db: str) -> None:
    narrow = _tasks(demo_db, "64")
    assert max(len(line) for line in narrow) <= 64  # piped, COLUMNS honoured
    assert "…" in "".join(narrow)  # capability and agent shrink; ids and status do not
    # piped without COLUMNS: whole rows, one per line
    rows_ = json.loads(CliRunner().invoke(cli, ["tasks", "--store", demo_db, "--json"]).stdout)
    whole = CliRunner().invoke(cli, ["tasks", "--store", demo_db], env={"COLUMNS": None})
    assert len(whole.stdout.splitlines()) == len(rows_) + 2 and "…" not in whole.stdout
    wide = "\n".join(_tasks(demo_db, "100", "--wide"))
    rows = json.loads(CliRunner().invoke(cli, ["tasks", "--store", demo_db, "--json"]).stdout)
    assert all(r["task_id"] in wide for r in rows)


def test_several_runs_get_a_root_column_of_short_ids(tmp_path: object) -> None:
    db = str(tmp_path) + "/two.db"  # type: ignore[operator]

    async def write() -> list[str]:
        store = await SqliteEventStore.open(db)
        try:
            a = await write_run(store, prefix="a-")
            b = await write_run(store, prefix="b-", t0=1_800_000_100.0)
            return [a.root, b.root]
        finally:
            await store.close()

    roots = asyncio.run(write())
    lines = _tasks(db, "100")
    assert lines[1].split()[:2] == ["task", "root"]
    assert all(len(line.split()[1]) <= 12 for line in lines[2:])
    assert len(lines) == 2 + 10 and all(len(line) <= 100 for line in lines)
    shown = {line.split()[1] for line in lines[2:]}
    assert len(shown) == 2
    for short in shown:
        r = CliRunner().invoke(cli, ["replay", short, "--store", db, "--json"])
        assert r.exit_code == 0, r.output
        assert json.loads(r.stdout)["root_id"] in roots
