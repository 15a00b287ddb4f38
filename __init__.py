"""cardbus: an event-sourced message bus for multi-agent work.

``import cardbus`` is the curated public API: what the README's examples use.
The packages under it keep the rest, by layer (imports only point down)::

    cardbus.tools        the `cardbus` command line
    cardbus.bus          transport, orchestrator, runtimes   (uses the three below)
    cardbus.agents       cards, Agent, LLM and tool seams    (uses eventstore)
    cardbus.projections  folds over the log, replay, traces  (uses eventstore)
    cardbus.eventstore   the log: events, hash chain, stores, the error tree

Names are loaded on first use, so ``import cardbus`` (and the CLI, which
lives under it) stays cheap.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from cardbus.agents import (
        LLM,
        Agent,
        AgentCard,
        AgentConstraints,
        Capability,
        CapabilitySpec,
        Completion,
        MockLLM,
        NeedsInput,
        OpenAIChatLLM,
        Reject,
        ResultCard,
        Review,
        TaskCard,
        TaskContext,
    )
    from cardbus.bus import (
        EmbeddedRuntime,
        Orchestrator,
        Plan,
        PlanTask,
        Policy,
        RunResult,
        Weights,
        decode_plan,
        validate_plan,
    )
    from cardbus.bus.runtime.nats import NatsRuntime
    from cardbus.eventstore import (
        EventStore,
        MemoryEventStore,
        SqliteEventStore,
        open_store,
    )
    from cardbus.eventstore.errors import (
        AccessDenied,
        BusError,
        CardbusError,
        ConcurrencyError,
        ConfigError,
        DecodeError,
        IdempotencyError,
        IllegalTransition,
        InvalidPlan,
        LLMError,
        PayloadTooLarge,
        PrerequisiteNotStored,
        StoreError,
        StoreUnavailable,
        StreamNotFound,
        SubjectLayoutError,
        ToolError,
        ToolFailed,
        ToolInputInvalid,
        ToolNotFound,
        ToolResultTooLarge,
        ToolTimeout,
        UnknownEventType,
        ValidationError,
    )
    from cardbus.eventstore.nats import NatsEventStore
    from cardbus.projections import AsOf, Timeline, replay

# public name -> the module that defines it
_HOME = {
    **dict.fromkeys(
        [
            "LLM",
            "Agent",
            "AgentCard",
            "AgentConstraints",
            "Capability",
            "CapabilitySpec",
            "Completion",
            "MockLLM",
            "NeedsInput",
            "OpenAIChatLLM",
            "Reject",
            "ResultCard",
            "Review",
            "TaskCard",
            "TaskContext",
        ],
        "cardbus.agents",
    ),
    **dict.fromkeys(
        [
            "EmbeddedRuntime",
            "Orchestrator",
            "Plan",
            "PlanTask",
            "Policy",
            "RunResult",
            "Weights",
            "decode_plan",
            "validate_plan",
        ],
        "cardbus.bus",
    ),
    "NatsRuntime": "cardbus.bus.runtime.nats",
    **dict.fromkeys(
        ["EventStore", "MemoryEventStore", "SqliteEventStore", "open_store"], "cardbus.eventstore"
    ),
    "NatsEventStore": "cardbus.eventstore.nats",
    **dict.fromkeys(
        [
            "AccessDenied",
            "BusError",
            "CardbusError",
            "ConfigError",
            "LLMError",
            "SubjectLayoutError",
            "ToolError",
            "ToolFailed",
            "ToolInputInvalid",
            "ToolNotFound",
            "ToolResultTooLarge",
            "ToolTimeout",
            "ConcurrencyError",
            "DecodeError",
            "IdempotencyError",
            "IllegalTransition",
            "InvalidPlan",
            "PayloadTooLarge",
            "PrerequisiteNotStored",
            "StoreError",
            "StoreUnavailable",
            "StreamNotFound",
            "UnknownEventType",
            "ValidationError",
        ],
        "cardbus.eventstore.errors",
    ),
    **dict.fromkeys(["AsOf", "Timeline", "replay"], "cardbus.projections"),
}

__all__ = [
    "AccessDenied",
    "Agent",
    "AgentCard",
    "AgentConstraints",
    "AsOf",
    "BusError",
    "Capability",
    "CapabilitySpec",
    "CardbusError",
    "Completion",
    "ConcurrencyError",
    "ConfigError",
    "DecodeError",
    "EmbeddedRuntime",
    "EventStore",
    "IdempotencyError",
    "IllegalTransition",
    "InvalidPlan",
    "LLM",
    "LLMError",
    "MemoryEventStore",
    "MockLLM",
    "NatsEventStore",
    "NatsRuntime",
    "NeedsInput",
    "OpenAIChatLLM",
    "Orchestrator",
    "PayloadTooLarge",
    "Plan",
    "PlanTask",
    "Policy",
    "PrerequisiteNotStored",
    "Reject",
    "ResultCard",
    "Review",
    "RunResult",
    "SqliteEventStore",
    "StoreError",
    "StoreUnavailable",
    "StreamNotFound",
    "SubjectLayoutError",
    "TaskCard",
    "TaskContext",
    "Timeline",
    "ToolError",
    "ToolFailed",
    "ToolInputInvalid",
    "ToolNotFound",
    "ToolResultTooLarge",
    "ToolTimeout",
    "UnknownEventType",
    "ValidationError",
    "Weights",
    "decode_plan",
    "open_store",
    "replay",
    "validate_plan",
]


def __getattr__(name: str) -> Any:
    home = _HOME.get(name)
    if home is None:
        raise AttributeError(f"module 'cardbus' has no attribute {name!r}")
    value = getattr(importlib.import_module(home), name)
    globals()[name] = value  # later look-ups skip this function
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *__all__])
