"""The orchestrator: decides the next events from the current state, and writes them first.

``core`` runs the decision loop (``Orchestrator``, in parts: ``fold``, ``intake``,
``commit``, ``creation``, ``resume``); ``decisions`` is the pure step from state to
events (``Decider``, in parts: ``attempts``, ``replies``, ``dispatch``,
``planning_rounds``), the docs' "one step, from the card to the log" following a
task through them in order; ``runstate`` folds the log into that state;
``plan`` checks plans; ``selection`` ranks agents; ``context`` fits a card to
an agent's input budget; ``access`` checks agents' requests; ``memory`` keeps
long-term memory; ``optional`` decides how a run goes on without an optional
task's output; ``policy`` holds the tunables and ``retry`` the retry
policy; ``checks`` checks every setting where it is made; ``journal`` records and
replays agents' model and tool calls, and ``effects`` takes an operator's word that a
tool call whose effect was unknown happened; ``children`` checks a plan task's child
run and ``child_runs`` starts, follows and closes it; ``refusals`` words why an agent
refuses a task; ``store_trouble`` tells a log's hiccup from a log that refuses writes.

Names are loaded on first use, so a submodule imported alone (``reviews``, ``questions``)
does not import the decision loop with it.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from cardbus.bus.orchestrator.core import Orchestrator, RunResult, answer_approval
    from cardbus.bus.orchestrator.effects import record_effect_done, unknown_effects
    from cardbus.bus.orchestrator.plan import Plan, PlanTask, as_plan, decode_plan, validate_plan
    from cardbus.bus.orchestrator.policy import Policy
    from cardbus.bus.orchestrator.retry import RetryPolicy

# public name -> the module that defines it
_HOME = {
    "Orchestrator": "cardbus.bus.orchestrator.core",
    "Plan": "cardbus.bus.orchestrator.plan",
    "PlanTask": "cardbus.bus.orchestrator.plan",
    "Policy": "cardbus.bus.orchestrator.policy",
    "RetryPolicy": "cardbus.bus.orchestrator.retry",
    "RunResult": "cardbus.bus.orchestrator.core",
    "answer_approval": "cardbus.bus.orchestrator.core",
    "as_plan": "cardbus.bus.orchestrator.plan",
    "decode_plan": "cardbus.bus.orchestrator.plan",
    "record_effect_done": "cardbus.bus.orchestrator.effects",
    "unknown_effects": "cardbus.bus.orchestrator.effects",
    "validate_plan": "cardbus.bus.orchestrator.plan",
}
__all__ = [
    "Orchestrator",
    "Plan",
    "PlanTask",
    "Policy",
    "RetryPolicy",
    "RunResult",
    "answer_approval",
    "as_plan",
    "decode_plan",
    "record_effect_done",
    "unknown_effects",
    "validate_plan",
]


def __getattr__(name: str) -> Any:
    home = _HOME.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(home), name)
    globals()[name] = value  # later look-ups skip this function
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *__all__])
