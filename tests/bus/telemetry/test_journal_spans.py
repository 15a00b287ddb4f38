"""The journal in traces: each model call a ``chat <model>`` span (CLIENT) and each tool call
an ``execute_tool <tool>`` span (INTERNAL) under its attempt's span, live and exported.

Two real runs (tests/journal_log.py) traced live into an SDK provider with an in-memory
exporter; the same runs are then rebuilt from the log (``cardbus export``'s
``collect_spans``) and handed to another in-memory exporter. Every exported call span
has a live twin (same id, name, parent, kind, status); a replayed call names the event
it replays and carries no usage; prompts and answers only with the standard switch.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest
from journal_log import ANSWERS, JournalRuns, write_journal_runs
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

from cardbus.agents.llm import OpenAIChatLLM
from cardbus.eventstore import SqliteEventStore
from cardbus.eventstore import events as ev
from cardbus.projections.traces import (
    CAPTURE_CONTENT,
    input_messages,
    output_messages,
    span_id_for,
    to_readable_spans,
)
from cardbus.tools.cmd_export import collect_spans


async def _exported(path: Path, root: str) -> tuple[list[Any], list[Any]]:
    """The run's spans rebuilt from the log, through an in-memory exporter; and its events."""
    store = await SqliteEventStore.open(path)
    try:
        records = await collect_spans(store, root, whole_root=True)
        events = await store.read_correlation(root)
    finally:
        await store.close()
    exporter = InMemorySpanExporter()
    exporter.export(to_readable_spans(records))
    return list(exporter.get_finished_spans()), events


@pytest.fixture
def traced(sdk_spans: InMemorySpanExporter, tmp_path: Path) -> tuple[JournalRuns, list[Any]]:
    runs = asyncio.run(write_journal_runs(tmp_path / "log.db"))
    return runs, list(sdk_spans.get_finished_spans())


def _calls(spans: list[Any]) -> list[Any]:
    return [s for s in spans if s.name.startswith(("chat ", "execute_tool "))]


def test_calls_are_spans_under_their_attempt_with_the_genai_attributes(
    traced: tuple[JournalRuns, list[Any]], monkeypatch: pytest.MonkeyPatch
) -> None:
    runs, _ = traced
    monkeypatch.delenv(CAPTURE_CONTENT, raising=False)
    spans, events = asyncio.run(_exported(runs.db, runs.retry_root))
    by_id = {s.context.span_id: s for s in spans}
    dispatched = [e for e in events if isinstance(e.data, ev.TaskDispatched)]
    attempt_ids = {span_id_for(e.event_id): e.data.attempt for e in dispatched}
    calls = sorted(_calls(spans), key=lambda s: s.start_time)
    assert [s.name for s in calls] == ["chat stub-model"] * 4 + [
        "execute_tool charge",
        "chat stub-model",
    ]
    for s in calls:
        assert s.parent.span_id in attempt_ids, s.name  # under the attempt's span
        a = s.attributes
        assert attempt_ids[s.parent.span_id] == a["cardbus.task.attempt"]
        assert "gen_ai.input.messages" not in a and "gen_ai.tool.call.arguments" not in a
    chats = [s for s in calls if s.name.startswith("chat ")]
    assert all(s.kind == SpanKind.CLIENT for s in chats)
    assert all(s.attributes["gen_ai.operation.name"] == "chat" for s in chats)
    # Required by the GenAI conventions: the journal recorded the client's provider (the
    # stub on loopback is no known provider: its host, a custom value), replays included
    assert [s.attributes.get("gen_ai.provider.name") for s in chats] == ["127.0.0.1"] * 5
    assert all(s.attributes["gen_ai.request.model"] == "stub-model" for s in chats)
    assert all(s.attributes["gen_ai.response.model"] == "stub-model-2024" for s in chats)
    live = [s for s in chats if "cardbus.journal.replayed_from" not in s.attributes]
    replayed = [s for s in chats if "cardbus.journal.replayed_from" in s.attributes]
    assert [
        (s.attributes["gen_ai.usage.input_tokens"], s.attributes["gen_ai.usage.output_tokens"])
        for s in live
    ] == [(i, o) for _, i, o in ANSWERS]
    # replayed: no usage, no duration, and the event named is attempt 1's answer
    answered = {
        e.event_id: e.data
        for e in events
        if isinstance(e.data, ev.ModelAnswered) and e.data.replayed_from is None
    }
    assert len(replayed) == 2
    for s in replayed:
        assert "gen_ai.usage.input_tokens" not in s.attributes
        assert s.start_time == s.end_time
        source = answered[s.attributes["cardbus.journal.replayed_from"]]
        assert (source.attempt, source.seq) == (1, s.attributes["cardbus.journal.seq"])
    (tool,) = [s for s in calls if s.name.startswith("execute_tool")]
    requested = next(e for e in events if isinstance(e.data, ev.ToolRequested))
    assert tool.kind == SpanKind.INTERNAL
    assert tool.context.span_id == span_id_for(requested.event_id)
    assert tool.attributes["gen_ai.operation.name"] == "execute_tool"
    assert tool.attributes["gen_ai.tool.name"] == "charge"
    assert tool.attributes["gen_ai.tool.call.id"] == requested.event_id  # its idempotency key
    assert tool.status.status_code != StatusCode.ERROR
    # the spans hang together: every parent is in the trace
    assert all(s.parent is None or s.parent.span_id in by_id for s in spans)


