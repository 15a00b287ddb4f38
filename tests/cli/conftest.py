"""CLI fixtures: an SQLite log holding a realistic run (tests/projections/lifecycle_log.py)."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import pytest

_ROOT = Path(__file__).resolve().parents[2]
if str(_ROOT / "tests" / "projections") not in sys.path:
    sys.path.insert(0, str(_ROOT / "tests" / "projections"))

from cardbus.eventstore import SqliteEventStore  # noqa: E402
from lifecycle_log import RunIds, write_run  # noqa: E402


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
