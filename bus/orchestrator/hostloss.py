"""An attempt lost with the runtime's own process: the host's fault, not the agent's.

The embedded runtime's agents live in its process (``attempts_survive_restart=False``):
when that process dies (SIGKILL, a crash, the machine) or stops, the attempts it had
in flight die with it. The next start (or the stop itself) times them out at once;
they are *host losses*, reason ``host_lost``:

* ``task.timed_out`` with reason ``host_lost``, then ``task.retry_scheduled`` whose
  reason starts with ``host_lost:`` and says which loss of how many it was;
* the retry does not spend the task's attempts (``RetryPolicy.max_attempts`` counts
  what its agents got wrong) nor count against the agent in selection or in its
  statistics;
* it is bounded on its own: past ``RetryPolicy.max_host_losses`` host losses of one
  task, the task fails ``host_lost`` (a run whose task crashes its host every time
  still ends, and says why).

An agent that goes while its process lives on (a lease lapsed, deregistered, a card
that could not be sent) is still ``agent_lost`` and spends an attempt.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from cardbus.eventstore import events as ev
from cardbus.eventstore.errors import ConfigError

if TYPE_CHECKING:
    from cardbus.bus.orchestrator.decisions import Decider
    from cardbus.bus.orchestrator.runstate import TaskView

__all__ = ["HOST_LOST", "is_host_loss", "lose_to_host"]

#: the reason of an attempt that died with the runtime's own process
HOST_LOST = "host_lost"


def is_host_loss(retry_reason: str) -> bool:
    """Whether a ``task.retry_scheduled`` reason is a host loss (not an agent's failure)."""
    return retry_reason.split(":", 1)[0].strip() == HOST_LOST


def lose_to_host(decider: Decider, task: TaskView, agent_id: str) -> None:
    """The task's current attempt died with the process that ran ``agent_id``: time it
    out, and retry it at once without spending an attempt, or fail the task ``host_lost``
    once its host losses pass ``max_host_losses``."""
    decider.d.add(
        task.task_id,
        ev.TaskTimedOut(
            attempt=task.attempt,
            agent_id=agent_id,
            deadline=task.dispatched_to.get(agent_id, 0.0),
            reason=HOST_LOST,
        ),
    )
    try:
        bound = decider.retry_policy(task.created).max_host_losses
    except ConfigError as e:  # settings no submit would log (a hand-written event)
        decider._fail(task, "invalid_retry_policy", f"{HOST_LOST}: {e}")
        return
    losses = task.host_losses + 1
    if losses > bound:
        decider._fail(
            task,
            HOST_LOST,
            f"the process running {agent_id} ended before it answered, {losses} times"
            f" (RetryPolicy.max_host_losses is {bound})",
        )
        return
    decider.d.add(
        task.task_id,
        ev.TaskRetryScheduled(
            attempt=task.attempt + 1,
            delay_s=0.0,  # nothing to wait for: the process that lost it is gone
            reason=f"{HOST_LOST}: the process running {agent_id} ended before it answered"
            f" (host loss {losses} of {bound}; no attempt of the agent's spent)",
            not_before=decider.now,
        ),
    )
