"""What the partitioned member's tests share (``bus.runtime.members``): a root in a
given partition, an event for it, a follower that collects what the member hands over,
and a wait for a condition."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from typing import Any

from cardbus.bus.runtime.members import MemberLog
from cardbus.eventstore import Envelope, NewEvent, new_id
from cardbus.eventstore import events as ev
from cardbus.eventstore.nats import NatsEventStore
from cardbus.eventstore.nats.subjects import partition_of

PARTITIONS = 8


def root_in(p: int, partitions: int = PARTITIONS) -> str:
    """A new root id that falls in partition ``p``."""
    root = new_id()
    while partition_of(root, partitions) != p:
        root = new_id()
    return root


def started(root: str) -> NewEvent:
    return NewEvent(data=ev.TaskStarted(attempt=1, agent_id="a1"), correlation_id=root)


async def follow(member: MemberLog, got: list[Envelope]) -> None:
    """Collect what ``member`` hands over from position 1; a marker runs at once (as the
    decision loop would run it)."""
    it: AsyncIterator[Any] = member.subscribe(1)
    async for item in it:
        if isinstance(item, Envelope):
            got.append(item)
        else:
            item()


async def until(check: Callable[[], bool], within: float) -> None:
    async with asyncio.timeout(within):
        while not check():
            await asyncio.sleep(0.005)


async def stop(task: asyncio.Future[Any]) -> None:
    """Cancel ``task`` until it is done: on Python 3.11 a cancellation that meets a NATS
    request completing at that moment is lost inside ``asyncio.wait_for``, and the
    follower would go on (its next look a heartbeat away) while the test waits for it."""
    while not task.done():
        task.cancel()
        await asyncio.wait({task}, timeout=0.5)
    await asyncio.gather(task, return_exceptions=True)


@contextlib.asynccontextmanager
async def two_stores(
    url: str, heartbeat: float, **connect: Any
) -> AsyncIterator[tuple[NatsEventStore, NatsEventStore]]:
    """The member's store (looking after ``heartbeat`` seconds with nothing heard) and
    another writer's, on one server."""
    async with (
        await NatsEventStore.connect(
            url, heartbeat=heartbeat, partitions=PARTITIONS, **connect
        ) as mine,
        await NatsEventStore.connect(url, partitions=PARTITIONS, **connect) as other,
    ):
        yield mine, other


@contextlib.asynccontextmanager
async def following(
    store: NatsEventStore, partitions: list[int]
) -> AsyncIterator[tuple[MemberLog, list[Envelope]]]:
    """A member on ``store`` holding ``partitions``, caught up, followed from position 1
    (``follow``) while the block runs: the member and what it handed over so far."""
    member = MemberLog(store)
    member.hold(partitions)
    await member.read_all()
    got: list[Envelope] = []
    follower = asyncio.ensure_future(follow(member, got))
    try:
        yield member, got
    finally:
        await stop(follower)
