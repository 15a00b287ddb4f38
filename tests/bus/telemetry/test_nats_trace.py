"""One trace across a NATS hop between two processes.

The orchestrator runs here (SDK in-memory exporter); the agents run in a
``cardbus agent serve`` subprocess whose SDK is configured from
``OTEL_EXPORTER_OTLP_ENDPOINT`` and exports to the loopback receiver. The
agent side's spans must continue the orchestrator's trace: each
``process cardbus.agent.<agent>`` span is a child of the orchestrator's
``send`` span for that card.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from cardbus.agents.demo import DEMO_AGENTS, report_plan
from cardbus.bus.runtime.nats import NatsRuntime
from cardbus.eventstore.nats.connection import NatsOptions

_ROOT = Path(__file__).resolve().parents[3]


def _received(receiver: Any) -> list[Any]:
    spans = []
    for _, _, body in receiver.received.requests_to("/v1/traces"):
        for rs in ExportTraceServiceRequest.FromString(body).resource_spans:
            spans += [s for ss in rs.scope_spans for s in ss.spans]
    return spans


async def test_agent_spans_in_another_process_join_the_orchestrators_trace(
    nats_url: str, otlp_receiver: Any, sdk_spans: InMemorySpanExporter
) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    env |= {
        "OTEL_EXPORTER_OTLP_ENDPOINT": otlp_receiver.url,
        "OTEL_SERVICE_NAME": "agents",
        "OTEL_BSP_SCHEDULE_DELAY": "50",
        "OTEL_EXPORTER_OTLP_TIMEOUT": "30",  # what is sent, not the short default deadline
    }
    paths = [f"cardbus.agents.demo:{a.__name__}" for a in DEMO_AGENTS]
    server = subprocess.Popen(
        [sys.executable, "-m", "cardbus.tools", "agent", "serve", *paths, "--nats", nats_url],
        cwd=_ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert server.stdout is not None
        line = server.stdout.readline()
        assert line.startswith("serving"), line + (server.stderr.read() if server.stderr else "")
        async with NatsRuntime(NatsOptions(url=nats_url)) as rt:
            result = await rt.run(report_plan("tides"), timeout=60, agent_timeout=30)
        assert result.status == "completed"
    finally:
        server.send_signal(signal.SIGTERM)
        try:
            server.wait(20)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait(5)

    local = list(sdk_spans.get_finished_spans())
    (workflow,) = [s for s in local if s.name == "invoke_workflow"]
    sends = {s.context.span_id: s for s in local if s.name.startswith("send ")}
    assert sends and all(s.attributes["messaging.system"] == "nats" for s in sends.values())

    remote = _received(otlp_receiver)
    processes = [s for s in remote if s.name.startswith("process ")]
    agents = [s for s in remote if s.name.startswith("handle ")]
    assert len(processes) == len(agents) == len(sends)
    trace_id = workflow.context.trace_id.to_bytes(16, "big")
    assert {s.trace_id for s in remote} == {trace_id}
    for p in processes:
        send = sends[int.from_bytes(p.parent_span_id, "big")]
        attrs = {a.key: a.value.string_value for a in p.attributes}
        assert attrs["messaging.system"] == "nats"
        assert attrs["messaging.message.id"] == send.attributes["messaging.message.id"]
    process_ids = {p.span_id for p in processes}
    assert all(a.parent_span_id in process_ids for a in agents)
