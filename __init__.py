"""cardbus: an event-sourced message bus for multi-agent work.

``import cardbus`` is the curated public API: what the README's and the docs' examples use.
The packages under it keep the rest, by layer (imports only point down)::

    cardbus.tools        the `cardbus` command line
    cardbus.bus          transport, orchestrator, runtimes, A2A   (uses the three below)
    cardbus.agents       cards, Agent, LLM and tool seams, planners (uses eventstore)
    cardbus.projections  folds over the log, replay, traces        (uses eventstore)
    cardbus.eventstore   the log: events, hash chains, stores, the error tree

Names are loaded on first use, so ``import cardbus`` (and the CLI, which
lives under it) stays cheap; ``RemoteA2AAgent`` needs the ``a2a`` extra.
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
        AskPerson,
        Capability,
        CapabilitySpec,
        Completion,
        LLMAgent,
        LLMPlanner,
        MockLLM,
        NeedsInput,
        OpenAIChatLLM,
        Reject,
        ResultCard,
        Review,
        RulePlanner,
        TaskCard,
        TaskContext,
        Tool,
        ToolRegistry,
    )
    from cardbus.bus import (
        EmbeddedRuntime,
        Orchestrator,
        Plan,
        PlanTask,
        Policy,
        RetryPolicy,
        RunResult,
        Weights,
        decode_plan,
        validate_plan,
    )
    from cardbus.bus.a2a import (
        RemoteA2AAgent,
    )
    from cardbus.bus.runtime.nats import (
        NatsRuntime,
    )
    from cardbus.eventstore import (
        EventStore,
        MemoryEventStore,
        SqliteEventStore,
        open_store,
    )
    from cardbus.eventstore.errors import (
        AccessDenied,
        AmbiguousId,
        BusError,
        CardbusError,
        ConcurrencyError,
        ConfigError,
        DecodeError,
        EffectUnknown,
        IdempotencyError,
        IllegalTransition,
        InvalidPlan,
        LLMBadOutput,
        LLMError,
        LLMLimitExceeded,
        LLMMaxToolCalls,
        LLMMaxTurns,
        LLMRateLimited,
        LLMRequestRefused,
        LLMServerError,
        LLMTimeout,
        LLMTokenLimit,
        NotStarted,
        PayloadTooLarge,
        PlanConflict,
        PrerequisiteNotStored,
        StoreClosed,
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
    from cardbus.eventstore.events import (
        ReviewIssue,
    )
    from cardbus.eventstore.nats import (
        NatsEventStore,
    )
    from cardbus.projections import (
        AsOf,
        Timeline,
        replay,
    )

# public name -> the module that defines it
_HOME = {
    **dict.fromkeys(
        [
            "LLM",
            "Agent",
            "AgentCard",
            "AgentConstraints",
            "AskPerson",
            "Capability",
            "CapabilitySpec",
            "Completion",
            "LLMAgent",
            "LLMPlanner",
            "MockLLM",
            "NeedsInput",
            "OpenAIChatLLM",
            "Reject",
            "ResultCard",
            "Review",
            "RulePlanner",
            "TaskCard",
            "TaskContext",
            "Tool",
            "ToolRegistry",
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
            "RetryPolicy",
            "RunResult",
            "Weights",
            "decode_plan",
            "validate_plan",
        ],
        "cardbus.bus",
    ),
    **dict.fromkeys(
        [
            "RemoteA2AAgent",
        ],
        "cardbus.bus.a2a",
    ),
    **dict.fromkeys(
        [
            "NatsRuntime",
        ],
        "cardbus.bus.runtime.nats",
    ),
    **dict.fromkeys(
        [
            "EventStore",
            "MemoryEventStore",
            "SqliteEventStore",
            "open_store",
        ],
        "cardbus.eventstore",
    ),
    **dict.fromkeys(
        [
            "AccessDenied",
            "AmbiguousId",
            "BusError",
            "CardbusError",
            "ConcurrencyError",
            "ConfigError",
            "DecodeError",
            "EffectUnknown",
            "IdempotencyError",
            "IllegalTransition",
            "InvalidPlan",
            "PlanConflict",
            "LLMBadOutput",
            "LLMError",
            "LLMLimitExceeded",
            "LLMMaxToolCalls",
            "LLMMaxTurns",
            "LLMRateLimited",
            "LLMRequestRefused",
            "LLMServerError",
            "LLMTimeout",
            "LLMTokenLimit",
            "NotStarted",
            "PayloadTooLarge",
            "PrerequisiteNotStored",
            "StoreError",
            "StoreClosed",
            "StoreUnavailable",
            "StreamNotFound",
            "SubjectLayoutError",
            "ToolError",
            "ToolFailed",
            "ToolInputInvalid",
            "ToolNotFound",
            "ToolResultTooLarge",
            "ToolTimeout",
            "UnknownEventType",
            "ValidationError",
        ],
        "cardbus.eventstore.errors",
    ),
    **dict.fromkeys(
        [
            "ReviewIssue",
        ],
        "cardbus.eventstore.events",
    ),
    **dict.fromkeys(
        [
            "NatsEventStore",
        ],
        "cardbus.eventstore.nats",
    ),
    **dict.fromkeys(
        [
            "AsOf",
            "Timeline",
            "replay",
        ],
        "cardbus.projections",
    ),
}

__all__ = [
    "AccessDenied",
    "Agent",
    "AgentCard",
    "AgentConstraints",
    "AskPerson",
    "AmbiguousId",
    "AsOf",
    "BusError",
    "Capability",
    "CapabilitySpec",
    "CardbusError",
    "Completion",
    "ConcurrencyError",
    "ConfigError",
    "DecodeError",
    "EffectUnknown",
    "EmbeddedRuntime",
    "EventStore",
    "IdempotencyError",
    "IllegalTransition",
    "InvalidPlan",
    "PlanConflict",
    "LLM",
    "LLMAgent",
    "LLMBadOutput",
    "LLMError",
    "LLMLimitExceeded",
    "LLMMaxToolCalls",
    "LLMMaxTurns",
    "LLMPlanner",
    "LLMRateLimited",
    "LLMRequestRefused",
    "LLMServerError",
    "LLMTimeout",
    "LLMTokenLimit",
    "MemoryEventStore",
    "MockLLM",
    "NatsEventStore",
    "NatsRuntime",
    "NeedsInput",
    "NotStarted",
    "OpenAIChatLLM",
    "Orchestrator",
    "PayloadTooLarge",
    "Plan",
    "PlanTask",
    "Policy",
    "PrerequisiteNotStored",
    "Reject",
    "RemoteA2AAgent",
    "ResultCard",
    "RetryPolicy",
    "Review",
    "ReviewIssue",
    "RulePlanner",
    "RunResult",
    "SqliteEventStore",
    "StoreError",
    "StoreClosed",
    "StoreUnavailable",
    "StreamNotFound",
    "SubjectLayoutError",
    "TaskCard",
    "TaskContext",
    "Timeline",
    "Tool",
    "ToolError",
    "ToolFailed",
    "ToolInputInvalid",
    "ToolNotFound",
    "ToolRegistry",
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
