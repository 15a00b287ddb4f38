"""Tampering with the SQLite file behind the store's back: ``verify`` names every bad event.

Each test builds a clean log, closes the store, edits the file with the raw
``sqlite3`` module the way an attacker or a broken tool would, reopens it and
checks that ``verify()`` returns a ``ChainProblem`` for exactly the events
where a chain breaks.
"""

from __future__ import annotations

import hashlib
import sqlite3
from collections.abc import Iterator
from pathlib import Path

import msgspec
import pytest

from cardbus.eventstore import ChainProblem, DecodeError, Envelope, NewEvent, SqliteEventStore
from cardbus.eventstore import events as ev
from cardbus.eventstore.audit import LOG_STREAM
from cardbus.eventstore.envelope import GENESIS_HASH, encode_body, seal


@pytest.fixture
async def log(tmp_path: Path) -> dict[str, list[Envelope]]:
    """Two interleaved streams: t1 with 5 events, t2 with 3; the file is closed after."""
    store = await SqliteEventStore.open(tmp_path / "log.db")
    streams: dict[str, list[Envelope]] = {"t1": [], "t2": []}
    for i in range(5):
        for stream in ("t1", "t2") if i < 3 else ("t1",):
            data: ev.Event = (
                ev.TaskCreated(root_id="r", capability="c")
                if i == 0
                else ev.TaskStarted(attempt=i, agent_id="a")
            )
            out = await store.append(stream, [NewEvent(data=data, correlation_id="r")], i)
            streams[stream] += out
    assert await store.verify() == []
    await store.close()
    return streams


@pytest.fixture
def db(tmp_path: Path, log: dict[str, list[Envelope]]) -> Iterator[sqlite3.Connection]:
    conn = sqlite3.connect(tmp_path / "log.db", isolation_level=None)
    yield conn
    conn.close()


async def problems_in(
    tmp_path: Path, stream: str | None = None, *, log_level: bool = False
) -> list[ChainProblem]:
    """The streams' problems (the log's own, positions and log chain, with ``log_level``)."""
    store = await SqliteEventStore.open(tmp_path / "log.db", create=False)
    try:
        found = await store.verify(stream)
    finally:
        await store.close()
    return [p for p in found if (p.stream == LOG_STREAM) == log_level]


def named(problems: list[ChainProblem]) -> set[tuple[str, int]]:
    return {(p.event_id, p.position) for p in problems}


async def test_a_clean_log_verifies(tmp_path: Path, db: sqlite3.Connection) -> None:
    assert await problems_in(tmp_path) == []
    assert await problems_in(tmp_path, "t1") == []


async def test_an_edited_body_is_named(
    tmp_path: Path, db: sqlite3.Connection, log: dict[str, list[Envelope]]
) -> None:
    victim = log["t1"][2]
    body = db.execute("SELECT body FROM events WHERE position = ?", (victim.position,)).fetchone()
    edited = bytes(body[0]).replace(b'"attempt":2', b'"attempt":9')
    assert edited != body[0]
    db.execute("UPDATE events SET body = ? WHERE position = ?", (edited, victim.position))
    problems = await problems_in(tmp_path)
    assert named(problems) == {(victim.event_id, victim.position)}
    assert "edited" in problems[0].problem
    assert problems[0].stream == "t1"
    assert problems[0].version == 3
    assert await problems_in(tmp_path, "t2") == []


async def test_an_edit_with_a_recomputed_hash_breaks_the_next_link(
    tmp_path: Path, db: sqlite3.Connection, log: dict[str, list[Envelope]]
) -> None:
    victim, successor = log["t1"][2], log["t1"][3]
    forged = msgspec.structs.replace(victim, data=ev.TaskStarted(attempt=9, agent_id="evil"))
    body = encode_body(forged)
    db.execute(
        "UPDATE events SET body = ?, hash = ? WHERE position = ?",
        (body, hashlib.sha256(body).hexdigest(), victim.position),
    )
    problems = await problems_in(tmp_path)
    assert named(problems) == {(successor.event_id, successor.position)}
    assert "prev_hash" in problems[0].problem


