"""What is particular to the NATS JetStream event store, against a real nats-server.

The shared contract (tests/contract) already runs against ``nats``; these tests
pin the subject scheme, the stored bytes and headers, atomic batches,
idempotency across connections, server restarts and crashes, connection
options, tamper detection and a replicated 3-node cluster.
"""

from __future__ import annotations

import asyncio
import hashlib
import math
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgspec
import nats
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from natsserver import (
    NatsCluster,
    NatsServer,
    free_port,
    make_tls_files,
    nats_server_binary,
    tls_config,
)

from cardbus.eventstore import (
    CardbusError,
    ConcurrencyError,
    DecodeError,
    IdempotencyError,
    MemoryEventStore,
    NewEvent,
    StoreUnavailable,
    ValidationError,
    open_store,
)
from cardbus.eventstore import events as ev
from cardbus.eventstore.envelope import encode_body
from cardbus.eventstore.nats import (
    HASH_HEADER,
    SUBJECT_LAYOUT,
    SUBJECT_LAYOUT_KEY,
    NatsEventStore,
    SubjectLayoutError,
    decode_token,
    encode_token,
    event_subject,
    kind_token,
    partition_of,
)
from cardbus.projections import ProjectionRunner, all_projections, dump_tables


def created(root: str = "root") -> NewEvent:
    return NewEvent(data=ev.TaskCreated(root_id=root, capability="echo"), correlation_id=root)


def started(root: str = "root", attempt: int = 1) -> NewEvent:
    return NewEvent(data=ev.TaskStarted(attempt=attempt, agent_id="a1"), correlation_id=root)


async def raw_messages(url: str, filt: str = "cardbus.evt.>") -> list[Any]:
    """Every stored message matching ``filt``, read with plain nats-py (not our store)."""
    nc = await nats.connect(url)
    try:
        js = nc.jetstream()
        info = await js.stream_info("CARDBUS_EVENTS")
        out = []
        for seq in range(1, (info.state.last_seq or 0) + 1):
            try:
                msg = await js.get_msg("CARDBUS_EVENTS", seq=seq)
            except nats.js.errors.NotFoundError:
                continue
            if nats_subject_matches(filt, msg.subject or ""):
                out.append(msg)
        return out
    finally:
        await nc.close()


def nats_subject_matches(filt: str, subject: str) -> bool:
    f, s = filt.split("."), subject.split(".")
    for i, tok in enumerate(f):
        if tok == ">":
            return len(s) > i
        if i >= len(s) or (tok != "*" and tok != s[i]):
            return False
    return len(f) == len(s)


# -- the subject scheme -----------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "token"),
    [
        ("t1", "t1"),
        ("0192f0c4-7b1a-7c3e-9d2f-1a2b3c4d5e6f", "0192f0c4-7b1a-7c3e-9d2f-1a2b3c4d5e6f"),
        ("agent-x", "agent-x"),
        ("r1.a", "r1_2ea"),
        ("a_b", "a_5fb"),
        ("a b*>", "a_20b_2a_3e"),
        ("é", "_c3_a9"),
        ("", "_"),
    ],
)
def test_tokens_are_readable_and_reversible(value: str, token: str) -> None:
    assert encode_token(value) == token
    assert decode_token(token) == value


@settings(max_examples=300, deadline=None)
@given(st.text())
def test_any_id_encodes_to_one_valid_token(value: str) -> None:
    token = encode_token(value)
    assert token
    assert all(c.isascii() and (c.isalnum() or c in "-_") for c in token)
    assert decode_token(token) == value


def test_subject_layout() -> None:
    assert kind_token("task.dispatched.v1") == "task_dispatched_v1"
    assert (
        event_subject("cardbus.evt", "root 1", "r1.a", "task.created.v1", 32)
        # the task first, then the run's partition, then the root
        == f"cardbus.evt.r1_2ea.{partition_of('root 1', 32)}.root_201.task_created_v1"
    )
    assert event_subject("p", "agent-x", "agent-x", "agent.registered.v1", 8) == (
        "p.agent-x.s.agent-x.agent_registered_v1"  # what every member folds: shared
    )


# -- what is stored -----------------------------------------------------------------


