"""Cards the log says were dispatched but that may never have reached an agent.

A dispatch is logged, then sent (invariant 2). A process that dies between the two
leaves an attempt dispatched whose card was never published; one whose send failed
leaves the same. Since an attempt's deadline counts from when an agent takes its card
(``deadlines``), such an attempt would wait for the queue limit. So:

* on resume, an orchestrator whose agents survive restarts (NATS) sends again the card
  of every attempt of its runs that is dispatched and not taken (no ``task.started``,
  no result): a card that did arrive is the same bytes, dropped by JetStream's
  de-duplication within its window, and after it answered at most once more per
  ``(task, attempt)`` (the worker answers a card it already answered from memory, and
  the journal replays a second execution's calls);
* a send that fails marks its attempt lost: it times out at once and is retried.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from cardbus.eventstore import TaskState

if TYPE_CHECKING:
    from cardbus.agents.cards import TaskCard
    from cardbus.bus.orchestrator.decisions import Decider

__all__ = ["untaken_cards"]


def untaken_cards(
    decider: Decider, owns: Callable[[str], bool] | None
) -> list[tuple[str, TaskCard]]:
    """``(agent_id, card)`` for each attempt of an open run (of ours) dispatched and not
    taken by any agent, rebuilt as the dispatch built it."""
    state = decider.state
    out: list[tuple[str, TaskCard]] = []
    for root, run in state.open.items():
        if owns is not None and not owns(root):
            continue
        for task_id in run.tasks:
            task = state.tasks[task_id]
            if (
                task.state is not TaskState.DISPATCHED
                or task.attempt in task.settled
                or task.started
                or task.results
            ):
                continue
            card = decider.card_for(task, task.attempt)
            out.extend((agent_id, card) for agent_id in task.dispatched_to)
    return out
