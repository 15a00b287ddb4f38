"""Shared fixtures: every EventStore backend, made fresh per test."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from eventstore import MemoryEventStore, SqliteEventStore


@pytest.fixture
async def sqlite_store(tmp_path: Path) -> AsyncIterator[SqliteEventStore]:
    store = await SqliteEventStore.open(tmp_path / "events.db")
    yield store
    await store.close()


@pytest.fixture
async def memory_store() -> AsyncIterator[MemoryEventStore]:
    yield MemoryEventStore()
