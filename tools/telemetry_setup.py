"""The OpenTelemetry SDK for the ``cardbus`` commands, configured from the standard env vars.

The library only uses the OpenTelemetry API (``bus.telemetry``); this module,
called by the ``cardbus`` group before any command, installs an SDK
``TracerProvider`` when the environment asks for traces:

* ``OTEL_EXPORTER_OTLP_ENDPOINT`` (``/v1/traces`` is appended) or
  ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`` (used as is): OTLP/HTTP protobuf,
  with ``OTEL_EXPORTER_OTLP_HEADERS``, ``..._TIMEOUT``, ``..._COMPRESSION``
  and friends read by the exporter itself;
* ``OTEL_TRACES_EXPORTER``: ``otlp`` (the default when an endpoint is set),
  ``console`` (spans as JSON on stderr) or ``none``, comma-separated;
* ``OTEL_SERVICE_NAME`` / ``OTEL_RESOURCE_ATTRIBUTES`` (service name
  ``cardbus`` by default), ``OTEL_TRACES_SAMPLER`` (read by the SDK);
* ``OTEL_SDK_DISABLED=true`` turns it all off.

With none of them set nothing is installed, and tracing costs nothing.
Spans are batched in the background and flushed when the process exits.

An unreachable collector must not hold a command up: unless
``OTEL_EXPORTER_OTLP_TRACES_TIMEOUT`` / ``OTEL_EXPORTER_OTLP_TIMEOUT`` says
otherwise, each export (its retries included) gets :data:`EXPORT_TIMEOUT_S`,
so the flush at exit costs at most that; a failed export is said once on
stderr (the exporter's own retry warnings are kept quiet), and later batches
are dropped at once until :data:`QUIET_AFTER_FAILURE_S` has passed.
"""

from __future__ import annotations

import logging
import os
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from typing import Any

__all__ = [
    "EXPORT_TIMEOUT_S",
    "QUIET_AFTER_FAILURE_S",
    "configure_metrics",
    "configure_tracing",
    "export_timeout",
    "otlp_span_exporter",
]

#: seconds an OTLP export may take, retries included, when the env sets no timeout:
#: the whole cost of an unreachable collector to a command (the flush at exit)
EXPORT_TIMEOUT_S = 0.4
#: after a failed export, batches are dropped without trying for this long
QUIET_AFTER_FAILURE_S = 30.0
# the loggers of the OTLP exporter's retries ("Transient error ... retrying")
_EXPORTER_LOGGERS = (
    "opentelemetry.exporter.otlp.common.http",
    "opentelemetry.exporter.otlp.proto.http.trace_exporter",
)

_MISSING_OTLP = (
    "cardbus: traces not exported: OTLP needs the opentelemetry-exporter-otlp-proto-http "
    "package (pip install 'cardbus[otlp]')"
)


def _wanted(env: Mapping[str, str]) -> list[str]:
    if env.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return []
    setting = env.get("OTEL_TRACES_EXPORTER", "").strip().lower()
    endpoint = env.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") or env.get(
        "OTEL_EXPORTER_OTLP_ENDPOINT"
    )
    if not setting:
        return ["otlp"] if endpoint else []
    return [n for n in (x.strip() for x in setting.split(",")) if n and n != "none"]


def configure_tracing(env: Mapping[str, str] | None = None) -> Any:
    """Install an SDK tracer provider if the env asks for one; returns it, or None.

    Does nothing when a real provider is already set (by the user, or an
    earlier call): the global provider can be set once per process.
    """
    env = os.environ if env is None else env
    names = _wanted(env)
    if not names:
        return None
    from opentelemetry import trace

    if not isinstance(trace.get_tracer_provider(), trace.ProxyTracerProvider):
        return None
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import (
        BatchSpanProcessor,
        ConsoleSpanExporter,
        SimpleSpanProcessor,
    )

    attrs = {} if env.get("OTEL_SERVICE_NAME") else {"service.name": "cardbus"}
    provider = TracerProvider(resource=Resource.create(attrs))
    added = 0
    for name in names:
        if name == "otlp":
            protocol = (
                env.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL")
                or env.get("OTEL_EXPORTER_OTLP_PROTOCOL")
                or "http/protobuf"
            )
            if protocol != "http/protobuf":
                print(
                    f"cardbus: OTLP protocol {protocol!r} is not supported, using http/protobuf",
                    file=sys.stderr,
                )
            try:
                import opentelemetry.exporter.otlp.proto.http.trace_exporter  # noqa: F401
            except ImportError:
                print(_MISSING_OTLP, file=sys.stderr)
                continue
            provider.add_span_processor(BatchSpanProcessor(otlp_span_exporter(env)))
            added += 1
        elif name == "console":
            provider.add_span_processor(SimpleSpanProcessor(ConsoleSpanExporter(out=sys.stderr)))
            added += 1
        else:
            print(f"cardbus: unknown OTEL_TRACES_EXPORTER {name!r} ignored", file=sys.stderr)
    if not added:
        return None
    trace.set_tracer_provider(provider)
    return provider


