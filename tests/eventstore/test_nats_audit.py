"""Whole-log tamper evidence on JetStream, against a real nats-server: a tamper matrix.

Each case writes the lifecycle log (tests/lifecycle_log.py, 42 events in six
streams) through ``NatsEventStore`` into a stream of its own, keeps the head
(``store.head()``) "outside the log", tampers with the stream through the
JetStream API as an operator with delete rights could (a message deleted, a
subject purged, the tail cut, the oldest events purged, the stream deleted
and written again shorter, forged messages published), and ``store.audit``
must name a problem at the position touched. Nothing here is mocked.
"""

from __future__ import annotations

import itertools
from collections.abc import AsyncIterator, Iterator

import lifecycle_log
import msgspec
import nats
import pytest
from nats.js import JetStreamContext
from natsserver import NatsServer

from cardbus.eventstore import NewEvent
from cardbus.eventstore.audit import LOG_STREAM
from cardbus.eventstore.envelope import ChainProblem, Envelope, encode_body
from cardbus.eventstore.loghead import LOG_GENESIS, LogHead
from cardbus.eventstore.nats import HASH_HEADER, NatsEventStore, encode_token, kind_token
from cardbus.eventstore.nats.audits import StreamState, audit_messages
from cardbus.eventstore.nats.subjects import partition_token
from cardbus.eventstore.nats.wire import Stored

N_EVENTS = 42
_names = itertools.count()


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NatsServer]:
    with NatsServer(tmp_path_factory.mktemp("audit") / "nats") as s:
        yield s


class Log:
    """One case's log: its own stream and subject prefix, the head kept, raw JetStream."""

    def __init__(
        self, url: str, store: NatsEventStore, js: JetStreamContext, head: LogHead
    ) -> None:
        self.url, self.store, self.js, self.head = url, store, js, head
        self.stream = store.stream_name
        self.prefix = store.subject_prefix

    async def events(self) -> list[Envelope]:
        return await self.store.read_all(0, 10_000)

    def subject(self, env: Envelope) -> str:
        task, root = encode_token(env.stream), encode_token(env.correlation_id)
        part = partition_token(env.correlation_id, self.store.partitions)
        return f"{self.prefix}.{task}.{part}.{root}.{kind_token(env.type)}"

    async def audit(self, head: LogHead | None = None) -> list[ChainProblem]:
        problems, _ = await self.store.audit(head)
        return problems


@pytest.fixture
async def log(server: NatsServer) -> AsyncIterator[Log]:
    n = next(_names)
    store = await NatsEventStore.connect(
        server.url, stream_name=f"AUDIT_{n}", subject_prefix=f"audit{n}.evt", deny_delete=False
    )
    nc = await nats.connect(server.url)
    try:
        await lifecycle_log.write_run(store, "a-")
        head = await store.head()
        assert head.position == N_EVENTS and head.log_hash != LOG_GENESIS
        yield Log(server.url, store, nc.jetstream(), head)
    finally:
        await nc.close()
        await store.close()


def named(problems: list[ChainProblem], position: int, *words: str) -> bool:
    return any(p.position == position and all(w in p.problem for w in words) for p in problems)


async def test_a_clean_log_audits_clean_and_its_head_is_reproducible(log: Log) -> None:
    problems, head = await log.store.audit(log.head)
    assert problems == [] and head == log.head
    assert await log.store.head() == log.head
    assert await log.store.verify() == []


@pytest.mark.parametrize("position", range(1, N_EVENTS + 1))
async def test_deleting_any_one_event_is_named_at_its_position(log: Log, position: int) -> None:
    await log.js.delete_msg(log.stream, position)
    problems = await log.audit()
    if position < N_EVENTS:
        assert named(problems, position, f"positions {position} missing (deleted)"), problems
    else:  # the last one: only the stream's state (and a kept head) can tell
        assert named(problems, position, "missing at the end", f"last sequence is {N_EVENTS}")
    assert named(await log.audit(log.head), position, "missing")


async def test_purging_each_task_stream_names_every_event_of_it(log: Log) -> None:
    by_stream: dict[str, list[int]] = {}
    for e in await log.events():
        by_stream.setdefault(e.stream, []).append(e.position)
    for stream, positions in by_stream.items():
        await log.js.purge_stream(log.stream, subject=f"{log.prefix}.{encode_token(stream)}.>")
        problems = await log.audit(log.head)
        for p in positions:
            assert any(p in _missing(q) for q in problems), (stream, p, problems)
    assert (await log.store.stream_state()).messages == 0
    assert named(await log.audit(), 1, f"positions 1..{N_EVENTS} missing at the end")


async def test_purging_one_subject_is_named(log: Log) -> None:
    first = (await log.events())[3]
    await log.js.purge_stream(log.stream, subject=log.subject(first))
    problems = await log.audit()
    assert named(problems, first.position, "missing (deleted)"), problems


