"""Live tracing through the OpenTelemetry API, recorded by the SDK's in-memory exporter.

The SDK provider is installed once per test process (``sdk_spans``); what a
process without an SDK does is checked in a subprocess (``test_no_sdk_*``).
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind

from cardbus.agents.demo import DEMO_AGENTS, report_plan
from cardbus.bus import telemetry
from cardbus.bus.runtime.embedded import EmbeddedRuntime
from cardbus.eventstore import MemoryEventStore
from cardbus.eventstore import events as ev
from cardbus.projections import traces

_ROOT = Path(__file__).resolve().parents[3]


def _by_kind(spans: list[ReadableSpan], prefix: str) -> list[ReadableSpan]:
    return [s for s in spans if s.name.startswith(prefix)]


def _parent(span: ReadableSpan) -> int | None:
    return span.parent.span_id if span.parent else None


# -- a whole demo run in one process --------------------------------------------


async def test_demo_run_is_one_trace(sdk_spans: InMemorySpanExporter) -> None:
    store = MemoryEventStore()
    async with EmbeddedRuntime(store, DEMO_AGENTS) as rt:
        result = await rt.run(report_plan("ocean tides"), timeout=30)
    assert result.status == "completed"
    spans = list(sdk_spans.get_finished_spans())

    (workflow,) = _by_kind(spans, "invoke_workflow")
    trace_id = workflow.context.trace_id
    assert workflow.kind is SpanKind.INTERNAL
    assert workflow.attributes["gen_ai.operation.name"] == "invoke_workflow"
    assert workflow.attributes["cardbus.root_id"] == result.root_id
    assert workflow.attributes["cardbus.run.status"] == "completed"
    assert {s.context.trace_id for s in spans} == {trace_id}

    by_id = {s.context.span_id: s for s in spans}
    sends = _by_kind(spans, "send cardbus.agent.")
    processes = _by_kind(spans, "process cardbus.agent.")
    agents = _by_kind(spans, "handle ")
    # one invoke_agent per attempt: the orchestrator's CLIENT span, the worker's is "handle"
    assert all(s.kind is SpanKind.CLIENT for s in _by_kind(spans, "invoke_agent "))
    attempts = [s for s in _by_kind(spans, "invoke_agent ") if s.kind is SpanKind.CLIENT]
    events = await store.read_correlation(result.root_id)
    dispatches = [e for e in events if isinstance(e.data, ev.TaskDispatched)]
    assert len(sends) == len(processes) == len(agents) == len(attempts) == len(dispatches)
    tasks = _by_kind(spans, "task ")
    assert len(tasks) == len({e.stream for e in events if isinstance(e.data, ev.TaskCreated)})
    for t in tasks:  # a plan task under the workflow, a review under the task it serves
        parent = by_id[_parent(t)]
        if t.attributes.get("cardbus.task.parent_id"):
            assert parent.attributes["cardbus.task.id"] == t.attributes["cardbus.task.parent_id"]
        else:
            assert parent is workflow
    for a in attempts:  # the orchestrator's attempt span, under its task's span
        assert by_id[_parent(a)].name.startswith("task ")
        assert by_id[_parent(a)].attributes["cardbus.task.id"] == a.attributes["cardbus.task.id"]

    for s in sends:
        assert s.kind is SpanKind.PRODUCER and by_id[_parent(s)] in attempts
        a = s.attributes
        assert a["messaging.system"] == "inprocess"
        assert a["messaging.operation.type"] == "send"
        assert s.name == f"send {a['messaging.destination.name']}"
        assert a["messaging.message.id"] == f"{a['cardbus.task.id']}#{a['cardbus.task.attempt']}"
    for p in processes:
        assert p.kind is SpanKind.CONSUMER
        send = by_id[_parent(p)]
        assert send.kind is SpanKind.PRODUCER
        assert p.attributes["messaging.operation.type"] == "process"
        assert p.attributes["messaging.message.id"] == send.attributes["messaging.message.id"]
        assert (
            p.attributes["messaging.destination.name"]
            == send.attributes["messaging.destination.name"]
        )
    results = {
        (e.stream, e.data.attempt): e.data
        for e in events
        if isinstance(e.data, ev.TaskResultSubmitted)
    }
    names = {a.agent_id: a.name or a.agent_id for a in DEMO_AGENTS}
    for g in agents:
        assert g.kind is SpanKind.INTERNAL
        assert by_id[_parent(g)].name.startswith("process ")
        a = g.attributes
        assert a["cardbus.operation.name"] == "handle"
        assert "gen_ai.operation.name" not in a
        assert g.name == f"handle {names[a['gen_ai.agent.id']]}"
        assert a["gen_ai.agent.name"] == names[a["gen_ai.agent.id"]]
        r = results[(a["cardbus.task.id"], a["cardbus.task.attempt"])]
        assert a["gen_ai.usage.input_tokens"] == r.usage.input_tokens
        assert a["gen_ai.usage.output_tokens"] == r.usage.output_tokens
        assert "error.type" not in a

    # every event of the run names the run's span in its envelope
    expected = telemetry.format_traceparent(workflow.context)
    assert {e.traceparent for e in events} == {expected}


# -- no SDK: nothing happens ------------------------------------------------------


def test_no_sdk_means_no_spans_no_traceparent_and_no_cost() -> None:
    code = textwrap.dedent(
        """
        import asyncio, time
        from cardbus.agents.demo import DEMO_AGENTS
        from cardbus.bus import telemetry
        from cardbus.agents.demo import report_plan
        from cardbus.bus.runtime.embedded import EmbeddedRuntime
        from cardbus.eventstore import MemoryEventStore

        assert not telemetry.enabled()

        async def main():
            store = MemoryEventStore()
            async with EmbeddedRuntime(store, DEMO_AGENTS) as rt:
                r = await rt.run(report_plan("tides"), timeout=30)
            assert r.status == "completed"
            events = await store.read_correlation(r.root_id)
            assert all(e.traceparent is None for e in events), "traceparent without an SDK"

        asyncio.run(main())
        print("ok")
        """
    )
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=_ROOT, capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "ok"


# -- the CLI: OTEL_EXPORTER_OTLP_ENDPOINT=... cardbus demo sends one trace per run -------


def test_cardbus_demo_sends_one_trace_per_run_to_the_env_endpoint(
    otlp_receiver: Any, tmp_path: Path
) -> None:
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
        ExportTraceServiceRequest,
    )

    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_") and k != "CARDBUS_DB"}
    env |= {"OTEL_EXPORTER_OTLP_ENDPOINT": otlp_receiver.url, "OTEL_SERVICE_NAME": "demo-test"}
    # a busy machine may answer slower than the commands' short default deadline: this
    # test is about what is sent (the deadline has tests of its own)
    env["OTEL_EXPORTER_OTLP_TIMEOUT"] = "30"
    db = tmp_path / "demo.db"
    out = subprocess.run(
        [sys.executable, "-m", "cardbus.tools", "demo", "--db", str(db)],
        cwd=_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    spans = []
    for _, content_type, body in otlp_receiver.received.requests_to("/v1/traces"):
        assert content_type == "application/x-protobuf"
        for rs in ExportTraceServiceRequest.FromString(body).resource_spans:
            service = {a.key: a.value.string_value for a in rs.resource.attributes}
            assert service["service.name"] == "demo-test"
            spans += [s for ss in rs.scope_spans for s in ss.spans]
    roots = [s for s in spans if s.name == "invoke_workflow"]
    assert len(roots) == 1 and not roots[0].parent_span_id
    assert {s.trace_id for s in spans} == {roots[0].trace_id}
    names = {s.name for s in spans}
    assert {"invoke_agent researcher", "invoke_agent writer", "invoke_agent reviewer"} <= names
    ids = {s.span_id for s in spans}
    assert all(s.parent_span_id in ids for s in spans if s is not roots[0])


async def test_a_restarted_orchestrator_rejoins_the_runs_trace(
    sdk_spans: InMemorySpanExporter, tmp_path: Path
) -> None:
    from cardbus.bus.orchestrator.plan import Plan, PlanTask
    from cardbus.eventstore import SqliteEventStore

    plan = Plan(
        goal="a report",
        tasks=[
            PlanTask(id="r", capability="research", inputs={"topic": "tides"}),
            PlanTask(
                id="o",
                capability="outline",
                deps=["r"],
                requires_approval=True,
                inputs={"topic": "tides", "facts": {"$dep": "r", "path": "facts"}},
            ),
        ],
    )
    store = await SqliteEventStore.open(tmp_path / "log.db", poll_interval=0.01)
    try:
        async with EmbeddedRuntime(store, DEMO_AGENTS) as first:
            root = await first.orchestrator.submit(plan)
            waiting = None
            for _ in range(500):  # until the outline waits for a human
                events = await store.read_correlation(root)
                waiting = next(
                    (e for e in events if isinstance(e.data, ev.ApprovalRequested)), None
                )
                if waiting:
                    break
                await asyncio.sleep(0.01)
            assert waiting is not None
        (workflow,) = _by_kind(list(sdk_spans.get_finished_spans()), "invoke_workflow")
        sdk_spans.clear()
        async with EmbeddedRuntime(store, DEMO_AGENTS) as second:  # a new orchestrator
            await second.orchestrator.approve(waiting.stream, by="alice")
            result = await second.orchestrator.wait(root, 10)
        assert result.status == "completed"
        after = list(sdk_spans.get_finished_spans())
        sends = _by_kind(after, "send cardbus.agent.")
        assert sends and all(s.context.trace_id == workflow.context.trace_id for s in sends)
        created = {
            e.stream: traces.task_span_id(e.stream)
            for e in await store.read_correlation(root)
            if isinstance(e.data, ev.TaskCreated)
        }
        by_id = {s.context.span_id: s for s in after}
        for s in sends:  # under a new attempt span, under the task span of the first trace
            attempt = by_id[_parent(s)]
            assert attempt.kind is SpanKind.CLIENT
            assert _parent(attempt) == created[attempt.attributes["cardbus.task.id"]]
        resumed = [e for e in await store.read_correlation(root) if e.position > waiting.position]
        expected = telemetry.format_traceparent(workflow.context)
        assert {e.traceparent for e in resumed if e.actor == "orchestrator"} == {expected}
    finally:
        await store.close()
