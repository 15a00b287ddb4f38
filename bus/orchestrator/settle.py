"""When the orchestrator is done with a reply: its transport may ack it only then.

A partitioned NATS member acks a reply of its partitions once it is *settled*: what the
orchestrator decided on it is in the log (the step's commit ended), or there was nothing
to record. One that died before that leaves the reply unacked, and whoever holds the
partition next reads it again (``bus.transport.nats_replies``). A reply deferred to a
later step (its task's stream busy) is settled by that step; one for a run another
member decides is not settled here (``Orchestrator.foreign_replies``).
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable

from cardbus.bus.transport.interface import Bus

__all__ = ["settle_after"]


def settle_after(
    bus: Bus, handled: list[object], deferred: Iterable[object], commit: asyncio.Task[None] | None
) -> None:
    """Settle the replies a step ``handled`` (but those it ``deferred``) once its ``commit``
    has ended, whatever its outcome (a failed append drops the reply: its attempt times
    out and is retried), or now when the step wrote nothing."""
    later = {id(x) for x in deferred}
    done = [r for r in handled if id(r) not in later]
    if not done:
        return
    if commit is None:
        bus.settle(done)  # type: ignore[arg-type]
    else:
        commit.add_done_callback(lambda _: bus.settle(done))  # type: ignore[arg-type]
