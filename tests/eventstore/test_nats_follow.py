"""Following the NATS log without its own echo (eventstore/nats/follow.py): what a store
appends reaches its own subscribers from the append, with no message back from the
server; what others append is read from the stream, whichever way the follower learns
of it (a core publish heard, a gap before its own acked append, an idle look); and the
stream's order holds, with no gap and no duplicate, as through a consumer.
Real nats-servers (tests/conftest.py), nothing mocked."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import nats
import pytest
from doorbellkit import count_doorbell
from natsserver import NatsCluster, NatsServer

from cardbus.eventstore import Envelope, NewEvent
from cardbus.eventstore import events as ev
from cardbus.eventstore.errors import ConcurrencyError, StoreUnavailable, ValidationError
from cardbus.eventstore.nats import NatsEventStore
from cardbus.eventstore.nats import follow as follow_module
from cardbus.eventstore.nats.connection import NatsOptions
from cardbus.testing import EventStoreContract


def started(root: str = "root", attempt: int = 1) -> NewEvent:
    return NewEvent(data=ev.TaskStarted(attempt=attempt, agent_id="a1"), correlation_id=root)


async def take(it: AsyncIterator[Envelope], n: int, timeout: float = 10.0) -> list[Envelope]:
    async def go() -> list[Envelope]:
        return [await anext(it) for _ in range(n)]

    return await asyncio.wait_for(go(), timeout)


async def test_own_appends_come_from_the_append_not_back_from_the_server(
    nats_store: NatsEventStore,
) -> None:
    store = nats_store
    assert store.nc.options["no_echo"]  # NatsEventStore.connect opens it so
    it = store.subscribe()
    first = asyncio.ensure_future(anext(it))
    await asyncio.sleep(0.2)  # the follower is listening
    received = store.nc.stats["in_msgs"]
    appends = 0
    mine: list[Envelope] = []
    for i in range(40):
        mine += await store.append(f"t{i}", [started()], 0)
        mine += await store.append(f"t{i}", [started(attempt=2), started(attempt=3)], 1)
        appends += 2
    got = [await asyncio.wait_for(first, 5)] + await take(it, len(mine) - 1)
    # the acks, and nothing per event: a consumer would have sent all 120 events back
    assert store.nc.stats["in_msgs"] - received < appends + 10
    assert got == mine == await store.read_all(0, 10_000)
    await it.aclose()  # type: ignore[attr-defined]


async def test_others_appends_are_read_in_order_between_its_own(nats_url: str) -> None:
    async with (
        await NatsEventStore.connect(nats_url, heartbeat=30.0) as mine,
        await NatsEventStore.connect(nats_url) as other,
    ):
        it = mine.subscribe()
        pending = asyncio.ensure_future(anext(it))
        await asyncio.sleep(0.2)
        # heard: a publish on another connection wakes the follower (long before a heartbeat)
        theirs = await other.append("theirs", [started("r2")], 0)
        assert [await asyncio.wait_for(pending, 5)] == theirs
        written: list[Envelope] = []

        async def mix(i: int) -> None:
            written.extend(await mine.append(f"m{i}", [started()], 0))
            written.extend(await other.append(f"o{i}", [started(), started(attempt=2)], 0))

        await asyncio.gather(*(mix(i) for i in range(30)))
        got = await take(it, len(written))
        assert [e.position for e in got] == sorted(e.position for e in written)
        assert got == (await mine.read_all(0, 10_000))[1:]
        await it.aclose()  # type: ignore[attr-defined]


async def test_without_hints_a_gap_before_its_own_ack_and_idle_looks_find_the_rest(
    nats_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Others' publishes unheard (as after a disconnect): an own append acked after one of
    theirs shows the gap at once; with nothing appended, a look every ``heartbeat``."""

    async def deaf(self: object, msg: object) -> None:
        return None

    monkeypatch.setattr(follow_module._Follower, "on_hint", deaf)
    async with (
        await NatsEventStore.connect(nats_url, heartbeat=30.0) as mine,
        await NatsEventStore.connect(nats_url) as other,
    ):
        it = mine.subscribe()
        pending = asyncio.ensure_future(anext(it))
        await asyncio.sleep(0.2)
        theirs = await other.append("theirs", [started("r2")], 0)
        await asyncio.sleep(0.3)
        assert not pending.done()  # unheard, and no look for 30 s
        own = await mine.append("mine", [started()], 0)  # acked at position 2: 1 is a gap
        assert [await asyncio.wait_for(pending, 2)] + await take(it, 1, 2) == theirs + own
        await it.aclose()  # type: ignore[attr-defined]
    async with (
        await NatsEventStore.connect(nats_url, heartbeat=0.2) as mine,
        await NatsEventStore.connect(nats_url) as other,
    ):
        it = mine.subscribe(3)
        pending = asyncio.ensure_future(anext(it))
        await asyncio.sleep(0.2)
        theirs = await other.append("theirs", [started("r2", attempt=2)], 1)
        assert [await asyncio.wait_for(pending, 3)] == theirs  # the idle look
        await it.aclose()  # type: ignore[attr-defined]