def test_message_content_only_with_the_standard_switch(
    traced: tuple[JournalRuns, list[Any]], monkeypatch: pytest.MonkeyPatch
) -> None:
    runs, _ = traced
    monkeypatch.setenv(CAPTURE_CONTENT, "true")
    spans, _ = asyncio.run(_exported(runs.db, runs.retry_root))
    chats = sorted(
        (s for s in _calls(spans) if s.name.startswith("chat ")), key=lambda s: s.start_time
    )
    first, replay_of_first = chats[0], chats[2]
    for s in (first, replay_of_first):  # a replayed call shows the content it replays
        assert json.loads(s.attributes["gen_ai.input.messages"]) == [
            {"role": "user", "parts": [{"type": "text", "content": "one: tides"}]}
        ]
        assert json.loads(s.attributes["gen_ai.output.messages"]) == [
            {
                "role": "assistant",
                "parts": [{"type": "text", "content": "answer one"}],
                "finish_reason": "stop",
            }
        ]
    (tool,) = [s for s in _calls(spans) if s.name.startswith("execute_tool")]
    assert json.loads(tool.attributes["gen_ai.tool.call.arguments"]) == {"amount": 5}
    assert json.loads(tool.attributes["gen_ai.tool.call.result"]) == {"charged": 5}


def test_every_exported_call_span_has_a_live_twin(
    traced: tuple[JournalRuns, list[Any]], monkeypatch: pytest.MonkeyPatch
) -> None:
    runs, live_spans = traced
    monkeypatch.delenv(CAPTURE_CONTENT, raising=False)
    live = {s.context.span_id: s for s in live_spans}
    for root in (runs.retry_root, runs.unknown_root):
        spans, _ = asyncio.run(_exported(runs.db, root))
        for x in _calls(spans):
            if x.attributes.get("cardbus.journal.status") == "unknown":
                continue  # the call the "crash" cut: its live span ended with that process
            twin = live.get(x.context.span_id)
            assert twin is not None, f"no live span for {x.name}"
            assert (twin.name, twin.parent.span_id, twin.kind) == (
                x.name,
                x.parent.span_id,
                x.kind,
            )
            assert twin.status.status_code == x.status.status_code, x.name
            if x.name.startswith("chat "):
                assert twin.attributes["gen_ai.provider.name"] == "127.0.0.1"
            for key in (
                "gen_ai.usage.input_tokens",
                "cardbus.journal.replayed_from",
                "gen_ai.provider.name",
            ):
                assert twin.attributes.get(key) == x.attributes.get(key), (x.name, key)
    # a journaled call has one span, the orchestrator's (made from the log): the agent's
    # side makes none of its own, so usage summed over chat spans counts each call once
    agent_chats = [
        s
        for s in live_spans
        if s.name.startswith("chat ")
        and s.context.span_id
        not in {
            c.context.span_id for c in _calls(asyncio.run(_exported(runs.db, runs.retry_root))[0])
        }
    ]
    assert agent_chats == []


