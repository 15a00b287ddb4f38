"""``bus.telemetry.use_tracer_provider`` also moves the agents' model-call spans."""

from __future__ import annotations

from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from cardbus.agents.llm import MeteredLLM, MockLLM
from cardbus.bus import telemetry


async def test_model_call_spans_follow_the_bus_provider() -> None:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    telemetry.use_tracer_provider(provider)
    try:
        await MeteredLLM(MockLLM(model="m-1")).complete("hello")
    finally:
        telemetry.use_tracer_provider(None)
    (span,) = exporter.get_finished_spans()
    assert span.name == "chat m-1" and span.attributes["gen_ai.usage.output_tokens"] > 0
