"""Fuzzing the decoder and the append path with hypothesis.

* any bytes, any JSON, any mutation of a valid body into ``decode_body``:
  it returns an ``Envelope`` or raises ``DecodeError``, nothing else;
* random payloads (any JSON-ish or not-JSON value in ``inputs``/``output``)
  into ``append`` of every backend: the event reads back equal, or the append
  raises a ``CardbusError`` and the log is unchanged.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cardbus.eventstore import (
    Append,
    CardbusError,
    DecodeError,
    Envelope,
    EventStore,
    MemoryEventStore,
    NewEvent,
    PrerequisiteNotStored,
    SqliteEventStore,
)
from cardbus.eventstore import events as ev
from cardbus.eventstore.envelope import GENESIS_HASH, decode_body, seal
from cardbus.eventstore.events import EVENT_TYPES, tag_of

FUZZ = settings(
    max_examples=200,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)

# -- values -------------------------------------------------------------------------

any_text = st.text(alphabet=st.characters(codec=None, exclude_categories=()), max_size=20) | (
    st.sampled_from(["\ud800", "a\udfffb", "\x00", "\u2028", "é", "🚀", " ", "x" * 300])
)
json_leaf = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=True, allow_infinity=True)
    | any_text
)
json_value = st.recursive(
    json_leaf,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(any_text, inner, max_size=4),
    max_leaves=12,
)
odd_leaf = (
    json_leaf
    | st.binary(max_size=8)
    | st.tuples(st.integers(), st.text(max_size=3))
    | st.frozensets(st.integers(), max_size=3)
    | st.builds(object)
    | st.complex_numbers(allow_nan=False, allow_infinity=False)
)
odd_value = st.recursive(
    odd_leaf,
    lambda inner: (
        st.lists(inner, max_size=4)
        | st.dictionaries(any_text | st.integers() | st.booleans(), inner, max_size=4)
        | st.sets(st.integers(), max_size=3)
    ),
    max_leaves=12,
)

# -- the decoder -------------------------------------------------------------------


def _valid_bodies() -> list[bytes]:
    bodies = []
    prev = GENESIS_HASH
    for i, event in enumerate(
        [
            ev.TaskCreated(root_id="r", capability="c", inputs={"x": [1, 2.5, "y"]}),
            ev.TaskDispatched(
                attempt=1, agent_id="a", candidates=[ev.Candidate(agent_id="a", score=1)]
            ),
            ev.TaskResultSubmitted(attempt=1, agent_id="a", status="completed", output={"k": None}),
            ev.RevisionRequested(
                round=1,
                reviewer_task_id="r2",
                issues=[
                    ev.ReviewIssue(issue_type="t", section="s", severity="low", suggestion="x")
                ],
            ),
            ev.TaskCompleted(attempt=1, agent_id="a", output="done", confidence=0.5),
        ]
    ):
        env, body = seal(NewEvent(data=event, correlation_id="r"), "t", i + 1, prev)
        prev = env.hash
        bodies.append(body)
    return bodies


VALID = _valid_bodies()


def decodes_or_decode_error(body: bytes) -> None:
    try:
        env = decode_body(body)
    except DecodeError:
        return
    assert isinstance(env, Envelope)
    assert tag_of(type(env.data)) == env.type


@FUZZ
@given(st.binary(max_size=600))
def test_garbage_bytes(body: bytes) -> None:
    decodes_or_decode_error(body)


@FUZZ
@given(json_value)
def test_random_json(value: Any) -> None:
    decodes_or_decode_error(msgspec.json.encode(value) if _encodable(value) else b"{")


def _encodable(value: Any) -> bool:
    try:
        msgspec.json.encode(value)
    except Exception:
        return False
    return True


envelope_like = st.fixed_dictionaries(
    {
        "event_id": json_leaf,
        "stream": json_leaf,
        "version": json_leaf,
        "recorded_at": json_leaf,
        "correlation_id": json_leaf,
        "data": st.dictionaries(any_text, json_value, max_size=5).map(dict)
        | st.fixed_dictionaries(
            {"type": st.sampled_from([tag_of(t) for t in EVENT_TYPES]) | any_text},
            optional={
                "reason": json_leaf,
                "attempt": json_leaf,
                "agent_id": json_leaf,
                "root_id": json_leaf,
                "capability": json_leaf,
                "inputs": json_value,
                "output": json_value,
                "issues": json_value,
                "usage": json_value,
            },
        ),
    },
    optional={"prev_hash": json_leaf, "actor": json_leaf, "causation_id": json_leaf},
)


@FUZZ
@given(envelope_like)
def test_envelope_shaped_json(value: dict[str, Any]) -> None:
    try:
        body = msgspec.json.encode(value)
    except Exception:
        return
    decodes_or_decode_error(body)


@FUZZ
@given(
    st.sampled_from(VALID),
    st.lists(
        st.tuples(
            st.sampled_from(["flip", "insert", "delete", "truncate"]),
            st.integers(0, 10**6),
            st.integers(0, 255),
        ),
        min_size=1,
        max_size=4,
    ),
)
def test_mutated_valid_bodies(body: bytes, mutations: list[tuple[str, int, int]]) -> None:
    b = bytearray(body)
    for kind, where, byte in mutations:
        i = where % max(len(b), 1)
        if kind == "flip" and b:
            b[i] ^= byte or 1
        elif kind == "insert":
            b.insert(i, byte)
        elif kind == "delete" and b:
            del b[i]
        elif kind == "truncate":
            del b[i:]
    decodes_or_decode_error(bytes(b))


# -- the append path ----------------------------------------------------------------


def payloads() -> st.SearchStrategy[ev.Event]:
    inputs = st.dictionaries(any_text, odd_value, max_size=4) | st.dictionaries(
        any_text, json_value, max_size=4
    )
    return st.one_of(
        st.builds(
            ev.TaskCreated,
            root_id=any_text,
            capability=any_text,
            inputs=inputs,
            timeout_s=st.floats(allow_nan=True, allow_infinity=True),
        ),
        st.builds(
            ev.TaskResultSubmitted,
            attempt=st.integers(-(2**65), 2**65),
            agent_id=any_text,
            status=any_text,
            output=odd_value | json_value,
            confidence=st.floats(allow_nan=True, allow_infinity=True),
        ),
        st.builds(ev.TaskCompleted, attempt=st.integers(0, 5), agent_id=any_text, output=odd_value),
        st.builds(
            ev.MemoryWritten,
            key=any_text,
            value=odd_value | json_value,
            tags=st.lists(any_text, max_size=3),
        ),
    )


new_events = st.builds(
    NewEvent,
    data=payloads(),
    correlation_id=any_text,
    actor=any_text,
    causation_id=st.none() | any_text,
)


async def _open(backend: str, path: Path) -> EventStore:
    if backend == "memory":
        return MemoryEventStore(max_event_bytes=4096)
    return await SqliteEventStore.open(path / "fuzz.db", max_event_bytes=4096, synchronous="OFF")


async def _check_append(store: EventStore, stream: str, events: list[NewEvent]) -> None:
    before = await store.last_position()
    version = await store.stream_version(stream)
    # A good append in the same group commit must not be disturbed by a bad one.
    good = NewEvent(data=ev.TaskFailed(reason="good"), correlation_id="good")
    bystander = asyncio.ensure_future(store.append(f"good-{good.event_id}", [good], 0))
    try:
        out = await store.append(stream, events, version)
    except CardbusError:
        assert (await bystander)[0].event_id == good.event_id
        assert await store.last_position() == before + 1
        assert await store.stream_version(stream) == version
        return
    await bystander
    assert [e.event_id for e in out] == [n.event_id for n in events]
    if all(e.position <= before for e in out):  # a retry of stored events
        assert await store.last_position() == before + 1
        return
    back = await store.read_stream(stream, version + 1)
    assert back == out
    for env, new in zip(back, events, strict=True):
        assert env.data == new.data
        assert env.correlation_id == new.correlation_id
        assert env.actor == new.actor
        assert not _has_nan(msgspec.to_builtins(env.data))
    assert await store.last_position() == before + 1 + len(events)


def _has_nan(value: Any) -> bool:
    if isinstance(value, float):
        return math.isnan(value) or math.isinf(value)
    if isinstance(value, dict):
        return any(_has_nan(v) for v in value.values())
    if isinstance(value, list):
        return any(_has_nan(v) for v in value)
    return False


@pytest.mark.parametrize("backend", ["memory", "sqlite"])
def test_random_payloads_store_or_refuse(backend: str, tmp_path: Path) -> None:
    with asyncio.Runner() as runner:
        store = runner.run(_open(backend, tmp_path))
        run: Callable[[Awaitable[None]], None] = runner.run
        counter = iter(range(10**9))

        @FUZZ
        @given(st.lists(new_events, min_size=1, max_size=3), st.sampled_from(["t", "u", "fresh"]))
        def check(events: list[NewEvent], stream: str) -> None:
            name = f"fresh-{next(counter)}" if stream == "fresh" else stream
            run(_check_append(store, name, events))

        try:
            check()
            run(_verify_clean(store))
        finally:
            runner.run(store.close())


@pytest.mark.parametrize("backend", ["memory", "sqlite"])
def test_random_stream_names_and_ids(backend: str, tmp_path: Path) -> None:
    with asyncio.Runner() as runner:
        store = runner.run(_open(backend, tmp_path))

        @FUZZ
        @given(any_text | st.text(max_size=600), any_text)
        def check(stream: str, event_id: str) -> None:
            event = NewEvent(
                data=ev.TaskFailed(reason="x"), correlation_id="r", event_id=event_id or "e"
            )
            runner.run(_check_append(store, stream, [event]))

        try:
            check()
            runner.run(_verify_clean(store))
        finally:
            runner.run(store.close())


async def _verify_clean(store: EventStore) -> None:
    assert await store.verify() == []


# -- append_many: independent appends and their prerequisites ----------------------

# (stream index, events, stale?, prerequisites as offsets back): a random plan of appends
_many_plan = st.lists(
    st.tuples(
        st.integers(0, 3),
        st.integers(1, 3),
        st.booleans(),
        st.lists(st.integers(1, 3), max_size=2),
    ),
    min_size=1,
    max_size=6,
)


async def _check_append_many(store: EventStore, prefix: str, plan: list[Any]) -> None:
    streams = [f"{prefix}-{i}" for i in range(4)]
    versions = {s: await store.stream_version(s) for s in streams}
    expected = dict(versions)  # what each append expects, as a caller deciding now would
    appends: list[Append] = []
    for i, (k, n, stale, back) in enumerate(plan):
        stream = streams[k]
        after = tuple(sorted({i - b for b in back if i - b >= 0}))
        events = [
            NewEvent(data=ev.TaskFailed(reason=f"{i}.{j}"), correlation_id=prefix) for j in range(n)
        ]
        appends.append(Append(stream, events, expected[stream] + (5 if stale else 0), after))
        if not stale:
            expected[stream] += n  # the next append to it expects this one stored
    before = await store.last_position()
    outcomes = await store.append_many(appends)
    stored = {i for i, o in enumerate(outcomes) if isinstance(o, list)}
    for i, (a, o) in enumerate(zip(appends, outcomes, strict=True)):
        if any(j not in stored for j in a.after):  # what it follows was not stored
            assert isinstance(o, PrerequisiteNotStored), (i, o)
        if isinstance(o, list):
            assert [e.event_id for e in o] == [e.event_id for e in a.events]
            first = o[0].position
            assert all(first > outcomes[j][0].position for j in a.after)  # type: ignore[index]
        else:
            assert isinstance(o, CardbusError)
    # exactly the stored appends' events were written, each stream's chain unbroken
    written = sum(len(appends[i].events) for i in stored)
    assert await store.last_position() == before + written
    for s in streams:
        back = await store.read_stream(s, versions[s] + 1)
        ids = [
            e.event_id
            for i in sorted(stored, key=lambda i: outcomes[i][0].position)  # type: ignore[index]
            if appends[i].stream == s
            for e in appends[i].events
        ]
        assert [e.event_id for e in back] == ids


@pytest.mark.parametrize("backend", ["memory", "sqlite"])
def test_append_many_with_random_prerequisites(backend: str, tmp_path: Path) -> None:
    with asyncio.Runner() as runner:
        store = runner.run(_open(backend, tmp_path))
        counter = iter(range(10**9))

        @FUZZ
        @given(_many_plan)
        def check(plan: list[Any]) -> None:
            runner.run(_check_append_many(store, f"m{next(counter)}", plan))

        try:
            check()
            runner.run(_verify_clean(store))
        finally:
            runner.run(store.close())
