"""A stored decision's cards sent, and its events folded: the agent first.

A part of ``Orchestrator`` (``core``), under ``commit``. A decision's cards leave once
its append is durable (invariant 2: logged, then sent), and what the append stored is
folded into the state before anything more is decided on those streams: they stay busy
(``_busy``) until ``_commit`` has done both, so no step decides on them in between.

Folded first, the fold (each event through the run state, the agent statistics and the
observers) ran between the commit and the agent's start, on the critical path of every
step (bench/step_trace.py's ``fold``: 0.17 ms p50 a step at one run in flight with 200 ms
agents). ``_send_then_fold`` sends first and yields once, so that an agent of this process
starts on its card (the send made its consumer's task) before the fold runs. Meanwhile a
step may look at the run on the state as it was before this decision: the same state
every step already decides on while the append itself is in flight, with the decision's
streams busy.

Only for cards of tasks the state knows already: a reply to one of them that comes
before the fold (over NATS an agent may answer before the publish's ack is back) finds
its stream busy and waits for it. A card of a task the state does not know (none today:
a task a decision creates, a review or a supplement, is dispatched by a later step; a
new run's first cards go out from ``creation``, after its fold) would go out after the
fold, as before: a reply for an unknown task would not wait, it would be dropped (a
``Started``) or taken for a bad message.

Only on a bus that delivers in this process (``Bus.local_delivery``): there a send takes
no time of its own. Over NATS a send waits for the server's ack, for as long as a restart
or an election lasts; folded after it, the state (``wait``, ``caught_up``, the projections)
lagged the log by that much (the NATS interleaving harness's reconnection scenario saw an
event unfolded after 10 s).

With tracing on, the fold still comes first: the send's span is a child of the attempt's
span, which the fold of ``task.dispatched`` opens.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

from cardbus.agents.cards import TaskCard
from cardbus.bus import telemetry
from cardbus.bus.orchestrator.decided import Decisions
from cardbus.bus.orchestrator.fold import Folding
from cardbus.bus.orchestrator.loop_items import TICK
from cardbus.bus.transport.interface import Bus
from cardbus.eventstore import TaskState

__all__ = ["Sending"]

log = logging.getLogger(__name__)


class Sending(Folding):
    """Sending decided cards, folding what was stored (state: ``Orchestrator``)."""

    bus: Bus
    attempts_survive_restart: bool
    _stopping: bool
    _sent: set[tuple[str, int]]
    _lost_attempts: dict[tuple[str, int], str]

    async def _send_then_fold(
        self, d: Decisions, stored: list[str], fold: Callable[[], None]
    ) -> None:
        """Send the cards decided for the ``stored`` streams; ``fold`` (what the append
        stored, into the state) after one turn of the loop in which the agents sent to
        begin, or first when no card goes out, the bus sends over a network, one is for a
        task the state does not know yet, or tracing is on."""
        cards = [pair for s in stored for pair in d.sends.get(s, [])]
        tasks = self.state.tasks
        if (
            not cards
            or not self.bus.local_delivery  # (a network send: the fold does not wait for it)
            or telemetry.enabled()
            or any(c.task_id not in tasks for _, c in cards)
        ):
            fold()
            await self._send_cards(cards)
            return
        try:
            await self._send_cards(cards)
            await asyncio.sleep(0)  # the consumers' tasks the send made run first
        finally:  # folded whatever happened: the log holds these events
            fold()

    async def _send(self, d: Decisions, stored: list[str]) -> None:
        """Send the cards decided for the streams whose events are stored."""
        await self._send_cards([pair for s in stored for pair in d.sends.get(s, [])])

    async def _send_cards(self, cards: list[tuple[str, TaskCard]]) -> None:
        """Send ``(agent_id, card)``s; an attempt whose card could not be sent is lost (it
        times out at once and is retried: its deadline would count from a start)."""
        if self._stopping and not self.attempts_survive_restart:
            # our agents are going (an embedded runtime stops its workers first): a card
            # sent now would never be run; kept as ours, ``_give_back`` gives it back
            self._sent.update((card.task_id, card.attempt) for _, card in cards)
            return
        sends = [self.tracing.send_task(self.bus, a, card) for a, card in cards]
        if len(sends) == 1:  # the common case: no task for a gather of one
            outcomes: list[Any] = [None]
            try:
                await sends[0]
            except Exception as e:
                outcomes = [e]
        else:
            outcomes = await asyncio.gather(*sends, return_exceptions=True)
        lost = set()
        for (_, card), outcome in zip(cards, outcomes, strict=True):
            if isinstance(outcome, BaseException):
                log.warning("send failed, the attempt is retried: %r", outcome)
                lost.add((card.task_id, card.attempt))
            elif not self.attempts_survive_restart:  # held by this process's agents
                self._sent.add((card.task_id, card.attempt))
        if len(self._sent) > 4096:  # (the cards just sent: their dispatch may be unfolded yet)
            now = {(card.task_id, card.attempt) for _, card in cards}
            self._sent = {key for key in self._sent if key in now or self._in_flight(*key)}
        if lost:
            self._lost_attempts = self._lost_attempts | dict.fromkeys(lost, "agent_lost")
            self._queue.put_nowait(TICK)

    def _in_flight(self, task_id: str, attempt: int) -> bool:
        task = self.state.tasks.get(task_id)
        return (
            task is not None
            and task.attempt == attempt
            and task.state in (TaskState.DISPATCHED, TaskState.RUNNING)
            and attempt not in task.settled
        )
