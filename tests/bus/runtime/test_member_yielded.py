"""What a partitioned member keeps of the positions it handed over (``yielded`` in
``MemberLog._subscribe_echo_free``: so that it hands no event twice) stays bounded by what
a read could still return again, on a real nats-server: a followed partition that gets no
event (the shared one here) no longer holds every position handed since following began.
Nothing is handed twice and nothing skipped: what the member handed over is compared with
the log."""

from __future__ import annotations

import asyncio

from memberkit import PARTITIONS, following, root_in, started, two_stores, until

from cardbus.eventstore import Envelope
from cardbus.eventstore.nats import NatsEventStore
from cardbus.eventstore.nats.subjects import SHARED, partition_token

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
