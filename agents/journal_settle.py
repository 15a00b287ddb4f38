"""Model answers recorded in the background, and the barrier that waits for them.

A live model call's answer is recorded (``model.answered``) by a request to the
orchestrator, which answers once it is durable: a round trip and a commit (an fsync on
SQLite, a publish and its ack on NATS), which the handler waited for before it saw the
answer. The journal's promise (issue 34, item 3; invariant 8 as it is read now) is
narrower and enough: the answer is durable *before anything that depends on it leaves
the process*: the next request to the orchestrator (the next model call, whose request
carries what the answer said; a tool call and so its effect; a memory write) and the
task's result. So the answer's record is sent and the handler gets the answer at once;
``Unsettled.settle`` is the barrier every later request of the task, and the result,
waits at. A crash in between loses at most that one answer, as a call in flight is lost
today: it was never used outside the process, and the resumed attempt asks the model
again (the call is re-sent; nothing it caused was).

Only for an answer recorded on the loop the task runs on (a sync handler's thread with
a loop of its own waits for its record, as before).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable
from typing import Any

from cardbus.eventstore.errors import BusError

__all__ = ["Unsettled"]

log = logging.getLogger(__name__)


class Unsettled:
    """The records of one task's answers that were sent and are not known durable yet."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self._pending: list[asyncio.Future[Any]] = []

    def here(self) -> bool:
        """Whether a record may be deferred from where the caller runs."""
        try:
            return asyncio.get_running_loop() is self.loop
        except RuntimeError:
            return False

    def defer(self, record: Awaitable[Any]) -> None:
        """Send ``record`` now and let it finish in the background (``settle`` waits)."""
        future = asyncio.ensure_future(record)
        future.add_done_callback(_retrieve)  # a failure is raised by settle, not lost
        self._pending.append(future)

    def __bool__(self) -> bool:
        return bool(self._pending)

    async def settle(self) -> None:
        """Wait until every deferred record is durable; a failed one is raised (the
        answer it carried may not be used outside the process: the task fails), and
        again at every later call. Callers that wait together all wait for every record,
        and go on in the order they came."""
        while pending := [f for f in self._pending if not f.done()]:
            # shielded: a handler cancelled here leaves the records to finish
            await asyncio.shield(asyncio.wait(pending))
        self._pending = [f for f in self._pending if f.cancelled() or f.exception()]
        for failed in self._pending:
            if failed.cancelled():
                raise BusError("a model answer's record was cancelled before it was durable")
            raise failed.exception()  # type: ignore[misc]


def _retrieve(future: asyncio.Future[Any]) -> None:
    if not future.cancelled() and future.exception() is not None:
        log.debug("a model answer's record failed: %r", future.exception())
