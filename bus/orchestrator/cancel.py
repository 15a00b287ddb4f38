"""Cancel a run from outside the decision loop: ``cancel_run(store, root_id)``.

Like ``answer_approval`` it writes to the log, never to the orchestrator:
each live task of the run gets a ``task.cancelled`` event (appended with its
stream's expected version; a race with the orchestrator's own append is
retried on the new version). The orchestrator follows the log, so it stops
dispatching those tasks, ignores late results for them, and ends the run
(``run.failed`` with ``tasks_not_completed``: the run did not complete, even
if only optional tasks were left: each cancel says ``whole_run``). A run that
is already finished is left alone.
"""

from __future__ import annotations

from cardbus.bus.orchestrator.runstate import RunState
from cardbus.eventstore import ConcurrencyError, EventStore, NewEvent
from cardbus.eventstore import events as ev
from cardbus.eventstore.errors import StreamNotFound

__all__ = ["cancel_run"]


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
    cancelled: list[str] = []
    for task_id in list(run.tasks):
        for _ in range(10):
            task = state.tasks.get(task_id)
            if task is None or task.terminal:
                break
            # whole_run: an optional task cancelled so is no absence to complete without
            data = ev.TaskCancelled(reason=reason, whole_run=True, note=note)
            event = NewEvent(data=data, correlation_id=root_id, actor=by)
            try:
                await store.append(task_id, [event], state.versions.get(task_id, 0))
                cancelled.append(task_id)
                break
            except ConcurrencyError:  # the orchestrator wrote first: look again
                for env in await store.read_stream(task_id, state.versions.get(task_id, 0) + 1):
                    state.apply(env)
    return cancelled
