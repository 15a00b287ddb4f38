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
"""

from __future__ import annotations

from .core import Orchestrator, RunResult, answer_approval
from .effects import record_effect_done, unknown_effects
from .plan import Plan, PlanTask, as_plan, decode_plan, validate_plan
from .policy import Policy
from .retry import RetryPolicy

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
