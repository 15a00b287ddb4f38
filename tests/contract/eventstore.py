"""The ``EventStore`` contract (``cardbus.eventstore.store``) as one abstract test class.

``EventStoreContract`` needs a ``store`` fixture: a fresh, empty store per test.
The store must take ``max_event_bytes`` (default 1 MiB) and keep it in the
attribute of that name, which the size-limit tests lower on the live store.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import msgspec
import pytest

from cardbus.eventstore import (
    Append,
    CardbusError,
    ConcurrencyError,
    Envelope,
    EventStore,
    IdempotencyError,
    NewEvent,
    PayloadTooLarge,
    PrerequisiteNotStored,
    ValidationError,
)
from cardbus.eventstore import events as ev
from cardbus.eventstore.envelope import GENESIS_HASH

__all__ = ["EventStoreContract"]


def created(root: str = "root", **fields: Any) -> NewEvent:
    return NewEvent(
        data=ev.TaskCreated(root_id=root, capability="echo", **fields), correlation_id=root
    )


def started(root: str = "root", attempt: int = 1) -> NewEvent:
    return NewEvent(data=ev.TaskStarted(attempt=attempt, agent_id="a1"), correlation_id=root)


def completed(root: str = "root", **fields: Any) -> NewEvent:
    return NewEvent(
        data=ev.TaskCompleted(attempt=1, agent_id="a1", **fields),
        correlation_id=root,
        causation_id="cause",
        actor="orchestrator",
        traceparent="00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
    )


async def snapshot(store: EventStore) -> list[Envelope]:
    return await store.read_all(0, 1_000_000)


async def take(it: AsyncIterator[Envelope], n: int, timeout: float = 10.0) -> list[Envelope]:
    out: list[Envelope] = []

    async def run() -> None:
        async for env in it:
            out.append(env)
            if len(out) == n:
                return

    await asyncio.wait_for(run(), timeout)
    return out


@contextlib.asynccontextmanager
async def subscription(store: EventStore, from_position: int = 0) -> AsyncIterator[Any]:
    it = store.subscribe(from_position)
    try:
        yield it
    finally:
        await it.aclose()  # type: ignore[attr-defined]


def _bad_inputs() -> list[tuple[str, Callable[[], tuple[Any, Any, Any]]]]:
    """(name, () -> (stream, events, expected_version)) for every kind of bad append."""

    class NotJson:
        pass

    def raw(**fields: Any) -> NewEvent:
        """A NewEvent with any field values, bypassing the type checker."""
        base: dict[str, Any] = {"data": ev.TaskFailed(reason="x"), "correlation_id": "r"}
        return NewEvent(**{**base, **fields})

    def twice(changed: bool) -> list[NewEvent]:
        e = started()
        return [e, msgspec.structs.replace(e, actor="x") if changed else e]

    nan = math.nan
    return [
        ("garbage NewEvent data", lambda: ("t", [raw(data={"x": 1})], 0)),
        ("a struct that is no event", lambda: ("t", [raw(data=ev.Usage())], 0)),
        ("a dict instead of NewEvent", lambda: ("t", [{"data": "x"}], 0)),
        ("a bare event instead of NewEvent", lambda: ("t", [ev.TaskFailed(reason="x")], 0)),
        ("None instead of a list", lambda: ("t", None, 0)),
        ("a string instead of a list", lambda: ("t", "events", 0)),
        ("empty list", lambda: ("t", [], 0)),
        ("empty stream name", lambda: ("", [created()], 0)),
        ("stream name not a string", lambda: (42, [created()], 0)),
        ("stream name too long", lambda: ("s" * 10_000, [created()], 0)),
        ("negative expected version", lambda: ("t", [created()], -1)),
        ("expected version not an int", lambda: ("t", [created()], "0")),
        ("expected version a bool", lambda: ("t", [created()], False)),
        ("NaN in a float field", lambda: ("t", [completed(confidence=nan)], 0)),
        ("infinity in a float field", lambda: ("t", [completed(confidence=math.inf)], 0)),
        ("NaN in inputs", lambda: ("t", [created(inputs={"x": nan})], 0)),
        ("non-JSON object in inputs", lambda: ("t", [created(inputs={"x": NotJson()})], 0)),
        ("a set in inputs", lambda: ("t", [created(inputs={"x": {1, 2}})], 0)),
        ("bytes in inputs", lambda: ("t", [created(inputs={"x": b"\x00"})], 0)),
        ("a non-string key in inputs", lambda: ("t", [created(inputs={1: "x"})], 0)),
        ("a wrongly typed field", lambda: ("t", [created(max_attempts="three")], 0)),
        ("correlation id not a string", lambda: ("t", [raw(correlation_id=None)], 0)),
        ("event id not a string", lambda: ("t", [raw(event_id=["x"])], 0)),
        ("empty event id", lambda: ("t", [raw(event_id="")], 0)),
        ("actor not a string", lambda: ("t", [raw(actor=3)], 0)),
        ("NaN recorded_at", lambda: ("t", [raw(recorded_at=nan)], 0)),
        ("a good event then a bad one", lambda: ("t", [created(), completed(confidence=nan)], 0)),
        ("one id twice in one append", lambda: ("t", twice(changed=False), 0)),
        ("one id twice, other content", lambda: ("t", twice(changed=True), 0)),
    ]


BAD_INPUTS = _bad_inputs()


class EventStoreContract:
    """The ``EventStore`` contract as tests: subclass it and provide a ``store`` fixture.

    The fixture yields a fresh, empty store per test; each test names the clause of
    the contract (``cardbus.eventstore.store``) it checks.
    """

    pytestmark = pytest.mark.asyncio

    # -- append: atomic, versioned, positioned --------------------------------

    async def test_append_assigns_versions_positions_and_chain(self, store: EventStore) -> None:
        batch = [created(), started(), completed()]
        out = await store.append("t1", batch, 0)
        assert [e.version for e in out] == [1, 2, 3]
        assert [e.position for e in out] == [1, 2, 3]
        assert [e.event_id for e in out] == [n.event_id for n in batch]
        assert [e.data for e in out] == [n.data for n in batch]
        assert all(e.stream == "t1" for e in out)
        assert out[0].prev_hash == GENESIS_HASH
        assert [e.prev_hash for e in out[1:]] == [e.hash for e in out[:-1]]
        assert all(len(e.hash) == 64 for e in out)
        assert out[2].type == "task.completed.v1"
        assert (out[2].causation_id, out[2].actor) == ("cause", "orchestrator")
        assert out[2].traceparent == batch[2].traceparent
        assert out[2].recorded_at == batch[2].recorded_at
        # A second stream continues the global positions but starts its own versions.
        [other] = await store.append("t2", [created()], 0)
        assert (other.version, other.position, other.prev_hash) == (1, 4, GENESIS_HASH)
        more = await store.append("t1", [started(attempt=2)], 3)
        assert (more[0].version, more[0].position, more[0].prev_hash) == (4, 5, out[2].hash)

    async def test_read_back_equals_what_append_returned(self, store: EventStore) -> None:
        out = await store.append("t1", [created(inputs={"k": [1, 2.5, "x", None]}), completed()], 0)
        assert await store.read_stream("t1") == out
        assert await store.read_all() == out

    async def test_append_is_atomic_all_or_nothing(self, store: EventStore) -> None:
        await store.append("t1", [created()], 0)
        before = await snapshot(store)
        with pytest.raises(CardbusError):
            await store.append("t1", [started(), started(), completed(confidence=math.nan)], 1)
        assert await snapshot(store) == before
        assert await store.stream_version("t1") == 1
        assert await store.last_position() == 1
        # The stream is still usable at the version it had.
        [env] = await store.append("t1", [started()], 1)
        assert (env.version, env.position) == (2, 2)

    async def test_stream_version_and_last_position(self, store: EventStore) -> None:
        assert await store.stream_version("t1") == 0
        assert await store.last_position() == 0
        await store.append("t1", [created(), started()], 0)
        await store.append("t2", [created()], 0)
        assert await store.stream_version("t1") == 2
        assert await store.stream_version("t2") == 1
        assert await store.stream_version("nope") == 0
        assert await store.last_position() == 3

    # -- optimistic concurrency ----------------------------------------------

    @pytest.mark.parametrize("expected", [0, 1, 3, 99])
    async def test_wrong_expected_version_is_a_concurrency_error(
        self, store: EventStore, expected: int
    ) -> None:
        await store.append("t1", [created(), started()], 0)
        before = await snapshot(store)
        with pytest.raises(ConcurrencyError) as info:
            await store.append("t1", [completed()], expected)
        err = info.value
        assert (err.stream, err.expected, err.actual) == ("t1", expected, 2)
        assert "t1" in str(err)
        assert await snapshot(store) == before

    async def test_new_stream_must_be_expected_at_version_zero(self, store: EventStore) -> None:
        with pytest.raises(ConcurrencyError) as info:
            await store.append("fresh", [created()], 1)
        assert (info.value.stream, info.value.expected, info.value.actual) == ("fresh", 1, 0)
        assert await store.last_position() == 0

    async def test_contending_appenders_exactly_one_wins(self, store: EventStore) -> None:
        await store.append("t1", [created()], 0)
        for round_ in range(5):
            version = await store.stream_version("t1")
            results = await asyncio.gather(
                *(store.append("t1", [started(attempt=round_)], version) for _ in range(8)),
                return_exceptions=True,
            )
            wins = [r for r in results if isinstance(r, list)]
            losses = [r for r in results if isinstance(r, BaseException)]
            assert len(wins) == 1
            assert len(losses) == 7
            assert all(isinstance(e, ConcurrencyError) for e in losses)
            assert all(e.actual == version + 1 for e in losses if isinstance(e, ConcurrencyError))
            assert await store.stream_version("t1") == version + 1
        assert len(await store.read_stream("t1")) == 6
        assert await store.verify() == []

    async def test_two_appenders_same_expected_version(self, store: EventStore) -> None:
        await store.append("t1", [created()], 0)
        a, b = await asyncio.gather(
            store.append("t1", [started()], 1),
            store.append("t1", [completed()], 1),
            return_exceptions=True,
        )
        outcomes = sorted([isinstance(a, list), isinstance(b, list)])
        assert outcomes == [False, True]
        loser = a if isinstance(a, BaseException) else b
        assert isinstance(loser, ConcurrencyError)
        assert (loser.stream, loser.expected, loser.actual) == ("t1", 1, 2)

    # -- append_many --------------------------------------------------------------

    async def test_append_many_is_each_append_on_its_own(self, store: EventStore) -> None:
        await store.append("t1", [created()], 0)
        before = await snapshot(store)
        outcomes = await store.append_many(
            [
                Append("t2", [created(), started()], 0),
                Append("t1", [started()], 0),  # stale: t1 is at version 1
                Append("t3", [], 0),  # bad input
                Append("t1", [started(attempt=2)], 1),
            ]
        )
        t2, stale, bad, t1 = outcomes
        assert isinstance(t2, list) and [e.version for e in t2] == [1, 2]
        assert isinstance(stale, ConcurrencyError)
        # the appends are independent: the stale one may be checked before or after t1's
        assert (stale.stream, stale.expected) == ("t1", 0) and stale.actual in (1, 2)
        assert isinstance(bad, ValidationError)
        assert isinstance(t1, list) and [e.version for e in t1] == [2]
        after = await snapshot(store)
        assert after[: len(before)] == before
        assert sorted(e.event_id for e in after[len(before) :]) == sorted(
            e.event_id for e in [*t2, *t1]
        )
        assert await store.read_stream("t2") == t2
        assert await store.verify() == []

    async def test_append_many_retry_returns_the_originals(self, store: EventStore) -> None:
        batch = [created(), started()]
        [first] = await store.append_many([Append("t1", batch, 0)])
        again = await store.append_many([Append("t1", batch, 5), Append("t1", batch, 0)])
        assert again == [first, first]
        assert await store.last_position() == 2

    async def test_append_many_after_follows_what_was_stored(self, store: EventStore) -> None:
        await store.append("done", [created()], 0)
        result, dispatch, finish = await store.append_many(
            [
                Append("done", [completed()], 1),
                Append("next", [created()], 0, after=(0,)),
                Append("root", [created()], 0, after=(0, 1)),
            ]
        )
        assert isinstance(result, list) and isinstance(dispatch, list)
        assert isinstance(finish, list)
        # stored after what they follow, whatever else shares the commit
        assert result[0].position < dispatch[0].position < finish[0].position
        assert await store.verify() == []

    async def test_append_many_after_a_failed_append_stores_nothing(
        self, store: EventStore
    ) -> None:
        await store.append("done", [created()], 0)
        before = await snapshot(store)
        stale, dispatch, finish, free = await store.append_many(
            [
                Append("done", [completed()], 0),  # stale: a ConcurrencyError
                Append("next", [created()], 0, after=(0,)),
                Append("root", [created()], 0, after=(1,)),  # follows one not attempted
                Append("free", [created()], 0),
            ]
        )
        assert isinstance(stale, ConcurrencyError)
        assert isinstance(dispatch, PrerequisiteNotStored)
        assert isinstance(finish, PrerequisiteNotStored)
        assert isinstance(free, list)
        after = await snapshot(store)
        assert after[: len(before)] == before and after[len(before) :] == free
        assert await store.stream_version("next") == 0 == await store.stream_version("root")

    async def test_append_many_after_must_name_an_earlier_append(self, store: EventStore) -> None:
        with pytest.raises(ValidationError):
            await store.append_many([Append("a", [created()], 0, after=(1,)), Append("b", [], 0)])
        with pytest.raises(ValidationError):
            await store.append_many([Append("a", [created()], 0, after=(0,))])
        assert await store.last_position() == 0

    # -- idempotency ------------------------------------------------------------

    @pytest.mark.parametrize("expected", [0, 2, 7])
    async def test_reappend_returns_the_original_envelopes(
        self, store: EventStore, expected: int
    ) -> None:
        batch = [created(), started()]
        original = await store.append("t1", batch, 0)
        await store.append("t2", [created()], 0)
        before = await snapshot(store)
        again = await store.append("t1", batch, expected)
        assert again == original
        assert [e.position for e in again] == [1, 2]
        assert await snapshot(store) == before

    async def test_reappend_of_a_copy_with_same_id_and_content(self, store: EventStore) -> None:
        first = created()
        [original] = await store.append("t1", [first], 0)
        copy = msgspec.json.decode(msgspec.json.encode(first), type=NewEvent)
        assert await store.append("t1", [copy], 0) == [original]

    async def test_id_reused_with_other_content_is_refused(self, store: EventStore) -> None:
        first = created()
        await store.append("t1", [first], 0)
        before = await snapshot(store)
        other = NewEvent(
            data=ev.TaskFailed(reason="other"), correlation_id="root", event_id=first.event_id
        )
        with pytest.raises(IdempotencyError):
            await store.append("t1", [other], 1)
        with pytest.raises(IdempotencyError):  # same event, another stream
            await store.append("t2", [first], 0)
        with pytest.raises(IdempotencyError):  # partial re-append: one old id, one new
            await store.append("t1", [first, started()], 1)
        with pytest.raises(IdempotencyError):  # one id twice in a call
            await store.append("t1", [other, other], 1)
        assert await snapshot(store) == before

    async def test_concurrent_retries_of_one_append_store_it_once(self, store: EventStore) -> None:
        batch = [created(), started()]
        results = await asyncio.gather(*(store.append("t1", batch, 0) for _ in range(6)))
        assert all(r == results[0] for r in results)
        assert await store.last_position() == 2

    # -- reading ----------------------------------------------------------------

    async def test_read_stream_from_version(self, store: EventStore) -> None:
        out = await store.append("t1", [created(), started(), started(attempt=2), completed()], 0)
        await store.append("t2", [created()], 0)
        assert await store.read_stream("t1") == out
        assert await store.read_stream("t1", 1) == out
        assert await store.read_stream("t1", 3) == out[2:]
        assert await store.read_stream("t1", 4) == out[3:]
        assert await store.read_stream("t1", 5) == []
        assert await store.read_stream("missing") == []

    async def test_read_all_from_position_and_limit(self, store: EventStore) -> None:
        for i in range(5):
            await store.append(f"t{i}", [created(), started()], 0)
        everything = await store.read_all()
        assert [e.position for e in everything] == list(range(1, 11))
        assert await store.read_all(0, 3) == everything[:3]
        assert await store.read_all(1, 3) == everything[:3]
        assert await store.read_all(4, 3) == everything[3:6]
        assert await store.read_all(9, 100) == everything[8:]
        assert await store.read_all(11) == []
        assert await store.read_all(0, 0) == []
        # Paging with from_position = last + 1 walks the whole log exactly once.
        paged: list[Envelope] = []
        position = 0
        while page := await store.read_all(position, 4):
            paged.extend(page)
            position = page[-1].position + 1
        assert paged == everything

    async def test_read_correlation_is_the_whole_tree_in_position_order(
        self, store: EventStore
    ) -> None:
        await store.append("r1", [created("r1")], 0)
        await store.append("r2", [created("r2")], 0)
        await store.append("r1.a", [created("r1", parent_id="r1")], 0)
        await store.append("r1", [started("r1")], 1)
        await store.append("r2.a", [created("r2", parent_id="r2")], 0)
        await store.append("r1.a", [started("r1"), completed("r1")], 1)
        tree = await store.read_correlation("r1")
        assert [(e.stream, e.version) for e in tree] == [
            ("r1", 1),
            ("r1.a", 1),
            ("r1", 2),
            ("r1.a", 2),
            ("r1.a", 3),
        ]
        assert [e.position for e in tree] == sorted(e.position for e in tree)
        assert all(e.correlation_id == "r1" for e in tree)
        assert len(await store.read_correlation("r2")) == 2
        assert await store.read_correlation("nope") == []

    # -- subscribe ----------------------------------------------------------------

    async def test_subscribe_catches_up_then_goes_live(self, store: EventStore) -> None:
        await store.append("t1", [created(), started()], 0)
        async with subscription(store) as it:
            first = await take(it, 2)
            assert [e.position for e in first] == [1, 2]
            await store.append("t1", [completed()], 2)
            await store.append("t2", [created()], 0)
            live = await take(it, 2)
            assert [(e.stream, e.position) for e in live] == [("t1", 3), ("t2", 4)]

    async def test_subscribe_from_a_position(self, store: EventStore) -> None:
        await store.append("t1", [created(), started(), completed()], 0)
        async with subscription(store, 2) as it:
            assert [e.position for e in await take(it, 2)] == [2, 3]
        async with subscription(store, 4) as it:
            waiting = asyncio.ensure_future(take(it, 1))
            await asyncio.sleep(0.01)
            assert not waiting.done()
            await store.append("t2", [created()], 0)
            assert [e.position for e in await waiting] == [4]

    async def test_subscribe_on_an_empty_store_waits_for_the_first_event(
        self, store: EventStore
    ) -> None:
        async with subscription(store) as it:
            waiting = asyncio.ensure_future(take(it, 1))
            await asyncio.sleep(0.02)
            assert not waiting.done()
            [env] = await store.append("t1", [created()], 0)
            assert await waiting == [env]

    async def test_subscribe_has_no_gap_and_no_duplicate_under_concurrent_appends(
        self, store: EventStore
    ) -> None:
        writers, appends = 20, 50
        total = sum(1 + (i % 2) for i in range(appends)) * writers  # 1 or 2 events per append
        appended: set[str] = set()

        async def writer(w: int) -> None:
            version = 0
            for i in range(appends):
                batch = [started(f"root{w % 3}", attempt=i) for _ in range(1 + (i % 2))]
                await store.append(f"task-{w}", batch, version)
                version += len(batch)
                appended.update(e.event_id for e in batch)
                if i % 7 == 0:
                    await asyncio.sleep(0)

        async def subscriber(delay: float) -> list[Envelope]:
            await asyncio.sleep(delay)
            async with subscription(store) as it:
                return await take(it, total, timeout=30)

        subs = [asyncio.ensure_future(subscriber(d)) for d in (0, 0.001, 0.01)]
        await asyncio.sleep(0)  # let the first subscriber start before any append
        await asyncio.gather(*(writer(w) for w in range(writers)))
        seen_by_each = await asyncio.gather(*subs)
        for seen in seen_by_each:
            assert [e.position for e in seen] == list(range(1, total + 1))
            assert {e.event_id for e in seen} == appended
        # Late subscriber: everything by catch-up, from a middle position too.
        async with subscription(store, total // 2) as it:
            tail = await take(it, total - total // 2 + 1)
            assert [e.position for e in tail] == list(range(total // 2, total + 1))
        assert await store.verify() == []

    # -- verify -------------------------------------------------------------------

    async def test_verify_a_clean_log(self, store: EventStore) -> None:
        assert await store.verify() == []
        await store.append("t1", [created(), started(), completed()], 0)
        await store.append("t2", [created()], 0)
        await store.append("t1", [started(attempt=2)], 3)
        assert await store.verify() == []
        assert await store.verify("t1") == []
        assert await store.verify("missing") == []

    # -- bad input ----------------------------------------------------------------

    @pytest.mark.parametrize(("name", "make"), BAD_INPUTS, ids=[n for n, _ in BAD_INPUTS])
    async def test_bad_input_is_a_typed_error_and_changes_nothing(
        self, store: EventStore, name: str, make: Callable[[], tuple[Any, Any, Any]]
    ) -> None:
        await store.append("t", [created()], 0)
        before = await snapshot(store)
        stream, events, expected = make()
        if type(expected) is int and expected == 0 and stream == "t" and isinstance(events, list):
            expected = 1  # so only the bad input itself can be the reason for refusal
        with pytest.raises(CardbusError):
            await store.append(stream, events, expected)
        assert await snapshot(store) == before
        assert await store.verify() == []
        # The store still works afterwards.
        await store.append("t", [started()], 1)

    async def test_bad_input_does_not_disturb_concurrent_good_appends(
        self, store: EventStore
    ) -> None:
        good = [store.append(f"g{i}", [created()], 0) for i in range(5)]
        bad: list[Awaitable[Any]] = [
            store.append("b1", [completed(confidence=math.nan)], 0),
            store.append("b2", [created(inputs={"x": {1}})], 0),
            store.append("g0", [created()], 3),
        ]
        results = await asyncio.gather(*good, *bad, return_exceptions=True)
        assert all(isinstance(r, list) for r in results[:5])
        assert all(isinstance(r, CardbusError) for r in results[5:])
        assert {e.stream for e in await snapshot(store)} == {f"g{i}" for i in range(5)}

    async def test_payload_over_the_configured_limit(self, store: EventStore) -> None:
        store.max_event_bytes = 2048  # type: ignore[attr-defined]
        await store.append("t", [created(goal="small")], 0)
        before = await snapshot(store)
        with pytest.raises(PayloadTooLarge) as info:
            await store.append("t", [completed(output="x" * 4096)], 1)
        assert info.value.limit == 2048
        assert info.value.size > 2048
        with pytest.raises(PayloadTooLarge):  # atomic: the small first event is not kept
            await store.append("t", [started(), completed(output="x" * 4096)], 1)
        assert await snapshot(store) == before
        [env] = await store.append("t", [completed(output="x" * 1024)], 1)
        assert env.version == 2

    async def test_payload_over_the_default_limit(self, store: EventStore) -> None:
        with pytest.raises(PayloadTooLarge):
            await store.append("t", [completed(output="x" * (1024 * 1024 + 1))], 0)
        assert await store.last_position() == 0

    async def test_errors_are_the_documented_types(self, store: EventStore) -> None:
        with pytest.raises(ValidationError):
            await store.append("", [created()], 0)
        with pytest.raises(ValidationError):
            await store.append("t", [], 0)
        with pytest.raises(ValidationError):
            await store.append("t", [created()], -1)
        with pytest.raises(ValidationError):
            await store.append("t", [completed(confidence=math.nan)], 0)

    async def test_unicode_streams_and_payloads_round_trip(self, store: EventStore) -> None:
        stream = "tâche-é-🚀"
        new = created(
            goal="résumé ✓",
            inputs={"emoji": "🚀", "nested": {"k": ["ü", 1e-300, 2**80, -(2**63)]}, "": None},
        )
        [env] = await store.append(stream, [new], 0)
        [back] = await store.read_stream(stream)
        assert back == env
        assert back.data == new.data
