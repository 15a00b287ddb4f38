"""cardbus bus: moving cards between the orchestrator and agents, and the orchestrator."""

from __future__ import annotations

from .inprocess import InProcessBus
from .interface import Bus
from .orchestrator import Orchestrator, RunResult, answer_approval
from .plan import Plan, PlanTask, decode_plan, validate_plan
from .policy import Policy
from .worker import AgentWorker

__all__ = [
    "AgentWorker",
    "Bus",
    "InProcessBus",
    "Orchestrator",
    "Plan",
    "PlanTask",
    "Policy",
    "RunResult",
    "answer_approval",
    "decode_plan",
    "validate_plan",
]
