"""Tables fit 100 columns without cutting a token (issue 16 item 7).

Each table command renders on a 100-column terminal: no line is longer, and every
full id (task, root, agent) of the log appears intact on some line. Without the
stacked layout these tables need more than 100 columns (checked too, so the
test fails if a table quietly stops holding its ids).
"""

from __future__ import annotations

import asyncio

import pytest
from click.testing import CliRunner
from lifecycle_log import RunIds

from cardbus.eventstore import SqliteEventStore
from cardbus.eventstore import events as ev
from cardbus.tools import cmd_inspect
from cardbus.tools.cli import cli
from cardbus.tools.cmd_inspect import fits


async def _ids(db: str) -> dict[str, set[str]]:
    store = await SqliteEventStore.open(db, create=False)
    try:
        events = await store.read_all(1, 100_000)
    finally:
        await store.close()
    return {
        "task": {e.stream for e in events if isinstance(e.data, ev.TaskCreated)},
        "root": {e.stream for e in events if isinstance(e.data, ev.RunStarted)},
        "agent": {e.data.agent_id for e in events if isinstance(e.data, ev.AgentRegistered)},
        "worked": {e.data.agent_id for e in events if isinstance(e.data, ev.TaskDispatched)},
    }


@pytest.fixture(scope="module")
def demo_db(tmp_path_factory: pytest.TempPathFactory) -> str:
    db = str(tmp_path_factory.mktemp("fit") / "demo.db")
    out = CliRunner().invoke(cli, ["demo", "--store", db, "--json"])
    assert out.exit_code == 0, out.output
    return db


def _show(*args: str) -> list[str]:
    out = CliRunner().invoke(cli, list(args))
    assert out.exit_code == 0, out.output
    return out.stdout.splitlines()


def _check(lines: list[str], ids: set[str]) -> None:
    assert lines
    too_long = [line for line in lines if len(line) > 100]
    assert not too_long, too_long
    text = "\n".join(lines)
    missing = [i for i in ids if not any(i in line for line in lines)]
    assert not missing, (missing, text)


@pytest.mark.parametrize("which", ["demo", "lifecycle"])
def test_tasks_runs_stats_agents_and_tail_fit_100_columns(
    which: str, demo_db: str, run_db: tuple[str, RunIds], monkeypatch: pytest.MonkeyPatch
) -> None:
    # a terminal 100 columns wide (off a terminal tables fit 100 too; tail lines do not wrap)
    monkeypatch.setattr(cmd_inspect, "out_width", lambda default=None: 100)
    db = demo_db if which == "demo" else run_db[0]
    ids = asyncio.run(_ids(db))
    _check(_show("tasks", "--wide", "--store", db), ids["task"] | ids["root"])
    _check(_show("runs", "--store", db), ids["root"])
    _check(_show("stats", "--store", db), ids["worked"])
    if ids["agent"]:
        _check(_show("agents", "--store", db), ids["agent"])
    tail = _show("tail", "-n", "1000", "--store", db)
    _check(tail, ids["task"])


def test_tables_fit_100_columns_off_a_terminal_too(demo_db: str) -> None:
    ids = asyncio.run(_ids(demo_db))
    _check(_show("tasks", "--wide", "--store", demo_db), ids["task"] | ids["root"])
    _check(_show("runs", "--store", demo_db), ids["root"])


def test_the_task_table_needs_the_stacked_layout_at_100_columns(demo_db: str) -> None:
    """The plain table of the demo's tasks cannot hold its ids in 100 columns."""
    from rich.console import Console
    from rich.table import Table

    ids = asyncio.run(_ids(demo_db))
    table = Table()
    for col in ("task", "root", "capability", "agent", "status", "att", "updated", "reason"):
        table.add_column(col)
    root = next(iter(ids["root"]))
    for task in ids["task"]:
        table.add_row(task, root, "research", "researcher", "completed", "1", "2026-01-01", "")
    assert not fits(Console(width=100), table, 100)
    assert fits(Console(width=300), table, 300)
