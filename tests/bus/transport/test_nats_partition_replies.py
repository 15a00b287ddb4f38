"""Partitioned replies on NATS (``NatsBus(reply_partitions=...)``): a card names its run's
partition, the agent answers on it, and only the member holding that partition reads
the answer, from the partition's own consumer, acked once settled; a member that dies
or lets the partition go leaves it to the next holder. Real nats-servers
(tests/conftest.py)."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
from collections.abc import AsyncIterator

from cardbus.agents.cards import Reply, ResultCard, TaskCard
from cardbus.bus.transport.nats import ORCHESTRATOR_DURABLE, REPLY_STREAM, NatsBus
from cardbus.bus.transport.nats_replies import member_filters, partition_consumer
from cardbus.eventstore import new_id
from cardbus.eventstore.nats.subjects import partition_of

N = 4


def root_in(p: int) -> str:
    return next(r for r in (new_id() for _ in itertools.count()) if partition_of(r, N) == p)


def card(task: str, root: str) -> TaskCard:
    return TaskCard(task_id=task, attempt=1, root_id=root, capability="c", inputs={})


async def member(url: str, name: str, **options: object) -> NatsBus:
    bus = await NatsBus.connect(
        url, reply_durable=name, reply_partitions=N, fetch_wait=0.5, **options
    )
    await bus.prepare_replies()
    return bus


async def agent(url: str) -> tuple[NatsBus, list[str]]:
    """An agent that answers every card at once; the subjects its answers went on."""
    bus = await NatsBus.connect(url, fetch_wait=0.5)
    subjects: list[str] = []
    publish = bus._publish

    async def recording(subject: str, *args, **kw):  # type: ignore[no-untyped-def]
        subjects.append(subject)
        return await publish(subject, *args, **kw)

    bus._publish = recording  # type: ignore[method-assign]

    async def handle(c: TaskCard) -> None:
        await bus.reply(
            ResultCard(task_id=c.task_id, attempt=c.attempt, agent_id="quick", status="completed")
        )

    await bus.consume("quick", handle)
    return bus, subjects


async def next_reply(replies: AsyncIterator[Reply], timeout: float = 20.0) -> ResultCard:
    reply = await asyncio.wait_for(anext(replies), timeout)
    assert isinstance(reply, ResultCard)
    return reply


async def consumer(bus: NatsBus, name: str, acked: bool = True) -> tuple[int, int]:
    """(pending, ack pending) of a reply consumer, once nothing waits for an ack."""
    for _ in range(200):
        info = await bus._js.consumer_info(REPLY_STREAM, name)
        if not acked or not info.num_ack_pending:
            break
        await asyncio.sleep(0.05)
    return int(info.num_pending or 0), int(info.num_ack_pending or 0)


async def test_a_reply_reaches_only_the_member_holding_its_runs_partition(nats_url: str) -> None:
    a = await member(nats_url, "m-a")
    b = await member(nats_url, "m-b")
    quick, subjects = await agent(nats_url)
    a.hold_replies({2})
    b.hold_replies({0, 1, 3})
    ra, rb = a.replies(), b.replies()
    b_got = asyncio.ensure_future(anext(rb))  # b reads its partitions and its own consumer
    try:
        await a.send_task("quick", card("t1", root_in(2)))
        reply = await next_reply(ra)
        assert reply.task_id == "t1"
        assert subjects == ["cardbus.reply.quick.t1.2"]  # the partition the card named
        a.settle([reply])
        assert await consumer(a, partition_consumer(2)) == (0, 0)  # acked once settled
        for p in (0, 1, 3):  # b's partitions and its own consumer had nothing for it
            assert await consumer(b, partition_consumer(p)) == (0, 0)
        info = await b._js.consumer_info(REPLY_STREAM, "m-b")
        assert info.delivered.stream_seq == 0 and info.num_pending == 0
        assert sorted(info.config.filter_subjects or []) == sorted(member_filters())
        assert not b_got.done()
    finally:
        b_got.cancel()
        for bus in (quick, a, b):
            await bus.close()


async def test_the_unread_default_consumer_is_gone_on_a_partitioned_log(nats_url: str) -> None:
    quick, _ = await agent(nats_url)  # it created the streams, and the default consumer
    assert (await quick._js.consumer_info(REPLY_STREAM, ORCHESTRATOR_DURABLE)).name
    a = await member(nats_url, "m-a")
    try:
        names = [c.name async for c in _consumers(a)]
        assert ORCHESTRATOR_DURABLE not in names
        assert {partition_consumer(p) for p in range(N)} | {"m-a"} == set(names)
    finally:
        for bus in (quick, a):
            await bus.close()


async def _consumers(bus: NatsBus) -> AsyncIterator[object]:
    for c in await bus._js.consumers_info(REPLY_STREAM):
        yield c.config


async def test_a_reply_taken_by_a_member_that_dies_unsettled_goes_to_the_next_holder(
    nats_url: str,
) -> None:
    a = await member(nats_url, "m-a", reply_ack_wait=1.0)
    b = await member(nats_url, "m-b", reply_ack_wait=1.0)
    quick, _ = await agent(nats_url)
    a.hold_replies({1})
    ra, rb = a.replies(), b.replies()
    try:
        await a.send_task("quick", card("t1", root_in(1)))
        assert (await next_reply(ra)).task_id == "t1"  # taken, not settled (not recorded)
        await a.nc.close()  # killed: no nak, no ack; its lease lapses, b takes over
        b.hold_replies({1})
        reply = await next_reply(rb)
        assert (reply.task_id, reply.attempt) == ("t1", 1)
        b.settle([reply])
        assert await consumer(b, partition_consumer(1)) == (0, 0)
    finally:
        for bus in (quick, b, a):
            with contextlib.suppress(Exception):
                await bus.close()


async def test_a_partition_let_go_hands_its_unsettled_replies_back_at_once(nats_url: str) -> None:
    # an ack wait far longer than the wait below: only the hand-back (a nak) brings it
    a = await member(nats_url, "m-a", reply_ack_wait=300.0)
    b = await member(nats_url, "m-b", reply_ack_wait=300.0)
    quick, _ = await agent(nats_url)
    a.hold_replies({3})
    ra, rb = a.replies(), b.replies()
    try:
        await a.send_task("quick", card("t1", root_in(3)))
        await a.send_task("quick", card("t2", root_in(3)))
        first = await next_reply(ra)
        second = await next_reply(ra)
        a.settle([first])  # recorded; the other one not yet when the partition goes
        a.hold_replies(set())
        b.hold_replies({3})
        again = await next_reply(rb, timeout=60.0)
        assert again.task_id == second.task_id
        b.settle([again])
        assert await consumer(b, partition_consumer(3)) == (0, 0)
    finally:
        for bus in (quick, a, b):
            await bus.close()


async def test_a_members_consumer_of_the_previous_layout_is_given_its_filters(
    nats_url: str,
) -> None:
    """A member's consumer made before partitioned replies (no filter: every reply) would
    keep every partition's replies unread: a member starting on it filters it, and the
    replies it held that are still for it (announcements, unpartitioned) are read."""
    old = await NatsBus.connect(nats_url, reply_durable="m-a", fetch_wait=0.5)
    quick = await NatsBus.connect(nats_url)
    try:
        await old._reply_sub()  # the consumer as the previous version made it
        info = await old._js.consumer_info(REPLY_STREAM, "m-a")
        assert not info.config.filter_subjects and not info.config.filter_subject
        await old.close()
        # an agent of the previous version answers without a partition meanwhile
        await quick.reply(ResultCard(task_id="t0", attempt=1, agent_id="quick", status="completed"))
        a = await member(nats_url, "m-a")
        try:
            info = await a._js.consumer_info(REPLY_STREAM, "m-a")
            assert sorted(info.config.filter_subjects or []) == sorted(member_filters())
            assert (await next_reply(a.replies())).task_id == "t0"
        finally:
            await a.close()
    finally:
        await quick.close()
