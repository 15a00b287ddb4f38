"""The envelope codec and the hash chain, without any store."""

from __future__ import annotations

import hashlib
import itertools
import time
import uuid

import msgspec
import pytest
from test_states import sample

from cardbus.eventstore import DecodeError, Envelope, NewEvent, PayloadTooLarge, UnknownEventType
from cardbus.eventstore import events as ev
from cardbus.eventstore.envelope import (
    DEFAULT_MAX_EVENT_BYTES,
    GENESIS_HASH,
    decode_body,
    decode_stored,
    encode_body,
    seal,
    verify_chain,
)
from cardbus.eventstore.events import EVENT_TYPES, tag_of
from cardbus.eventstore.ids import id_time, new_id


def new(data: ev.Event | None = None, **kw: object) -> NewEvent:
    return NewEvent(
        data=data or ev.TaskCreated(root_id="r", capability="c"),
        correlation_id="r",
        **kw,  # type: ignore[arg-type]
    )


def chain(n: int, stream: str = "s") -> list[tuple[Envelope, bytes]]:
    out: list[tuple[Envelope, bytes]] = []
    prev = GENESIS_HASH
    for v in range(1, n + 1):
        env, body = seal(new(ev.TaskStarted(attempt=v, agent_id="a")), stream, v, prev)
        out.append((env, body))
        prev = env.hash
    return out


def test_seal_hashes_the_body_and_leaves_out_position_and_hash() -> None:
    env, body = seal(new(actor="me", traceparent="00-x"), "t", 1, GENESIS_HASH, position=7)
    assert env.hash == hashlib.sha256(body).hexdigest()
    assert env.position == 7
    raw = msgspec.json.decode(body)
    assert "position" not in raw
    assert "hash" not in raw
    assert raw["data"]["type"] == "task.created.v1"
    assert "prev_hash" not in raw  # the genesis link is the default, left out
    assert (raw["stream"], raw["version"], raw["actor"]) == ("t", 1, "me")
    assert encode_body(env) == body


def test_decode_body_round_trips() -> None:
    env, body = seal(new(causation_id="c1"), "t", 3, "a" * 64)
    back = decode_body(body, position=9, hash=env.hash)
    assert back == msgspec.structs.replace(env, position=9)
    assert back.type == "task.created.v1"
    assert decode_body(body).position == 0
    assert decode_body(memoryview(body)) == decode_body(bytearray(body))


@pytest.mark.parametrize("event_type", EVENT_TYPES, ids=tag_of)
def test_every_event_type_round_trips(event_type: type) -> None:
    data = sample(event_type)
    _env, body = seal(new(data), "t", 1, GENESIS_HASH)
    back = decode_body(body)
    assert back.data == data
    assert type(back.data) is event_type
    assert back.type == tag_of(event_type)


def test_decode_stored_fast_path_matches_decode_body() -> None:
    rows = [(i + 1, body, env.hash) for i, (env, body) in enumerate(chain(5))]
    assert decode_stored(rows) == [decode_body(b, p, h) for p, b, h in rows]
    assert decode_stored([]) == []


def test_decode_stored_names_a_bad_row_with_a_typed_error() -> None:
    rows = [(i + 1, body, env.hash) for i, (env, body) in enumerate(chain(3))]
    rows[1] = (2, b"{broken", rows[1][2])
    with pytest.raises(DecodeError):
        decode_stored(rows)


@pytest.mark.parametrize(
    "body",
    [
        b"",
        b"\x00\xff\xfe",
        b"null",
        b"[]",
        b"{}",
        b'{"event_id": 1}',
        b"not json at all",
        b'{"event_id":"x","stream":"s","version":"one","recorded_at":1,"correlation_id":"r",'
        b'"data":{"type":"task.failed.v1","reason":"x"}}',
        b'{"event_id":"x","stream":"s","version":1,"recorded_at":1,"correlation_id":"r",'
        b'"data":{"type":"task.failed.v1"}}',
        b'{"event_id":"x","stream":"s","version":1,"recorded_at":1,"correlation_id":"r",'
        b'"data":{"reason":"no tag"}}',
        b'{"event_id":"x","stream":"s","version":1,"recorded_at":1,"correlation_id":"r",'
        b'"data":"task.failed.v1"}',
    ],
)
def test_bad_bytes_are_decode_errors(body: bytes) -> None:
    with pytest.raises(DecodeError):
        decode_body(body)


def test_unknown_tag_names_the_tag() -> None:
    body = (
        b'{"event_id":"x","stream":"s","version":1,"recorded_at":1,"correlation_id":"r",'
        b'"data":{"type":"task.teleported.v1"}}'
    )
    with pytest.raises(UnknownEventType) as info:
        decode_body(body)
    assert info.value.tag == "task.teleported.v1"
    assert isinstance(info.value, DecodeError)


