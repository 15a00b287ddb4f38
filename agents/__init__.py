"""cardbus agents: cards, the Agent base class, the LLM and tool seams, embeddings, the demo."""

from __future__ import annotations

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

__all__ = [
    "LLM",
    "Agent",
    "AgentCard",
    "AgentConstraints",
    "Announce",
    "AskPerson",
    "CapabilitySpec",
    "Capability",
    "Completion",
    "Embedder",
    "HashingEmbedder",
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
    "RulePlanner",
    "Review",
    "Started",
    "TaskCard",
    "TaskContext",
    "Tool",
    "ToolCall",
    "ToolRegistry",
    "current_idempotency_key",
    "ToolSpec",
    "configured_llm",
    "plan_json_schema",
]
