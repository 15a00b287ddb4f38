"""NatsBus keeps the Bus contract (cardbus.testing), on this test's nats-server; and
what only NATS has: trace context in message headers."""

from collections.abc import AsyncIterator
from typing import Any

import pytest

from cardbus.agents.cards import Started, TaskCard, encode
from cardbus.bus.transport.nats import NatsBus
from cardbus.testing import BusContract
from cardbus.testing.bus import card, until


class TestNatsBusContract(BusContract):
    @pytest.fixture
    async def bus(self, nats_url: str) -> AsyncIterator[NatsBus]:
        bus = await NatsBus.connect(
            nats_url, ack_wait=1.0, max_deliver=3, redelivery_delay=0.02, fetch_wait=0.5
        )
        yield bus
        await bus.close()


async def test_nats_traceparent_travels_in_headers_read_case_insensitively(nats_url: str) -> None:
    trace = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    bus = await NatsBus.connect(nats_url, ack_wait=1.0, fetch_wait=0.5)
    spy = await NatsBus.connect(nats_url)
    try:
        seen_headers: list[dict[str, str]] = []

        async def on_reply(msg: Any) -> None:
            seen_headers.append(dict(msg.headers or {}))

        await spy.nc.subscribe("cardbus.reply.>", cb=on_reply)
        got: list[TaskCard] = []

        async def handle(c: TaskCard) -> None:
            got.append(c)
            await bus.reply(Started(task_id=c.task_id, attempt=1, agent_id="a"))

        await bus.consume("a", handle)
        # the body has no trace context; the header (odd case) has it
        await bus._js.publish("cardbus.agent.a", encode(card(1)), headers={"TraceParent": trace})
        await until(lambda: len(got) == 1 and len(seen_headers) == 1)
        assert got[0].traceparent == trace
        assert seen_headers[0].get("traceparent") == trace  # the reply carries it on
    finally:
        await bus.close()
        await spy.close()
