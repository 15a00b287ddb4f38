"""CLI fixtures: an SQLite log holding a realistic run (tests/projections/lifecycle_log.py)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from lifecycle_log import RunIds, write_run

from cardbus.eventstore import SqliteEventStore


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
