"""What reaches the decision loop besides the log: whose a reply is, and what the bus refused.

A part of ``Orchestrator`` (``core``). A reply is decided by its run's owner
(``_reply_owned``) and proves its replica alive (``_alive``: as good as a lease
renewal); a reply or request the bus refused for its sender is recorded through
the decision loop (``_on_refused``: ``reply.refused``); a message that could not
be read is kept among the latest ``bad_messages`` (``_bad``).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

from cardbus.bus.orchestrator.fold import Folding
from cardbus.bus.orchestrator.loop_items import TICK, Record
from cardbus.bus.transport.interface import Refusal
from cardbus.eventstore import Envelope
from cardbus.eventstore import events as ev

__all__ = ["Intake"]

log = logging.getLogger(__name__)


class Intake(Folding):
    """Replies' owners and liveness, refusals and bad messages (state: ``Orchestrator``)."""

    owns: Callable[[str], bool] | None
    bad_messages: list[tuple[str, str]]

    def _reply_owned(self, reply: object) -> bool:
        """A reply is decided by its run's owner; a task not folded yet is not ours: the
        owner folded the dispatch before it sent the card."""
        task = self.state.tasks.get(getattr(reply, "task_id", ""))
        return task is not None and self.owns is not None and self.owns(task.created.root_id)

    def _alive(self, reply: object) -> None:
        """A Started or result from a replica proves it alive: as good as a renewal."""
        agent_id, replica_id = getattr(reply, "agent_id", None), getattr(reply, "replica_id", "")
        if not replica_id or agent_id not in self.state.agents:
            return
        lease = self.state.agent_leases.get(agent_id) or self.leases.default_lease_s
        if self.leases.renew(agent_id, replica_id, lease, time.time()) and self.state.open:
            self._queue.put_nowait(TICK)  # tasks waiting for it look again

    def _on_refused(self, refusal: Refusal) -> None:
        """A reply or request the bus refused for its sender: recorded through the decision
        loop, on the task's stream if the task is known, else on ``agent-<sender>``."""
        known = refusal.task_id in self.state.tasks
        who = refusal.sender or refusal.claimed
        stream = refusal.task_id if known else f"agent-{who}"
        event = ev.ReplyRefused(
            kind=refusal.kind,
            claimed_agent_id=refusal.claimed,
            sender=refusal.sender,
            reason=refusal.reason[:1000],
            task_id=refusal.task_id,
            attempt=refusal.attempt,
            subject=refusal.subject[:1000],
        )
        done: asyncio.Future[list[Envelope]] = asyncio.get_running_loop().create_future()
        done.add_done_callback(_log_unrecorded)
        self._queue.put_nowait(Record(stream, [event], done))

    def _on_bad_message(self, subject: str, data: bytes, reason: str) -> None:
        self._bad(subject, reason, logged=True)  # the bus logged and dead-lettered it

    def _bad(self, subject: str, reason: str, logged: bool = False) -> None:
        if not logged:
            log.warning("bad message on %s: %s", subject, reason)  # one line, no traceback
        self.bad_messages.append((subject, reason))
        if len(self.bad_messages) > 1000:  # a long-lived orchestrator keeps the latest
            del self.bad_messages[:500]


def _log_unrecorded(done: asyncio.Future[list[Envelope]]) -> None:
    if not done.cancelled() and done.exception() is not None:
        log.error("a refusal could not be recorded: %r", done.exception())
