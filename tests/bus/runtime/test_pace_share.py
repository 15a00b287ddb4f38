"""Provider limits shared by the members of a NATS cluster (``bus.runtime.pace_share``):
each member paces the part of the limit its demand is of the cluster's, learned from the
``cardbus-limits`` bucket on a real nats-server; a 429 one member gets holds them all.

The shares' loops are slowed to a tick an hour: each test ticks by hand, then waits for
the other member's word to arrive through the subscription (a condition, not a duration)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from typing import Any

import nats
import pytest
from nats.aio.client import Client

from cardbus.agents.pacing import Limit, Pacer
from cardbus.bus.runtime.pace_share import (
    IDLE_WEIGHT,
    PaceShare,
    limit_id,
    share_pace,
    unshare_pace,
)

KEY = ("api.example:443", "m", "k")


async def _until(check: Callable[[], bool]) -> None:
    while not check():
        await asyncio.sleep(0.01)


@pytest.fixture
async def connections(nats_url: str) -> AsyncIterator[list[Client]]:
    ncs = [await nats.connect(nats_url) for _ in range(2)]
    try:
        yield ncs
    finally:
        for nc in ncs:
            await nc.close()


def _pacer(in_flight: int) -> Pacer:
    pacer = Pacer()
    pacer.configure(KEY, Limit(requests_per_minute=600))
    pacer.state(KEY).in_flight = in_flight  # calls under way: the member's demand
    return pacer


async def test_each_member_paces_its_demands_part_of_the_limit(connections: list[Client]) -> None:
    a, b = _pacer(in_flight=3), _pacer(in_flight=1)
    share_a = await PaceShare(connections[0], a, member="a", period_s=3600).start()
    async with PaceShare(connections[1], b, member="b", period_s=3600) as share_b:
        try:
            await share_a.tick()
            await share_b.tick()
            await asyncio.wait_for(_until(lambda: b.state(KEY).share == 0.25), 30)
            await asyncio.wait_for(_until(lambda: a.state(KEY).share == 0.75), 30)
            requests = a.state(KEY).requests
            assert requests is not None
            # 3/4 of 600 a minute, less its burst of a twentieth: the cluster stays within
            assert requests.rate * 60 == pytest.approx(450 - 450 / 20)
            # b has nothing left to send: a takes nearly all of the limit, and b, should it
            # start again, starts slow (it counts as IDLE_WEIGHT of a call)
            b.state(KEY).in_flight = 0
            await share_b.tick()
            busy = 3 / (3 + IDLE_WEIGHT)
            await asyncio.wait_for(_until(lambda: a.state(KEY).share == busy), 30)
            assert b.state(KEY).share == pytest.approx(IDLE_WEIGHT / (3 + IDLE_WEIGHT))
            # a limit b meets for the first time, while a uses it, starts at b's idle
            # share: not the whole limit until b's next tick
            other = ("api.example:443", "m2", "k")
            a.state(other).in_flight = 2
            await share_a.tick()
            await asyncio.wait_for(_until(lambda: limit_id(other) in share_b.demands), 30)
            assert other not in b.states
            assert b.state(other).share == pytest.approx(IDLE_WEIGHT / (2 + IDLE_WEIGHT))
        finally:
            await share_a.stop()
        # a member that stops deletes its word: the other no longer counts it
        b.state(KEY).in_flight = 1
        await share_b.tick()
        await asyncio.wait_for(_until(lambda: b.state(KEY).share == 1.0), 30)


async def test_a_member_that_leaves_gives_its_part_back_at_once(
    connections: list[Client],
) -> None:
    """Heard after the other's last tick (a busy machine delays the deletion's message):
    the share grows when the deletion is heard, not at the next tick (an hour here)."""
    a, b = _pacer(in_flight=1), _pacer(in_flight=1)
    share_a = await PaceShare(connections[0], a, member="a", period_s=3600).start()
    async with PaceShare(connections[1], b, member="b", period_s=3600) as share_b:
        try:
            await share_a.tick()
            await share_b.tick()
            await asyncio.wait_for(_until(lambda: b.state(KEY).share == 0.5), 30)
        finally:
            await share_a.stop()  # its word deleted; b does not tick again
        await asyncio.wait_for(_until(lambda: b.state(KEY).share == 1.0), 30)
        assert "a" not in share_b.demands[limit_id(KEY)]


async def test_a_429_one_member_gets_holds_every_member(connections: list[Client]) -> None:
    a, b = _pacer(in_flight=1), _pacer(in_flight=1)
    async with (
        PaceShare(connections[0], a, member="a", period_s=3600),
        PaceShare(connections[1], b, member="b", period_s=3600),
    ):
        before = b.state(KEY).slowdown
        a.rate_limited(KEY, 30.0)  # a was answered 429 with a retry-after of 30 s
        await asyncio.wait_for(_until(lambda: b.state(KEY).hold_until > b.clock()), 30)
        assert b.state(KEY).slowdown == before / 2  # b's pace is halved too
        assert b.state(KEY).wait_for(1, b.clock()) > 20  # and nothing goes before the hold
        assert b.state(KEY).rate_limited == 0  # b was not answered 429 itself


async def test_one_share_per_pacer_however_many_runtimes_ask(connections: list[Client]) -> None:
    pacer = Pacer()
    first = await share_pace(connections[0], pacer)
    second = await share_pace(connections[1], pacer)
    assert second is first  # the process is counted once
    await asyncio.wait_for(_until(lambda: bool(first._tasks)), 30)  # started meanwhile
    await unshare_pace(second)
    assert first._tasks  # still shared: one user left
    await unshare_pace(first)
    assert not first._tasks


async def test_a_connection_that_may_not_use_the_bucket_paces_alone(
    nats_server_factory: Callable[..., Any], caplog: pytest.LogCaptureFixture
) -> None:
    # an agent's permissions (``agent_permissions``) do not include the limits bucket
    server = nats_server_factory(
        extra_config='authorization { users = [ { user: "agent", password: "pw",'
        ' permissions: { publish: ["cardbus.reply.>"], subscribe: ["_INBOX.>"] } } ] }'
    )
    nc = await nats.connect(server.url, user="agent", password="pw")
    try:
        pacer = Pacer()
        share = await share_pace(nc, pacer)  # returns at once: nothing waits for the bucket
        assert share._starting is not None
        await asyncio.wait_for(_until(lambda: "paced by this process alone" in caplog.text), 60)
        assert not share._tasks  # not shared: the pacer goes on alone
        await unshare_pace(share)
    finally:
        await nc.close()


async def test_a_member_that_met_no_limit_stays_quiet_and_hears_what_was_put_before(
    connections: list[Client],
) -> None:
    """A member with no limit met neither ticks nor puts (it ticked twice a second and
    watched the bucket through an ordered consumer); it still reads what the bucket held
    when it started, hears each put after, and starts ticking at its first limit."""
    busy = _pacer(in_flight=3)
    async with PaceShare(connections[0], busy, member="busy", period_s=3600) as share_busy:
        await share_busy.tick()  # put before the quiet one starts: read at its start
        quiet = Pacer()
        ticks: list[int] = []
        share = PaceShare(connections[1], quiet, member="quiet", period_s=0.01)
        real = share.tick

        async def counting() -> None:
            ticks.append(1)
            await real()

        share.tick = counting  # type: ignore[method-assign]
        async with share:
            lid = limit_id(KEY)
            await asyncio.wait_for(_until(lambda: "busy" in share.demands.get(lid, {})), 30)
            await asyncio.sleep(0.2)  # twenty periods
            assert ticks == []
            busy.state(KEY).in_flight = 5
            await share_busy.tick()  # heard through the subscription
            await asyncio.wait_for(_until(lambda: share.demands[lid]["busy"][0] == 5.0), 30)
            quiet.configure(KEY, Limit(requests_per_minute=600))
            quiet.state(KEY)  # its first limit: the tick starts
            await asyncio.wait_for(_until(lambda: bool(ticks)), 30)
            await asyncio.wait_for(_until(lambda: "quiet" in share_busy.demands.get(lid, {})), 30)
