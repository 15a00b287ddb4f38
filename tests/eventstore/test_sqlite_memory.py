"""What the SQLite store keeps in memory: bounded page caches, stream heads packed."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from cardbus.eventstore import NewEvent, SqliteEventStore
from cardbus.eventstore import events as ev
from cardbus.eventstore.envelope import GENESIS_HASH
from cardbus.eventstore.sqlite_heads import StreamHeads
from cardbus.eventstore.sqlite_memory import READER_CACHE_KIB, SPILL_KIB, WRITER_CACHE_KIB


def started(attempt: int) -> NewEvent:
    return NewEvent(data=ev.TaskStarted(attempt=attempt, agent_id="a"), correlation_id="r")


@pytest.mark.parametrize(
    "head",
    [
        (0, GENESIS_HASH),
        (1, "ab" * 32),
        (2**64 - 1, "0123456789abcdef" * 4),
        (2**64, "ab" * 32),  # a version past 64 bits: kept as given
        (3, "AB" * 32),  # upper case: not what a digest's hex is, kept as given
        (3, "ab" * 31 + "zz"),  # not hex
        (3, "ab" * 16),  # 16 bytes
        (3, ""),
    ],
)
def test_a_head_comes_back_exactly_as_it_went_in(head: tuple[int, str]) -> None:
    heads = StreamHeads()
    heads["s"] = head
    heads.update({"t": head})
    assert heads["s"] == head and heads["t"] == head
    assert "s" in heads and "u" not in heads and len(heads) == 2
    heads.clear()
    assert len(heads) == 0


async def test_a_head_edited_in_the_file_is_chained_onto_as_it_reads(tmp_path: Path) -> None:
    """A hash changed to what no digest's hex is: the next append links to exactly that
    string, and verify names the edited event, as it did with heads kept as strings."""
    path = tmp_path / "log.db"
    store = await SqliteEventStore.open(path)
    await store.append("t", [started(1), started(2)], 0)
    await store.close()
    edited = "AB" * 32
    with sqlite3.connect(path, isolation_level=None) as db:
        db.execute("UPDATE events SET hash = ? WHERE stream = 't' AND version = 2", (edited,))
    store = await SqliteEventStore.open(path)
    try:
        (third,) = await store.append("t", [started(3)], 2)
        (fourth,) = await store.append("t", [started(4)], 3)  # its head from the cache
        assert third.prev_hash == edited
        assert fourth.prev_hash == third.hash
        problems = await store.verify("t")
        assert [p.version for p in problems] == [2]
    finally:
        await store.close()


async def test_each_connection_s_page_cache_is_bounded(tmp_path: Path) -> None:
    store = await SqliteEventStore.open(tmp_path / "log.db")
    try:
        writer = store._writer.conn
        assert writer.execute("PRAGMA cache_size").fetchone()[0] == -WRITER_CACHE_KIB
        reader = list(await store._reader.execute_fetchall("PRAGMA cache_size"))
        assert reader[0][0] == -READER_CACHE_KIB
        # a transaction spills as it did with SQLite's default cache: at SPILL_KIB
        spill = writer.execute("PRAGMA cache_spill").fetchone()[0]
        page = writer.execute("PRAGMA page_size").fetchone()[0]
        assert spill * page >= SPILL_KIB * 1024 * 0.9
    finally:
        await store.close()
