"""Optional tasks: a run that does without a task's output when it has to.

A plan task marked ``optional`` (``TaskOptions.optional``) may end without
completing (failed once its retries are spent, cancelled, its approval denied)
and the run still goes on. The rules, all read from the folded state (so a
restart, a fork or a snapshot decides the same):

* A dependency that ended without completing **blocks** its dependents (each is
  cancelled, ``dependency_<state>``, as before) when it is not optional, when it
  was halted (the run stops), when it was cancelled with the whole run
  (``task.cancelled`` with ``whole_run``) or when it was itself cancelled because
  a dependency of its own blocked it (the run fails then: nothing more is started
  for it).
* Otherwise (an optional task that failed, or was cancelled on its own) its output
  is **absent**: its dependents are dispatched once their other dependencies
  completed. Each ``{"$dep": ..., "path": ...}`` placeholder naming an absent
  output is left out of the inputs (a key of a mapping omitted, an item of a list
  dropped; ``resolve_inputs``), and the card and the ``task.dispatched`` name the
  absent dependencies (``absent``).
* A dependent whose inputs no agent accepts without the absent output (its input
  schema requires the field) fails at once with the reason ``dependency_absent``,
  naming the absent task and the agents' objections: a typed failure, not a crash
  and not a retry.
* The run ends when every task has: ``run.failed`` (``tasks_not_completed``) if a
  plan task that does not count as absent did not complete, exactly as without
  optional tasks; else ``run.completed``, whose ``degraded`` names the optional
  plan tasks that did not complete (a *degraded* completion) and whose
  ``outputs`` hold only the completed tasks'. A planned run re-plans (its
  ``replan_on_failure``) only for the failures, never for an absence.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from cardbus.bus.orchestrator.runstate import TaskView
from cardbus.eventstore import TaskState
from cardbus.eventstore import events as ev

__all__ = [
    "DEPENDENCY_ABSENT",
    "absent_deps",
    "blocks",
    "completion",
    "degraded_detail",
    "is_absent",
    "no_agent_failure",
    "not_completed",
    "outcome",
    "why_ended",
]

S = TaskState

#: the reason a dependent fails with when no agent takes its inputs without an absent output
DEPENDENCY_ABSENT = "dependency_absent"


def blocks(dep: TaskView) -> bool:
    """``dep`` ended without completing, and its dependents are cancelled for it."""
    if not dep.terminal or dep.state is S.COMPLETED:
        return False
    return not dep.created.optional or dep.state is S.HALTED or bool(dep.cancel_cause)


def is_absent(dep: TaskView) -> bool:
    """``dep`` is optional, ended without completing, and its dependents go on without it."""
    return dep.terminal and dep.state is not S.COMPLETED and not blocks(dep)


def absent_deps(deps: Iterable[TaskView]) -> list[str]:
    """The task ids of the absent ones among ``deps``, in their order."""
    return [d.task_id for d in deps if is_absent(d)]


def why_ended(task: TaskView) -> str:
    """How a task ended without completing: ``failed: attempts_exhausted (agent error)``."""
    why = task.state.value if task.state else "not created"
    if task.reason:
        why += f": {task.reason}"
    if task.error:
        why += f" ({task.error[:200]})"
    return why


def outcome(
    plan_tasks: Mapping[str, TaskView], done: Mapping[str, object]
) -> tuple[list[str], list[str]]:
    """(failed, degraded) of a run whose tasks have all ended: the task ids of the plan
    tasks that did not complete and are not absent (they fail the run), and the plan
    task ids (names) of the absent ones. ``done``: completions decided in this step."""
    failed: list[str] = []
    degraded: list[str] = []
    for name, task in plan_tasks.items():
        if task.state is S.COMPLETED or task.task_id in done:
            continue
        if is_absent(task):
            degraded.append(name)
        else:
            failed.append(task.task_id)
    return sorted(failed), sorted(degraded)


def not_completed(plan_tasks: Mapping[str, TaskView], done: Mapping[str, object]) -> list[str]:
    """The task ids of every plan task that did not complete, absent ones included (what a
    failed run's ``failed_tasks`` names)."""
    return sorted(
        t.task_id
        for t in plan_tasks.values()
        if t.state is not S.COMPLETED and t.task_id not in done
    )


def completion(
    plan_tasks: Mapping[str, TaskView], done: Mapping[str, Any], degraded: list[str]
) -> ev.RunCompleted:
    """The ``run.completed`` of a run whose only plan tasks not completed are ``degraded``
    (names): the completed tasks' outputs, and the absent ones named with how they ended."""
    gone = set(degraded)
    return ev.RunCompleted(
        outputs={
            name: done.get(t.task_id, t.output)
            for name, t in plan_tasks.items()
            if name not in gone
        },
        degraded=degraded,
        detail=degraded_detail(plan_tasks, degraded)[:2000],
    )


def degraded_detail(plan_tasks: Mapping[str, TaskView], names: Iterable[str]) -> str:
    """Each absent plan task and how it ended: ``research: failed: ... ; ...``."""
    return "; ".join(f"{name}: {why_ended(plan_tasks[name])}" for name in sorted(names))


def no_agent_failure(absent: list[str], tasks: Mapping[str, TaskView], why: str) -> tuple[str, str]:
    """(reason, error) of a dispatch that found no agent: ``dependency_absent`` when the
    card lacks absent outputs (they are why), else ``no_capable_agent`` as always."""
    if not absent:
        return "no_capable_agent", why
    named = []
    for task_id in absent:
        dep = tasks.get(task_id)
        name = (dep.created.plan_id or task_id) if dep is not None else task_id
        named.append(f"{name!r} ({why_ended(dep)})" if dep is not None else repr(name))
    return (
        DEPENDENCY_ABSENT,
        f"the output of optional task {', '.join(named)} is absent and no agent takes the"
        f" inputs without it: {why}",
    )
