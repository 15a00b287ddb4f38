"""The ``mcp`` SDK's own spans in a traced run: its ``tools/call`` span is a child of the
journal's ``execute_tool`` span of that call, and its session traffic (initialize,
tools/list) makes no traces of its own. Real parts: a real MCP server over stdio
(tests/mcpservers.py), the embedded runtime, the SDK's spans routed to the in-memory
exporter."""

from __future__ import annotations

from typing import Any

import mcp.shared._otel as mcp_otel
import pytest
from mcpservers import Asker, stdio_server
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from cardbus.agents.tools import ToolRegistry
from cardbus.bus.orchestrator.plan import Plan, PlanTask
from cardbus.bus.runtime.embedded import EmbeddedRuntime
from cardbus.eventstore import MemoryEventStore
from cardbus.eventstore import events as ev
from cardbus.projections.traces import span_id_for


async def test_mcp_sdk_spans_sit_under_their_execute_tool_span(
    sdk_spans: InMemorySpanExporter, monkeypatch: pytest.MonkeyPatch
) -> None:
    mcp_spans = InMemorySpanExporter()
    provider = TracerProvider()  # the SDK's default sampler: parent-based, always on
    provider.add_span_processor(SimpleSpanProcessor(mcp_spans))
    monkeypatch.setattr(mcp_otel, "_tracer", provider.get_tracer("mcp-python-sdk"))
    store = MemoryEventStore()
    plan = Plan(
        goal="ask",
        tasks=[PlanTask(id="ask", capability="ask", inputs={"text": "tide", "hang": False})],
    )
    async with EmbeddedRuntime(
        store, [Asker], tools=ToolRegistry(), mcp_servers=[stdio_server("t"), stdio_server("u")]
    ) as rt:
        result = await rt.run(plan, timeout=120)
    assert result.status == "completed", result
    spans: list[Any] = list(sdk_spans.get_finished_spans())
    requested = [
        e
        for e in await store.read_correlation(result.root_id)
        if isinstance(e.data, ev.ToolRequested)
    ]
    execute = {s.context.span_id: s for s in spans if s.name.startswith("execute_tool ")}
    assert {span_id_for(e.event_id) for e in requested} <= set(execute)
    sdk: list[Any] = list(mcp_spans.get_finished_spans())
    calls = [s for s in sdk if "tools/call" in s.name]
    assert calls, [s.name for s in sdk]
    for s in calls:
        assert s.parent is not None and s.parent.span_id in execute, s.name
        assert s.context.trace_id == execute[s.parent.span_id].context.trace_id
    # no separate traces: every span of the SDK is in the run's trace
    run_trace = next(iter(execute.values())).context.trace_id
    assert {s.context.trace_id for s in sdk} == {run_trace}, [s.name for s in sdk]
