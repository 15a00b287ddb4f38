"""Child runs: a plan task that runs a sub-plan or a sub-goal as a run of its own.

A plan task spells it ``"child": {"plan": {...}}`` or ``"child": {"goal": "..."}``
with a parent-close policy (what happens to the child when its parent ends, as
Temporal's): ``terminate`` (cancel it at once), ``request_cancel`` (ask it to
cancel; it ends at its own pace) or ``abandon`` (it runs on alone).

The child's ``run.started`` carries its lineage (``parent_root``,
``parent_task``, ``parent_attempt``, ``parent_close``): replay, ``cardbus runs``
and traces find the tree from it. This module holds the checks of the spec
and the lineage a child starts with; the orchestrator's hook that writes the
child's creation as the parent task's dispatch (a decision written before it
takes effect) is not built yet: ``validate_plan`` refuses a child task naming
that, rather than accepting a plan it cannot run.
"""

from __future__ import annotations

from typing import Any

import msgspec

from cardbus.eventstore.errors import InvalidPlan

__all__ = [
    "PARENT_CLOSE_POLICIES",
    "ChildSpec",
    "Lineage",
    "check_child",
    "lineage_of",
]

# what happens to a child when its parent ends (completed, failed or cancelled)
PARENT_CLOSE_POLICIES = ("terminate", "request_cancel", "abandon")


class ChildSpec(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """What a plan task runs as a child run: a sub-plan or a sub-goal (exactly one)."""

    plan: dict[str, Any] | None = None  # a plan, as a plan file spells it
    goal: str | None = None  # a goal alone, for a planner to split into tasks
    parent_close: str = "terminate"  # one of PARENT_CLOSE_POLICIES


class Lineage(msgspec.Struct, frozen=True, kw_only=True):
    """The parent a child run names on its ``run.started``."""

    parent_root: str
    parent_task: str
    parent_attempt: int
    parent_close: str = "terminate"


def check_child(task_id: str, spec: ChildSpec) -> None:
    """Raise ``InvalidPlan`` naming the first problem of a task's child spec.

    A sub-plan is checked as a plan (``validate_plan``, without agents: the
    child's agents are known when it starts), so a bad sub-plan is refused
    with the parent's plan, before anything runs.
    """
    if (spec.plan is None) == (spec.goal is None):
        raise InvalidPlan(
            f"task {task_id!r}: child needs exactly one of 'plan' or 'goal'"
            f" (got {'both' if spec.plan is not None else 'neither'})"
        )
    if spec.parent_close not in PARENT_CLOSE_POLICIES:
        raise InvalidPlan(
            f"task {task_id!r}: child parent_close must be one of"
            f" {', '.join(PARENT_CLOSE_POLICIES)}; got {spec.parent_close!r}"
        )
    if spec.goal is not None and not spec.goal.strip():
        raise InvalidPlan(f"task {task_id!r}: child goal is empty")
    if spec.plan is not None:
        from cardbus.bus.orchestrator.plan import as_plan, validate_plan  # plan imports this

        try:
            sub = as_plan(spec.plan)
            if sub.tasks:
                validate_plan(sub)
        except InvalidPlan as e:
            raise InvalidPlan(f"task {task_id!r}: child plan: {e}") from e


def lineage_of(parent_root: str, task_id: str, attempt: int, spec: ChildSpec) -> dict[str, Any]:
    """The lineage fields of the child's ``run.started``, from its parent task's attempt."""
    return msgspec.structs.asdict(
        Lineage(
            parent_root=parent_root,
            parent_task=task_id,
            parent_attempt=attempt,
            parent_close=spec.parent_close,
        )
    )
