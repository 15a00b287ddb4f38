"""cardbus agents: cards, the Agent base class, selection, the LLM seam and demo agents."""

from __future__ import annotations

from .agent import Agent, Capability, NeedsInput, Reject, TaskContext
from .cards import (
    AgentCard,
    AgentConstraints,
    Announce,
    CapabilitySpec,
    ResultCard,
    Review,
    Started,
    TaskCard,
)
from .llm import LLM, Completion, MockLLM, OpenAIChatLLM
from .selection import Embedder, HashingEmbedder, Weights

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
    "MockLLM",
    "NeedsInput",
    "OpenAIChatLLM",
    "Reject",
    "ResultCard",
    "Review",
    "Started",
    "TaskCard",
    "TaskContext",
    "Weights",
]