async def test_an_edited_hash_column_is_named(
    tmp_path: Path, db: sqlite3.Connection, log: dict[str, list[Envelope]]
) -> None:
    victim = log["t2"][1]
    db.execute("UPDATE events SET hash = ? WHERE position = ?", ("f" * 64, victim.position))
    problems = await problems_in(tmp_path)
    # The event no longer matches its hash, and its successor no longer links to it.
    assert named(problems) == {
        (victim.event_id, victim.position),
        (log["t2"][2].event_id, log["t2"][2].position),
    }


async def test_a_deleted_row_is_named_at_its_successor(
    tmp_path: Path, db: sqlite3.Connection, log: dict[str, list[Envelope]]
) -> None:
    gone, successor = log["t1"][1], log["t1"][2]
    db.execute("DELETE FROM events WHERE position = ?", (gone.position,))
    problems = await problems_in(tmp_path)
    assert named(problems) == {(successor.event_id, successor.position)}
    assert any("missing predecessor" in p.problem for p in problems)
    assert any("prev_hash" in p.problem for p in problems)
    # and the log itself: a gap in positions, a log hash that no longer follows
    gaps = await problems_in(tmp_path, log_level=True)
    assert [p.problem for p in gaps if p.position == gone.position] == [
        f"positions {gone.position} missing (deleted)"
    ]
    assert any("log hash does not follow" in p.problem for p in gaps)


async def test_a_deleted_first_event_is_detected(
    tmp_path: Path, db: sqlite3.Connection, log: dict[str, list[Envelope]]
) -> None:
    db.execute("DELETE FROM events WHERE position = ?", (log["t2"][0].position,))
    problems = await problems_in(tmp_path)
    assert named(problems) == {(log["t2"][1].event_id, log["t2"][1].position)}


async def test_a_deleted_last_event_is_caught_only_against_a_kept_head(
    tmp_path: Path, db: sqlite3.Connection, log: dict[str, list[Envelope]]
) -> None:
    """Cutting the log's tail leaves valid chains: only a head kept elsewhere tells."""
    store = await SqliteEventStore.open(tmp_path / "log.db", create=False)
    kept = await store.head()
    await store.close()
    db.execute("DELETE FROM events WHERE position = ?", (log["t1"][4].position,))
    assert await problems_in(tmp_path) == []
    assert await problems_in(tmp_path, log_level=True) == []
    found, _ = await SqliteEventStore.verify_file(tmp_path / "log.db", kept)
    assert [p.position for p in found] == [log["t1"][4].position]
    assert "missing (truncated)" in found[0].problem


async def test_two_swapped_rows_are_named(
    tmp_path: Path, db: sqlite3.Connection, log: dict[str, list[Envelope]]
) -> None:
    a, b = log["t1"][1], log["t1"][2]
    cols = "event_id, stream, version, correlation_id, type, recorded_at, body, hash"
    row_a = db.execute(f"SELECT {cols} FROM events WHERE position = ?", (a.position,)).fetchone()
    row_b = db.execute(f"SELECT {cols} FROM events WHERE position = ?", (b.position,)).fetchone()
    db.execute("BEGIN")
    db.execute("DELETE FROM events WHERE position IN (?, ?)", (a.position, b.position))
    insert = f"INSERT INTO events (position, {cols}) VALUES (?,?,?,?,?,?,?,?,?)"
    db.execute(insert, (a.position, *row_b))
    db.execute(insert, (b.position, *row_a))
    db.execute("COMMIT")
    problems = await problems_in(tmp_path)
    assert named(problems) == {(b.event_id, a.position), (a.event_id, b.position)} | {
        (log["t1"][3].event_id, log["t1"][3].position)
    }
    assert any("out of order" in p.problem for p in problems)


async def test_a_forged_row_is_named(
    tmp_path: Path, db: sqlite3.Connection, log: dict[str, list[Envelope]]
) -> None:
    """A forger appends an event that claims to follow v2 (a fork of the chain)."""
    forged, body = seal(
        NewEvent(data=ev.TaskFailed(reason="forged"), correlation_id="r"),
        "t1",
        6,
        log["t1"][1].hash,
    )
    top = db.execute("SELECT MAX(position) FROM events").fetchone()[0]
    db.execute(
        "INSERT INTO events (position, event_id, stream, version, correlation_id, type,"
        " recorded_at, body, hash) VALUES (?,?,?,?,?,?,?,?,?)",
        (
            top + 1,
            forged.event_id,
            "t1",
            6,
            "r",
            forged.type,
            forged.recorded_at,
            body,
            forged.hash,
        ),
    )
    problems = await problems_in(tmp_path)
    assert named(problems) == {(forged.event_id, top + 1)}
    assert "prev_hash" in problems[0].problem


