"""An attempt's run time stops while its model calls wait for the provider's limit.

A model call that cannot go at once waits in the agent's pacer (``cardbus.agents.pacing``)
and says so: ``model.queued`` when it starts waiting, ``model.slot_granted`` when it goes.
That wait is the provider's, not the task's: the attempt's start-to-close deadline
(``deadlines``) is pushed back by exactly the time waited. While a call waits, the
deadline is what was left of the attempt's time plus the wait's bound (``max_wait_s``,
after which the call fails), so an agent that goes silent while queued still times out;
when the slot comes, the deadline is the grant plus what was left. Several calls of one
attempt waiting at once stop the clock once, until the last of them goes.

Read from the fold alone (the events' ``recorded_at``): a restart gives the same deadline.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from cardbus.bus.orchestrator.empties import plus, with_item, without
from cardbus.eventstore import events as ev

if TYPE_CHECKING:
    from cardbus.bus.orchestrator.runstate import RunState, TaskView
    from cardbus.eventstore.envelope import Envelope

__all__ = ["FOLDED", "fold"]

FOLDED = frozenset({ev.ModelQueued, ev.ModelSlotGranted})


def fold(state: RunState, task: TaskView, env: Envelope) -> None:
    data = env.data
    assert isinstance(data, (ev.ModelQueued, ev.ModelSlotGranted))
    agent = data.agent_id
    if data.attempt != task.attempt or agent not in task.dispatched_to:
        return  # an earlier attempt's call: its deadline is no longer the one
    now = env.recorded_at
    # the views' mappings are values, replaced on a write (``empties``)
    if isinstance(data, ev.ModelQueued):
        deadline = task.dispatched_to[agent]
        if task.start_to_close_s > 0 and agent not in task.started:
            # a call proves the card was taken: its time runs from here (as a Started)
            task.started = plus(task.started, agent)
            deadline = now + task.start_to_close_s
        left, waiting = task.limit_waits.get(agent, (0.0, 0))
        if waiting == 0:
            left = max(0.0, deadline - now)
        task.limit_waits = with_item(task.limit_waits, agent, (left, waiting + 1))
        deadline = max(deadline, now + left + data.max_wait_s)
    else:
        if agent not in task.limit_waits:
            return
        left, waiting = task.limit_waits[agent]
        if waiting > 1:  # another call still waits: the clock stays stopped
            task.limit_waits = with_item(task.limit_waits, agent, (left, waiting - 1))
            return
        task.limit_waits = without(task.limit_waits, agent)
        deadline = now + left
    task.dispatched_to = with_item(task.dispatched_to, agent, deadline)
    state._wake(task.dispatched_to[agent], task.created.root_id)
