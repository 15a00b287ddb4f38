"""GenAI client metrics from the journal: ``gen_ai.client.token.usage`` and
``gen_ai.client.operation.duration`` (the OpenTelemetry GenAI conventions), one record
per model call the journal answered live (a replayed call spent nothing and took no time).

Only the OpenTelemetry API is used; without an SDK meter provider the instruments are
no-ops. ``tools/telemetry_setup.py`` installs one that exports over OTLP beside the traces.
"""

from __future__ import annotations

from typing import Any

from opentelemetry import metrics

__all__ = ["record_model_call", "use_meter_provider"]

_provider: metrics.MeterProvider | None = None
_instruments: tuple[Any, Any] | None = None


def use_meter_provider(provider: metrics.MeterProvider | None) -> None:
    """Record into ``provider`` instead of the global one (None: the global again)."""
    global _provider, _instruments
    _provider, _instruments = provider, None


def _made() -> tuple[Any, Any]:
    global _instruments
    if _instruments is None:
        provider = _provider if _provider is not None else metrics.get_meter_provider()
        meter = provider.get_meter("cardbus")
        # the conventions' names, units and bucket advice (gen_ai_metrics.py in semconv)
        tokens = meter.create_histogram(
            "gen_ai.client.token.usage",
            unit="{token}",
            description="Number of input and output tokens used.",
            explicit_bucket_boundaries_advisory=[4**i for i in range(14)],
        )
        duration = meter.create_histogram(
            "gen_ai.client.operation.duration",
            unit="s",
            description="GenAI operation duration.",
            explicit_bucket_boundaries_advisory=[0.01 * 2**i for i in range(14)],
        )
        _instruments = (tokens, duration)
    return _instruments


def record_model_call(call: Any) -> None:
    """Record one journaled model call (a ``projections.replay.ModelCall`` that ended)."""
    if call.end is None or call.replayed_from is not None:
        return
    tokens, duration = _made()
    attrs: dict[str, str] = {"gen_ai.operation.name": "chat"}
    if call.provider:
        attrs["gen_ai.provider.name"] = call.provider
    if call.model:
        attrs["gen_ai.request.model"] = call.model
    if call.response_model:
        attrs["gen_ai.response.model"] = call.response_model
    if call.error is not None:
        attrs["error.type"] = call.error_type or "error"
    took = call.latency_s if call.latency_s > 0 else max(0.0, call.end - call.start)
    duration.record(took, attrs)
    if call.error is None:
        tokens.record(call.input_tokens, {**attrs, "gen_ai.token.type": "input"})
        tokens.record(call.output_tokens, {**attrs, "gen_ai.token.type": "output"})
