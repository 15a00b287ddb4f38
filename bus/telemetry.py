"""Live tracing with the OpenTelemetry API (never the SDK: tools and users configure that).

Spans, all on the tracer ``cardbus``::

    invoke_workflow                       INTERNAL  one per root run (submit .. run.* finish)
      send cardbus.agent.<agent>          PRODUCER  the orchestrator hands a card to the bus
        process cardbus.agent.<agent>     CONSUMER  an agent worker takes the card (any process)
          invoke_agent <agent name>       INTERNAL  the agent's attempt, with gen_ai usage

The W3C ``traceparent`` links them across processes: the orchestrator stores
the run span's in every event envelope it appends (``NewEvent.traceparent``)
and puts the send span's in ``TaskCard.traceparent`` (and so in the bus
headers on NATS); a worker continues the trace from the card.

Helpers for bus backends: :func:`inject_headers` / :func:`extract_traceparent`
(header names matched case-insensitively) and :func:`parse_traceparent` /
:func:`format_traceparent`.

Cost without an SDK: every entry point first asks :func:`enabled` (one
``isinstance`` on the global provider) and, when no SDK provider is set, does
nothing else: no span objects, no attribute dicts, no card copies. Attributes
are only built for spans that are recording.
"""

from __future__ import annotations

import os
import re
from collections.abc import Awaitable, Callable, Iterator, Mapping, MutableMapping
from contextlib import contextmanager
from typing import TYPE_CHECKING

import msgspec
from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.trace import (
    NonRecordingSpan,
    Span,
    SpanContext,
    SpanKind,
    Status,
    StatusCode,
    TraceFlags,
)

if TYPE_CHECKING:
    from cardbus.agents.agent import Agent
    from cardbus.agents.cards import ResultCard, TaskCard
    from cardbus.agents.llm import LLM
    from cardbus.bus.transport.interface import Bus
    from cardbus.eventstore.envelope import Envelope

__all__ = [
    "TRACEPARENT",
    "TRACER_NAME",
    "RunTracing",
    "context_from_traceparent",
    "current_traceparent",
    "enabled",
    "extract_traceparent",
    "format_traceparent",
    "inject_headers",
    "invoke_agent",
    "messaging_system",
    "parse_traceparent",
    "send_task",
    "traced_handler",
    "tracer",
    "use_tracer_provider",
    "use_traceparent",
]

TRACER_NAME = "cardbus"
TRACEPARENT = "traceparent"
_NOOP_PROVIDERS = (trace.ProxyTracerProvider, trace.NoOpTracerProvider)
_TP = re.compile(r"^([0-9a-f]{2})-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})(-.*)?$")


_enabled = False
_MISSING = object()
# With this env var the API loads a provider lazily: always ask it then.
_LAZY_PROVIDER = "OTEL_PYTHON_TRACER_PROVIDER" in os.environ


def enabled() -> bool:
    """True once an SDK (any real ``TracerProvider``) is set globally, or one is in use
    through :func:`use_tracer_provider`.

    The global provider can be set only once, so a yes is remembered; until
    then the check is one attribute read (the API's ``get_tracer_provider``
    looks at ``os.environ`` on every call, ~1 us).
    """
    global _enabled
    if _enabled or _provider is not None:
        return True
    if not _LAZY_PROVIDER and getattr(trace, "_TRACER_PROVIDER", _MISSING) is None:
        return False
    _enabled = not isinstance(trace.get_tracer_provider(), _NOOP_PROVIDERS)
    return _enabled


_provider: trace.TracerProvider | None = None


def use_tracer_provider(provider: trace.TracerProvider | None) -> None:
    """Trace cardbus into ``provider`` instead of the global one (None: the global again).

    For tests and for programs that keep cardbus's spans apart; the global
    provider (``opentelemetry.trace.set_tracer_provider``) is the usual way.
    The agents' model-call spans (``chat <model>``) follow it too.
    """
    from cardbus.agents.llm import use_tracer_provider as use_for_llm_calls

    global _provider
    _provider = provider
    use_for_llm_calls(provider)


_tracers: dict[int, tuple[trace.TracerProvider, trace.Tracer]] = {}


def tracer() -> trace.Tracer:
    """cardbus's tracer from the provider in use (made once per provider)."""
    provider = _provider if _provider is not None else trace.get_tracer_provider()
    cached = _tracers.get(id(provider))
    if cached is None or cached[0] is not provider:
        cached = (provider, provider.get_tracer(TRACER_NAME))
        _tracers[id(provider)] = cached
    return cached[1]


# -- traceparent ---------------------------------------------------------------


def format_traceparent(ctx: SpanContext) -> str | None:
    """The W3C ``traceparent`` of a span context, None if it is not valid."""
    if not ctx.is_valid:
        return None
    return f"00-{ctx.trace_id:032x}-{ctx.span_id:016x}-{int(ctx.trace_flags) & 0xFF:02x}"


