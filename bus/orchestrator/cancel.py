"""Cancel a run from outside the decision loop: ``cancel_run(store, root_id)``.

Like ``answer_approval`` it writes to the log, never to the orchestrator:
each live task of the run gets a ``task.cancelled`` event, all in one
``append_many`` (one write), each with its stream's expected version; a race
with the orchestrator's own append is retried on the new version. The
orchestrator follows the log, so it stops dispatching those tasks, ignores
late results for them, and ends the run as cancelled
(:func:`run_not_completed`: ``run.failed`` with ``cancelled``, the reason
``cancelled``, its detail who cancelled it and why; its status is ``cancelled``, in ``cardbus
runs``, the console and A2A (canceled); even if only optional tasks were left: each
cancel says ``whole_run``). The handlers still running are stopped
(``bus.orchestrator.cancel_notices``). A run that is already finished is left alone.
"""

from __future__ import annotations

from cardbus.bus.orchestrator.runstate import RunState, TaskView
from cardbus.eventstore import Append, ConcurrencyError, EventStore, NewEvent
from cardbus.eventstore import events as ev
from cardbus.eventstore.errors import StreamNotFound
from cardbus.eventstore.states import TaskState

__all__ = ["cancel_run", "run_not_completed"]


async def cancel_run(
    store: EventStore,
    root_id: str,
    by: str = "api",
    reason: str = "cancelled_by_user",
    note: str = "",
) -> list[str]:
    """Cancel every live task of run ``root_id``; the ids of the tasks cancelled.

    ``by``: the actor of the cancels (who authenticated); ``note``: what they said
    besides the reason (a name they gave), kept in each ``task.cancelled``.

    Raises ``StreamNotFound`` if there is no such run.
    """
    state = RunState()
    for env in await store.read_correlation(root_id):
        state.apply(env)
    run = state.runs.get(root_id)
    if run is None:
        raise StreamNotFound(root_id)
    if run.finished is not None:
        return []
    # whole_run: an optional task cancelled so is no absence to complete without
    data = ev.TaskCancelled(reason=reason, whole_run=True, note=note)
    cancelled: list[str] = []
    todo = list(run.tasks)
    for _ in range(10):
        live = [t for t in todo if (task := state.tasks.get(t)) is not None and not task.terminal]
        if not live:
            break
        appends = [
            Append(
                t, [NewEvent(data=data, correlation_id=root_id, actor=by)], state.versions.get(t, 0)
            )
            for t in live
        ]
        # one write for the whole cancel (one transaction; one atomic batch on NATS)
        outcomes = await store.append_many(appends)
        todo = []
        for task_id, outcome in zip(live, outcomes, strict=True):
            if isinstance(outcome, ConcurrencyError):  # the orchestrator wrote first: look again
                for env in await store.read_stream(task_id, state.versions.get(task_id, 0) + 1):
                    state.apply(env)
                todo.append(task_id)
            elif isinstance(outcome, Exception):
                raise outcome
            else:
                cancelled.append(task_id)
    return [t for t in run.tasks if t in cancelled]


def run_not_completed(
    plan_tasks: dict[str, TaskView], failed: list[str], detail: str
) -> ev.RunFailed:
    """The end of a run whose ``failed`` plan tasks (ids) did not complete: cancelled when
    a whole-run cancel left one of them undone, else ``tasks_not_completed``. A cancelled
    run's detail says who and why (``by ops: cancelled_by_user: wrong``), then ``detail``
    (each task and why) only if a task also failed for another reason."""
    ended = [t for t in plan_tasks.values() if t.task_id in failed]
    cancelled = [t for t in ended if t.state is TaskState.CANCELLED and t.cancel_cause == "run"]
    if not cancelled:
        return ev.RunFailed(reason="tasks_not_completed", failed_tasks=failed, detail=detail)
    by = ", ".join(dict.fromkeys(t.cancelled_by for t in cancelled if t.cancelled_by))
    why = (f"by {by}: " if by else "") + cancelled[0].reason
    if len(cancelled) < len(ended):
        why += f"; {detail}"  # something else failed too: each task says what
    return ev.RunFailed(
        reason="cancelled", failed_tasks=failed, detail=why, cancelled=True, cancelled_by=by
    )
