"""cardbus bus: moving cards (``transport``), deciding (``orchestrator``), assembling (``runtime``).

``cardbus.bus.transport``     the Bus interface and its backends (in-process, NATS)
``cardbus.bus.orchestrator``  the decision loop and what it decides with
``cardbus.bus.runtime``       the embedded and NATS assemblies, and the agent worker
``cardbus.bus.telemetry``     OpenTelemetry spans for the above (API only)

Names are loaded on first use: importing one submodule (``cardbus.bus.orchestrator.reviews``
for ``cardbus review``) does not import the rest of the package with it.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from cardbus.bus.orchestrator.core import Orchestrator, RunResult, answer_approval
    from cardbus.bus.orchestrator.effects import record_effect_done, unknown_effects
    from cardbus.bus.orchestrator.plan import Plan, PlanTask, as_plan, decode_plan, validate_plan
    from cardbus.bus.orchestrator.policy import Policy
    from cardbus.bus.orchestrator.questions import QuestionRefused, answer_question, open_questions
    from cardbus.bus.orchestrator.retry import RetryPolicy
    from cardbus.bus.orchestrator.selection import Weights
    from cardbus.bus.runtime.embedded import EmbeddedRuntime
    from cardbus.bus.runtime.worker import AgentWorker
    from cardbus.bus.transport import Bus, InProcessBus

# public name -> the module that defines it
_HOME = {
    "AgentWorker": "cardbus.bus.runtime.worker",
    "Bus": "cardbus.bus.transport",
    "EmbeddedRuntime": "cardbus.bus.runtime.embedded",
    "InProcessBus": "cardbus.bus.transport",
    "Orchestrator": "cardbus.bus.orchestrator.core",
    "Plan": "cardbus.bus.orchestrator.plan",
    "PlanTask": "cardbus.bus.orchestrator.plan",
    "Policy": "cardbus.bus.orchestrator.policy",
    "QuestionRefused": "cardbus.bus.orchestrator.questions",
    "RetryPolicy": "cardbus.bus.orchestrator.retry",
    "RunResult": "cardbus.bus.orchestrator.core",
    "Weights": "cardbus.bus.orchestrator.selection",
    "answer_approval": "cardbus.bus.orchestrator.core",
    "answer_question": "cardbus.bus.orchestrator.questions",
    "as_plan": "cardbus.bus.orchestrator.plan",
    "decode_plan": "cardbus.bus.orchestrator.plan",
    "open_questions": "cardbus.bus.orchestrator.questions",
    "record_effect_done": "cardbus.bus.orchestrator.effects",
    "unknown_effects": "cardbus.bus.orchestrator.effects",
    "validate_plan": "cardbus.bus.orchestrator.plan",
}
__all__ = [
    "AgentWorker",
    "Bus",
    "EmbeddedRuntime",
    "InProcessBus",
    "Orchestrator",
    "Plan",
    "PlanTask",
    "Policy",
    "QuestionRefused",
    "RetryPolicy",
    "RunResult",
    "Weights",
    "answer_approval",
    "answer_question",
    "as_plan",
    "decode_plan",
    "open_questions",
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