async def test_a_refused_publish_heard_is_not_waited_for(nats_url: str) -> None:
    """A publish the stream refuses (a conflict) is heard but never stored: the follower
    looks a few times, then goes on; the next event still comes at once."""
    async with (
        await NatsEventStore.connect(nats_url, heartbeat=30.0) as mine,
        await NatsEventStore.connect(nats_url) as other,
    ):
        await other.append("t", [started()], 0)
        it = mine.subscribe(2)
        pending = asyncio.ensure_future(anext(it))
        await asyncio.sleep(0.2)
        other._heads.clear()  # so it publishes (expecting a new task) and the server refuses
        with pytest.raises(ConcurrencyError):
            await other.append("t", [started(attempt=2)], 0)
        await asyncio.sleep(0.5)
        assert not pending.done()
        later = await other.append("u", [started()], 0)
        assert [await asyncio.wait_for(pending, 2)] == later
        await it.aclose()  # type: ignore[attr-defined]


async def test_a_store_beside_a_bus_connection_opens_its_own(nats_url: str) -> None:
    """``from_connection`` on a connection that echoes (a bus's, made by NatsOptions.connect)
    opens its own ``no_echo`` connection like it; ``own_connection=False`` stays on it; a
    connection cardbus did not open is used as it is."""
    nc = await NatsOptions(url=nats_url).connect("cardbus-orchestrator")
    plain = await nats.connect(nats_url)
    try:
        store = await NatsEventStore.from_connection(nc)
        assert store.nc is not nc and store.nc.options["no_echo"]
        assert store.nc.options["name"] == "cardbus-orchestrator-log"
        await store.append("t", [started()], 0)
        await store.close()
        assert store.nc.is_closed and nc.is_connected  # its own closed, the given one open
        shared = await NatsEventStore.from_connection(nc, own_connection=False)
        assert shared.nc is nc and await shared.read_stream("t")
        await shared.close()
        other = await NatsEventStore.from_connection(plain)
        assert other.nc is plain
        it = other.subscribe()  # an echoing connection: followed through a consumer
        assert [e.version for e in await take(it, 1)] == [1]
        await it.aclose()  # type: ignore[attr-defined]
        await other.close()
        with pytest.raises(ValidationError):
            await NatsEventStore.from_connection(plain, own_connection=True)
    finally:
        await nc.close()
        await plain.close()


class TestNatsStoreContractThroughAConsumer(EventStoreContract):
    """The contract again with the store on a connection that echoes (consumer follow)."""

    @pytest.fixture
    async def store(self, nats_url: str) -> AsyncIterator[NatsEventStore]:
        nc = await nats.connect(nats_url)
        store = await NatsEventStore.from_connection(nc, request_timeout=10.0)
        try:
            yield store
        finally:
            await store.close()
            await nc.close()


async def test_follow_consumer_has_the_server_send_every_event(nats_url: str) -> None:
    """``follow="consumer"``: for processes that mostly follow others' events."""
    async with await NatsEventStore.connect(nats_url, follow="consumer") as store:
        it = store.subscribe()
        first = asyncio.ensure_future(anext(it))
        await asyncio.sleep(0.2)
        received = store.nc.stats["in_msgs"]
        mine = [e for i in range(20) for e in await store.append(f"t{i}", [started()], 0)]
        assert [await asyncio.wait_for(first, 5)] + await take(it, 19) == mine
        assert store.nc.stats["in_msgs"] - received >= 40  # the acks and the events again
        await it.aclose()  # type: ignore[attr-defined]
    with pytest.raises(ValidationError):
        await NatsEventStore.connect(nats_url, follow="echo")