async def test_stored_message_is_the_envelope_body_on_the_documented_subject(
    nats_store: NatsEventStore, nats_url: str
) -> None:
    out = await nats_store.append("r1.a", [created("r1"), started("r1")], 0)
    msgs = await raw_messages(nats_url)
    assert [m.seq for m in msgs] == [e.position for e in out] == [1, 2]
    for env, msg in zip(out, msgs, strict=True):
        p = partition_of("r1", 32)
        assert msg.subject == f"cardbus.evt.r1_2ea.{p}.r1.{kind_token(env.type)}"
        assert msg.data == encode_body(env)
        assert msg.headers[HASH_HEADER] == env.hash == hashlib.sha256(msg.data).hexdigest()
        assert msg.headers["Nats-Msg-Id"] == env.event_id
    # Only the first message of an append carries the per-task expectation.
    assert msgs[0].headers["Nats-Expected-Last-Subject-Sequence"] == "0"
    assert msgs[0].headers["Nats-Expected-Last-Subject-Sequence-Subject"] == (
        "cardbus.evt.r1_2ea.>"
    )
    assert "Nats-Expected-Last-Subject-Sequence" not in msgs[1].headers


async def test_stream_config(nats_store: NatsEventStore) -> None:
    info = await nats_store._js.stream_info("CARDBUS_EVENTS")
    assert info.config.subjects == ["cardbus.evt.>"]
    assert info.config.allow_atomic is True
    assert info.config.deny_delete is True
    assert info.config.deny_purge is True
    assert nats_store.atomic is True
    metadata = info.config.metadata or {}
    assert metadata[SUBJECT_LAYOUT_KEY] == SUBJECT_LAYOUT == "task.part.root.kind"
    assert metadata["cardbus.partitions"] == "32" and nats_store.partitions == 32


async def _old_style_stream(url: str, events: int) -> None:
    """A stream as earlier cardbus versions made it: no layout marker in its metadata."""
    nc = await nats.connect(url)
    try:
        js = nc.jetstream()
        await js.add_stream(name="CARDBUS_EVENTS", subjects=["cardbus.evt.>"])
        for i in range(events):  # <root>.<task>.<kind>, the old order
            await js.publish(f"cardbus.evt.r1.r1-{i}.task_created_v1", b"{}")
    finally:
        await nc.close()


async def test_a_stream_in_the_old_subject_layout_is_refused_on_connect(nats_url: str) -> None:
    await _old_style_stream(nats_url, 2)
    with pytest.raises(SubjectLayoutError, match=r"holds 2 events in subject layout root\.task"):
        await NatsEventStore.connect(nats_url)
    nc = await nats.connect(nats_url)
    try:  # refused as it is: nothing was changed or written
        info = await nc.jetstream().stream_info("CARDBUS_EVENTS")
        assert info.state.messages == 2
        assert SUBJECT_LAYOUT_KEY not in (info.config.metadata or {})
        with pytest.raises(SubjectLayoutError):
            await NatsEventStore.from_connection(nc)
    finally:
        await nc.close()


async def test_a_stream_in_the_layout_before_partitions_is_refused_with_one_line(
    nats_url: str,
) -> None:
    nc = await nats.connect(nats_url)
    try:
        js = nc.jetstream()
        await js.add_stream(
            name="CARDBUS_EVENTS",
            subjects=["cardbus.evt.>"],
            metadata={SUBJECT_LAYOUT_KEY: "task.root.kind"},
        )
        await js.publish("cardbus.evt.t1.r1.task_created_v1", b"{}")
    finally:
        await nc.close()
    with pytest.raises(SubjectLayoutError) as raised:
        await NatsEventStore.connect(nats_url)
    text = str(raised.value)
    assert "\n" not in text
    assert "holds 1 events in subject layout task.root.kind" in text
    assert "<task>.<partition>.<root>.<kind>" in text and "use a new stream" in text


async def test_an_empty_unmarked_stream_is_marked_and_used(nats_url: str) -> None:
    await _old_style_stream(nats_url, 0)
    async with await NatsEventStore.connect(nats_url) as store:
        await store.append("t", [created()], 0)
        info = await store._js.stream_info("CARDBUS_EVENTS")
        assert (info.config.metadata or {})[SUBJECT_LAYOUT_KEY] == SUBJECT_LAYOUT
    async with await NatsEventStore.connect(nats_url) as store:  # marked: opens again
        assert [e.stream for e in await store.read_stream("t")] == ["t"]


