"""The NATS store's count of the log (``NatsEventStore._counts``, a busy partitioned
member's look): a position of the log, then how many messages of each filter are stored
from a start on, compared with a read of the log. Real nats-server, nothing mocked."""

from __future__ import annotations

import asyncio

from cardbus.eventstore import NewEvent, new_id
from cardbus.eventstore import events as ev
from cardbus.eventstore.nats import NatsEventStore
from cardbus.eventstore.nats.subjects import SHARED, partition_filter, partition_token

PARTITIONS = 4


def started(root: str) -> NewEvent:
    return NewEvent(data=ev.TaskStarted(attempt=1, agent_id="a1"), correlation_id=root)


async def test_the_counts_are_the_logs_from_each_start_and_last_is_stored(
    nats_url: str,
) -> None:
    async with await NatsEventStore.connect(nats_url, partitions=PARTITIONS) as store:
        prefix = store.subject_prefix
        empty = await store._counts(1, [(partition_filter(prefix, SHARED), 1)])
        assert empty == [(0, 0)]
        roots = [new_id() for _ in range(60)] + ["agent-a1"]
        for version in range(2):
            await asyncio.gather(*(store.append(r, [started(r)], version) for r in roots))
        log = await store.read_all(0, 10_000)
        assert len(log) == 122
        tokens = [SHARED, *(str(p) for p in range(PARTITIONS))]
        for known, start in [(1, 1), (50, 40), (122, 100), (122, 123)]:
            counted = await store._counts(
                known, [(partition_filter(prefix, t), start) for t in tokens]
            )
            # (no gap: the message at known and the 122 - known after it)
            assert [last for last, _ in counted] == [122] * len(tokens)
            counts = [n for _, n in counted]
            want = [
                sum(
                    1
                    for e in log
                    if e.position >= start and partition_token(e.correlation_id, PARTITIONS) == t
                )
                for t in tokens
            ]
            assert counts == want, (known, start)