def test_an_unknown_effect_is_an_event_of_the_attempt_that_met_it(
    traced: tuple[JournalRuns, list[Any]],
) -> None:
    runs, live_spans = traced
    spans, events = asyncio.run(_exported(runs.db, runs.unknown_root))
    attempts = {
        s.attributes["cardbus.task.attempt"]: s for s in spans if s.name.startswith("invoke_agent")
    }
    decisions = {
        n: [
            e.attributes["cardbus.journal.decision"]
            for e in s.events
            if e.name == "tool.effect_unknown"
        ]
        for n, s in attempts.items()
    }
    assert decisions == {1: [], 2: ["ask"], 3: ["repeat"]}
    requested = next(e for e in events if isinstance(e.data, ev.ToolRequested))
    (event,) = [e for e in attempts[2].events if e.name == "tool.effect_unknown"]
    assert event.attributes["gen_ai.tool.name"] == "charge"
    assert event.attributes["cardbus.journal.requested_event_id"] == requested.event_id
    # live, the same attempt spans carry the same events
    live = {s.context.span_id: s for s in live_spans}
    for n in (2, 3):
        twin = live[attempts[n].context.span_id]
        assert [e.name for e in twin.events] == [e.name for e in attempts[n].events]
    # the cut call: a span under attempt 1 whose status says its effect is unknown
    (cut,) = [s for s in _calls(spans) if s.context.span_id == span_id_for(requested.event_id)]
    assert cut.parent.span_id == attempts[1].context.span_id
    assert cut.attributes["cardbus.journal.status"] == "unknown"


@pytest.mark.parametrize(
    ("url", "provider"),
    [
        ("https://api.openai.com/v1", "openai"),
        ("https://api.anthropic.com/v1/", "anthropic"),
        ("https://generativelanguage.googleapis.com/v1beta/openai/", "gcp.gemini"),
        ("https://my-team.openai.azure.com/openai/deployments/x", "azure.ai.openai"),
        ("https://api.mistral.ai/v1", "mistral_ai"),
        ("https://api.deepseek.com", "deepseek"),
        ("https://api.groq.com/openai/v1", "groq"),
        ("http://localhost:8000/v1", "localhost"),
        ("http://gpu-box.internal:11434/v1", "gpu-box.internal"),
    ],
)
def test_the_provider_is_named_from_the_endpoint(url: str, provider: str) -> None:
    assert OpenAIChatLLM(url, "m", api_key="unused").provider == provider


def test_a_tool_calling_turn_in_the_genai_message_shape() -> None:
    request = {
        "op": "chat",
        "messages": [
            {"role": "system", "content": "be brief"},
            {"role": "user", "content": "weather?"},
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": "c1",
                        "type": "function",
                        "function": {"name": "weather", "arguments": '{"city": "Oslo"}'},
                    }
                ],
            },
            {"role": "tool", "tool_call_id": "c1", "content": "rain"},
        ],
    }
    assert input_messages(request) == [
        {"role": "system", "parts": [{"type": "text", "content": "be brief"}]},
        {"role": "user", "parts": [{"type": "text", "content": "weather?"}]},
        {
            "role": "assistant",
            "parts": [
                {"type": "tool_call", "id": "c1", "name": "weather", "arguments": {"city": "Oslo"}}
            ],
        },
        {"role": "tool", "parts": [{"type": "tool_call_response", "id": "c1", "response": "rain"}]},
    ]
    answer = {
        "text": "",
        "tool_calls": [{"id": "c2", "name": "weather", "arguments": "{}"}],
        "finish_reason": "tool_calls",
    }
    assert output_messages(answer) == [
        {
            "role": "assistant",
            "parts": [{"type": "tool_call", "id": "c2", "name": "weather", "arguments": {}}],
            "finish_reason": "tool_call",
        }
    ]
