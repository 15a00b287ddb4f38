"""Why an agent would refuse a task, in words that name the field or the constraint.

``selection.hard_filter`` gives the bare reason an agent would reject a card with
(``input_schema_mismatch``, ``over_constraint``, ...): selection needs no more.
Where the reason reaches a person (a plan refused before it runs, a task that
fails ``no_capable_agent``) it says what broke it: each input that breaks the
schema and what it expected (``$.region: required field missing (expected
str)``), or the constraint the agent does not meet (``model='gpt-x' not in
['mock-1']``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import msgspec

from cardbus.agents.cards import AgentCard, constraint_problem
from cardbus.agents.schema import schema_errors
from cardbus.bus.orchestrator.selection import hard_filter

__all__ = ["rejected_it", "worded_refusal"]

_SHOWN = 3  # schema errors named, at most


def rejected_it(agent_id: str, rejections: Sequence[str]) -> str:
    """``lax: rejected it: input_schema_mismatch (Object missing required field `region`)``:
    the agent's latest rejection of the task as its ``task.rejected`` said it
    (``rejections``: the task's latest, each ``"<agent>: <reason> (<detail>)"``)."""
    head = f"{agent_id}: "
    said = next((r for r in reversed(rejections) if r.startswith(head)), None)
    return f"{head}rejected it" + (f": {said[len(head) :]}" if said else "")


def worded_refusal(
    card: AgentCard,
    capability: str,
    inputs: dict[str, Any],
    constraints: dict[str, Any],
    timeout_s: float,
    *,
    partial_inputs: bool = False,
    absent: Sequence[str] = (),
) -> str | None:
    """The reason ``card``'s agent would refuse the task, with what broke it; None: none.

    ``partial_inputs``: a plan's inputs before its dependencies ran (placeholders
    pass); ``absent``: required inputs the plan does not give (the partial check
    passes them, but nothing will fill them), named too.
    """
    reason = hard_filter(
        card, capability, inputs, constraints, timeout_s, partial_inputs=partial_inputs
    )
    if reason is None and absent:
        reason = "input_schema_mismatch"
    spec = card.capability(capability)
    said: list[str] = []
    if reason == "input_schema_mismatch" and spec is not None:
        said = schema_errors(inputs, spec.input_schema, partial=partial_inputs)
        if absent:  # the full check's words for each absent one
            heads = tuple(f"$.{name}: " for name in absent)
            full = schema_errors(inputs, spec.input_schema)
            said += [e for e in full if e.startswith(heads) and e not in said]
    elif reason == "over_constraint":
        try:
            size = len(msgspec.json.encode(inputs))
            problem = constraint_problem(card.constraints, constraints, timeout_s, size)
        except Exception:  # inputs that cannot be measured: the bare reason says enough
            problem = None
        said = [problem] if problem else []
    if reason is None or not said:
        return reason
    return f"{reason} ({'; '.join(said[:_SHOWN])})"