def parse_traceparent(value: str | None) -> SpanContext | None:
    """A remote span context from a ``traceparent`` value; None if absent or malformed."""
    if not value:
        return None
    m = _TP.match(value.strip().lower())
    if m is None or m.group(1) == "ff" or (m.group(1) == "00" and m.group(5)):
        return None
    trace_id, span_id = int(m.group(2), 16), int(m.group(3), 16)
    if not trace_id or not span_id:
        return None
    return SpanContext(
        trace_id, span_id, is_remote=True, trace_flags=TraceFlags(int(m.group(4), 16))
    )


def context_from_traceparent(value: str | None) -> otel_context.Context | None:
    """A context whose current span is the remote parent named by ``value`` (or None)."""
    parent = parse_traceparent(value)
    return trace.set_span_in_context(NonRecordingSpan(parent)) if parent else None


def current_traceparent() -> str | None:
    """The ``traceparent`` of the current span, if there is a valid one."""
    return format_traceparent(trace.get_current_span().get_span_context())


def inject_headers(
    headers: MutableMapping[str, str], traceparent: str | None = None
) -> MutableMapping[str, str]:
    """Put ``traceparent`` (given, or the current span's) into a headers dict; returns it."""
    value = traceparent or (current_traceparent() if enabled() else None)
    if value:
        for key in [k for k in headers if k.lower() == TRACEPARENT and k != TRACEPARENT]:
            del headers[key]
        headers[TRACEPARENT] = value
    return headers


def extract_traceparent(headers: Mapping[str, str] | None) -> str | None:
    """The ``traceparent`` header, its name matched case-insensitively; None if absent/invalid."""
    if not headers:
        return None
    value = headers.get(TRACEPARENT)
    if value is None:
        value = next((v for k, v in headers.items() if k.lower() == TRACEPARENT), None)
    return value if parse_traceparent(value) else None


def messaging_system(bus: object) -> str:
    """``nats`` for a NATS bus, ``inprocess`` otherwise (a bus may set ``messaging_system``)."""
    name = getattr(bus, "messaging_system", None)
    if isinstance(name, str):
        return name
    return "nats" if type(bus).__module__.rsplit(".", 1)[-1] == "nats" else "inprocess"


def _message_id(card: TaskCard) -> str:
    return f"{card.task_id}#{card.attempt}"


# -- the orchestrator's side ---------------------------------------------------


class RunTracing:
    """The orchestrator's spans: one ``invoke_workflow`` per run it submitted, open until
    the run's ``run.completed|failed|halted`` is applied; cheap no-ops without an SDK."""

    def __init__(self) -> None:
        self._runs: dict[str, Span] = {}

    def start_run(self, root_id: str, plan_id: str | None = None, goal: str = "") -> None:
        if not enabled() or root_id in self._runs:
            return
        span = tracer().start_span("invoke_workflow", kind=SpanKind.INTERNAL)
        if span.is_recording():
            span.set_attributes(
                {"gen_ai.operation.name": "invoke_workflow", "cardbus.root_id": root_id}
            )
            if plan_id:
                span.set_attribute("cardbus.plan_id", plan_id)
            if goal:
                span.set_attribute("cardbus.run.goal", goal)
        self._runs[root_id] = span

    def resume_run(self, root_id: str, traceparent: str | None) -> None:
        """Rejoin the trace of a run started before a restart: its workflow span (named by
        its ``run.started`` envelope) becomes the parent of what follows, though this
        process cannot end it (the export from the log draws the whole run)."""
        if not enabled() or root_id in self._runs:
            return
        ctx = parse_traceparent(traceparent)
        if ctx is not None:
            self._runs[root_id] = NonRecordingSpan(ctx)

    def traceparent(self, root_id: str) -> str | None:
        """What to store in the envelope of an event of ``root_id``'s run."""
        if not self._runs:
            return current_traceparent() if enabled() else None
        span = self._runs.get(root_id)
        if span is None:
            return current_traceparent()
        return format_traceparent(span.get_span_context())

    def context(self, root_id: str) -> otel_context.Context | None:
        span = self._runs.get(root_id)
        return trace.set_span_in_context(span) if span is not None else None

    def on_event(self, env: Envelope) -> None:
        """Follow the log: end a run's span when the run finishes."""
        if not self._runs or env.stream not in self._runs:
            return
        tag = env.type
        if not tag.startswith("run.") or tag.startswith("run.started"):
            return
        span = self._runs.pop(env.stream)
        if span.is_recording():
            span.set_attribute("cardbus.run.status", tag.split(".")[1])
            reason = getattr(env.data, "reason", None)
            if tag.startswith(("run.failed", "run.halted")):
                span.set_attribute("error.type", str(reason or tag.split(".")[1]))
                span.set_status(Status(StatusCode.ERROR, str(reason or "")))
        span.end(end_time=round(env.recorded_at * 1e9))

    def send_task(self, bus: Bus, agent_id: str, card: TaskCard) -> Awaitable[None]:
        """``bus.send_task`` inside a PRODUCER span whose context travels in the card."""
        if not enabled():
            return bus.send_task(agent_id, card)
        return send_task(bus, agent_id, card, self.context(card.root_id))

    def close(self) -> None:
        """End the spans of runs still open (the orchestrator stops before they finish)."""
        for span in self._runs.values():
            if span.is_recording():
                span.set_attribute("cardbus.run.status", "open")
            span.end()
        self._runs.clear()


