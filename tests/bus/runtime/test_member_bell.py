"""An idle partitioned member waits on the server (``bus/runtime/member_bell.py``): it
reads nothing and asks for nothing while nothing is stored in its partitions, and the
server rings it for an append it did not hear; an append it did not hear before it went
idle is found by its first look. Real nats-server, real store; only the member's
hearing of others' publishes is switched off where a test says so (as a lost route or
a slow consumer loses them)."""

from __future__ import annotations

import asyncio
from typing import Any

from doorbellkit import count_doorbell
from memberkit import following, root_in, started, two_stores, until
from natsserver import NatsServer

from cardbus.eventstore import Envelope
from cardbus.eventstore.errors import StoreUnavailable
from cardbus.eventstore.nats import NatsEventStore

HEARTBEAT = 0.2  # the member looks after this long with nothing heard


class _Watched:
    """The member's store with its reads counted and its hearing switchable."""

    def __init__(self, store: NatsEventStore) -> None:
        self.reads = 0  # direct-get reads of the log
        self.ends = 0  # looks at the log's last position
        self.hearing = True
        read, end, subscribe = store._read_direct, store._last_position, store.nc.subscribe
        prefix = store.subject_prefix + "."

        async def counted_read(*args: Any) -> Any:
            self.reads += 1
            return await read(*args)

        async def counted_end() -> int:
            self.ends += 1
            return await end()

        async def switchable(subject: str, *args: Any, cb: Any = None, **kw: Any) -> Any:
            if cb is not None and subject.startswith(prefix):  # the member's hints
                heard = cb

                async def cb(msg: Any) -> None:
                    if self.hearing:
                        await heard(msg)

            return await subscribe(subject, *args, cb=cb, **kw)

        store._read_direct = counted_read  # type: ignore[method-assign]
        store._last_position = counted_end  # type: ignore[method-assign]
        store.nc.subscribe = switchable  # type: ignore[method-assign]

    def zero(self) -> None:
        self.reads = self.ends = 0


async def test_an_idle_member_reads_nothing_and_is_rung_by_an_append_it_did_not_hear(
    nats_url: str,
) -> None:
    async with two_stores(nats_url, HEARTBEAT) as (mine, other):
        watched = _Watched(mine)
        async with following(mine, [3]) as (_member, got):
            # listening, and its first read done (read_all's, then the follower's, of the
            # shared partition and its own): a publish is heard, not found by that read
            await until(lambda: watched.reads >= 4, 5)
            # work: its own appends and another writer's, heard, in its partition
            a, b, c = root_in(3), root_in(3), root_in(5)
            written = await mine.append(a, [started(a)], 0)
            written += await other.append(b, [started(b)], 0)
            written += await mine.append(a, [started(a)], 1)
            await until(lambda: len(got) == 3, 5)
            watched.zero()
            # idle: 17 heartbeats (before, it looked at the log's end after 1, 3, 7 and
            # 15, and read its partitions at the first look after work), with another
            # member's partition written meanwhile (not its own: no answer)
            await asyncio.sleep(HEARTBEAT)
            await other.append(c, [started(c)], 0)
            await asyncio.sleep(16 * HEARTBEAT)
            assert (watched.reads, watched.ends) == (0, 0)
            # an append in its partition it does not hear: the server rings, at once
            watched.hearing = False
            written += await other.append(b, [started(b)], 1)
            await until(lambda: len(got) == 4, 1.5)
            assert watched.reads == 1  # the partition that rang, nothing else
            assert sorted(got, key=lambda e: e.position) == written
            await asyncio.sleep(2 * HEARTBEAT)
            assert len(got) == 4