async def test_custom_stream_name_and_prefix(nats_url: str) -> None:
    async with await NatsEventStore.connect(
        nats_url, stream_name="OTHER_LOG", subject_prefix="acme.log"
    ) as store:
        [env] = await store.append("t", [created()], 0)
        assert (await store.read_all()) == [env]
        nc = await nats.connect(nats_url)
        try:
            msg = await nc.jetstream().get_msg("OTHER_LOG", seq=1)
            p = partition_of("root", 32)
            assert msg.subject == f"acme.log.t.{p}.root.task_created_v1"
        finally:
            await nc.close()


async def test_open_store_by_url(nats_url: str) -> None:
    store = await open_store(nats_url)
    try:
        assert isinstance(store, NatsEventStore)
        await store.append("t", [created()], 0)
        assert await store.stream_version("t") == 1
    finally:
        await store.close()


# -- atomic batches and concurrency ---------------------------------------------


async def test_server_side_conflict_on_a_stale_head_changes_nothing(nats_url: str) -> None:
    """Store A's cached head is stale; the server refuses A's whole batch."""
    async with (
        await NatsEventStore.connect(nats_url) as a,
        await NatsEventStore.connect(nats_url) as b,
    ):
        await a.append("t", [created()], 0)  # A caches version 1
        await b.append("t", [started()], 1)  # B moves the task to version 2
        before = await a.read_all()
        with pytest.raises(ConcurrencyError) as info:
            await a.append("t", [started(attempt=2), started(attempt=3), started(attempt=4)], 1)
        assert (info.value.stream, info.value.expected, info.value.actual) == ("t", 1, 2)
        assert isinstance(info.value.__cause__, nats.js.errors.APIError)
        assert await a.read_all() == before
        # A's cache is now right again.
        out = await a.append("t", [started(attempt=2), started(attempt=3)], 2)
        assert [e.version for e in out] == [3, 4]
        assert await a.verify() == []


async def test_large_batches_are_atomic_and_bounded(nats_store: NatsEventStore) -> None:
    out = await nats_store.append("t", [started(attempt=i) for i in range(1000)], 0)
    assert [e.position for e in out] == list(range(1, 1001))
    with pytest.raises(ValidationError):
        await nats_store.append("t", [started() for _ in range(1001)], 1000)
    bad = [started() for _ in range(999)] + [
        NewEvent(data=ev.TaskCompleted(attempt=1, agent_id="a", confidence=math.nan),
                 correlation_id="root")
    ]  # fmt: skip
    with pytest.raises(ValidationError):
        await nats_store.append("t", bad, 1000)
    assert await nats_store.last_position() == 1000
    # Reads page through more than one pull batch.
    assert len(await nats_store.read_all(0, 10_000)) == 1000
    assert [e.position for e in await nats_store.read_all(990, 5)] == list(range(990, 995))
    assert len(await nats_store.read_stream("t", 400)) == 601
    assert await nats_store.verify("t") == []


async def test_reads_page_through_direct_get_batches(nats_store: NatsEventStore) -> None:
    """More than one direct get batch (1000 messages) per read, with and without a limit."""
    assert nats_store._direct_reads
    written = await nats_store.append("t", [started(attempt=i) for i in range(1000)], 0)
    written += await nats_store.append("u", [started(root="r2") for _ in range(700)], 0)
    written += await nats_store.append("t", [started(attempt=i) for i in range(600)], 1000)
    assert await nats_store.read_all(0, 10_000) == written
    assert await nats_store.read_all(1500, 1200) == written[1499:]
    assert await nats_store.read_all(200, 1200) == written[199:1399]
    assert await nats_store.read_stream("t") == written[:1000] + written[1700:]
    assert await nats_store.read_stream("t", 1500) == written[2199:]
    assert await nats_store.read_correlation("r2") == written[1000:1700]
    assert await nats_store.read_stream("nothing") == []
    assert await nats_store.read_all(2301) == []
    assert await nats_store.verify() == []


