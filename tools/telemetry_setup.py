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
Spans are batched and flushed when the process exits.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from typing import Any

__all__ = ["configure_tracing"]

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
                from opentelemetry.exporter.otlp.proto.http.trace_exporter import (
                    OTLPSpanExporter,
                )
            except ImportError:
                print(_MISSING_OTLP, file=sys.stderr)
                continue
            provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
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
