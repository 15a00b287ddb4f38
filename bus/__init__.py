"""cardbus bus: moving cards (``transport``), deciding (``orchestrator``), assembling (``runtime``).

``cardbus.bus.transport``     the Bus interface and its backends (in-process, NATS)
``cardbus.bus.orchestrator``  the decision loop and what it decides with
``cardbus.bus.runtime``       the embedded and NATS assemblies, and the agent worker
``cardbus.bus.telemetry``     OpenTelemetry spans for the above (API only)
"""

from __future__ import annotations

from cardbus.bus.orchestrator import (
    Orchestrator,
    Plan,
    PlanTask,
    Policy,
    RetryPolicy,
    RunResult,
    answer_approval,
    as_plan,
    decode_plan,
    record_effect_done,
    unknown_effects,
    validate_plan,
)
from cardbus.bus.orchestrator.questions import QuestionRefused, answer_question, open_questions
from cardbus.bus.orchestrator.selection import Weights
from cardbus.bus.runtime import AgentWorker, EmbeddedRuntime
from cardbus.bus.transport import Bus, InProcessBus

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
