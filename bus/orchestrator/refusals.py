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

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import msgspec

from cardbus.agents.cards import AgentCard, TaskCard, constraint_problem
from cardbus.agents.schema import dep_path_problem, schema_errors
from cardbus.bus.orchestrator.selection import hard_filter
from cardbus.eventstore.states import TaskState

if TYPE_CHECKING:
    from cardbus.bus.orchestrator.dispatch import Dispatching
    from cardbus.bus.orchestrator.runstate import RunState, RunView, TaskView

__all__ = ["rejected_it", "unresolved_deps", "why_no_agent", "worded_refusal"]

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


def why_no_agent(d: Dispatching, task: TaskView, card: TaskCard, run: RunView | None = None) -> str:
    """Each agent offering the task's capability, with why it was left out (the detail of
    a ``no_capable_agent`` failure)."""
    c = task.created
    why = []
    named = set(run.started.agents) if run is not None else set()
    for agent in sorted(d.state.agents.values(), key=lambda a: a.agent_id):
        if agent.capability(c.capability) is None:
            continue
        if named and agent.agent_id not in named:
            why.append(f"{agent.agent_id}: not one of the run's agents")
        elif d.leases is not None and not d.leases.live(agent.agent_id, d.now):
            why.append(f"{agent.agent_id}: no live lease")
        elif agent.agent_id in task.excluded:
            why.append(rejected_it(agent.agent_id, task.rejections))
        else:
            # naming the fields ("$.region: expected str, got int") or the constraint
            reason = worded_refusal(agent, c.capability, card.inputs, c.constraints, c.timeout_s)
            why.append(f"{agent.agent_id}: {reason}")
    detail = "; ".join(why) or "no registered agent offers it"
    unresolved = unresolved_deps(d.state, d.d.completed, c.inputs)
    if unresolved:  # an input that came out empty because its $dep path leads nowhere
        detail += "; " + "; ".join(unresolved)
    return f"no agent left for {c.capability!r} ({detail})"


def unresolved_deps(state: RunState, done: Mapping[str, Any], value: Any) -> list[str]:
    """``$dep 'q' has no path 'nosuch.field'`` for each placeholder leading nowhere
    (``done``: completions decided in this very step too, task id -> output)."""
    found: list[str] = []
    stack = [value]
    while stack:
        v = stack.pop()
        if isinstance(v, dict):
            if "$dep" in v and v.get("path"):
                dep = state.tasks.get(str(v["$dep"]))
                if dep is not None and (dep.task_id in done or dep.state is TaskState.COMPLETED):
                    output = done.get(dep.task_id, dep.output)
                    name = dep.created.plan_id or dep.task_id
                    problem = dep_path_problem(name, str(v["path"]), output)
                    if problem:
                        found.append(problem)
                continue
            stack.extend(v.values())
        elif isinstance(v, list):
            stack.extend(v)
    return sorted(found)