def otlp_span_exporter(env: Mapping[str, str]) -> Any:
    """The OTLP/HTTP span exporter the commands use: the env's endpoint and headers, a
    short deadline (:func:`export_timeout`), its failures said once."""
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

    return _SaidOnce(OTLPSpanExporter(timeout=export_timeout(env)))


def export_timeout(env: Mapping[str, str]) -> float:
    """The env's OTLP timeout if it sets one (seconds), else :data:`EXPORT_TIMEOUT_S`."""
    for name in ("OTEL_EXPORTER_OTLP_TRACES_TIMEOUT", "OTEL_EXPORTER_OTLP_TIMEOUT"):
        value = env.get(name, "").strip()
        if value:
            try:
                return float(value)
            except ValueError:
                print(f"cardbus: {name}={value!r} is not a number, ignored", file=sys.stderr)
    return EXPORT_TIMEOUT_S


class _SaidOnce:
    """A span exporter that says its first failure once and then stays quiet.

    The OTLP exporter logs a warning per retry and an error per failed batch; a
    command run with the collector down would print them on every exit. This says
    one line, and drops batches for :data:`QUIET_AFTER_FAILURE_S` after a failure
    rather than spending the export deadline again on each of them.
    """

    def __init__(self, inner: Any, clock: Any = time.monotonic) -> None:
        self._inner = inner
        self._clock = clock
        self._lock = threading.Lock()
        self._said = False
        self._quiet_until = 0.0
        for name in _EXPORTER_LOGGERS:
            logging.getLogger(name).setLevel(logging.CRITICAL)

    @property
    def inner(self) -> Any:
        return self._inner

    def export(self, spans: Sequence[Any]) -> Any:
        from opentelemetry.sdk.trace.export import SpanExportResult

        if self._clock() < self._quiet_until:
            return SpanExportResult.FAILURE
        result = self._inner.export(spans)
        if result is not SpanExportResult.SUCCESS:
            with self._lock:
                self._quiet_until = self._clock() + QUIET_AFTER_FAILURE_S
                said, self._said = self._said, True
            if not said:
                where = getattr(self._inner, "_endpoint", "the collector")
                print(
                    f"cardbus: traces not exported to {where} (unreachable or refused); "
                    f"spans are dropped for {QUIET_AFTER_FAILURE_S:.0f} s",
                    file=sys.stderr,
                )
        return result

    def shutdown(self) -> None:
        self._inner.shutdown()

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return bool(self._inner.force_flush(timeout_millis))


def configure_metrics(env: Mapping[str, str] | None = None) -> Any:
    """Install an SDK meter provider exporting over OTLP/HTTP beside the traces (the GenAI
    client metrics of ``bus.genai_metrics``) when an OTLP endpoint is set and
    ``OTEL_METRICS_EXPORTER`` is not ``none``; returns it, or None.

    The same short export deadline as the traces (:func:`export_timeout`); the metrics
    are collected once more and sent when the process exits.
    """
    env = os.environ if env is None else env
    if env.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return None
    if env.get("OTEL_METRICS_EXPORTER", "otlp").strip().lower() != "otlp":
        return None
    if not (
        env.get("OTEL_EXPORTER_OTLP_METRICS_ENDPOINT") or env.get("OTEL_EXPORTER_OTLP_ENDPOINT")
    ):
        return None
    from opentelemetry import metrics
    from opentelemetry.sdk.metrics import MeterProvider

    if isinstance(metrics.get_meter_provider(), MeterProvider):  # set once per process
        return None
    try:
        from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter
    except ImportError:
        return None  # said once by configure_tracing (the same extra)
    from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader
    from opentelemetry.sdk.resources import Resource

    for name in ("opentelemetry.exporter.otlp.proto.http.metric_exporter",):
        logging.getLogger(name).setLevel(logging.CRITICAL)
    timeout = export_timeout(env)
    reader = PeriodicExportingMetricReader(
        OTLPMetricExporter(timeout=timeout), export_timeout_millis=timeout * 1000.0
    )
    attrs = {} if env.get("OTEL_SERVICE_NAME") else {"service.name": "cardbus"}
    provider = MeterProvider(metric_readers=[reader], resource=Resource.create(attrs))
    metrics.set_meter_provider(provider)
    return provider
