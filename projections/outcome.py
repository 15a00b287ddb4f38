"""Why a run did not complete, from its events: the task that failed first, and its reason.

A failed run's ``run.failed`` lists every plan task that did not complete;
most of them are only collateral (cancelled because a task they depend on
failed, ``cause_task_id``). :func:`first_failure` folds a run's events into
the one task whose end made the run fail, the earliest of:

* ``task.failed`` (its reason, its error, its attempts of its budget);
* ``task.halted`` (loop detection, a budget);
* ``task.cancelled`` that no other task caused (an operator, a client that
  gave up waiting).

``others`` counts the rest of the run's tasks that ended that way. A run
that failed before any task did (a plan refused, planning failed) has no
such task: None, and the run's own reason says why.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from cardbus.eventstore import events as ev
from cardbus.eventstore.envelope import Envelope

__all__ = ["Failure", "first_failure"]


@dataclass(frozen=True)
class Failure:
    """The task that failed a run first (see the module docstring)."""

    task_id: str
    capability: str
    name: str  # its plan task id ("" for a task the orchestrator added)
    ended: str  # "failed" | "halted" | "cancelled"
    reason: str  # the event's reason: agent_error, attempts_exhausted, loop_detected, ...
    error: str  # the last error (task.failed) or detail (task.halted); "" if none
    attempts: int  # attempts made (0: unknown, or it never ran)
    max_attempts: int  # its attempt budget
    others: int  # other tasks of the run that failed, halted or were cancelled by no task


def first_failure(events: Iterable[Envelope]) -> Failure | None:
    """The task whose end failed the run of ``events`` (one run's, in log order), or None."""
    created: dict[str, ev.TaskCreated] = {}
    attempts: dict[str, int] = {}
    ends: list[tuple[Envelope, str, str, str]] = []  # (event, ended, reason, error)
    for env in events:
        data = env.data
        match data:
            case ev.TaskCreated():
                created[env.stream] = data
            case ev.TaskDispatched():
                attempts[env.stream] = max(attempts.get(env.stream, 0), data.attempt)
            case ev.TaskFailed():
                ends.append((env, "failed", data.reason, data.error))
                if data.attempts:
                    attempts[env.stream] = data.attempts
            case ev.TaskHalted():
                ends.append((env, "halted", data.reason, data.detail))
            case ev.TaskCancelled() if data.cause_task_id is None:
                ends.append((env, "cancelled", data.reason, ""))
    if not ends:
        return None
    env, ended, reason, error = min(ends, key=lambda e: e[0].position)
    task = created.get(env.stream)
    return Failure(
        task_id=env.stream,
        capability=task.capability if task is not None else "",
        name=(task.plan_id or "") if task is not None else "",
        ended=ended,
        reason=reason,
        error=error,
        attempts=attempts.get(env.stream, 0),
        max_attempts=task.max_attempts if task is not None else 0,
        others=len({e[0].stream for e in ends} - {env.stream}),
    )
