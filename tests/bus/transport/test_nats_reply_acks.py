"""The orchestrator's acks of its reply consumer (``ReplyAcks``, AckAll) on both event
loops the product runs on: asyncio's, and uvloop's, which the ``cardbus`` commands use
when the ``fast`` extra is installed. uvloop hands back a call due within half a
millisecond as a plain ``Handle`` without ``when()``: an ack scheduled "now" (an
announcement taken while an ack is due soon) must not break the replies taken after it.
A real nats-server (tests/conftest.py)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from typing import Any

import pytest
import uvloop

from cardbus.agents.cards import AgentCard, Announce, Started
from cardbus.bus.transport.nats import NatsBus
from cardbus.bus.transport.nats_replies import ORCHESTRATOR_DURABLE, REPLY_STREAM

LOOPS: dict[str, Callable[[Coroutine[Any, Any, None]], None]] = {
    "asyncio": asyncio.run,
    "uvloop": uvloop.run,
}


def _started(task: str) -> Started:
    return Started(task_id=task, attempt=1, agent_id="quick", replica_id="x")


async def _reply_then_announcement_then_reply(url: str) -> None:
    orch = await NatsBus.connect(url)
    agent = await NatsBus.connect(url)
    try:
        replies = orch.replies()
        await agent.reply(_started("t0"))
        assert (await asyncio.wait_for(anext(replies), 10)).task_id == "t0"  # bound
        # three replies waiting together, taken in one go (no wait between them):
        # a reply (an ack due in 20 ms), an announcement (that ack is due within half
        # a round: it is sent at once), a reply (an ack due again)
        await agent.reply(_started("t1"))
        await agent.reply(Announce(card=AgentCard(agent_id="quick", name="Q"), replica_id="x"))
        await agent.reply(_started("t2"))
        await agent.reply(_started("t3"))
        await asyncio.sleep(0.5)  # all four delivered into the pull's queue
        # (plain anext: wait_for would run the loop between them, and the ack with it)
        taken = [await anext(replies) for _ in range(4)]
        assert [getattr(r, "task_id", "announce") for r in taken] == [
            "t1",
            "announce",
            "t2",
            "t3",
        ]
        # every reply up to t2 acked (t3's ack is owed until the next one is taken)
        for _ in range(100):
            info = await orch._js.consumer_info(REPLY_STREAM, ORCHESTRATOR_DURABLE)
            if info.ack_floor.stream_seq >= 4:
                break
            await asyncio.sleep(0.05)
        assert info.ack_floor.stream_seq >= 4, info.ack_floor
        await replies.aclose()
    finally:
        await orch.close()
        await agent.close()


@pytest.mark.parametrize("loop", sorted(LOOPS))
def test_replies_taken_around_an_announcement_are_acked_on_either_loop(
    loop: str, nats_url: str
) -> None:
    LOOPS[loop](_reply_then_announcement_then_reply(nats_url))