async def test_an_append_unheard_before_the_member_went_idle_is_found_by_its_first_look(
    nats_url: str,
) -> None:
    async with two_stores(nats_url, HEARTBEAT) as (mine, other):
        watched = _Watched(mine)
        async with following(mine, [3, 6]) as (_member, got):
            await until(lambda: watched.reads >= 6, 5)  # listening, and its first read done
            a, b = root_in(3), root_in(6)
            written = await mine.append(a, [started(a)], 0)
            watched.hearing = False
            # unheard, while the member is busy with its own: no doorbell armed yet
            written += await other.append(b, [started(b)], 0)
            written += await mine.append(a, [started(a)], 1)
            await until(lambda: len(got) == 3, 4 * HEARTBEAT + 1.0)
            assert sorted(got, key=lambda e: e.position) == written
            await asyncio.sleep(4 * HEARTBEAT)
            assert len(got) == 3  # nothing twice


async def test_a_partition_taken_while_the_member_waits_is_rung_for_too(nats_url: str) -> None:
    async with two_stores(nats_url, HEARTBEAT) as (mine, other):
        watched = _Watched(mine)
        async with following(mine, [3]) as (member, got):
            await until(lambda: watched.reads >= 4, 5)  # listening, and its first read done
            b = root_in(6)
            written = await other.append(b, [started(b)], 0)  # not its partition yet
            await asyncio.sleep(3 * HEARTBEAT)  # idle, waiting on the server
            assert got == []
            member.hold([3, 6])  # a lease round gave it partition 6: caught up, then followed
            await until(lambda: len(got) == 1 and member.folded == {3, 6}, 5)
            await asyncio.sleep(3 * HEARTBEAT)
            watched.zero()
            watched.hearing = False
            written += await other.append(b, [started(b)], 1)
            await until(lambda: len(got) == 2, 1.5)
            assert got == written and (watched.reads, watched.ends) == (1, 0)


async def test_a_member_whose_doorbell_went_with_a_server_restart_reads_and_is_rung_again(
    nats_server: NatsServer,
) -> None:
    """Its doorbell (a consumer in the server's memory) is gone with the restart: the
    reconnect wakes the member, which reads its partitions, arms again and is rung by the
    next append it does not hear."""
    url = nats_server.url
    async with two_stores(url, HEARTBEAT, request_timeout=2.0) as (mine, other):
        watched = _Watched(mine)
        watched.hearing = False  # nothing heard at all: the doorbell and the reconnect only
        async with following(mine, [3]) as (_member, got):
            await until(lambda: watched.reads >= 4, 5)
            await asyncio.sleep(3 * HEARTBEAT)  # armed
            nats_server.restart()
            b = root_in(3)
            written: list[Envelope] = []
            for _ in range(200):
                try:
                    written += await other.append(b, [started(b)], 0)
                    break
                except StoreUnavailable:
                    await asyncio.sleep(0.05)
            assert len(written) == 1
            await until(lambda: len(got) == 1, 10)
            async with asyncio.timeout(10):  # armed again: its consumer on the new server
                while (await other._js.stream_info(other.stream_name)).state.consumer_count < 1:
                    await asyncio.sleep(0.05)
            watched.zero()
            written += await other.append(b, [started(b)], 1)
            await until(lambda: len(got) == 2, 3)
            assert got == written and (watched.reads, watched.ends) == (1, 0)


async def test_a_member_asks_its_doorbell_again_when_its_request_expires(
    nats_url: str, monkeypatch: Any
) -> None:
    """The doorbell's request expires (408) with nothing stored: the same consumer is
    asked again (``Doorbell.again``), not deleted and made anew with a look; an append the
    member does not hear still rings it."""
    bell = count_doorbell(monkeypatch)
    arms, asked = bell.arms, bell.asked
    heartbeat = 0.04  # the request expires every 30 heartbeats: 1.2 s
    async with two_stores(nats_url, heartbeat) as (mine, other):
        watched = _Watched(mine)
        async with following(mine, [3]) as (_member, got):
            await until(lambda: len(arms) >= 1, 5)  # idle: armed
            await asyncio.sleep(0.2)
            armed = len(arms)
            await asyncio.sleep(3.0)  # two expiries at least
            assert len(arms) == armed  # not armed anew
            assert len(asked) >= 2 and len(set(asked)) == 1 and asked[0] is not None
            watched.hearing = False
            b = root_in(3)
            written = await other.append(b, [started(b)], 0)
            await until(lambda: len(got) == 1, 1.5)
            assert got == written
