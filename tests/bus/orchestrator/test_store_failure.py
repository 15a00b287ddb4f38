"""A log that cannot be written (disk full) ends the run at once; the log stays intact.

The disk is made full with SQLite's own limit (``PRAGMA max_page_count`` on
the store's write connection): the store then fails every write with
SQLITE_FULL exactly as on a full disk. Before, the orchestrator decided the
same step again and again (a million error lines in two minutes) until the
caller's timeout.
"""

from __future__ import annotations

import asyncio
import logging
import time
from pathlib import Path

import pytest

from cardbus import EmbeddedRuntime, SqliteEventStore, StoreUnavailable
from cardbus.agents.demo import DEMO_AGENTS, report_plan


async def test_a_full_disk_ends_the_run_at_once_and_the_log_verifies(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "full.db"
    store = await SqliteEventStore.open(path)
    loop = asyncio.get_running_loop()
    pages = await loop.run_in_executor(
        store._executor,  # the writer's own thread and connection
        lambda: store._writer.conn.execute("PRAGMA page_count").fetchone()[0],
    )
    await loop.run_in_executor(
        store._executor,
        lambda: store._writer.conn.execute(f"PRAGMA max_page_count={pages + 8}"),
    )
    t0 = time.monotonic()
    with caplog.at_level(logging.ERROR):
        async with EmbeddedRuntime(store, DEMO_AGENTS) as rt:
            with pytest.raises(StoreUnavailable, match="full"):
                await rt.run(report_plan("ocean tides"), timeout=60)
    assert time.monotonic() - t0 < 10  # not the 60 s timeout
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert 1 <= len(errors) <= 3, [r.getMessage() for r in errors]  # said once, not in a loop
    await store.close()
    found, head = await SqliteEventStore.verify_file(path)
    assert found == [] and head.position > 0