async def send_task(
    bus: Bus, agent_id: str, card: TaskCard, parent: otel_context.Context | None = None
) -> None:
    """Send ``card`` in a ``send cardbus.agent.<agent>`` PRODUCER span; the card carries it."""
    if not enabled():
        await bus.send_task(agent_id, card)
        return
    destination = f"cardbus.agent.{agent_id}"
    with tracer().start_as_current_span(
        f"send {destination}", context=parent, kind=SpanKind.PRODUCER
    ) as span:
        if span.is_recording():
            span.set_attributes(
                {
                    "messaging.system": messaging_system(bus),
                    "messaging.destination.name": destination,
                    "messaging.operation.type": "send",
                    "messaging.operation.name": "send",
                    "messaging.message.id": _message_id(card),
                    "cardbus.task.id": card.task_id,
                    "cardbus.task.attempt": card.attempt,
                    "gen_ai.agent.id": agent_id,
                }
            )
        tp = format_traceparent(span.get_span_context())
        if tp:
            card = msgspec.structs.replace(card, traceparent=tp)
        await bus.send_task(agent_id, card)


# -- the agent worker's side ---------------------------------------------------

CardHandler = Callable[["TaskCard"], Awaitable[None]]


def traced_handler(handler: CardHandler, bus: Bus, agent_id: str) -> CardHandler:
    """Wrap a consumer's handler in a ``process cardbus.agent.<agent>`` CONSUMER span,
    continuing the trace named by the card's ``traceparent``."""
    destination = f"cardbus.agent.{agent_id}"

    async def handle(card: TaskCard) -> None:
        if not enabled():
            await handler(card)
            return
        parent = context_from_traceparent(card.traceparent)
        with tracer().start_as_current_span(
            f"process {destination}", context=parent, kind=SpanKind.CONSUMER
        ) as span:
            if span.is_recording():
                span.set_attributes(
                    {
                        "messaging.system": messaging_system(bus),
                        "messaging.destination.name": destination,
                        "messaging.operation.type": "process",
                        "messaging.operation.name": "process",
                        "messaging.message.id": _message_id(card),
                        "messaging.consumer.group.name": f"agent-{agent_id}",
                        "cardbus.task.id": card.task_id,
                        "cardbus.task.attempt": card.attempt,
                    }
                )
            await handler(card)

    return handle


async def invoke_agent(agent: type[Agent], card: TaskCard, llm: LLM | None) -> ResultCard:
    """``agent.run(card, llm)`` in an ``invoke_agent <name>`` span with the gen_ai attributes."""
    if not enabled():
        return await agent.run(card, llm)
    name = agent.name or agent.agent_id
    parent = None
    if not trace.get_current_span().get_span_context().is_valid:
        parent = context_from_traceparent(card.traceparent)
    with tracer().start_as_current_span(
        f"invoke_agent {name}", context=parent, kind=SpanKind.INTERNAL
    ) as span:
        recording = span.is_recording()
        if recording:
            span.set_attributes(
                {
                    "gen_ai.operation.name": "invoke_agent",
                    "gen_ai.agent.id": agent.agent_id,
                    "gen_ai.agent.name": name,
                    "cardbus.task.id": card.task_id,
                    "cardbus.task.attempt": card.attempt,
                    "cardbus.task.capability": card.capability,
                    "cardbus.root_id": card.root_id,
                }
            )
            if agent.description:
                span.set_attribute("gen_ai.agent.description", agent.description)
        result = await agent.run(card, llm)
        if recording:
            _record_result(span, result)
        return result


def _record_result(span: Span, result: ResultCard) -> None:
    span.set_attributes(
        {
            "gen_ai.usage.input_tokens": result.usage.input_tokens,
            "gen_ai.usage.output_tokens": result.usage.output_tokens,
            "cardbus.result.status": result.status,
        }
    )
    if result.status == "failed":
        error = result.error or ""
        head = error.split(":", 1)[0].strip()
        span.set_attribute("error.type", head if head and " " not in head else "agent_error")
        span.set_status(Status(StatusCode.ERROR, error))
    elif result.status == "rejected":
        span.set_attribute("error.type", result.reason or "rejected")
        span.set_status(Status(StatusCode.ERROR, result.notes or result.reason or "rejected"))


@contextmanager
def use_traceparent(value: str | None) -> Iterator[None]:
    """Make the span named by ``value`` the current parent inside the block (no-op if None)."""
    ctx = context_from_traceparent(value) if value and enabled() else None
    if ctx is None:
        yield
        return
    token = otel_context.attach(ctx)
    try:
        yield
    finally:
        otel_context.detach(token)
