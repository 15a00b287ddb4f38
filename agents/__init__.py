"""cardbus agents: cards, the Agent base class, the LLM and tool seams, embeddings, the demo.

Names are loaded on first use, so a submodule imported alone (``cards`` for a
command that reads cards) does not import the LLM agents and planners with it.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from cardbus.agents.agent import Agent, Capability, NeedsInput, Reject, TaskContext
    from cardbus.agents.cards import (
        AgentCard,
        AgentConstraints,
        Announce,
        CapabilitySpec,
        ResultCard,
        Review,
        Started,
        TaskCard,
    )
    from cardbus.agents.embedding import Embedder, HashingEmbedder
    from cardbus.agents.llm import LLM, Completion, MockLLM, OpenAIChatLLM, ToolCall, configured_llm
    from cardbus.agents.llm_agent import LLMAgent
    from cardbus.agents.planning import (
        LLMPlanner,
        PlanLimits,
        PlanProposal,
        PlanRequest,
        RulePlanner,
        plan_json_schema,
    )
    from cardbus.agents.questions import AskPerson
    from cardbus.agents.tools import Tool, ToolRegistry, ToolSpec, current_idempotency_key

# public name -> the module that defines it
_HOME = {
    "Agent": "cardbus.agents.agent",
    "AgentCard": "cardbus.agents.cards",
    "AgentConstraints": "cardbus.agents.cards",
    "Announce": "cardbus.agents.cards",
    "AskPerson": "cardbus.agents.questions",
    "Capability": "cardbus.agents.agent",
    "CapabilitySpec": "cardbus.agents.cards",
    "Completion": "cardbus.agents.llm",
    "Embedder": "cardbus.agents.embedding",
    "HashingEmbedder": "cardbus.agents.embedding",
    "LLM": "cardbus.agents.llm",
    "LLMAgent": "cardbus.agents.llm_agent",
    "LLMPlanner": "cardbus.agents.planning",
    "MockLLM": "cardbus.agents.llm",
    "NeedsInput": "cardbus.agents.agent",
    "OpenAIChatLLM": "cardbus.agents.llm",
    "PlanLimits": "cardbus.agents.planning",
    "PlanProposal": "cardbus.agents.planning",
    "PlanRequest": "cardbus.agents.planning",
    "Reject": "cardbus.agents.agent",
    "ResultCard": "cardbus.agents.cards",
    "Review": "cardbus.agents.cards",
    "RulePlanner": "cardbus.agents.planning",
    "Started": "cardbus.agents.cards",
    "TaskCard": "cardbus.agents.cards",
    "TaskContext": "cardbus.agents.agent",
    "Tool": "cardbus.agents.tools",
    "ToolCall": "cardbus.agents.llm",
    "ToolRegistry": "cardbus.agents.tools",
    "ToolSpec": "cardbus.agents.tools",
    "configured_llm": "cardbus.agents.llm",
    "current_idempotency_key": "cardbus.agents.tools",
    "plan_json_schema": "cardbus.agents.planning",
}
__all__ = [
    "Agent",
    "AgentCard",
    "AgentConstraints",
    "Announce",
    "AskPerson",
    "Capability",
    "CapabilitySpec",
    "Completion",
    "Embedder",
    "HashingEmbedder",
    "LLM",
    "LLMAgent",
    "LLMPlanner",
    "MockLLM",
    "NeedsInput",
    "OpenAIChatLLM",
    "PlanLimits",
    "PlanProposal",
    "PlanRequest",
    "Reject",
    "ResultCard",
    "Review",
    "RulePlanner",
    "Started",
    "TaskCard",
    "TaskContext",
    "Tool",
    "ToolCall",
    "ToolRegistry",
    "ToolSpec",
    "configured_llm",
    "current_idempotency_key",
    "plan_json_schema",
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
