"""The public API of ``agents`` is chosen on purpose: pinned here."""

from __future__ import annotations

import importlib

import pytest

import cardbus.agents as agents

PUBLIC = {
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
}


def test_the_package_exports_exactly_the_public_names() -> None:
    assert set(agents.__all__) == PUBLIC
    for name in PUBLIC:
        assert getattr(agents, name) is not None


@pytest.mark.parametrize(
    "module",
    ["cards", "agent", "embedding", "schema", "llm", "llm_agent", "planning", "tool_loop", "tools"],
)
def test_every_module_name_in_all_exists(module: str) -> None:
    mod = importlib.import_module(f"cardbus.agents.{module}")
    missing = [n for n in mod.__all__ if not hasattr(mod, n)]
    assert missing == []


def test_errors_share_the_library_root() -> None:
    from cardbus.agents.llm import LLMError
    from cardbus.eventstore.errors import CardbusError

    assert issubclass(LLMError, CardbusError)