async def test_an_idle_follower_waits_on_the_server_instead_of_reading(
    nats_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Nothing heard for a heartbeat: the follower arms its doorbell (one consumer from its
    next position, doorbell.py) and reads nothing more while idle (it used to read after
    1, 2, 4, ... heartbeats); another writer's append, even unheard, rings it at once."""

    async def deaf(self: object, msg: object) -> None:
        return None

    monkeypatch.setattr(follow_module._Follower, "on_hint", deaf)
    reads: list[int] = []
    read_direct = NatsEventStore._read_direct

    async def counted_read(self: NatsEventStore, *args: object, **kw: object) -> object:
        reads.append(1)
        return await read_direct(self, *args, **kw)  # type: ignore[arg-type]

    monkeypatch.setattr(NatsEventStore, "_read_direct", counted_read)
    arms = count_doorbell(monkeypatch).arms
    async with (
        await NatsEventStore.connect(nats_url, heartbeat=0.2) as mine,
        await NatsEventStore.connect(nats_url) as other,
    ):
        await other.append("before", [started("r1")], 0)
        it = mine.subscribe()
        assert [e.position for e in await take(it, 1)] == [1]  # the catch-up read
        pending = asyncio.ensure_future(anext(it))
        await asyncio.sleep(0.5)
        reads.clear()
        await asyncio.sleep(2.0)  # 10 heartbeats idle: reads after 3 and 7 of them before
        assert reads == [] and arms == [2]
        theirs = await other.append("theirs", [started("r2")], 0)
        # rung: the doorbell's request expires only 30 heartbeats (6 s) after its arming
        assert [await asyncio.wait_for(pending, 1.0)] == theirs
        assert reads == [1] and arms == [2]  # one read: what the ring said is there
        await it.aclose()  # type: ignore[attr-defined]


async def test_an_idle_followers_doorbell_is_asked_again_when_its_request_expires(
    nats_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Its request expires (408) with nothing stored: the same consumer, which delivered
    nothing and so waits where it was armed, is asked again (one pull request), not
    deleted and made anew (a round trip more each 30 heartbeats of idleness); it still
    rings for another writer's append."""

    async def deaf(self: object, msg: object) -> None:
        return None

    monkeypatch.setattr(follow_module._Follower, "on_hint", deaf)
    bell = count_doorbell(monkeypatch)
    arms, asked = bell.arms, bell.asked
    # a heartbeat of 0.04 s: the doorbell's request expires every 1.2 s
    async with (
        await NatsEventStore.connect(nats_url, heartbeat=0.04) as mine,
        await NatsEventStore.connect(nats_url) as other,
    ):
        await other.append("before", [started("r1")], 0)
        it = mine.subscribe()
        assert [e.position for e in await take(it, 1)] == [1]
        pending = asyncio.ensure_future(anext(it))
        await asyncio.sleep(3.2)  # armed once, then two expiries
        assert arms == [2]
        assert len(asked) >= 2 and len(set(asked)) == 1 and asked[0] is not None
        theirs = await other.append("theirs", [started("r2")], 0)
        assert [await asyncio.wait_for(pending, 1.0)] == theirs
        await it.aclose()  # type: ignore[attr-defined]


async def test_an_idle_follower_finds_what_was_appended_across_a_server_restart(
    nats_server: NatsServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Its doorbell (a consumer in the server's memory) is gone with the restart: the
    reconnect wakes the follower, which reads, arms again and is rung by the next append."""

    async def deaf(self: object, msg: object) -> None:
        return None

    monkeypatch.setattr(follow_module._Follower, "on_hint", deaf)
    async with (
        await NatsEventStore.connect(nats_server.url, heartbeat=0.2, request_timeout=2.0) as mine,
        await NatsEventStore.connect(nats_server.url, request_timeout=2.0) as other,
    ):
        it = mine.subscribe()
        pending = asyncio.ensure_future(anext(it))
        await asyncio.sleep(0.6)  # armed
        nats_server.restart()
        written: list[Envelope] = []
        for _ in range(200):
            try:
                written += await other.append("after", [started("r3")], 0)
                break
            except StoreUnavailable:
                await asyncio.sleep(0.05)
        assert len(written) == 1
        assert [await asyncio.wait_for(pending, 10)] == written
        later = await other.append("later", [started("r4")], 0)
        assert await take(it, 1, 5) == later
        await it.aclose()  # type: ignore[attr-defined]


async def test_an_idle_follower_on_another_node_of_a_cluster_is_rung(
    nats_cluster: NatsCluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An R3 log, the writer and the follower on different nodes, hints unheard (as with
    a route down): the doorbell, a consumer of the replicated stream, still rings."""

    async def deaf(self: object, msg: object) -> None:
        return None

    monkeypatch.setattr(follow_module._Follower, "on_hint", deaf)
    reads: list[int] = []
    read_direct = NatsEventStore._read_direct

    async def counted_read(self: NatsEventStore, *args: object, **kw: object) -> object:
        reads.append(1)
        return await read_direct(self, *args, **kw)  # type: ignore[arg-type]

    monkeypatch.setattr(NatsEventStore, "_read_direct", counted_read)
    first, second = nats_cluster.nodes[0], nats_cluster.nodes[1]
    async with (
        await NatsEventStore.connect(first.url, replicas=3, request_timeout=5.0) as writer,
        await NatsEventStore.connect(second.url, heartbeat=0.2, request_timeout=5.0) as mine,
    ):
        it = mine.subscribe()
        pending = asyncio.ensure_future(anext(it))
        await asyncio.sleep(0.5)
        reads.clear()
        await asyncio.sleep(1.5)  # armed: no read (idle reads at 0.6 and 1.4 s before)
        assert reads == []
        theirs = await writer.append("theirs", [started("r1")], 0)
        assert [await asyncio.wait_for(pending, 2.0)] == theirs
        later = await writer.append("later", [started("r2")], 0)
        assert await take(it, 1, 3.0) == later
        await it.aclose()  # type: ignore[attr-defined]
