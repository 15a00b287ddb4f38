"""``bus.telemetry`` helpers and the agent worker's spans (SDK in-memory exporter)."""

from __future__ import annotations

import asyncio

from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from cardbus.agents.cards import TaskCard
from cardbus.agents.demo import Researcher
from cardbus.bus import telemetry
from cardbus.bus.runtime.worker import AgentWorker
from cardbus.bus.transport.inprocess import InProcessBus


def _by_kind(spans: list[ReadableSpan], prefix: str) -> list[ReadableSpan]:
    return [s for s in spans if s.name.startswith(prefix)]


def _parent(span: ReadableSpan) -> int | None:
    return span.parent.span_id if span.parent else None


# -- helpers -------------------------------------------------------------------


def test_traceparent_round_trip_and_case_insensitive_headers() -> None:
    tp = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    ctx = telemetry.parse_traceparent(tp)
    assert ctx is not None and ctx.is_remote
    assert ctx.trace_id == 0x0AF7651916CD43DD8448EB211C80319C
    assert telemetry.format_traceparent(ctx) == tp
    assert telemetry.parse_traceparent(tp.upper()) == ctx
    for bad in (None, "", "junk", "00-" + "0" * 32 + "-b7ad6b7169203331-01", "ff" + tp[2:]):
        assert telemetry.parse_traceparent(bad) is None
    assert telemetry.extract_traceparent({"TraceParent": tp}) == tp
    assert telemetry.extract_traceparent({"TRACEPARENT": tp, "x": "y"}) == tp
    assert telemetry.extract_traceparent({"traceparent": "nonsense"}) is None
    assert telemetry.extract_traceparent(None) is None
    headers = telemetry.inject_headers({"Nats-Msg-Id": "1", "Traceparent": "old"}, tp)
    assert headers == {"Nats-Msg-Id": "1", "traceparent": tp}
    assert telemetry.messaging_system(InProcessBus()) == "inprocess"


# -- an agent in "another process": it joins the trace named by the card --------


async def test_worker_continues_the_cards_trace(sdk_spans: InMemorySpanExporter) -> None:
    bus = InProcessBus()
    worker = AgentWorker(bus, Researcher, started_after_s=0)  # Started always
    await worker.start()
    tp = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    card = TaskCard(
        task_id="t1", root_id="r1", capability="research", inputs={"topic": "x"}, traceparent=tp
    )
    await bus.send_task(Researcher.agent_id, card)
    replies = bus.replies()
    for _ in range(3):  # announce, started, result
        await asyncio.wait_for(replies.__anext__(), 5)
    await bus.close()
    spans = list(sdk_spans.get_finished_spans())
    (process,) = _by_kind(spans, "process ")
    (agent,) = _by_kind(spans, "handle ")
    assert process.context.trace_id == agent.context.trace_id == 0x0AF7651916CD43DD8448EB211C80319C
    assert _parent(process) == 0xB7AD6B7169203331 and process.parent.is_remote  # type: ignore[union-attr]
    assert _parent(agent) == process.context.span_id


async def test_failed_and_rejected_attempts_carry_error_type(
    sdk_spans: InMemorySpanExporter,
) -> None:
    bus = InProcessBus()
    worker = AgentWorker(bus, Researcher, started_after_s=0)  # Started always
    await worker.start()
    await bus.send_task(
        Researcher.agent_id, TaskCard(task_id="t2", root_id="r", capability="research", inputs={})
    )
    replies = bus.replies()
    for _ in range(3):
        await asyncio.wait_for(replies.__anext__(), 5)
    await bus.close()
    (agent,) = _by_kind(list(sdk_spans.get_finished_spans()), "handle ")
    assert agent.attributes["error.type"] == "input_schema_mismatch"
    assert agent.status.status_code.name == "ERROR"
