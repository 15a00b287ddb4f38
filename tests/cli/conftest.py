"""CLI fixtures: an SQLite log holding a realistic run (tests/projections/lifecycle_log.py),
a headless Chromium and a page of it (chromium.py), and the ``cardbus run`` processes
of a test, reaped after it (doors.py)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from lifecycle_log import RunIds, write_run

from cardbus.eventstore import SqliteEventStore
from tests.cli.chromium import launched, watched_page
from tests.cli.doors import Runs


async def _populate(path: Path) -> RunIds:
    store = await SqliteEventStore.open(path)
    try:
        return await write_run(store)
    finally:
        await store.close()


@pytest.fixture
def run_db(tmp_path: Path) -> tuple[str, RunIds]:
    path = tmp_path / "cardbus.db"
    ids = asyncio.run(_populate(path))
    return str(path), ids


@pytest.fixture
def db(tmp_path: Path) -> Path:
    """An empty SQLite log, created (a console opens only a log that exists)."""
    path = tmp_path / "log.db"

    async def create() -> None:
        await (await SqliteEventStore.open(path)).close()

    asyncio.run(create())
    return path


@pytest.fixture
def browser() -> Iterator[Any]:
    """A headless Chromium (the system's; skipped without one, failed on CI)."""
    yield from launched()


@pytest.fixture
def page(browser: Any) -> Iterator[Any]:
    """A page of ``browser``; the test fails if a script on it raised."""
    yield from watched_page(browser)


@pytest.fixture
def runs() -> Iterator[Runs]:
    """Start ``cardbus run`` processes with ``runs.start``: each is killed (if still
    going) and waited for when the test ends, a failed assertion included."""
    started = Runs()
    try:
        yield started
    finally:
        started.reap()
