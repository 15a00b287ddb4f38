"""Fixtures for the orchestrator tests; helper agents and queries live in ``orchkit``.

``store`` is a real SQLite file in ``tmp_path`` (``db_path``); ``make_runtime``
starts an orchestrator, an in-process bus and workers for the given agent
classes on it, and stops every runtime it made at the end of the test.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from orchkit import CARDS, Runtime

from cardbus.eventstore import SqliteEventStore


@pytest.fixture(autouse=True)
def _clear_cards() -> Iterator[None]:
    CARDS.clear()
    yield
    CARDS.clear()


@pytest.fixture
def db_path(tmp_path: Path) -> Path:
    return tmp_path / "cardbus.db"


@pytest.fixture
async def store(db_path: Path) -> AsyncIterator[SqliteEventStore]:
    s = await SqliteEventStore.open(db_path, poll_interval=0.01)
    yield s
    await s.close()


MakeRuntime = Callable[..., Awaitable[Runtime]]


@pytest.fixture
async def make_runtime(store: SqliteEventStore) -> AsyncIterator[MakeRuntime]:
    made: list[Runtime] = []

    async def make(agents: Any, **kw: Any) -> Runtime:
        rt = Runtime(kw.pop("store", store), agents, **kw)
        made.append(rt)
        return await rt.start()

    yield make
    for rt in reversed(made):
        await rt.stop()
