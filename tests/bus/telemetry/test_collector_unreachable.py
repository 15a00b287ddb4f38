"""An unreachable collector costs a command little: the commands' OTLP exporters have a
short deadline, probe the collector in the background as they are made, say a failure once,
and drop later exports (traces and metrics alike) without trying again.

Real parts: the SDK's OTLP/HTTP exporters against a closed loopback port and against the
loopback receiver (conftest's ``otlp_receiver``); no wall-clock assertion (the timing is
bench/otel_unreachable_bench.py).
"""

from __future__ import annotations

import socket
import threading
from typing import Any

import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.sdk.metrics.export import MetricExportResult, MetricsData
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SpanExportResult

from cardbus.tools.telemetry_setup import (
    EXPORT_TIMEOUT_S,
    QUIET_AFTER_FAILURE_S,
    _SaidOnce,
    export_timeout,
    otlp_metric_exporter,
    otlp_span_exporter,
)


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])  # closed when the block ends: nothing listens


def _spans(n: int) -> list[Any]:
    tracer = TracerProvider().get_tracer("t")
    out = []
    for i in range(n):
        span = tracer.start_span(f"s{i}")
        span.end()
        out.append(span)
    return out


def test_the_export_deadline_is_short_unless_the_env_sets_one() -> None:
    assert EXPORT_TIMEOUT_S <= 0.5
    assert export_timeout({}) == EXPORT_TIMEOUT_S
    assert export_timeout({"OTEL_EXPORTER_OTLP_TIMEOUT": "2"}) == 2.0
    env = {"OTEL_EXPORTER_OTLP_TIMEOUT": "2", "OTEL_EXPORTER_OTLP_TRACES_TIMEOUT": "3"}
    assert export_timeout(env) == 3.0
    assert export_timeout(env, "METRICS") == 2.0
    assert export_timeout({**env, "OTEL_EXPORTER_OTLP_METRICS_TIMEOUT": "4"}, "METRICS") == 4.0
    exporter = otlp_span_exporter({}, probe=False)
    # the deadline the SDK's client holds, retries included, is the one set here
    assert exporter.inner._client._timeout == EXPORT_TIMEOUT_S
    metric_exporter = otlp_metric_exporter({}, probe=False)
    assert metric_exporter.inner._client._timeout == EXPORT_TIMEOUT_S


def _counted(monkeypatch: pytest.MonkeyPatch, exporter: Any) -> list[Any]:
    """The exports that really reach the SDK's exporter (tried, not dropped)."""
    tries: list[Any] = []
    inner_export = exporter.inner.export

    def counted(batch: Any, *args: Any, **kwargs: Any) -> Any:
        tries.append(batch)
        return inner_export(batch, *args, **kwargs)

    monkeypatch.setattr(exporter.inner, "export", counted)
    return tries


def test_a_closed_collector_is_said_once_and_later_batches_are_dropped(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    origin = f"http://127.0.0.1:{_closed_port()}"
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", origin + "/v1/traces")
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_METRICS_ENDPOINT", origin + "/v1/metrics")
    now = [100.0]
    exporter = otlp_span_exporter({}, probe=False)
    exporter._clock = lambda: now[0]
    metric_exporter = otlp_metric_exporter({}, clock=lambda: now[0], probe=False)
    tries = _counted(monkeypatch, exporter)
    metric_tries = _counted(monkeypatch, metric_exporter)
    assert exporter.export(_spans(2)) is SpanExportResult.FAILURE
    assert exporter.export(_spans(1)) is SpanExportResult.FAILURE
    assert [len(b) for b in tries] == [2]  # the second batch was not tried: known down
    # the metrics to the same collector are not tried either: one deadline for both
    empty = MetricsData(resource_metrics=[])
    assert metric_exporter.export(empty) is MetricExportResult.FAILURE
    assert metric_tries == []
    now[0] += QUIET_AFTER_FAILURE_S + 1  # tried again: by the metrics, this time
    assert metric_exporter.export(empty) is MetricExportResult.FAILURE
    assert len(metric_tries) == 1
    assert exporter.export(_spans(1)) is SpanExportResult.FAILURE
    assert [len(b) for b in tries] == [2]
    err = capsys.readouterr().err
    assert err.count("cardbus: telemetry not exported") == 1, err
    assert origin in err
    assert "Transient error" not in err and "retrying" not in err
    assert "Exception while exporting" not in err
    exporter.shutdown()
    metric_exporter.shutdown()


def test_the_probe_finds_a_closed_collector_before_any_export(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """As a command starts, its exporter probes the collector in the background: a batch
    at exit then waits for that probe (bounded by the deadline), never for its own try."""
    origin = f"http://127.0.0.1:{_closed_port()}"
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", origin + "/v1/traces")
    exporter = otlp_span_exporter({})
    tries = _counted(monkeypatch, exporter)
    assert exporter.export(_spans(3)) is SpanExportResult.FAILURE
    assert tries == []  # the probe had found it down: the batch was not tried
    err = capsys.readouterr().err
    assert err.count("cardbus: telemetry not exported") == 1 and origin in err, err
    exporter.shutdown()


def test_a_reachable_collector_gets_the_spans(
    otlp_receiver: Any, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", otlp_receiver.url + "/v1/traces")
    exporter = otlp_span_exporter({})
    assert exporter.export(_spans(3)) is SpanExportResult.SUCCESS
    probe, batch = otlp_receiver.received.requests_to("/v1/traces")
    # the probe: an empty export (valid OTLP: no span recorded), then the batch itself
    assert not ExportTraceServiceRequest.FromString(probe[2]).resource_spans
    spans = ExportTraceServiceRequest.FromString(batch[2]).resource_spans[0].scope_spans[0].spans
    assert len(spans) == 3
    assert "cardbus:" not in capsys.readouterr().err
    exporter.shutdown()


class _Hanging:
    """An exporter whose probe never answers, as one stuck in a name lookup (which the
    SDK's deadline does not bound); every later export is counted."""

    _endpoint = "http://collector.example:4318/v1/traces"

    def __init__(self) -> None:
        self.release = threading.Event()
        self.batches: list[Any] = []

    def export(self, spans: Any) -> Any:
        if not spans:  # the probe
            self.release.wait(60)
            return SpanExportResult.FAILURE
        self.batches.append(spans)
        return SpanExportResult.SUCCESS

    def shutdown(self) -> None:
        self.release.set()


def test_a_probe_that_never_answers_counts_as_down_after_twice_the_deadline(
    capsys: pytest.CaptureFixture[str],
) -> None:
    inner = _Hanging()
    exporter = _SaidOnce(inner, deadline=0.05)  # waited for at most 0.1 s
    try:
        assert exporter.export(_spans(1)) is SpanExportResult.FAILURE
        assert inner.batches == []  # not tried: the collector did not answer the probe
        err = capsys.readouterr().err
        assert err.count("cardbus: telemetry not exported to http://collector.example:4318") == 1
    finally:
        exporter.shutdown()
