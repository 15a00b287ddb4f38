"""The orchestrator's readers (the log follower, the reply reader) read again after a
failure instead of ending.

Each runs as a task of its own beside the decision loop. Ended by an exception nobody
awaits, the task would leave the orchestrator deaf while it went on deciding: every
reply, or every other writer's event, unheard, and the runs waiting on them wedged
with nothing said but a "Task exception was never retrieved" at exit. Read again, it
loses nothing: the log follower resumes after the last event it handed on; an
unpartitioned NATS reply consumer delivers again whatever was not acked (its acks
wait for those first, ``ReplyAcks``), and the in-process bus's replies wait in one
queue whoever reads them.

A closed store is the one failure not read again: it will not open again, and reading
each second would only repeat the same traceback until the orchestrator stops.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

from cardbus.eventstore.errors import StoreClosed

__all__ = ["read_again_after_failure", "reader_task"]

log = logging.getLogger(__name__)

#: between a failure and the next read: a failure that repeats is logged once a second,
#: not in a tight loop
PAUSE_S = 1.0


async def read_again_after_failure(
    what: str, read: Callable[[], Awaitable[None]], pause_s: float = PAUSE_S
) -> None:
    """Await ``read()``; if it raises, log it and call it again after ``pause_s``. Ends
    when ``read()`` returns (its source closed), raises :class:`StoreClosed`, or the
    task is cancelled."""
    while True:
        try:
            await read()
            return
        except asyncio.CancelledError:
            raise
        except StoreClosed as e:
            log.warning("%s ended: %s", what, e)
            return
        except Exception:
            log.exception("%s failed; reading again in %.1f s", what, pause_s)
            await asyncio.sleep(pause_s)


def reader_task(name: str, read: Callable[[], Awaitable[None]]) -> asyncio.Task[None]:
    """``read`` as the task ``name``, read again after a failure."""
    return asyncio.create_task(read_again_after_failure(name, read), name=name)
