"""What a partitioned member keeps of the positions it handed over (``yielded`` in
``MemberLog._subscribe_echo_free``: so that it hands no event twice) stays bounded by what
a read could still return again, on a real nats-server: a followed partition that gets no
event (the shared one here) no longer holds every position handed since following began.
Nothing is handed twice and nothing skipped: what the member handed over is compared with
the log."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from memberkit import PARTITIONS, following, root_in, started, stop, two_stores, until

from cardbus.bus.runtime import member_busy
from cardbus.bus.runtime.members import MemberLog
from cardbus.eventstore import Envelope
from cardbus.eventstore.nats import NatsEventStore
from cardbus.eventstore.nats.subjects import SHARED, partition_filter, partition_token

HEARTBEAT = 0.2  # the member looks after this long with nothing heard


async def _followed_in_log(store: NatsEventStore, parts: set[str]) -> list[Envelope]:
    out: list[Envelope] = []
    while True:
        page = await store.read_all(out[-1].position + 1 if out else 1, 1000)
        if not page:
            break
        out += page
    return [e for e in out if partition_token(e.correlation_id, PARTITIONS) in parts]


async def test_a_member_keeps_no_position_its_partitions_were_read_through(
    nats_url: str,
) -> None:
    async with (
        two_stores(nats_url, HEARTBEAT) as (mine, other),
        following(mine, [3]) as (member, got),
    ):
        await asyncio.sleep(2 * HEARTBEAT)  # listening, its first reads done
        for rnd in range(2):
            # the shared partition gets no event; partition 3 this member's own
            # appends and another writer's (heard, read), partition 5 another's
            own = [root_in(3) for _ in range(20)]
            others = [root_in(3) for _ in range(20)]
            elsewhere = [root_in(5) for _ in range(5)]
            for version in range(3):
                await asyncio.gather(
                    *(mine.append(r, [started(r)], version) for r in own),
                    *(other.append(r, [started(r)], version) for r in others),
                    *(other.append(r, [started(r)], version) for r in elsewhere),
                )
            want = await _followed_in_log(other, {SHARED, "3"})
            assert len(want) == 120 * (rnd + 1)
            await until(lambda want=want: len(got) >= len(want), 10)
            # idle: the look finds nothing missed, and what was kept is let go
            await until(lambda: member.remembered == 0, 15)  # (a wait, not a speed target)
            assert sorted(got, key=lambda e: e.position) == want
            assert len({e.position for e in got}) == len(got)  # nothing twice
        await asyncio.sleep(3 * HEARTBEAT)
        assert len(got) == 240  # nothing handed again later


async def test_a_busy_member_lets_go_of_positions_by_count_without_reading_them_again(
    nats_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Work that keeps arriving means no idle look (a heartbeat of 60 s here): past
    ``BUSY_LOOK_AFTER`` positions kept, the member counts its partitions' events on the
    server and lets go of the positions counted as handed over, instead of keeping every
    position handed while busy. The shared partition gets no event and partition 4 only
    this member's own: neither is read (a look by count, not a read of its own events);
    partition 3 gets another writer's events too."""
    monkeypatch.setattr(member_busy, "BUSY_LOOK_AFTER", 60)
    monkeypatch.setattr(member_busy, "BUSY_LOOK_S", 0.01)
    async with two_stores(nats_url, 60) as (mine, other):
        read: dict[str, int] = {}  # partition filter -> events its reads returned
        direct = mine._read_direct

        async def counted(filt: str, *args: Any) -> Any:
            got = await direct(filt, *args)
            read[filt] = read.get(filt, 0) + len(got)
            return got

        monkeypatch.setattr(mine, "_read_direct", counted)
        member = MemberLog(mine)
        member.hold([3, 4])
        await member.read_all()
        got: list[Envelope] = []
        kept: list[int] = []  # what the member kept, at each event it handed over

        async def follow_and_count() -> None:
            async for item in member.subscribe(1):
                if isinstance(item, Envelope):
                    got.append(item)
                    kept.append(member.remembered)
                else:
                    item()

        follower = asyncio.ensure_future(follow_and_count())
        try:
            await asyncio.sleep(0.3)  # listening, its first reads (of an empty log) done
            for _ in range(20):  # 800 events: 400 of partition 3, 400 of partition 4
                own = [root_in(3) for _ in range(5)] + [root_in(4) for _ in range(10)]
                others = [root_in(3) for _ in range(5)]
                for version in range(2):
                    await asyncio.gather(
                        *(mine.append(r, [started(r)], version) for r in own),
                        *(other.append(r, [started(r)], version) for r in others),
                    )
                await asyncio.sleep(0.03)  # (work that goes on, never idle for a heartbeat)
            want = await _followed_in_log(other, {SHARED, "3", "4"})
            assert len(want) == 800
            await until(lambda: len(got) >= len(want), 10)
            assert sorted(got, key=lambda e: e.position) == want
            assert len({e.position for e in got}) == len(got)  # nothing twice
            # without the looks: 800 (every position since following began)
            assert max(kept) < 250, max(kept)
            busy = member._busy
            assert busy is not None and busy.moved > 0
            prefix = mine.subject_prefix
            assert read.get(partition_filter(prefix, 4), 0) == 0  # its own: never read
            assert read.get(partition_filter(prefix, SHARED), 0) == 0
        finally:
            await stop(follower)


async def test_a_busy_look_never_takes_an_unheard_event_for_handed_over(
    nats_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Another writer's event in partition 3 whose publish the member does not hear (a
    hint lost) is counted and never handed while the member is busy with its own: the
    look keeps partition 3 where it was (below that event) while it moves the others,
    and the member's first idle look finds it. Nothing lost, nothing twice."""
    monkeypatch.setattr(member_busy, "BUSY_LOOK_AFTER", 20)
    monkeypatch.setattr(member_busy, "BUSY_LOOK_S", 0.01)
    async with two_stores(nats_url, 0.4) as (mine, other):
        deaf = False
        subscribe = mine.nc.subscribe
        three = partition_filter(mine.subject_prefix, 3)

        async def hearing(subject: str, **kw: Any) -> Any:  # partition 3's hints, unless deaf
            if subject == three:
                cb = kw["cb"]

                async def heard(msg: Any) -> None:
                    if not deaf:
                        await cb(msg)

                kw["cb"] = heard
            return await subscribe(subject, **kw)

        monkeypatch.setattr(mine.nc, "subscribe", hearing)
        async with following(mine, [3, 4]) as (member, got):
            await asyncio.sleep(0.3)  # listening, its first reads (of an empty log) done
            deaf = True
            lost = root_in(3)
            unheard = (await other.append(lost, [started(lost)], 0))[0].position
            await asyncio.sleep(0.05)  # (its publish has come, and gone unheard)
            deaf = False
            busy = member._busy
            assert busy is not None
            for _ in range(12):  # busy with its own: 240 events, no 0.4 s without one
                own = [root_in(3) for _ in range(10)] + [root_in(4) for _ in range(10)]
                await asyncio.gather(*(mine.append(r, [started(r)], 0) for r in own))
                await asyncio.sleep(0.02)
                assert busy.read_from["3"] <= unheard  # never past what was not handed
                assert unheard not in {e.position for e in got}
            assert busy.moved > 0  # (the other partitions were let go of meanwhile)
            want = await _followed_in_log(other, {SHARED, "3", "4"})
            assert len(want) == 241
            await until(lambda: len(got) >= len(want), 10)  # the idle look finds it
            assert sorted(got, key=lambda e: e.position) == want
            assert len({e.position for e in got}) == len(got)  # nothing twice
