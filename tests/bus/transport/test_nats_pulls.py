"""What the NATS bus sends per card and per reply: replies acked together (``AckAll``) and
never before they are taken, a stopped orchestrator's unacked replies redelivered to its
successor, and one pull loop per agent asking for no more cards than its handlers can
take. Real nats-servers (tests/conftest.py)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

from cardbus.agents.cards import Reply, ResultCard, TaskCard
from cardbus.bus.transport.nats import REPLY_STREAM, NatsBus


def result(task: str, agent: str = "quick") -> ResultCard:
    return ResultCard(task_id=task, attempt=1, agent_id=agent, status="completed", output=1)


def card(task: str) -> TaskCard:
    return TaskCard(task_id=task, attempt=1, root_id="r", capability="c", inputs={})


async def take(replies: AsyncIterator[Reply], n: int, timeout: float = 10.0) -> list[str]:
    async def go() -> list[str]:
        out = []
        for _ in range(n):
            reply = await anext(replies)
            assert isinstance(reply, ResultCard)
            out.append(reply.task_id)
        return out

    return await asyncio.wait_for(go(), timeout)


async def settled(bus: NatsBus, durable: str, pending: int = 0) -> tuple[int, int]:
    """(acked, pending) of a reply consumer once its acks have arrived."""
    for _ in range(100):
        info = await bus._js.consumer_info(REPLY_STREAM, durable)
        if (info.num_ack_pending or 0) <= pending:
            break
        await asyncio.sleep(0.05)
    return int(info.ack_floor.stream_seq or 0), int(info.num_ack_pending or 0)


async def test_replies_taken_are_acked_together(nats_url: str) -> None:
    orch = await NatsBus.connect(nats_url, reply_durable="o1", fetch_wait=0.5)
    agent = await NatsBus.connect(nats_url)
    acks: list[str] = []
    publish = orch.nc.publish

    async def counting(subject: str, payload: bytes = b"", **kw):  # type: ignore[no-untyped-def]
        if payload == b"+ACK":
            acks.append(subject)
        return await publish(subject, payload, **kw)

    orch.nc.publish = counting  # type: ignore[method-assign]
    try:
        replies = orch.replies()
        for i in range(100):
            await agent.reply(result(f"t{i}"))
        assert await take(replies, 100) == [f"t{i}" for i in range(100)]
        # every reply taken is acked (the last one is taken when the next is asked for) ...
        assert await settled(orch, "o1", pending=1) == (99, 1)
        assert 1 <= len(acks) <= 20  # ... by a few acks, not one a reply
        with contextlib.suppress(Exception):
            await replies.aclose()  # type: ignore[attr-defined]
    finally:
        await agent.close()
        await orch.close()


async def test_a_stopped_orchestrators_unacked_replies_go_to_its_successor(
    nats_url: str,
) -> None:
    """The predecessor took three replies and died before acking them: its successor (same
    consumer) acks nothing until those three have come again, so an ack of a newer one
    cannot acknowledge them unseen."""
    options = {"reply_durable": "o2", "reply_ack_wait": 1.0, "fetch_wait": 0.5}
    agent = await NatsBus.connect(nats_url)
    first = await NatsBus.connect(nats_url, **options)
    try:
        replies = first.replies()
        for i in range(3):
            await agent.reply(result(f"old{i}"))
        assert await take(replies, 3) == ["old0", "old1", "old2"]
        await first.nc.close()  # killed: no ack went out (they wait 20 ms)
    finally:
        with contextlib.suppress(Exception):
            await first.close()
    second = await NatsBus.connect(nats_url, **options)
    try:
        replies = second.replies()
        for i in range(2):
            await agent.reply(result(f"new{i}"))
        got = await take(replies, 5)
        assert sorted(got) == ["new0", "new1", "old0", "old1", "old2"]
        assert got[:2] == ["new0", "new1"]  # the old ones came back after their ack wait
        await asyncio.sleep(0.2)
        # old2 is not taken until the next is asked for: nothing acked before that
        assert await settled(second, "o2", pending=5) == (0, 5)
        await agent.reply(result("later"))
        # (new0 and new1 may come again: unacked for longer than their ack wait)
        while (await take(replies, 1)) != ["later"]:
            pass
        acked, _ = await settled(second, "o2", pending=1)
        assert acked == 5  # everything before "later", taken, is acked
        with contextlib.suppress(Exception):
            await replies.aclose()  # type: ignore[attr-defined]
    finally:
        await second.close()
        await agent.close()


async def test_an_agents_handlers_share_one_pull_loop_that_never_asks_for_too_many(
    nats_url: str,
) -> None:
    """Two consume calls on one bus: two cards at once there, and a third waits in the
    inbox for another replica rather than behind them."""
    orch = await NatsBus.connect(nats_url)
    busy = await NatsBus.connect(nats_url, fetch_wait=0.5)
    other = await NatsBus.connect(nats_url, fetch_wait=0.5)
    release = asyncio.Event()
    running: list[str] = []
    ran_elsewhere: list[str] = []

    async def slow(c: TaskCard) -> None:
        running.append(c.task_id)
        await release.wait()

    async def quick(c: TaskCard) -> None:
        ran_elsewhere.append(c.task_id)

    try:
        await busy.consume("pool", slow)
        await busy.consume("pool", slow)
        for i in range(3):
            await orch.send_task("pool", card(f"c{i}"))
        for _ in range(100):
            if len(running) == 2:
                break
            await asyncio.sleep(0.02)
        await asyncio.sleep(0.3)
        assert len(running) == 2  # two handlers: two cards, not three
        await other.consume("pool", quick)
        for _ in range(100):
            if ran_elsewhere:
                break
            await asyncio.sleep(0.02)
        assert len(ran_elsewhere) == 1 and not set(ran_elsewhere) & set(running)
        release.set()
    finally:
        release.set()
        for bus in (other, busy, orch):
            await bus.close()


def test_the_stream_sequence_of_an_ack_subject() -> None:
    from cardbus.bus.transport.nats_replies import left_after as _left
    from cardbus.bus.transport.nats_replies import stream_seq as _stream_seq

    assert _stream_seq("$JS.ACK.CARDBUS_REPLIES.o1.1.42.7.1700000000000000000.0") == 42
    assert _stream_seq("$JS.ACK.hub.ACCHASH.CARDBUS_REPLIES.o1.2.43.8.1700000000.3.tok") == 43
    assert _stream_seq("") == 0 and _stream_seq("$JS.ACK.x") == 0
    assert _left("$JS.ACK.CARDBUS_INBOX.agent-a.1.42.7.1700000000000000000.5") == 5
    assert _left("$JS.ACK.hub.ACCHASH.CARDBUS_INBOX.agent-a.1.42.7.1700000000.3.tok") == 3
