"""What the runtimes share: a plan in any of its forms, and the started check."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from cardbus.bus.orchestrator.plan import Plan, as_plan, decode_plan
from cardbus.eventstore.errors import InvalidPlan, NotStarted

__all__ = ["PlanLike", "plan_of", "require_started"]

#: a Plan, its JSON form as a mapping, or JSON text (str or bytes) of the plan format
PlanLike = Plan | Mapping[str, Any] | str | bytes


def plan_of(plan: PlanLike) -> Plan:
    """A ``Plan`` from any of its forms; anything else is ``InvalidPlan`` saying what it got."""
    if isinstance(plan, (bytes, bytearray, memoryview)):
        return decode_plan(bytes(plan))
    if isinstance(plan, str):
        return decode_plan(plan.encode("utf-8", "surrogatepass"))
    if not isinstance(plan, (Plan, Mapping)):
        raise InvalidPlan(
            "a plan is a Plan, a mapping of the plan format or its JSON text (str or bytes),"
            f" not {type(plan).__name__}"
        )
    return as_plan(plan)


def require_started(runtime: object, state: str) -> None:
    """``NotStarted`` unless ``state`` is ``"running"`` (``"new"`` or ``"stopped"``)."""
    if state == "running":
        return
    name = type(runtime).__name__
    when = "was stopped (its `async with` block ended)" if state == "stopped" else "is not started"
    raise NotStarted(
        f"{name} {when}: use it as `async with {name}(...) as runtime:`"
        " and call run() / submit() inside the block"
    )