async def test_concurrent_multi_event_appends_share_batches_and_keep_their_checks(
    nats_url: str,
) -> None:
    """Group commit: multi-event appends waiting together go out as one atomic batch, yet
    each is still checked on its own task, stored whole or not at all, and idempotent."""
    async with (
        await NatsEventStore.connect(nats_url) as a,
        await NatsEventStore.connect(nats_url) as b,
    ):
        pair = {i: [created(), started(attempt=i)] for i in range(20)}
        first = await asyncio.gather(*(a.append(f"t{i}", pair[i], 0) for i in range(20)))
        assert all([e.version for e in out] == [1, 2] for out in first)
        # They really shared batches (fewer batch ids than appends).
        batch_ids = {m.headers.get("Nats-Batch-Id") for m in await raw_messages(nats_url)}
        assert 1 <= len(batch_ids) < 20
        await b.append("t3", [started()], 2)  # A's cached head of t3 is now stale
        more = {i: [started(attempt=i + 100), started(attempt=i + 200)] for i in range(20)}
        results = await asyncio.gather(
            *(a.append(f"t{i}", more[i], 2) for i in range(20)),
            a.append("t5", [started(attempt=7), started(attempt=8)], 2),  # races t5's own
            return_exceptions=True,
        )
        conflict = results[3]
        assert isinstance(conflict, ConcurrencyError) and conflict.actual == 3
        # Of the two appends expecting t5 at version 2, exactly one is stored.
        assert sum(isinstance(r, ConcurrencyError) for r in (results[5], results[20])) == 1
        for i in range(20):
            out = results[i]
            if i in (3, 5):
                continue
            assert isinstance(out, list) and [e.version for e in out] == [3, 4]
            assert out == await a.read_stream(f"t{i}", 3)
        # A retry of stored appends, alongside new ones, returns the originals.
        again = await asyncio.gather(
            *(a.append(f"t{i}", more[i], 2) for i in (0, 1, 2)),
            *(a.append(f"t{i}", [started(attempt=9), started(attempt=10)], 4) for i in (0, 1)),
        )
        assert again[:3] == [results[0], results[1], results[2]]
        assert [[e.version for e in out] for out in again[3:]] == [[5, 6], [5, 6]]
        assert await a.verify() == []
        assert await b.read_all(0, 10_000) == await a.read_all(0, 10_000)


async def test_many_concurrent_batches_from_two_connections(nats_url: str) -> None:
    async with (
        await NatsEventStore.connect(nats_url) as a,
        await NatsEventStore.connect(nats_url) as b,
    ):

        async def writer(store: NatsEventStore, name: str) -> None:
            version = 0
            for i in range(10):
                out = await store.append(name, [started(attempt=i), started(attempt=i)], version)
                version = out[-1].version

        await asyncio.gather(*(writer(a if i % 2 else b, f"w{i}") for i in range(16)))
        everything = await a.read_all(0, 100_000)
        assert [e.position for e in everything] == list(range(1, 321))
        assert await b.verify() == []


# -- idempotency beyond one connection ---------------------------------------------


async def test_retry_from_another_connection_returns_the_originals(nats_url: str) -> None:
    single, batch = [created("r")], [started("r"), started("r", 2)]
    async with await NatsEventStore.connect(nats_url) as a:
        first = await a.append("t", single, 0)
        second = await a.append("t", batch, 1)
    # A new process retries both appends, with the expected versions they had then.
    async with await NatsEventStore.connect(nats_url) as b:
        assert await b.append("t", single, 0) == first
        assert await b.append("t", batch, 1) == second
        # ... and at the current version (the server's dedup answers).
        assert await b.append("t", single, 3) == first
        assert await b.append("t", batch, 3) == second
        assert await b.last_position() == 3
        with pytest.raises(IdempotencyError):
            await b.append("elsewhere", batch, 0)
        assert await b.last_position() == 3


# -- faults ------------------------------------------------------------------------


async def test_down_server_is_store_unavailable_then_recovers(nats_server: NatsServer) -> None:
    store = await NatsEventStore.connect(
        nats_server.url, request_timeout=1.0, store_retry_timeout=0.5
    )
    try:
        await store.append("t", [created()], 0)
        nats_server.stop()
        t0 = time.monotonic()
        with pytest.raises(StoreUnavailable):
            await store.append("t", [started()], 1)
        with pytest.raises(StoreUnavailable):
            await store.read_all()
        assert time.monotonic() - t0 < 5
        nats_server.start()
        for _ in range(100):  # the client reconnects with backoff
            if store.nc.is_connected:
                break
            await asyncio.sleep(0.05)
        [env] = await store.append("t", [started()], 1)
        assert (env.version, env.position) == (2, 2)
    finally:
        await store.close()


