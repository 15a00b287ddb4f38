"""GenAI client metrics: ``gen_ai.client.token.usage`` and ``gen_ai.client.operation.duration``
(the OpenTelemetry GenAI semantic conventions), one record per model call answered live.

Attributes, as the conventions require them: ``gen_ai.operation.name`` (``chat``) and
``gen_ai.provider.name`` (required), ``gen_ai.token.type`` (required on the token usage),
``gen_ai.request.model`` (conditionally required: when known), ``error.type``
(conditionally required on the duration of a call that failed), and the recommended
``gen_ai.response.model``. ``server.address`` is recommended, not required, and the journal
does not record it: it is left out (and so is ``server.port``, required only beside it).

:class:`cardbus.bus.run_metrics.RunMetrics` calls :func:`record_model_call` for each
``model.answered`` the orchestrator folds that is not a replay (a call answered from the
journal spent nothing and took no time). Only the OpenTelemetry API is used: without an SDK
meter provider nothing is recorded (``bus.meters``).
"""

from __future__ import annotations

from typing import Any

from opentelemetry import metrics

from cardbus.bus import meters

__all__ = ["DURATION_BUCKETS", "TOKEN_BUCKETS", "record_model_call"]

#: the bucket boundaries the conventions advise (gen_ai_metrics in semconv)
TOKEN_BUCKETS = [4**i for i in range(14)]
DURATION_BUCKETS = [0.01 * 2**i for i in range(14)]


def _make(meter: metrics.Meter) -> tuple[Any, Any]:
    tokens = meter.create_histogram(
        "gen_ai.client.token.usage",
        unit="{token}",
        description="Number of input and output tokens used.",
        explicit_bucket_boundaries_advisory=TOKEN_BUCKETS,
    )
    duration = meter.create_histogram(
        "gen_ai.client.operation.duration",
        unit="s",
        description="GenAI operation duration.",
        explicit_bucket_boundaries_advisory=DURATION_BUCKETS,
    )
    return tokens, duration


def record_model_call(
    *,
    provider: str,
    request_model: str,
    response_model: str,
    duration_s: float,
    input_tokens: int,
    output_tokens: int,
    error_type: str | None = None,
) -> None:
    """Record one live model call: its duration, and its tokens unless it failed."""
    tokens, duration = meters.instruments(_make)
    attrs: dict[str, str] = {"gen_ai.operation.name": "chat"}
    if provider:
        attrs["gen_ai.provider.name"] = provider
    if request_model:
        attrs["gen_ai.request.model"] = request_model
    if response_model:
        attrs["gen_ai.response.model"] = response_model
    if error_type is not None:
        attrs["error.type"] = error_type or "error"
    duration.record(max(0.0, duration_s), attrs)
    if error_type is None:
        tokens.record(max(0, input_tokens), {**attrs, "gen_ai.token.type": "input"})
        tokens.record(max(0, output_tokens), {**attrs, "gen_ai.token.type": "output"})
