"""An unreachable collector costs a command little: the commands' OTLP exporter has a short
deadline, says its failure once, and drops later batches without trying again.

Real parts: the SDK's OTLP/HTTP exporter against a closed loopback port and against the
loopback receiver (conftest's ``otlp_receiver``); no wall-clock assertion (the timing is
bench/otel_unreachable_bench.py).
"""

from __future__ import annotations

import socket
from typing import Any

import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SpanExportResult

from cardbus.tools.telemetry_setup import (
    EXPORT_TIMEOUT_S,
    QUIET_AFTER_FAILURE_S,
    export_timeout,
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
    exporter = otlp_span_exporter({})
    # the deadline the SDK's client holds, retries included, is the one set here
    assert exporter.inner._client._timeout == EXPORT_TIMEOUT_S


def test_a_closed_collector_is_said_once_and_later_batches_are_dropped(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    url = f"http://127.0.0.1:{_closed_port()}/v1/traces"
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", url)
    now = [100.0]
    exporter = otlp_span_exporter({})
    exporter._clock = lambda: now[0]
    tries = []
    inner_export = exporter.inner.export

    def counted(spans: Any) -> Any:
        tries.append(len(spans))
        return inner_export(spans)

    monkeypatch.setattr(exporter.inner, "export", counted)
    assert exporter.export(_spans(2)) is SpanExportResult.FAILURE
    assert exporter.export(_spans(1)) is SpanExportResult.FAILURE
    assert tries == [2]  # the second batch was not tried: the collector is known down
    now[0] += QUIET_AFTER_FAILURE_S + 1
    assert exporter.export(_spans(1)) is SpanExportResult.FAILURE
    assert tries == [2, 1]
    err = capsys.readouterr().err
    assert err.count("cardbus: traces not exported") == 1, err
    assert url in err
    assert "Transient error" not in err and "retrying" not in err
    exporter.shutdown()


def test_a_reachable_collector_gets_the_spans(
    otlp_receiver: Any, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", otlp_receiver.url + "/v1/traces")
    exporter = otlp_span_exporter({})
    assert exporter.export(_spans(3)) is SpanExportResult.SUCCESS
    assert len(otlp_receiver.received.requests_to("/v1/traces")) == 1
    assert "cardbus:" not in capsys.readouterr().err
    exporter.shutdown()