async def test_an_append_waits_out_a_short_outage(nats_server: NatsServer) -> None:
    async with await NatsEventStore.connect(
        nats_server.url, request_timeout=0.5, store_retry_timeout=15.0
    ) as store:
        await store.append("t", [created()], 0)
        nats_server.stop()
        pending = asyncio.ensure_future(store.append("t", [started(), started(attempt=2)], 1))
        await asyncio.sleep(0.7)
        assert not pending.done()
        nats_server.start()
        out = await asyncio.wait_for(pending, 15)
        assert [(e.version, e.position) for e in out] == [(2, 2), (3, 3)]
        assert await store.verify() == []


async def test_acked_events_survive_a_server_crash(nats_server: NatsServer) -> None:
    async with await NatsEventStore.connect(nats_server.url) as store:
        written = []
        for i in range(20):
            written += await store.append(f"t{i % 3}", [started(attempt=i)], i // 3)
    nats_server.kill()  # SIGKILL: no flush, no goodbye
    nats_server.start()
    async with await NatsEventStore.connect(nats_server.url) as store:
        assert await store.read_all() == written
        assert await store.verify() == []


async def test_subscription_survives_a_server_restart_without_gap_or_duplicate(
    nats_server: NatsServer,
) -> None:
    store = await NatsEventStore.connect(nats_server.url, request_timeout=1.0)
    store.heartbeat = 0.2
    seen: list[int] = []
    try:
        await store.append("t", [created()], 0)

        async def follow() -> None:
            async for env in store.subscribe():
                seen.append(env.position)
                if len(seen) == 30:
                    return

        task = asyncio.ensure_future(follow())
        version = 1
        for i in range(10):
            await store.append("t", [started(attempt=i)], version)
            version += 1
        nats_server.restart()
        for i in range(19):
            for _ in range(200):
                try:
                    await store.append("t", [started(attempt=100 + i)], version)
                    break
                except StoreUnavailable:
                    await asyncio.sleep(0.05)
            version += 1
        await asyncio.wait_for(task, 20)
        assert seen == list(range(1, 31))
    finally:
        await store.close()


async def test_unreachable_server_is_store_unavailable() -> None:
    with pytest.raises(StoreUnavailable):
        await NatsEventStore.connect(f"nats://127.0.0.1:{free_port()}", connect_timeout=0.5)


async def test_closed_store_refuses_work(nats_store: NatsEventStore) -> None:
    await nats_store.close()
    with pytest.raises(StoreUnavailable):
        await nats_store.append("t", [created()], 0)
    with pytest.raises(StoreUnavailable):
        await nats_store.read_all()


# -- tampering and garbage on the log subjects ---------------------------------------


async def test_verify_names_deleted_and_forged_events(tmp_path: Path) -> None:
    with NatsServer(tmp_path / "nats") as server:
        async with await NatsEventStore.connect(server.url, deny_delete=False) as store:
            out = await store.append("t", [created(), started(), started(attempt=2)], 0)
            await store.append("u", [created()], 0)
            nc = await nats.connect(server.url)
            try:
                js = nc.jetstream()
                await js.delete_msg("CARDBUS_EVENTS", out[1].position)
                forged = msgspec.structs.replace(out[0], actor="mallory")
                await js.publish(
                    f"cardbus.evt.t.root.{kind_token(forged.type)}",
                    encode_body(forged),
                    headers={HASH_HEADER: out[0].hash},
                )
                await js.publish("cardbus.evt.t.root.x", b"\xff not json")  # stored (acked)
            finally:
                await nc.close()
            problems = await store.verify()
            where = [(p.stream, p.position) for p in problems]
            assert ("t", 3) in where  # its predecessor was deleted
            assert ("t", 5) in where  # forged: edited content under an old hash
            assert ("t", 6) in where  # undecodable
            assert all(p.stream == "t" for p in problems)
            assert await store.verify("u") == []
            # Garbage is a clear, typed error when read, never a silent skip.
            with pytest.raises(DecodeError, match=r"position 6 \(cardbus\.evt\.t\.root\.x\)"):
                await store.read_stream("t")


async def test_bad_ids_are_refused_before_anything_is_sent(nats_store: NatsEventStore) -> None:
    with pytest.raises(ValidationError):
        await nats_store.append("t", [created(root="r" * 5000)], 0)
    with pytest.raises(CardbusError):
        await nats_store.append("t" * 600, [created()], 0)
    assert await nats_store.last_position() == 0


# -- connection options ----------------------------------------------------------------


async def test_token_and_user_password_auth(
    nats_server_factory: Callable[..., NatsServer],
) -> None:
    server = nats_server_factory(extra_config='authorization { token: "s3cret" }')
    # (Usually "Authorization Violation" at once; the server may also reset the
    # connection before the client reads why, and then the connect times out.)
    with pytest.raises(StoreUnavailable):
        await NatsEventStore.connect(server.url, token="wrong", connect_timeout=2.0)
    async with await NatsEventStore.connect(server.url, token="s3cret") as store:
        await store.append("t", [created()], 0)
    users = 'authorization { users: [ { user: "orch", password: "pw" } ] }'
    server = nats_server_factory(extra_config=users)
    with pytest.raises(StoreUnavailable):
        await NatsEventStore.connect(server.url, user="orch", password="nope", connect_timeout=2.0)
    async with await NatsEventStore.connect(server.url, user="orch", password="pw") as store:
        await store.append("t", [created()], 0)


async def test_missing_tls_files_are_store_unavailable(nats_url: str, tmp_path: Path) -> None:
    with pytest.raises(StoreUnavailable):
        await NatsEventStore.connect(nats_url, tls_ca=str(tmp_path / "missing-ca.pem"))


# -- the fixtures themselves ------------------------------------------------------------


def test_binary_is_found_and_servers_do_not_collide(tmp_path: Path) -> None:
    assert Path(nats_server_binary()).is_file()
    with NatsServer(tmp_path / "a") as a, NatsServer(tmp_path / "b") as b:
        assert a.port != b.port
        port = a.port
        a.kill()
        assert not a.running
        a.start()
        assert a.port == port


async def test_replicated_stream_on_a_three_node_cluster_loses_nothing(
    nats_cluster: NatsCluster,
) -> None:
    store = await NatsEventStore.connect(nats_cluster.url, replicas=3, request_timeout=5.0)
    try:
        info = await store._js.stream_info("CARDBUS_EVENTS")
        assert info.config.num_replicas == 3
        leader = info.cluster.leader if info.cluster else None
        victim = next(n for n in nats_cluster.nodes if n.name == leader)
        follower = next(n for n in nats_cluster.nodes if n.name != leader)
        # Read-your-writes through a connection to a follower, whose consumers may lag.
        written = []
        async with await NatsEventStore.connect(follower.url) as reader:
            for i in range(40):
                written += await store.append("t", [started(attempt=i)], i)
                assert (await reader.read_stream("t", i + 1))[-1] == written[-1]
                assert await reader.read_all(written[-1].position) == written[-1:]
                assert await reader.stream_version("t") == i + 1
        victim.stop()
        # The store rides through the leader election (it retries transient failures).
        for version in range(40, 50):
            written += await store.append("t", [started(attempt=version)], version)
        assert await store.read_all() == written
        victim.start()
        assert await store.verify() == []
    finally:
        await store.close()


async def test_tls_with_a_client_certificate(tmp_path: Path) -> None:
    tls = make_tls_files(tmp_path / "tls")
    with NatsServer(tmp_path / "nats", extra_config=tls_config(tls)) as server:
        # Without our CA the server's certificate is not trusted.
        with pytest.raises(StoreUnavailable):
            await NatsEventStore.connect(
                server.url.replace("nats://", "tls://"), connect_timeout=1.0
            )
        async with await NatsEventStore.connect(
            server.url,
            tls_ca=str(tls.ca),
            tls_cert=str(tls.client_cert),
            tls_key=str(tls.client_key),
        ) as store:
            [env] = await store.append("t", [created()], 0)
            assert await store.read_stream("t") == [env]


STORE_PERMISSIONS = """
authorization {
  users: [
    {
      user: "writer", password: "pw",
      permissions: {
        publish: [
          "cardbus.evt.>",
          "$JS.API.STREAM.INFO.CARDBUS_EVENTS",
          "$JS.API.STREAM.CREATE.CARDBUS_EVENTS",
          "$JS.API.STREAM.UPDATE.CARDBUS_EVENTS",
          "$JS.API.STREAM.MSG.GET.CARDBUS_EVENTS",
          "$JS.API.DIRECT.GET.CARDBUS_EVENTS",
          "$JS.API.CONSUMER.CREATE.CARDBUS_EVENTS",
          "$JS.API.CONSUMER.MSG.NEXT.CARDBUS_EVENTS.*",
          "$JS.API.CONSUMER.DELETE.CARDBUS_EVENTS.*",
        ]
        subscribe: ["_INBOX.>"]
      }
    }
  ]
}
"""


@pytest.mark.parametrize("direct_get", [True, False], ids=["documented", "without-direct-get"])
async def test_the_documented_permissions_are_enough(tmp_path: Path, direct_get: bool) -> None:
    """The subjects the docs list (docs/reference/nats.md, permissions) cover everything the
    store does; without ``$JS.API.DIRECT.GET`` (the permissions of older versions) reads use
    consumers."""
    config = STORE_PERMISSIONS
    if not direct_get:
        config = config.replace('"$JS.API.DIRECT.GET.CARDBUS_EVENTS",', "")
    with NatsServer(tmp_path / "nats", extra_config=config) as server:
        async with await NatsEventStore.connect(
            server.url, user="writer", password="pw", request_timeout=2.0
        ) as store:
            assert isinstance(store, NatsEventStore) and store._direct_reads is direct_get
            first, batch = [created()], [started(), started(attempt=2)]
            one = await store.append("t", first, 0)
            two = await store.append("t", batch, 1)
            assert await store.append("t", first, 0) == one  # read back after a conflict
            assert await store.append("t", batch, 3) == two  # the server's dedup
            with pytest.raises(ConcurrencyError):
                await store.append("t", [started(attempt=3)], 1)
            assert await store.read_stream("t") == one + two
            assert await store.read_correlation("root") == one + two
            assert await store.stream_version("t") == 3
            assert await store.last_position() == 3
            assert await store.verify() == []
            it = store.subscribe(2)
            try:
                assert [(await anext(it)).position for _ in range(2)] == [2, 3]
            finally:
                await it.aclose()  # type: ignore[attr-defined]


# -- projections run on it unchanged ----------------------------------------------------


async def test_projections_fold_the_same_models_from_nats(nats_store: NatsEventStore) -> None:
    import lifecycle_log as log  # tests/lifecycle_log.py: a realistic run

    memory = MemoryEventStore()
    projections = all_projections()
    on_nats = ProjectionRunner.open(nats_store, ":memory:", projections, batch_size=7)
    try:
        for i, prefix in enumerate(("a-", "b-")):
            await log.write_run(nats_store, prefix, t0=log.T0 + 1000 * i)
            await log.write_run(memory, prefix, t0=log.T0 + 1000 * i)
        await on_nats.catch_up()
        follower = asyncio.ensure_future(on_nats.follow())  # live, through subscribe
        await log.write_run(nats_store, "c-", t0=log.T0 + 2000)
        await log.write_run(memory, "c-", t0=log.T0 + 2000)
        await on_nats.wait_for(await nats_store.last_position(), timeout=10)
        follower.cancel()
        with pytest.raises(asyncio.CancelledError):
            await follower
        assert [e.data for e in await nats_store.read_all(0, 10_000)] == [
            e.data for e in await memory.read_all(0, 10_000)
        ]
        with ProjectionRunner.open(memory, ":memory:", all_projections()) as reference:
            await reference.catch_up()
            assert dump_tables(on_nats.conn, projections) == dump_tables(
                reference.conn, projections
            )
        assert not on_nats.errors
    finally:
        on_nats.close()


@pytest.mark.parametrize("shared_connection", [False, True])
async def test_close_ends_a_running_subscription(nats_url: str, shared_connection: bool) -> None:
    nc = await nats.connect(nats_url)
    try:
        if shared_connection:
            store = await NatsEventStore.from_connection(nc)
        else:
            store = await NatsEventStore.connect(nats_url)
        await store.append("t", [created()], 0)
        got: list[int] = []

        async def follow() -> None:
            async for env in store.subscribe():
                got.append(env.position)

        task = asyncio.ensure_future(follow())
        while not got:
            await asyncio.sleep(0.01)
        await store.close()
        with pytest.raises(StoreUnavailable):
            await asyncio.wait_for(task, 5)
        assert got == [1]
        assert nc.is_connected  # a shared connection stays open
    finally:
        await nc.close()


# -- differential: NATS behaves exactly like the in-memory model -------------------------

_append = st.tuples(
    st.just("append"),
    st.integers(0, 2),  # which stream
    st.integers(1, 3),  # how many events
    st.sampled_from([0, 0, 0, -1, 1, 5]),  # expected version offset (0 = right)
)
_op = st.one_of(
    _append,
    _append,
    _append,
    st.tuples(st.just("retry"), st.integers(0, 20), st.sampled_from(["same", "current"])),
    st.tuples(st.just("read_all"), st.integers(0, 12), st.integers(0, 6)),
    st.tuples(st.just("read_stream"), st.integers(0, 2), st.integers(1, 4)),
    st.tuples(st.just("read_correlation"), st.integers(0, 1)),
)


def test_nats_matches_the_memory_model(nats_server: NatsServer) -> None:
    counter = iter(range(1_000_000))

    @settings(max_examples=40, deadline=None)
    @given(st.lists(_op, min_size=1, max_size=25))
    def run(ops: list[tuple[Any, ...]]) -> None:
        n = next(counter)

        async def go() -> None:
            model = MemoryEventStore()
            async with await NatsEventStore.connect(
                nats_server.url, stream_name=f"DIFF{n}", subject_prefix=f"diff{n}.evt"
            ) as real:
                done: list[tuple[str, list[NewEvent], int]] = []

                async def both(call: Any) -> Any:
                    outcomes = []
                    for store in (model, real):
                        try:
                            outcomes.append(("ok", await call(store)))
                        except CardbusError as e:
                            outcomes.append((type(e).__name__, str(e)))
                    assert outcomes[1] == outcomes[0], ops
                    return outcomes[0]

                for op in ops:
                    if op[0] == "append":
                        _, s, k, delta = op
                        stream = f"task.{s}/é"
                        expected = max(await model.stream_version(stream) + delta, 0)
                        batch = [started(f"root{s % 2}", attempt=i) for i in range(k)]
                        kind, _ = await both(lambda st, b=batch: st.append(stream, b, expected))  # noqa: B023
                        if kind == "ok":
                            done.append((stream, batch, expected))
                    elif op[0] == "retry" and done:
                        stream, batch, expected = done[op[1] % len(done)]
                        if op[2] == "current":
                            expected = await model.stream_version(stream)
                        await both(lambda st: st.append(stream, batch, expected))  # noqa: B023
                    elif op[0] == "read_all":
                        await both(lambda st: st.read_all(op[1], op[2]))  # noqa: B023
                    elif op[0] == "read_stream":
                        await both(lambda st: st.read_stream(f"task.{op[1]}/é", op[2]))  # noqa: B023
                    elif op[0] == "read_correlation":
                        await both(lambda st: st.read_correlation(f"root{op[1]}"))  # noqa: B023
                assert await real.read_all(0, 10_000) == await model.read_all(0, 10_000)
                assert await real.verify() == []

        asyncio.run(go())

    run()


def test_cluster_start_survives_a_stolen_route_port(tmp_path: Path) -> None:
    import socket

    cluster = NatsCluster(tmp_path / "cluster")
    thief = socket.socket()
    thief.bind(("127.0.0.1", cluster.nodes[1].cluster_port))
    thief.listen()
    try:
        cluster.start()
        assert all(n.running for n in cluster.nodes)
        assert cluster.nodes[1].cluster_port != thief.getsockname()[1]
    finally:
        thief.close()
        cluster.stop()


async def test_fallback_without_atomic_batches_still_checks_every_event(
    nats_store: NatsEventStore,
) -> None:
    """What a pre-2.12 server gets: one publish per event, each expecting the one before."""
    nats_store.atomic = False
    out = await nats_store.append("t", [created(), started(), started(attempt=2)], 0)
    assert [(e.version, e.position) for e in out] == [(1, 1), (2, 2), (3, 3)]
    assert await nats_store.read_stream("t") == out
    with pytest.raises(ConcurrencyError):
        await nats_store.append("t", [started(attempt=3), started(attempt=4)], 2)
    assert await nats_store.append("t", [started(attempt=3), started(attempt=4)], 3)
    assert await nats_store.verify() == []