@pytest.mark.parametrize("cut", [1, 3, 10])
async def test_cutting_the_tail_is_named(log: Log, cut: int) -> None:
    for seq in range(N_EVENTS - cut + 1, N_EVENTS + 1):
        await log.js.delete_msg(log.stream, seq)
    first = N_EVENTS - cut + 1
    problems = await log.audit()
    gap = f"{first}" + (f"..{N_EVENTS}" if cut > 1 else "")
    assert named(problems, first, f"positions {gap} missing at the end"), problems
    problems = await log.audit(log.head)
    assert named(problems, first, f"events {first}..{N_EVENTS} missing (truncated)"), problems


async def test_purging_the_oldest_events_is_named(log: Log) -> None:
    await log.js.purge_stream(log.stream, seq=11)  # keeps 11.. (JetStream's purge "up to")
    assert (await log.store.stream_state()).first_seq == 11
    problems = await log.audit()
    assert named(problems, 1, "positions 1..10 missing (deleted)"), problems


async def test_a_stream_deleted_and_written_again_shorter_is_caught_by_the_kept_head(
    log: Log,
) -> None:
    """The one tamper the log alone cannot show: a new stream, the old events but the last
    five copied into it. Only the head kept outside catches it."""
    events = await log.events()
    await log.js.delete_stream(log.stream)
    store = await NatsEventStore.connect(
        log.url,
        stream_name=log.stream,
        subject_prefix=log.prefix,
    )
    try:
        versions: dict[str, int] = {}
        for e in events[:-5]:
            new = NewEvent(
                data=e.data,
                correlation_id=e.correlation_id,
                actor=e.actor,
                recorded_at=e.recorded_at,
                event_id=e.event_id,
                causation_id=e.causation_id,
            )
            await store.append(e.stream, [new], versions.get(e.stream, 0))
            versions[e.stream] = versions.get(e.stream, 0) + 1
        problems, head = await store.audit()
        assert problems == [] and head.position == N_EVENTS - 5  # a shorter log is a log
        problems, _ = await store.audit(log.head)
        assert named(problems, N_EVENTS - 4, f"events {N_EVENTS - 4}..{N_EVENTS} missing")
    finally:
        await store.close()


async def test_forged_and_misfiled_messages_are_named(log: Log) -> None:
    events = await log.events()
    target = events[5]
    # an edited copy under the original hash, on the right subject
    forged = msgspec.structs.replace(target, actor="mallory")
    ack = await log.js.publish(
        log.subject(target), encode_body(forged), headers={HASH_HEADER: target.hash}
    )
    problems = await log.audit()
    assert any(p.position == ack.seq and p.stream == target.stream for p in problems)
    # an untouched body filed under another task's subject and another kind
    other = events[7]
    part = partition_token(other.correlation_id, log.store.partitions)
    wrong = f"{log.prefix}.a-task-code.{part}.{encode_token(other.correlation_id)}.x"
    ack2 = await log.js.publish(
        wrong, encode_body(other), headers={HASH_HEADER: other.hash, "Nats-Msg-Id": "zzz"}
    )
    problems = await log.audit()
    here = [p.problem for p in problems if p.position == ack2.seq]
    assert any(f"subject task is 'a-task-code', the body says {other.stream!r}" in p for p in here)
    assert any("subject kind is 'x'" in p for p in here), here
    assert any("Nats-Msg-Id is 'zzz'" in p for p in here), here
    # garbage
    ack3 = await log.js.publish(f"{log.prefix}.t.r.k", b"\xff not json")
    assert any(p.position == ack3.seq for p in await log.audit())
    # and against the kept head, the history up to it is unchanged: only what follows is new
    assert not any(p.stream == LOG_STREAM for p in await log.audit(log.head))


def test_audit_messages_is_a_pure_function() -> None:
    """No server: the stream's state alone names a cut tail; an empty log is clean."""
    problems, head = audit_messages("p", [], StreamState(0, 0, 0, 0))
    assert problems == [] and head.position == 0 and head.log_hash == LOG_GENESIS
    problems, _ = audit_messages("p", [], StreamState(4, 3, 0, 0))
    assert [p.problem for p in problems] == [
        "positions 1..3 missing at the end (deleted or purged): the stream's last sequence"
        " is 3, its last stored event is at 0"
    ]
    junk = Stored(1, "p.t.r.k", b"{}", "h")
    problems, _ = audit_messages("p", [junk], StreamState(1, 1, 1, 0))
    assert problems and all(p.position == 1 for p in problems)


def _missing(p: ChainProblem) -> range:
    """The positions a gap problem names ("positions a..b missing ...")."""
    if p.stream != LOG_STREAM or "missing" not in p.problem:
        return range(0)
    words = p.problem.split()
    span = words[words.index("positions") + 1] if "positions" in words else ""
    a, _, b = span.partition("..")
    return range(int(a), int(b or a) + 1) if a.isdigit() else range(0)


def test_the_helper_reads_gaps() -> None:
    assert list(_missing(ChainProblem(LOG_STREAM, 2, "?", 0, "positions 2..4 missing x"))) == [
        2,
        3,
        4,
    ]
    assert list(_missing(ChainProblem("t", 2, "?", 0, "positions 2 missing"))) == []
