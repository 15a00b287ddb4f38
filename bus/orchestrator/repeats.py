"""Replies the orchestrator has seen before, or cannot place yet: quiet, true status.

Deliveries are at least once (invariant 4), and on NATS every orchestrator without
partitions reads every reply, while a partition's new holder reads again what its
previous holder took and did not ack. Neither is news about the agent:

* **the same reply again** (``ignored_result``): a result the log already records for
  that attempt from that replica on that delivery is the very message delivered again.
  It is settled with no event: a ``task.result_ignored`` is written only for an answer
  that is not in the log (a second one for the attempt, or one for an attempt that is
  over), so the log says "duplicate" only when an agent really answered twice;
* **a reply for a task not folded yet** (``UnknownReplies``): another orchestrator on
  the same log may have created and dispatched the task a moment ago, and this one's
  follower has not folded it. The reply is looked at once more after the fold has
  caught up with the log as it was when the reply came; only a task still unknown then
  is a bad message ("result for unknown task").
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Iterable

from cardbus.agents.cards import ResultCard
from cardbus.bus.orchestrator.cancel_notices import ignored_reason
from cardbus.bus.orchestrator.runstate import TaskView
from cardbus.eventstore import events as ev

__all__ = ["UnknownReplies", "ignored_result", "same_reply"]

_FORGET_S = 60.0  # a reply offered again is remembered this long (its second look is soon)


def same_reply(task: TaskView, reply: ResultCard) -> bool:
    """Whether the log records this very reply: its attempt's result from the same replica
    on the same delivery (a replica's identity is host, pid and a random part, so two
    answers of one attempt never share it: a card run again is another delivery)."""
    if not reply.replica_id:  # an agent that says nothing of where it ran: not provable
        return False
    return (reply.attempt, reply.agent_id, reply.replica_id, reply.delivery) in task.answered


def ignored_result(task: TaskView, reply: ResultCard) -> ev.TaskResultIgnored | None:
    """What a result that changes nothing records: ``duplicate`` (the current attempt
    answered again), ``handler_cancelled`` (a handler its worker stopped on a cancel) or
    ``stale_attempt`` (any other answer: an earlier attempt, or the
    current one after it timed out, its retry not dispatched yet; one never dispatched);
    None for a reply the log already records (delivered again: nothing new)."""
    if same_reply(task, reply):
        return None
    again = reply.attempt == task.attempt and reply.agent_id in task.results
    reason = "duplicate" if again else ignored_reason(reply)
    return ev.TaskResultIgnored(attempt=reply.attempt, agent_id=reply.agent_id, reason=reason)


class UnknownReplies:
    """Results for tasks this orchestrator has not folded: offered again once it has caught
    up with the log, then reported (``bad``) if their task is still unknown."""

    def __init__(
        self,
        caught_up: Callable[[], Awaitable[object]],
        offer: Callable[[object], None],
        bad: Callable[[str, str], None],
    ) -> None:
        self._caught_up = caught_up  # returns once the fold holds the log as it was
        self._offer = offer  # hands a reply to the decision loop again
        self._bad = bad  # (subject, reason): the orchestrator's bad messages
        # replies offered again, by identity (held, so no other object takes their id),
        # with when: one whose task was found on its second look is let go later
        self._second: dict[int, tuple[float, ResultCard]] = {}
        self._waits: set[asyncio.Task[None]] = set()

    def look_again(self, replies: Iterable[ResultCard]) -> None:
        """Replies whose task the fold does not hold: a first time, offered again after
        the fold catches up; a second time, reported."""
        now = time.monotonic()
        for key in [k for k, (at, _) in self._second.items() if at < now - _FORGET_S]:
            del self._second[key]
        first = []
        for reply in replies:
            if self._second.pop(id(reply), None) is not None:
                why = f"result for unknown task {reply.task_id!r} from {reply.agent_id}"
                self._bad("cardbus.reply", why)
            else:
                self._second[id(reply)] = (now, reply)
                first.append(reply)
        if first:
            wait = asyncio.create_task(self._later(first), name="orchestrator-unknown-replies")
            self._waits.add(wait)
            wait.add_done_callback(self._waits.discard)

    async def _later(self, replies: list[ResultCard]) -> None:
        try:
            await self._caught_up()
        finally:  # offered again even if the wait failed: the next look reports it
            for reply in replies:
                self._offer(reply)

    def close(self) -> None:
        for wait in self._waits:
            wait.cancel()
