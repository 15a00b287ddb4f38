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
from cardbus.agents.llm import LLM, Completion, MockLLM, OpenAIChatLLM, configured_llm
from cardbus.agents.llm_agent import LLMAgent

__all__ = [
    "LLM",
    "Agent",
    "AgentCard",
    "AgentConstraints",
    "Announce",
    "CapabilitySpec",
    "Capability",
    "Completion",
    "Embedder",
    "HashingEmbedder",
    "LLMAgent",
    "MockLLM",
    "NeedsInput",
    "OpenAIChatLLM",
    "Reject",
    "ResultCard",
    "Review",
    "Started",
    "TaskCard",
    "TaskContext",
    "configured_llm",
]
