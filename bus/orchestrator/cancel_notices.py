"""A cancel reaches the handler: the orchestrator's side of stopping an attempt in flight.

When a task ends by ``task.cancelled`` or ``task.halted`` while an attempt of it
is in flight, whatever its handler does next (model calls, tool effects) is not
wanted. Two ways tell the agent, so that a lost one only delays the stop:

* :class:`CancelNotices` (an orchestrator observer): on folding such an event it
  sends a :class:`~cardbus.agents.cards.CancelNotice` to every agent the current
  attempt was sent to that has not answered it (``Bus.cancel_attempt``; on NATS a
  core publish on ``cardbus.cancel.<agent>``, at most once).
* :func:`attempt_live` answers the worker's ``attempt.live`` request, asked for a
  handler still running after ``AgentWorker.cancel_check_s``: ``live`` is False
  only when the log says the task was cancelled or halted, so a lagging or unknowing
  orchestrator never stops a handler that should run.

The worker cancels the handler (``CancelledError`` inside it) and answers with a
failed result of reason ``cancelled``, which the orchestrator records as
``task.result_ignored`` with the reason ``handler_cancelled``: the log says the
handler was stopped, and no result of it counts.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from cardbus.agents.cards import CancelNotice
from cardbus.agents.requests import AgentRequest
from cardbus.bus.orchestrator.runstate import RunState, TaskView
from cardbus.bus.transport.interface import Bus
from cardbus.eventstore import events as ev
from cardbus.eventstore.envelope import Envelope
from cardbus.eventstore.states import TaskState

__all__ = [
    "CANCELLED_REASON",
    "HANDLER_CANCELLED",
    "CancelNotices",
    "attempt_live",
    "ignored_reason",
]

log = logging.getLogger(__name__)

#: ``task.result_ignored``'s reason for the answer of a handler stopped by a cancel
HANDLER_CANCELLED = "handler_cancelled"
#: ``ResultCard.reason`` of a worker's answer for a handler it stopped on a notice
CANCELLED_REASON = "cancelled"

_STOPPED = (TaskState.CANCELLED, TaskState.HALTED)


class CancelNotices:
    """An orchestrator observer that sends cancel notices for attempts whose task ended."""

    def __init__(self, bus: Bus, state: RunState) -> None:
        self.bus = bus
        self.state = state
        self._sending: set[asyncio.Future[None]] = set()

    def observe(self, env: Envelope) -> None:
        data = env.data
        if not isinstance(data, (ev.TaskCancelled, ev.TaskHalted)):
            return
        task = self.state.tasks.get(env.stream)
        if task is None or not task.attempt:
            return  # never dispatched: no handler to stop
        for agent_id in task.dispatched_to:
            if agent_id in task.results:  # it answered this attempt: nothing runs
                continue
            notice = CancelNotice(
                task_id=task.task_id,
                attempt=task.attempt,
                agent_id=agent_id,
                reason=data.reason,
                by=env.actor or "",
            )
            sending = asyncio.ensure_future(self.bus.cancel_attempt(notice))
            self._sending.add(sending)
            sending.add_done_callback(self._sent)

    def _sent(self, sending: asyncio.Future[None]) -> None:
        self._sending.discard(sending)
        if not sending.cancelled() and (e := sending.exception()) is not None:
            # a hint only: the worker's attempt.live check stops the handler later
            log.info("cancel notice not sent: %s", e)


def attempt_live(state: RunState, req: AgentRequest) -> dict[str, Any]:
    """The answer to ``attempt.live``: ``{"live": False, "reason", "by"}`` when the task of
    the asking agent's attempt ``req.attempt`` was cancelled or halted; else live."""
    task = state.tasks.get(req.task_id)
    if (
        task is None
        or req.agent_id not in task.assigned  # not its task: it learns nothing here
        or task.state not in _STOPPED
        or req.attempt > task.attempt
    ):
        return {"live": True}
    return {"live": False, "reason": task.reason, "by": _by(task)}


def _by(task: TaskView) -> str:
    return task.cancelled_by if task.state is TaskState.CANCELLED else ""


def ignored_reason(reply: Any) -> str:
    """``task.result_ignored``'s reason for a stale answer: ``handler_cancelled`` when the
    worker says it stopped the handler on a cancel, else ``stale_attempt``."""
    stopped = reply.status == "failed" and reply.reason == CANCELLED_REASON
    return HANDLER_CANCELLED if stopped else "stale_attempt"
