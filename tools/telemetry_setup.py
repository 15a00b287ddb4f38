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
otherwise (or ``..._METRICS_TIMEOUT`` for the metrics), each export (its retries
included) gets :data:`EXPORT_TIMEOUT_S`;
the collector is probed in the background as the command starts (an empty
export); a failed export or probe is said once on stderr (the exporter's own
retry warnings are kept quiet), and later exports to the same collector,
traces and metrics alike, are dropped at once until
:data:`QUIET_AFTER_FAILURE_S` has passed. So a collector that is down costs
the flush at exit nothing once the probe has failed (a command longer than
the deadline), and at most one deadline however many signals wait.
"""

from __future__ import annotations

import logging
import os
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any
from urllib.parse import urlsplit

__all__ = [
    "EXPORT_TIMEOUT_S",
    "QUIET_AFTER_FAILURE_S",
    "configure_metrics",
    "configure_tracing",
    "export_timeout",
    "otlp_metric_exporter",
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
    "opentelemetry.exporter.otlp.proto.http.metric_exporter",
    "opentelemetry.sdk.metrics._internal.export",  # "Exception while exporting metrics"
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


def otlp_span_exporter(env: Mapping[str, str], probe: bool = True) -> Any:
    """The OTLP/HTTP span exporter the commands use: the env's endpoint and headers, a
    short deadline (:func:`export_timeout`), its failures said once; ``probe``: the
    collector is probed at once in the background (see ``_Collector``)."""
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

    timeout = export_timeout(env)
    return _SaidOnce(OTLPSpanExporter(timeout=timeout), probe=probe, deadline=timeout)


def export_timeout(env: Mapping[str, str], signal: str = "TRACES") -> float:
    """The env's OTLP timeout for ``signal`` (``TRACES`` or ``METRICS``) if it sets one
    (seconds; the signal's own variable first), else :data:`EXPORT_TIMEOUT_S`."""
    for name in (f"OTEL_EXPORTER_OTLP_{signal}_TIMEOUT", "OTEL_EXPORTER_OTLP_TIMEOUT"):
        value = env.get(name, "").strip()
        if value:
            try:
                return float(value)
            except ValueError:
                print(f"cardbus: {name}={value!r} is not a number, ignored", file=sys.stderr)
    return EXPORT_TIMEOUT_S


class _Collector:
    """What the exporters to one collector (scheme, host and port) know of it: whether it
    failed lately, and whether that was said. Shared by the span and metric exporters.

    The first exporter made for a collector probes it at once, in the background: an
    empty export (valid OTLP, nothing recorded), with the exporter's own endpoint,
    headers, certificates, proxy and deadline. A collector that is down is then known
    before the command ends, and its flush at exit is not waited for again.
    """

    def __init__(self, where: str) -> None:
        self.where = where
        self.lock = threading.Lock()
        self.said = False
        self.quiet_until = 0.0
        self.probed: threading.Event | None = None  # set when the probe has answered
        self.probe_until = 0.0  # monotonic time after which an unanswered probe failed

    def failed(self, now: float) -> None:
        with self.lock:
            self.quiet_until = now + QUIET_AFTER_FAILURE_S
            said, self.said = self.said, True
        # (not while the interpreter exits: a daemon probe that prints then can wedge
        # the flush of stderr; a command that ends before its probe has lost nothing)
        if not said and not sys.is_finalizing():
            print(
                f"cardbus: telemetry not exported to {self.where} (unreachable or refused);"
                f" traces and metrics are dropped for {QUIET_AFTER_FAILURE_S:.0f} s",
                file=sys.stderr,
            )

    def probe(self, check: Callable[[], bool], clock: Callable[[], float], deadline: float) -> None:
        """Run ``check`` (True: the collector took an export) in the background, once;
        ``deadline``: the export's, which bounds how long an export waits for it."""
        with self.lock:
            if self.probed is not None:
                return
            done = self.probed = threading.Event()
            self.probe_until = time.monotonic() + 2 * deadline

        def run() -> None:
            try:
                if not check():
                    self.failed(clock())
            except Exception:  # an exporter's bug: the exports themselves will say
                pass
            finally:
                done.set()

        threading.Thread(target=run, name="cardbus-otlp-probe", daemon=True).start()

    def wait_probe(self, clock: Callable[[], float]) -> None:
        """Until the probe has answered: an export never runs beside it, and never tries a
        collector the probe found down. A probe still unanswered at twice the deadline
        (a name lookup that hangs: the exporter's deadline does not bound it) counts as
        a failure."""
        if self.probed is None or self.probed.is_set():
            return
        if not self.probed.wait(max(0.0, self.probe_until - time.monotonic())):
            self.failed(clock())


_collectors: dict[str, _Collector] = {}
_collectors_lock = threading.Lock()


def _collector(endpoint: Any) -> _Collector:
    parts = urlsplit(str(endpoint or ""))
    where = f"{parts.scheme}://{parts.netloc}" if parts.netloc else "the collector"
    with _collectors_lock:
        found = _collectors.get(where)
        if found is None:
            found = _collectors[where] = _Collector(where)
        return found


class _Quiet:
    """Around an OTLP exporter: an export to a collector known down is dropped at once."""

    def __init__(
        self, inner: Any, clock: Callable[[], float], probe: bool, deadline: float
    ) -> None:
        self._inner = inner
        self._clock = clock
        self._collector = _collector(getattr(inner, "_endpoint", ""))
        for name in _EXPORTER_LOGGERS:
            logging.getLogger(name).setLevel(logging.CRITICAL)
        if probe:
            self._collector.probe(self._empty_export, clock, deadline)

    @property
    def inner(self) -> Any:
        return self._inner

    def _empty_export(self) -> bool:
        raise NotImplementedError

    def _down(self) -> bool:
        self._collector.wait_probe(self._clock)
        return self._clock() < self._collector.quiet_until

    def _failed(self) -> None:
        self._collector.failed(self._clock())


class _SaidOnce(_Quiet):
    """A span exporter that says its first failure once and then stays quiet.

    The OTLP exporter logs a warning per retry and an error per failed batch; a
    command run with the collector down would print them on every exit. This says
    one line, and drops batches for :data:`QUIET_AFTER_FAILURE_S` after a failure
    (of the spans, the metrics or the probe) rather than spending the deadline again.
    """

    def __init__(
        self,
        inner: Any,
        clock: Callable[[], float] = time.monotonic,
        probe: bool = True,
        deadline: float = EXPORT_TIMEOUT_S,
    ) -> None:
        super().__init__(inner, clock, probe, deadline)

    def _empty_export(self) -> bool:
        from opentelemetry.sdk.trace.export import SpanExportResult

        return self._inner.export([]) is SpanExportResult.SUCCESS

    def export(self, spans: Sequence[Any]) -> Any:
        from opentelemetry.sdk.trace.export import SpanExportResult

        if self._down():
            return SpanExportResult.FAILURE
        result = self._inner.export(spans)
        if result is not SpanExportResult.SUCCESS:
            self._failed()
        return result

    def shutdown(self) -> None:
        self._inner.shutdown()

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return bool(self._inner.force_flush(timeout_millis))


def otlp_metric_exporter(
    env: Mapping[str, str], clock: Callable[[], float] = time.monotonic, probe: bool = True
) -> Any:
    """The OTLP/HTTP metric exporter the commands use: as :func:`otlp_span_exporter`, and
    quiet while the collector is known down (its spans failed, or its metrics)."""
    from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter
    from opentelemetry.sdk.metrics.export import MetricExporter, MetricExportResult, MetricsData

    class _QuietMetrics(_Quiet, MetricExporter):
        def __init__(self, inner: Any) -> None:
            MetricExporter.__init__(
                self,
                preferred_temporality=inner._preferred_temporality,
                preferred_aggregation=inner._preferred_aggregation,
            )
            _Quiet.__init__(self, inner, clock, probe, timeout)

        def _empty_export(self) -> bool:
            empty = MetricsData(resource_metrics=[])
            return self._inner.export(empty) is MetricExportResult.SUCCESS

        def export(
            self, metrics_data: Any, timeout_millis: float = 10_000, **kwargs: Any
        ) -> MetricExportResult:
            if self._down():
                return MetricExportResult.FAILURE
            result: MetricExportResult = self._inner.export(
                metrics_data, timeout_millis=timeout_millis, **kwargs
            )
            if result is not MetricExportResult.SUCCESS:
                self._failed()
            return result

        def force_flush(self, timeout_millis: float = 10_000) -> bool:
            return bool(self._inner.force_flush(timeout_millis))

        def shutdown(self, timeout_millis: float = 30_000, **kwargs: Any) -> None:
            self._inner.shutdown(timeout_millis=timeout_millis, **kwargs)

    timeout = export_timeout(env, "METRICS")
    return _QuietMetrics(OTLPMetricExporter(timeout=timeout))


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
        import opentelemetry.exporter.otlp.proto.http.metric_exporter  # noqa: F401
    except ImportError:
        return None  # said once by configure_tracing (the same extra)
    from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader
    from opentelemetry.sdk.resources import Resource

    timeout = export_timeout(env, "METRICS")
    reader = PeriodicExportingMetricReader(
        otlp_metric_exporter(env), export_timeout_millis=timeout * 1000.0
    )
    attrs = {} if env.get("OTEL_SERVICE_NAME") else {"service.name": "cardbus"}
    provider = MeterProvider(metric_readers=[reader], resource=Resource.create(attrs))
    metrics.set_meter_provider(provider)
    return provider
