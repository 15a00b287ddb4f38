"""Child runs, the plan side: a plan task that runs a sub-plan or a sub-goal as a run of its own.

A plan task spells it ``"child": {"plan": {...}}`` or ``"child": {"goal": "..."}``
with a parent-close policy (what happens to the child when the attempt that
started it ends without it, as Temporal's): ``terminate`` (its live tasks are
cancelled at once), ``request_cancel`` (its tasks not in flight are cancelled;
those in flight finish their attempt) or ``abandon`` (it runs on alone).

The sub-plan reads the parent task's resolved inputs with ``{"$parent": "path"}``
placeholders (``""``: the inputs whole); a sub-goal gets them after its words.
The child's ``run.started`` carries its lineage (``parent_root``,
``parent_task``, ``parent_attempt``, ``parent_close``): replay, ``cardbus runs``
and traces find the tree from it. This module holds the checks of the spec
and the placeholders; ``child_runs`` is the orchestrator's side (starting,
following and closing children).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

import msgspec

from cardbus.eventstore.errors import InvalidPlan

if TYPE_CHECKING:
    from cardbus.agents.cards import AgentCard
    from cardbus.bus.orchestrator.plan import Plan

__all__ = [
    "PARENT_CLOSE_POLICIES",
    "ChildSpec",
    "Lineage",
    "check_child",
    "child_plan",
    "lineage_of",
    "remote_lineage",
    "with_parent_inputs",
]

# what happens to a child when the attempt that started it ends without it
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


def check_child(
    task_id: str,
    spec: ChildSpec,
    agents: Iterable[AgentCard] | None = None,
    goal: str = "",
) -> None:
    """Raise ``InvalidPlan`` naming the first problem of a task's child spec.

    A sub-plan is checked as a plan (``validate_plan``); with ``agents``, each of
    its capabilities must be offered (its inputs' schemas are checked when the
    child starts: its ``$parent`` placeholders are filled only then). A sub-goal
    needs a planner among ``agents``. So a bad child is refused with the parent's
    plan, before anything runs.
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
    from cardbus.bus.orchestrator.plan import (  # plan imports this module
        validate_goal_plan,
        validate_plan,
    )

    cards = list(agents) if agents is not None else None
    try:
        sub = child_plan(spec, {}, goal or task_id, check=True)
        if sub.tasks:
            validate_plan(sub)
            for t in sub.tasks:
                offered = t.child is not None or cards is None
                if not offered and not any(c.capability(t.capability) for c in cards or ()):
                    raise InvalidPlan(
                        f"task {t.id!r}: no registered agent offers capability {t.capability!r}"
                    )
                if t.child is not None:
                    check_child(t.id, t.child, cards, t.goal)
        else:
            validate_goal_plan(sub, cards)
    except InvalidPlan as e:
        raise InvalidPlan(f"task {task_id!r}: child plan: {e}") from e


def child_plan(spec: ChildSpec, inputs: Mapping[str, Any], goal: str, check: bool = False) -> Plan:
    """The plan a child run runs: the sub-plan with its ``$parent`` placeholders filled
    from the parent task's resolved ``inputs`` (its goal, when it gives none, the parent
    task's), or the sub-goal with the inputs after its words. ``check``: placeholders
    are kept (the plan is only checked)."""
    from cardbus.bus.orchestrator.plan import as_plan  # plan imports this module

    if spec.plan is not None:
        body = dict(spec.plan)
        body.setdefault("goal", goal)
        body.pop("plan_id", None)  # a child's run is named by its parent task's attempt
        if not check and isinstance(body.get("tasks"), list):  # its own tasks' inputs only
            body["tasks"] = [
                {**t, "inputs": with_parent_inputs(t.get("inputs", {}), inputs)}
                if isinstance(t, dict)
                else t
                for t in body["tasks"]
            ]
        return as_plan(body)
    words = str(spec.goal)
    if inputs:
        words += "\n\nInputs: " + msgspec.json.encode(dict(inputs), order="sorted").decode()
    return as_plan({"goal": words})


def with_parent_inputs(value: Any, inputs: Mapping[str, Any]) -> Any:
    """``value`` with each ``{"$parent": "a.b"}`` replaced by that path of ``inputs``
    (``""``: ``inputs`` whole; a path leading nowhere: None)."""
    if isinstance(value, dict):
        if "$parent" in value and len(value) == 1:
            out: Any = dict(inputs)
            for key in filter(None, str(value["$parent"]).split(".")):
                out = out.get(key) if isinstance(out, dict) else None
            return out
        return {k: with_parent_inputs(v, inputs) for k, v in value.items()}
    if isinstance(value, list):
        return [with_parent_inputs(v, inputs) for v in value]
    return value


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


def remote_lineage(meta: Any) -> dict[str, Any] | None:
    """The lineage of a run an A2A caller's task starts, from the message's
    ``metadata.cardbus`` (``task_id``, ``attempt``, ``root_id``: what a cardbus caller's
    remote agent sends, ``bus.a2a.remote``); None when it names no task. ``InvalidPlan``
    for one that names a task badly. The parent is in the caller's log, not this one:
    its cancel reaches this run as an A2A cancel, its budget not at all."""
    from cardbus.eventstore.batch import MAX_ID_CHARS

    if not isinstance(meta, Mapping) or meta.get("task_id") is None:
        return None
    task, root, attempt = meta.get("task_id"), meta.get("root_id"), meta.get("attempt", 1)
    for name, value in (("task_id", task), ("root_id", root)):
        if not isinstance(value, str) or not 0 < len(value) <= MAX_ID_CHARS:
            raise InvalidPlan(f"metadata.cardbus.{name} must be 1 to {MAX_ID_CHARS} chars")
    if isinstance(attempt, float) and attempt.is_integer():
        attempt = int(attempt)  # JSON numbers come back from protobuf's Struct as floats
    if not isinstance(attempt, int) or isinstance(attempt, bool) or attempt < 1:
        raise InvalidPlan(f"metadata.cardbus.attempt must be an int >= 1, got {attempt!r}")
    return msgspec.structs.asdict(
        Lineage(parent_root=str(root), parent_task=str(task), parent_attempt=attempt)
    )
