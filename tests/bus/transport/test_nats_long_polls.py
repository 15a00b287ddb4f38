"""What an idle NATS bus costs, and what it still notices: long pull requests with idle
heartbeats (``bus.transport.nats_pulls``), asked for again at once after a reconnect;
lease renewals published without JetStream's ack and still delivered. Real
nats-servers (tests/conftest.py)."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import msgspec
from natsserver import NatsServer

from cardbus.agents.cards import AgentCard, Announce, TaskCard
from cardbus.bus.runtime.renewals import renewal_wait
from cardbus.bus.transport.nats import NatsBus
from cardbus.bus.transport.nats_pulls import LeaseWatch, PullClock


def test_a_long_request_asks_for_heartbeats_and_is_lost_after_two_missing() -> None:
    clock = PullClock(fetch_wait=30.0, pull_heartbeat=10.0)
    body = json.loads(clock.request(3))
    assert body == {"batch": 3, "expires": 30_000_000_000, "idle_heartbeat": 10_000_000_000}
    assert clock.gone(0.0)  # nothing asked yet
    clock.asked = 100.0
    assert not clock.gone(120.9)
    assert clock.gone(121.1)  # two heartbeats missed (and a second of slack)
    clock.heard = 120.0  # a heartbeat came
    assert not clock.gone(131.0)
    assert clock.gone(131.1)  # expired (30 s) and its 408 not seen
    clock.forget()  # a reconnect
    assert clock.gone(100.0)


def test_a_short_request_asks_for_no_heartbeat_and_is_lost_after_its_expiry() -> None:
    clock = PullClock(fetch_wait=0.5, pull_heartbeat=10.0)
    assert "idle_heartbeat" not in json.loads(clock.request(1))
    clock.asked = 10.0
    assert not clock.gone(11.4)
    assert clock.gone(11.6)


def test_the_heartbeat_is_at_most_half_the_expiry() -> None:
    clock = PullClock(fetch_wait=4.0, pull_heartbeat=10.0)
    assert json.loads(clock.request(1))["idle_heartbeat"] == 2_000_000_000


def test_a_request_carrying_renewals_is_lost_after_three_quarters_of_the_shortest_lease() -> None:
    leases = LeaseWatch()
    clock = PullClock(fetch_wait=30.0, pull_heartbeat=10.0, leases=leases)
    clock.asked = clock.heard = 100.0
    assert clock.wait(100.0) == 21.0  # no lease yet: its heartbeats alone
    leases.announced("slow", 20.0, True, 100.0)
    leases.announced("quick", 4.0, True, 100.0)
    assert clock.wait(100.0) == 3.0 and not clock.gone(102.9) and clock.gone(103.1)
    leases.announced("quick", 4.0, False, 101.0)  # gone offline: no renewal due
    assert clock.wait(101.0) == 14.0
    assert clock.wait(121.1) == 0.001 and clock.gone(121.1)  # its heartbeats: lost
    clock.asked = 121.1
    assert clock.wait(121.1) == 21.0  # the last lease ran out: no renewal due either


def test_renewals_of_one_period_fall_on_one_instant() -> None:
    period = 10 / 3
    for a, b in [(100.0, 101.5), (7.25, 7.26), (0.0, period * 0.99)]:
        wait_a, wait_b = renewal_wait(a, period), renewal_wait(b, period)
        assert 0 < wait_a <= period + 1e-3 and 0 < wait_b <= period + 1e-3
        assert (
            abs((a + wait_a) - (b + wait_b)) < 1e-9
            or abs(abs((a + wait_a) - (b + wait_b)) - period) < 1e-9
        )
    at = 50.0 + renewal_wait(50.0, period)
    assert renewal_wait(at, period) > period - 1e-6  # on the instant: the next one


async def test_a_card_is_asked_for_again_at_once_after_the_server_is_killed_and_back(
    nats_server: NatsServer,
) -> None:
    # requests that would be noticed lost only after two minutes: the reconnect must tell
    agent = await NatsBus.connect(nats_server.url, fetch_wait=600.0, pull_heartbeat=60.0)
    orch = await NatsBus.connect(nats_server.url)
    got: asyncio.Queue[str] = asyncio.Queue()

    async def handle(card: TaskCard) -> None:
        got.put_nowait(card.task_id)

    try:
        await agent.consume("quick", handle)
        card = TaskCard(task_id="t1", attempt=1, root_id="r", capability="c", inputs={})
        await orch.send_task("quick", card)
        assert await asyncio.wait_for(got.get(), 10) == "t1"
        # killed, so it cannot tell the request's end (a stopping server answers 409)
        await asyncio.to_thread(nats_server.kill)
        await asyncio.to_thread(nats_server.start)
        # (the send is tried again through the orchestrator's reconnect)
        await orch.send_task("quick", msgspec.structs.replace(card, task_id="t2"))
        assert await asyncio.wait_for(got.get(), 30) == "t2"
    finally:
        await orch.close()
        await agent.close()


async def test_a_renewal_is_published_without_an_ack_and_delivered(nats_url: str) -> None:
    orch = await NatsBus.connect(nats_url, reply_durable="renewals", fetch_wait=0.5)
    agent = await NatsBus.connect(nats_url)
    sent: list[tuple[str, dict[str, Any]]] = []
    publish = agent.nc.publish

    async def recording(subject: str, payload: bytes = b"", **kw: Any) -> None:
        sent.append((subject, kw))
        await publish(subject, payload, **kw)

    agent.nc.publish = recording  # type: ignore[method-assign]
    try:
        replies = orch.replies()
        card = AgentCard(agent_id="quick", name="Q")
        await agent.reply(Announce(card=card, replica_id="x", renewal=1))
        await agent.reply(Announce(card=card, replica_id="x", renewal=2))
        first = await asyncio.wait_for(anext(replies), 10)
        second = await asyncio.wait_for(anext(replies), 10)
        assert [first.renewal, second.renewal] == [1, 2]  # type: ignore[union-attr]
        renewals = [kw for subject, kw in sent if subject == "cardbus.announce.quick"]
        assert renewals and not renewals[-1].get("reply")  # no ack asked for the renewal
    finally:
        await orch.close()
        await agent.close()


async def test_a_reply_pull_lost_without_a_word_is_asked_again_within_the_lease(
    nats_url: str,
) -> None:
    # The orchestrator's reply requests live 30 s with a heartbeat every 10 s: lost
    # without a reconnect (a route down in a cluster), two missing heartbeats tell it
    # after 21 s. Renewals sent meanwhile wait in the stream, and a 2 s lease lapses (the
    # agent deregistered while it runs). Silence past three quarters of the shortest
    # lease announced means the request is gone: asked again, the renewal arrives in time.
    lease_s = 2.0
    orch = await NatsBus.connect(nats_url, reply_durable="lost-pull", reply_batch=1)
    agent = await NatsBus.connect(nats_url)
    ask_for = orch._ask_for
    lose: list[str] = []

    async def losing(subject: str, inbox: str, request: bytes) -> bool:
        if lose:  # sent where nobody listens: from the loop's side, a request lost
            inbox = lose.pop()
        return await ask_for(subject, inbox, request)

    orch._ask_for = losing  # type: ignore[method-assign]
    try:
        replies = orch.replies()
        card = AgentCard(agent_id="quick", name="Q")
        await agent.reply(Announce(card=card, lease_s=lease_s, replica_id="x", renewal=1))
        first = await asyncio.wait_for(anext(replies), 10)
        assert first.renewal == 1  # type: ignore[union-attr]
        lose.append(orch.nc.new_inbox())
        heard = asyncio.get_running_loop().time()
        following = asyncio.ensure_future(anext(replies))  # its request goes nowhere
        await asyncio.sleep(0.1)
        await orch.nc.flush()
        assert not lose
        await agent.reply(Announce(card=card, lease_s=lease_s, replica_id="x", renewal=2))
        await asyncio.sleep(lease_s / 3)
        await agent.reply(Announce(card=card, lease_s=lease_s, replica_id="x", renewal=3))
        # before the lease of the last one heard runs out
        got = await asyncio.wait_for(following, heard + lease_s - asyncio.get_running_loop().time())
        assert got.renewal in (2, 3)  # type: ignore[union-attr]
    finally:
        await orch.close()
        await agent.close()
