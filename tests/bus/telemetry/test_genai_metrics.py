"""GenAI client metrics over OTLP: a real run (tests/journal_log.py: OpenAIChatLLM against
the loopback stub) records ``gen_ai.client.token.usage`` and
``gen_ai.client.operation.duration`` through the SDK's OTLP/HTTP metric exporter into the
loopback receiver, decoded with opentelemetry-proto. No tracer provider is set: the metrics
do not depend on tracing.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from journal_log import ANSWERS, write_journal_runs
from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceRequest,
)
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader

from cardbus.bus import meters
from cardbus.tools.telemetry_setup import configure_metrics


def _attrs(kvs: Any) -> dict[str, Any]:
    return {kv.key: kv.value.string_value for kv in kvs}


def test_model_calls_are_recorded_as_genai_client_metrics(
    otlp_receiver: Any, tmp_path: Path
) -> None:
    exporter = OTLPMetricExporter(endpoint=otlp_receiver.url + "/v1/metrics", timeout=5)
    reader = PeriodicExportingMetricReader(exporter, export_interval_millis=3_600_000)
    provider = MeterProvider(metric_readers=[reader])
    meters.use_meter_provider(provider)
    try:
        asyncio.run(write_journal_runs(tmp_path / "log.db"))
        provider.force_flush()
    finally:
        meters.use_meter_provider(None)
        provider.shutdown()
    bodies = [b for _, _, b in otlp_receiver.received.requests_to("/v1/metrics")]
    assert bodies
    points: dict[str, list[tuple[dict[str, Any], Any]]] = {}
    units = {}
    for body in bodies:
        for rm in ExportMetricsServiceRequest.FromString(body).resource_metrics:
            for sm in rm.scope_metrics:
                for m in sm.metrics:
                    units[m.name] = m.unit
                    for p in m.histogram.data_points:
                        points.setdefault(m.name, []).append((_attrs(p.attributes), p))
    assert units["gen_ai.client.token.usage"] == "{token}"
    assert units["gen_ai.client.operation.duration"] == "s"
    required = {
        "gen_ai.operation.name": "chat",
        "gen_ai.provider.name": "127.0.0.1",  # the stub's host: no well-known provider
        "gen_ai.request.model": "stub-model",
        "gen_ai.response.model": "stub-model-2024",
    }
    usage = points["gen_ai.client.token.usage"]
    for attrs, _ in usage:
        assert {k: attrs[k] for k in required} == required
    by_type = {a["gen_ai.token.type"]: p for a, p in usage if "error.type" not in a}
    live = [(i, o) for _, i, o in ANSWERS]  # every answer the stub gave, spent once
    assert by_type["input"].sum == sum(i for i, _ in live)
    assert by_type["output"].sum == sum(o for _, o in live)
    assert by_type["input"].count == len(live)
    durations = points["gen_ai.client.operation.duration"]
    assert sum(p.count for _, p in durations) >= len(live)
    for attrs, _ in durations:
        assert {k: attrs[k] for k in required} == required


def test_the_demo_exports_its_metrics_beside_its_traces(otlp_receiver: Any, tmp_path: Path) -> None:
    """``cardbus demo`` with OTEL_EXPORTER_OTLP_ENDPOINT: a process of its own (the SDK's
    global providers are set once per process), the mock's calls recorded and sent."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    env["OTEL_EXPORTER_OTLP_ENDPOINT"] = otlp_receiver.url
    env["OTEL_EXPORTER_OTLP_TIMEOUT"] = "30"  # what is sent, not the deadline: a busy machine
    cardbus = Path(sys.executable).with_name("cardbus")
    done = subprocess.run(
        [str(cardbus), "demo", "--db", str(tmp_path / "demo.db")],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert otlp_receiver.received.requests_to("/v1/traces")
    names = set()
    for _, _, body in otlp_receiver.received.requests_to("/v1/metrics"):
        for rm in ExportMetricsServiceRequest.FromString(body).resource_metrics:
            for sm in rm.scope_metrics:
                for m in sm.metrics:
                    names.add(m.name)
                    if not m.name.startswith("gen_ai."):
                        continue
                    for p in m.histogram.data_points:
                        attrs = _attrs(p.attributes)
                        assert attrs["gen_ai.provider.name"] == "cardbus.mock"
                        assert attrs["gen_ai.operation.name"] == "chat"
    assert names >= {"gen_ai.client.token.usage", "gen_ai.client.operation.duration"}
    # cardbus's own, beside them (the mock's calls cost nothing, and are priced so)
    assert names >= {
        "cardbus.runs.finished",
        "cardbus.run.duration",
        "cardbus.tasks.finished",
        "cardbus.task.queue_wait",
        "cardbus.model.cost",
    }


def test_no_metrics_provider_without_an_endpoint_or_when_turned_off() -> None:
    assert configure_metrics({}) is None
    off = {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318", "OTEL_METRICS_EXPORTER": "none"}
    assert configure_metrics(off) is None
    disabled = {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318", "OTEL_SDK_DISABLED": "true"}
    assert configure_metrics(disabled) is None
