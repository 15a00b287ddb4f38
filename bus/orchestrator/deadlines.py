"""An attempt's deadlines: how long its card may wait for an agent, and how long the
agent may take once it has it (Temporal's schedule-to-start and start-to-close).

A dispatch records both: ``TaskDispatched.deadline`` is when the attempt times out if no
agent has taken the card by then (``Policy.queue_timeout_s`` after the dispatch; reason
``queue_timeout``), and ``TaskDispatched.timeout_s`` the task's own limit, counted from
the moment an agent took it: its ``task.started`` (``recorded_at``); a fast agent sends
no Started and its result settles the attempt first. So a card waiting behind others in
a busy agent's inbox does not time out while it waits, and an overloaded system queues
instead of timing out and retrying everything (which only added load).

A dispatch logged before this (``timeout_s`` 0) keeps its one deadline from the dispatch.
Everything here is read from the fold (``TaskView``): restarting gives the same deadlines.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from cardbus.bus.orchestrator.hostloss import HOST_LOST, lose_to_host
from cardbus.eventstore import events as ev

if TYPE_CHECKING:
    from cardbus.bus.orchestrator.decisions import Decider
    from cardbus.bus.orchestrator.runstate import TaskView

__all__ = ["check_deadline", "timeout_reason"]


def timeout_reason(task: TaskView, agent_id: str) -> str:
    """``queue_timeout`` if the attempt's card was never taken by ``agent_id``, else
    ``timeout`` (past its start-to-close deadline, or a dispatch's one deadline)."""
    if task.start_to_close_s > 0 and agent_id not in task.started:
        return "queue_timeout"
    return "timeout"


def check_deadline(decider: Decider, task: TaskView) -> None:
    """The current attempt, dispatched and not settled: time it out if its agent is gone or
    its deadline passed (a fan-out with answers in settles with those at the deadline)."""
    now = decider.now
    if task.results:
        # fan-out with some answers in: at the deadline, settle with those
        # (the attempt did not time out; the silent candidates were late)
        waiting = [d for a, d in task.dispatched_to.items() if a not in task.results]
        if waiting and all(d <= now for d in waiting):
            decider._settle_fanout(task, task.results)
        return
    lost = [a for a in task.dispatched_to if _lost(decider, task, a)]
    if lost and len(lost) == len(task.dispatched_to):
        # its agent is gone (lease lapsed, deregistered, or died with the previous
        # process): no answer will come, so the attempt times out now, not at the deadline
        agent = lost[0]
        if decider.lost_attempts.get((task.task_id, task.attempt)) == HOST_LOST:
            lose_to_host(decider, task, agent)  # the process's fault: no attempt spent
            return
        decider.d.add(
            task.task_id,
            ev.TaskTimedOut(
                attempt=task.attempt,
                agent_id=agent,
                deadline=task.dispatched_to[agent],
                reason="agent_lost",
            ),
        )
        decider._fail_attempt(task, "agent_lost", f"{agent} went before it answered")
        return
    overdue = [a for a, deadline in task.dispatched_to.items() if deadline <= now]
    if not overdue or len(overdue) < len(task.dispatched_to):
        return
    agent = overdue[0]
    reason = timeout_reason(task, agent)
    queued = reason == "queue_timeout"
    decider.d.add(
        task.task_id,
        ev.TaskTimedOut(
            attempt=task.attempt,
            agent_id=agent,
            deadline=task.dispatched_to[agent],
            reason="queue_timeout" if queued else "deadline",
        ),
    )
    why = (
        f"{agent} did not take the card by the queue deadline"
        if queued
        else f"no result from {agent} by the deadline"
    )
    decider._fail_attempt(task, reason, why)


def _lost(decider: Decider, task: TaskView, agent_id: str) -> bool:
    """The attempt's agent will never answer it."""
    if (task.task_id, task.attempt) in decider.lost_attempts:
        return True
    if decider.leases is None:
        return False
    return agent_id not in decider.state.agents or decider.leases.lost(agent_id, decider.now)