def test_oversized_body_is_payload_too_large() -> None:
    _, body = seal(new(ev.TaskFailed(reason="x" * 5000)), "t", 1, GENESIS_HASH)
    with pytest.raises(PayloadTooLarge) as info:
        decode_body(body, max_bytes=1000)
    assert (info.value.size, info.value.limit) == (len(body), 1000)
    assert decode_body(body).data == ev.TaskFailed(reason="x" * 5000)
    assert DEFAULT_MAX_EVENT_BYTES == 1024 * 1024


def test_new_fields_get_defaults_and_unknown_fields_are_ignored() -> None:
    """An old body without a newer optional field, and a newer body with an unknown one."""
    body = (
        b'{"event_id":"x","stream":"s","version":1,"recorded_at":1.5,"correlation_id":"r",'
        b'"data":{"type":"task.created.v1","root_id":"r","capability":"c","from_the_future":1}}'
    )
    env = decode_body(body)
    assert isinstance(env.data, ev.TaskCreated)
    assert env.data.max_attempts == 3
    assert env.prev_hash == GENESIS_HASH
    assert env.actor == ""


def test_new_event_defaults() -> None:
    before = time.time()
    a, b = new(), new()
    assert uuid.UUID(a.event_id).version == 7
    assert a.event_id < b.event_id  # time-ordered, monotonic within the process
    assert before - 1 <= a.recorded_at <= time.time() + 1
    assert abs(id_time(a.event_id) - a.recorded_at) < 1
    assert a.type == "task.created.v1"


def test_new_ids_are_monotonic_and_unique() -> None:
    ids = [new_id() for _ in range(10_000)]
    assert ids == sorted(ids)
    assert len(set(ids)) == len(ids)


# -- the chain -------------------------------------------------------------------


def rows_of(sealed: list[tuple[Envelope, bytes]]) -> list[tuple[int, bytes, str]]:
    return [(i + 1, body, env.hash) for i, (env, body) in enumerate(sealed)]


def test_a_clean_chain_verifies() -> None:
    assert verify_chain(rows_of(chain(6)), "s") == []
    assert verify_chain([], "s") == []


def test_chain_links_each_event_to_its_predecessor() -> None:
    sealed = chain(4)
    assert sealed[0][0].prev_hash == GENESIS_HASH
    for (prev, _), (env, _) in itertools.pairwise(sealed):
        assert env.prev_hash == prev.hash


def test_verify_chain_finds_each_kind_of_break() -> None:
    rows = rows_of(chain(5))
    edited = list(rows)
    edited[2] = (3, rows[2][1].replace(b'"attempt":3', b'"attempt":4'), rows[2][2])
    assert [p.position for p in verify_chain(edited, "s")] == [3]
    deleted = rows[:2] + rows[3:]
    assert {p.position for p in verify_chain(deleted, "s")} == {4}
    swapped = [rows[0], rows[2], rows[1], rows[3], rows[4]]
    assert {p.version for p in verify_chain(swapped, "s")} == {3, 2, 4}
    wrong_stream = verify_chain(rows, "other")
    assert len(wrong_stream) == 5
    assert all("belongs to stream 's'" in p.problem for p in wrong_stream)
    garbage = [*rows[:1], (2, b"junk", "0" * 64)]
    [problem] = verify_chain(garbage, "s")
    assert (problem.position, problem.event_id) == (2, "?")
    assert "undecodable" in problem.problem


def test_decode_stored_leaves_the_collector_as_it_found_it() -> None:
    import gc

    rows = [(i + 1, body, env.hash) for i, (env, body) in enumerate(chain(300))]
    assert gc.isenabled()
    assert len(decode_stored(rows)) == 300
    assert gc.isenabled()
    bad = [*rows[:299], (300, b"{broken", "0" * 64)]
    with pytest.raises(DecodeError):
        decode_stored(bad)
    assert gc.isenabled()
    gc.disable()
    try:
        decode_stored(rows)
        assert not gc.isenabled()
    finally:
        gc.enable()


def test_seal_batch_seals_exactly_like_seal() -> None:
    from cardbus.eventstore.batch import seal_batch

    events = [new(ev.TaskStarted(attempt=i, agent_id="a")) for i in range(4)]
    first = seal_batch("s", events[:2], 0, 0, GENESIS_HASH)
    more = seal_batch("s", events[2:], 2, 2, first[-1][0].hash, first_position=7)
    expected = []
    prev = GENESIS_HASH
    for i, e in enumerate(events):
        env, body = seal(e, "s", i + 1, prev, position=0 if i < 2 else 5 + i)
        expected.append((env, body))
        prev = env.hash
    assert first + more == expected
    assert [env.position for env, _ in more] == [7, 8]
    assert (
        verify_chain([(i + 1, b, env.hash) for i, (env, b) in enumerate(first + more)], "s") == []
    )