async def test_a_row_moved_to_another_stream_is_named(
    tmp_path: Path, db: sqlite3.Connection, log: dict[str, list[Envelope]]
) -> None:
    victim = log["t1"][4]
    db.execute(
        "UPDATE events SET stream = 't2', version = 4 WHERE position = ?", (victim.position,)
    )
    problems = await problems_in(tmp_path)
    assert (victim.event_id, victim.position) in named(problems)
    assert any("belongs to stream 't1'" in p.problem for p in problems)


async def test_a_forged_first_event_inserted_before_the_stream(
    tmp_path: Path, db: sqlite3.Connection, log: dict[str, list[Envelope]]
) -> None:
    forged, body = seal(
        NewEvent(data=ev.TaskCreated(root_id="r", capability="evil"), correlation_id="r"),
        "t2",
        1,
        GENESIS_HASH,
    )
    db.execute(
        "INSERT INTO events (position, event_id, stream, version, correlation_id, type,"
        " recorded_at, body, hash) VALUES (0,?,?,?,?,?,?,?,?)",
        (forged.event_id, "t2-copy", 1, "r", forged.type, forged.recorded_at, body, forged.hash),
    )
    # Stored under another stream name than its body says: named.
    problems = await problems_in(tmp_path)
    assert named(problems) == {(forged.event_id, 0)}


async def test_garbage_in_a_body_is_named_and_reads_raise_typed(
    tmp_path: Path, db: sqlite3.Connection, log: dict[str, list[Envelope]]
) -> None:
    victim = log["t2"][2]
    db.execute(
        "UPDATE events SET body = ? WHERE position = ?", (b"\xff\x00 not json", victim.position)
    )
    problems = await problems_in(tmp_path)
    assert victim.position in {p.position for p in problems}
    assert any("undecodable" in p.problem for p in problems)
    store = await SqliteEventStore.open(tmp_path / "log.db", create=False)
    try:
        with pytest.raises(DecodeError):
            await store.read_stream("t2")
        with pytest.raises(DecodeError):
            await store.read_all()
        assert len(await store.read_stream("t1")) == 5  # the rest still reads
    finally:
        await store.close()


async def test_every_tampered_event_is_reported_at_once(
    tmp_path: Path, db: sqlite3.Connection, log: dict[str, list[Envelope]]
) -> None:
    db.execute("UPDATE events SET hash = ? WHERE position = ?", ("0" * 64, log["t1"][0].position))
    db.execute("DELETE FROM events WHERE position = ?", (log["t2"][1].position,))
    problems = await problems_in(tmp_path)
    assert {p.stream for p in problems} == {"t1", "t2"}
    assert await problems_in(tmp_path, log_level=True) != []  # the deletion, log-wide
    assert (log["t1"][0].event_id, log["t1"][0].position) in named(problems)
    assert (log["t2"][2].event_id, log["t2"][2].position) in named(problems)
    assert [p.position for p in problems] == sorted(p.position for p in problems)


async def test_body_edited_into_text_is_named_not_a_crash(tmp_path: Path) -> None:
    """An SQL replace() turns the BLOB into TEXT: verify names the event instead of crashing."""
    db = tmp_path / "t.db"
    store = await SqliteEventStore.open(db)
    try:
        new = NewEvent(
            data=ev.TaskCreated(root_id="r", capability="c", goal="g"), correlation_id="r"
        )
        [env] = await store.append("t", [new], 0)
    finally:
        await store.close()
    con = sqlite3.connect(db)
    con.execute("UPDATE events SET body = replace(body, 'goal', 'gaol')")
    con.commit()
    con.close()
    store = await SqliteEventStore.open(db)
    try:
        problems = await store.verify()
    finally:
        await store.close()
    assert [(p.event_id, p.position) for p in problems] == [(env.event_id, env.position)]
