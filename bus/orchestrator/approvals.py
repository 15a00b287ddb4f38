"""A person's answer to a task that waits for approval, written to the log from outside the
decision loop (``cardbus approve`` / ``deny``, the console, the A2A gateway).

Like ``cancel_run`` it appends with the stream's expected version. The orchestrator may
write to the same stream at the same moment (the attempt that asked records its last call);
the answer then reads what was written and decides again, so a person approving just as
the ask lands is not told "conflict": only a task no longer waiting is refused.
"""

from __future__ import annotations

from cardbus.agents.questions import USER_INPUT
from cardbus.bus.orchestrator.runstate import RunState
from cardbus.bus.orchestrator.waits import require_approver, run_start
from cardbus.eventstore import ConcurrencyError, EventStore, NewEvent, TaskState
from cardbus.eventstore import events as ev
from cardbus.eventstore.errors import CardbusError, StreamNotFound

__all__ = ["answer_approval"]

_TRIES = 10


async def answer_approval(
    store: EventStore, task_id: str, granted: bool, by: str, note: str = ""
) -> None:
    """Grant or deny a task waiting for approval (the API behind ``cardbus approve``)."""
    events = await store.read_stream(task_id)
    if not events:
        raise StreamNotFound(task_id)  # not InvalidPlan: no plan is involved
    root = events[0].correlation_id
    state = RunState()
    for env in await run_start(store, root, task_id):  # its wait policy: who may answer
        state.apply(env)
    for env in events:
        state.apply(env)
    for attempt in range(_TRIES):
        task = state.tasks.get(task_id)
        if task is None or task.state is not TaskState.AWAITING_APPROVAL:
            current = task.state if task else "unknown"
            raise CardbusError(f"task {task_id!r} is not awaiting approval (it is {current})")
        require_approver(task, by)  # escalated by a deadline: only its approvers
        data: ev.Event
        if granted and task.created.capability == USER_INPUT:  # approving answers nothing
            raise CardbusError(
                f"task {task_id!r} asks a question: answer it (cardbus answer {task_id}"
                " --json ...), or deny it to decline"
            )
        if granted:
            resume = "running" if task.has_proposal else "pending"
            data = ev.ApprovalGranted(by=by, resume=resume, note=note)
        else:
            data = ev.ApprovalDenied(by=by, note=note)
        version = state.versions.get(task_id, 0)
        try:
            await store.append(
                task_id, [NewEvent(data=data, correlation_id=root, actor=by)], version
            )
            return
        except ConcurrencyError:  # another writer first: what it wrote decides again
            if attempt == _TRIES - 1:
                raise
            for env in await store.read_stream(task_id, version + 1):
                state.apply(env)
