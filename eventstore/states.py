"""The task state machine: one pure function ``transition(state, event) -> state``.

It lives beside the event catalogue because it is a fact about task events,
not an orchestrator policy: projections and the orchestrator both fold task
streams with it, and an event it refuses is an ``IllegalTransition``.

``None`` is the state of a task that does not exist yet. Events that only
record a fact without moving the task (a result arriving, a duplicate result
being ignored, a backoff being scheduled while pending) map a state to itself.
"""

from __future__ import annotations

from enum import StrEnum

from cardbus.eventstore.errors import IllegalTransition
from cardbus.eventstore.events import (
    ApprovalDenied,
    ApprovalGranted,
    ApprovalRequested,
    ChildRunStarted,
    InputProvided,
    RevisionRequested,
    TaskCancelled,
    TaskCompleted,
    TaskCreated,
    TaskDispatched,
    TaskFailed,
    TaskHalted,
    TaskNeedsInput,
    TaskRedelivered,
    TaskRejected,
    TaskResultIgnored,
    TaskResultSubmitted,
    TaskRetryScheduled,
    TaskStarted,
    TaskTimedOut,
    WaitExpired,
    tag_of,
)

__all__ = ["A2A_STATE", "TERMINAL", "TRANSITIONS", "TaskState", "fold_state", "transition"]


class TaskState(StrEnum):
    PENDING = "pending"
    DISPATCHED = "dispatched"
    RUNNING = "running"
    NEEDS_INPUT = "needs_input"
    NEEDS_REVISION = "needs_revision"
    AWAITING_APPROVAL = "awaiting_approval"
    COMPLETED = "completed"
    FAILED = "failed"
    CANCELLED = "cancelled"
    HALTED = "halted"


S = TaskState
TERMINAL = frozenset({S.COMPLETED, S.FAILED, S.CANCELLED, S.HALTED})
_LIVE = frozenset(S) - TERMINAL

# Each state's A2A TaskState, in A2A v1.0 names (the enum of a2a-sdk's ``TaskState``).
# Waiting for approval is input-required: A2A keeps auth-required for authentication.
A2A_STATE: dict[TaskState, str] = {
    S.PENDING: "TASK_STATE_SUBMITTED",
    S.DISPATCHED: "TASK_STATE_SUBMITTED",
    S.RUNNING: "TASK_STATE_WORKING",
    S.NEEDS_INPUT: "TASK_STATE_INPUT_REQUIRED",
    S.NEEDS_REVISION: "TASK_STATE_WORKING",
    S.AWAITING_APPROVAL: "TASK_STATE_INPUT_REQUIRED",
    S.COMPLETED: "TASK_STATE_COMPLETED",
    S.FAILED: "TASK_STATE_FAILED",
    S.CANCELLED: "TASK_STATE_CANCELED",
    S.HALTED: "TASK_STATE_FAILED",
}

# event type -> {from state: to state}; the one table docs/reference/states.md prints.
TRANSITIONS: dict[type, dict[TaskState | None, TaskState]] = {
    TaskCreated: {None: S.PENDING},
    TaskDispatched: {
        S.PENDING: S.DISPATCHED,
        S.NEEDS_REVISION: S.DISPATCHED,
        S.DISPATCHED: S.DISPATCHED,  # fan-out: one attempt sent to k candidates
    },
    # a child-run task: its child run is working for it (``bus.orchestrator.children``)
    ChildRunStarted: {S.PENDING: S.RUNNING},
    TaskStarted: {S.DISPATCHED: S.RUNNING, S.RUNNING: S.RUNNING},
    TaskResultSubmitted: {S.DISPATCHED: S.DISPATCHED, S.RUNNING: S.RUNNING},
    TaskResultIgnored: {s: s for s in S},
    TaskRedelivered: {s: s for s in S},
    TaskRejected: {S.DISPATCHED: S.PENDING, S.RUNNING: S.PENDING},
    TaskTimedOut: {S.DISPATCHED: S.PENDING, S.RUNNING: S.PENDING},
    TaskRetryScheduled: {S.DISPATCHED: S.PENDING, S.RUNNING: S.PENDING, S.PENDING: S.PENDING},
    TaskNeedsInput: {S.DISPATCHED: S.NEEDS_INPUT, S.RUNNING: S.NEEDS_INPUT},
    InputProvided: {S.NEEDS_INPUT: S.PENDING},
    RevisionRequested: {S.DISPATCHED: S.NEEDS_REVISION, S.RUNNING: S.NEEDS_REVISION},
    ApprovalRequested: {
        S.PENDING: S.AWAITING_APPROVAL,
        S.DISPATCHED: S.AWAITING_APPROVAL,
        S.RUNNING: S.AWAITING_APPROVAL,
    },
    ApprovalDenied: {S.AWAITING_APPROVAL: S.CANCELLED},
    # a wait's deadline passed: the task still waits (an escalation) until the events
    # that follow it in the same write say otherwise (``bus.orchestrator.waits``)
    WaitExpired: {S.AWAITING_APPROVAL: S.AWAITING_APPROVAL, S.NEEDS_INPUT: S.NEEDS_INPUT},
    TaskCompleted: {
        S.DISPATCHED: S.COMPLETED,
        S.RUNNING: S.COMPLETED,
        S.PENDING: S.COMPLETED,  # a result reused from a forked-from run
        S.AWAITING_APPROVAL: S.COMPLETED,
    },
    TaskFailed: {s: S.FAILED for s in _LIVE},
    TaskCancelled: {s: S.CANCELLED for s in _LIVE},
    TaskHalted: {s: S.HALTED for s in _LIVE},
}


def transition(state: TaskState | None, event: object) -> TaskState:
    """The state a task is in after ``event``; refuses what the table does not allow."""
    if isinstance(event, ApprovalGranted):
        if state is not S.AWAITING_APPROVAL:
            raise IllegalTransition(str(state), tag_of(event))
        try:
            resume = TaskState(event.resume)
        except ValueError:
            raise IllegalTransition(
                str(state), f"{tag_of(event)}(resume={event.resume!r})"
            ) from None
        if resume not in (S.PENDING, S.RUNNING):
            raise IllegalTransition(str(state), f"{tag_of(event)}(resume={event.resume!r})")
        return resume
    moves = TRANSITIONS.get(type(event))
    if moves is None or state not in moves:
        tag = str(getattr(getattr(event, "__struct_config__", None), "tag", type(event).__name__))
        raise IllegalTransition(str(state), tag)
    return moves[state]


def fold_state(events: list[object]) -> TaskState | None:
    """Fold a whole task stream's event payloads into its current state."""
    state: TaskState | None = None
    for event in events:
        state = transition(state, event)
    return state
