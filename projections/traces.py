"""Traces rebuilt from the log alone: OpenTelemetry spans for any past run.

:func:`trace_spans` turns the events of one or more runs into
:class:`SpanRecord` values; :func:`to_readable_spans` makes them SDK
``ReadableSpan`` objects that any span exporter (OTLP, console) can send. It
reuses the replay fold (:func:`projections.replay.build_timeline`): the tree
of tasks and their attempt spans is the timeline's, the details (tokens,
reasons, approvals) are read from the events the steps point to.

Shape of a trace (one per root run)::

    invoke_workflow                          run.started .. run.completed|failed|halted
      task {capability}                      task.created .. the task's last event
        invoke_agent {agent name}  (CLIENT)  task.dispatched .. the attempt's outcome
        task {capability}                    a review / supplementary subtask
          invoke_agent {agent name}

Lifecycle facts become span events: on the attempt span ``task.started``,
``task.result_submitted``, ``task.rejected``, ``task.timed_out``; on the task
span ``task.retry_scheduled``, ``task.revision_requested``,
``task.approval_requested|granted|denied``, ``task.needs_input``,
``task.input_provided``, ``task.result_ignored``, ``task.failed``,
``task.cancelled``, ``task.halted``; on the workflow span the ``run.*`` and
``plan.*`` events. Every span event carries ``cardbus.event.id``.

Ids are deterministic, so exporting the same run twice (or a task, then its
whole run) gives the same ids and a tracing backend sees one trace, not two:

* trace id = the first 16 bytes of ``sha256(root id)``;
* span id = the first 8 bytes of ``sha256(event id)`` of an attempt's opening
  event (``task.dispatched``); a task's is ``sha256("task:" + task id)`` and the
  workflow's ``sha256("run:" + root id)``: known without reading the log (the
  workflow's before ``run.started`` is written, whose envelope names it; a task's
  by an orchestrator that resumes a run from a snapshot).

Live tracing (``bus.telemetry.RunTracing``) opens its spans with the same ids
and the same span events (:func:`span_event`), so a run traced live and then
exported is one trace, each exported span the twin of a live one.

Times are the recorded times (``recorded_at``) of the events, so a run from
last week is sent with last week's times.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import msgspec

from cardbus.eventstore import events as ev
from cardbus.eventstore.batch import tokens_in_range
from cardbus.eventstore.envelope import Envelope
from cardbus.projections.replay import AttemptSpan, Step, TaskNode, _step, build_timeline

__all__ = [
    "SCOPE_NAME",
    "SpanEventRecord",
    "SpanRecord",
    "agent_names_from",
    "event_home",
    "span_event",
    "span_id_for",
    "task_span_id",
    "workflow_span_id",
    "trace_id_for",
    "trace_spans",
    "to_readable_spans",
]

SCOPE_NAME = "cardbus.export"

#: events that belong to one attempt (its span), the rest of a task's go on the task span
_ATTEMPT_KINDS = frozenset({"started", "result_submitted", "rejected", "timed_out"})
_TASK_EVENT_KINDS = frozenset(
    {
        "retry_scheduled",
        "revision_requested",
        "approval_requested",
        "approval_granted",
        "approval_denied",
        "needs_input",
        "input_provided",
        "result_ignored",
        "failed",
        "cancelled",
        "halted",
    }
)
_ERROR_STATUSES = frozenset({"failed", "halted", "cancelled"})
_ERROR_OUTCOMES = frozenset({"rejected", "timed_out", "failed", "halted", "cancelled", "retry"})


class SpanEventRecord(msgspec.Struct, frozen=True, kw_only=True):
    name: str
    time: float  # unix seconds
    attributes: dict[str, Any] = {}


class SpanRecord(msgspec.Struct, kw_only=True):
    """One span, exporter-neutral (ids as ints, times in unix seconds)."""

    trace_id: int
    span_id: int
    parent_span_id: int | None = None
    name: str
    kind: str = "internal"  # internal | client
    start: float
    end: float
    attributes: dict[str, Any] = {}
    events: list[SpanEventRecord] = []
    error: str | None = None  # error.type when the span failed
    status_message: str = ""
    opening_event_id: str = ""
    link_traceparent: str | None = None  # the live trace this run was recorded under, if any


def _digest(text: str) -> bytes:
    return hashlib.sha256(text.encode("utf-8")).digest()


def trace_id_for(root_id: str) -> int:
    """The trace id of a run: the first 16 bytes of ``sha256(root_id)`` (never 0)."""
    return int.from_bytes(_digest(root_id)[:16], "big") or 1


def span_id_for(event_id: str) -> int:
    """The span id of the span opened by an event: the first 8 bytes of its sha256 (never 0)."""
    return int.from_bytes(_digest(event_id)[:8], "big") or 1


def workflow_span_id(root_id: str) -> int:
    """The span id of a run's ``invoke_workflow`` span: ``sha256("run:" + root_id)``."""
    return span_id_for(f"run:{root_id}")


def task_span_id(task_id: str) -> int:
    """The span id of a task's span: ``sha256("task:" + task_id)``."""
    return span_id_for(f"task:{task_id}")


def event_home(kind: str) -> str | None:
    """Which span a step of this kind (``Step.kind``) is an event of: attempt, task or None."""
    if kind in _ATTEMPT_KINDS:
        return "attempt"
    if kind in _TASK_EVENT_KINDS:
        return "task"
    return None


def span_event(env: Envelope) -> SpanEventRecord:
    """The span event an event becomes (the same live and exported)."""
    return _span_event(_step(env), env.data)


def _span_event(step: Step, data: Any, extra: dict[str, Any] | None = None) -> SpanEventRecord:
    attrs: dict[str, Any] = {"cardbus.event.id": step.event_id}
    if step.attempt is not None:
        attrs["cardbus.task.attempt"] = step.attempt
    if step.agent_id:
        attrs["gen_ai.agent.id"] = step.agent_id
    if step.reason:
        attrs["cardbus.reason"] = step.reason
    if step.actor:
        attrs["cardbus.actor"] = step.actor
    match data:
        case ev.TaskRejected():
            attrs["error.type"] = data.reason
        case ev.TaskTimedOut():
            attrs["error.type"] = "timeout"
        case ev.TaskRetryScheduled():
            attrs["cardbus.retry.delay_s"] = data.delay_s
            attrs["error.type"] = _error_type(data.reason)
        case ev.RevisionRequested():
            attrs["cardbus.revision.round"] = data.round
            attrs["cardbus.revision.reviewer_task_id"] = data.reviewer_task_id
        case ev.ApprovalGranted() | ev.ApprovalDenied():
            attrs["cardbus.approval.by"] = data.by
        case ev.ApprovalRequested():
            attrs["cardbus.approval.reason"] = data.reason
        case ev.TaskResultSubmitted():
            attrs["cardbus.result.status"] = data.status
        case ev.TaskFailed():
            attrs["error.type"] = data.reason
    if extra:
        attrs.update(extra)
    return SpanEventRecord(name=step.type.rsplit(".", 1)[0], time=step.time, attributes=attrs)


def agent_names_from(events: Iterable[Envelope]) -> dict[str, str]:
    """Agent id -> display name, from ``agent.registered`` events (the latest wins)."""
    names: dict[str, str] = {}
    for env in events:
        data = env.data
        if isinstance(data, ev.AgentRegistered):
            name = data.card.get("name") if isinstance(data.card, dict) else None
            names[data.agent_id] = str(name or data.agent_id)
    return names


def parse_traceparent_ids(value: str | None) -> tuple[int, int] | None:
    """(trace id, span id) of a W3C ``traceparent``, None if absent or malformed."""
    parts = (value or "").strip().split("-")
    if len(parts) < 4 or len(parts[1]) != 32 or len(parts[2]) != 16:
        return None
    try:
        return int(parts[1], 16), int(parts[2], 16)
    except ValueError:
        return None


def _error_type(text: str | None) -> str:
    """A low-cardinality error type from a reason such as ``timeout: no result from x``."""
    if not text:
        return "error"
    head = text.split(":", 1)[0].strip()
    return head if head and " " not in head and len(head) <= 64 else "error"


class _Builder:
    def __init__(
        self, root_id: str, by_id: Mapping[str, Envelope], agent_names: Mapping[str, str]
    ) -> None:
        self.root_id = root_id
        self.trace_id = trace_id_for(root_id)
        self.by_id = by_id
        self.agent_names = agent_names
        self.spans: list[SpanRecord] = []
        self.tokens_in = 0
        self.tokens_out = 0

    def event(self, step: Step, extra: dict[str, Any] | None = None) -> SpanEventRecord:
        data = self.by_id[step.event_id].data if step.event_id in self.by_id else None
        return _span_event(step, data, extra)

    def run_span(self, run_steps: list[Step], start: float, end: float) -> SpanRecord:
        started = next(
            (s for s in run_steps if s.type == ev.RunStarted.__struct_config__.tag), None
        )
        opening = started.event_id if started else ""
        span = SpanRecord(
            trace_id=self.trace_id,
            span_id=workflow_span_id(self.root_id),
            name="invoke_workflow",
            start=started.time if started else start,
            end=end,
            opening_event_id=opening,
            attributes={
                "gen_ai.operation.name": "invoke_workflow",
                "cardbus.root_id": self.root_id,
            },
            events=[],
        )
        status = "open"
        for step in run_steps:
            env = self.by_id.get(step.event_id)
            data = env.data if env else None
            match data:
                case ev.RunStarted():
                    span.attributes["cardbus.plan_id"] = data.plan_id
                    if data.goal:
                        span.attributes["cardbus.run.goal"] = data.goal
                    live = parse_traceparent_ids(env.traceparent if env else None)
                    if live is not None and live[0] != self.trace_id:  # another trace
                        span.link_traceparent = env.traceparent if env else None
                case ev.RunCompleted():
                    status, span.end = "completed", step.time
                case ev.RunFailed():
                    status, span.end = "failed", step.time
                    span.error, span.status_message = data.reason, step.reason or data.reason
                case ev.RunHalted():
                    status, span.end = "halted", step.time
                    span.error, span.status_message = data.reason, data.detail or data.reason
            if not isinstance(data, ev.RunStarted):
                span.events.append(self.event(step))
        span.attributes["cardbus.run.status"] = status
        if span.error:
            span.attributes["error.type"] = span.error
        span.end = max(span.end, span.start)
        return span

    def task_span(self, node: TaskNode, parent: int | None, run_end: float) -> None:
        created = node.steps[0] if node.steps and node.steps[0].kind == "created" else None
        opening = created.event_id if created else node.steps[0].event_id
        attrs: dict[str, Any] = {
            "cardbus.task.id": node.task_id,
            "cardbus.root_id": self.root_id,
            "cardbus.task.status": node.status or "",
            "cardbus.task.attempts": node.attempts,
        }
        if node.capability:
            attrs["cardbus.task.capability"] = node.capability
        if node.parent_id:
            attrs["cardbus.task.parent_id"] = node.parent_id
        env = self.by_id.get(opening)
        if env is not None and isinstance(env.data, ev.TaskCreated) and env.data.role:
            attrs["cardbus.task.role"] = env.data.role
        end = node.end if node.status in _TERMINAL else max(node.end, run_end)
        span = SpanRecord(
            trace_id=self.trace_id,
            span_id=task_span_id(node.task_id),
            parent_span_id=parent,
            name=f"task {node.capability or 'unknown'}",
            start=node.start,
            end=end,
            opening_event_id=opening,
            attributes=attrs,
            events=[],
        )
        self.spans.append(span)
        for step in node.steps:
            if step.kind in _TASK_EVENT_KINDS:
                span.events.append(self.event(step))
            env = self.by_id.get(step.event_id)
            if env is not None and isinstance(
                env.data, (ev.TaskFailed, ev.TaskHalted, ev.TaskCancelled)
            ):
                span.error, span.status_message = env.data.reason, step.reason or ""
        if node.status in _ERROR_STATUSES and not span.error:
            span.error = node.status
        if span.error:
            attrs["error.type"] = span.error
        for attempt in node.spans:
            self.attempt_span(node, attempt, span, run_end)
        for child in node.children:
            self.task_span(child, span.span_id, run_end)

    def attempt_span(
        self, node: TaskNode, a: AttemptSpan, task: SpanRecord, run_end: float
    ) -> None:
        steps = [s for s in node.steps if s.attempt == a.attempt and s.agent_id == a.agent_id]
        dispatched = next((s for s in steps if s.kind == "dispatched"), None)
        if dispatched is None:
            return
        name = self.agent_names.get(a.agent_id, a.agent_id)
        end = a.end if a.end is not None else max(task.end, run_end, a.start)
        attrs: dict[str, Any] = {
            "gen_ai.operation.name": "invoke_agent",
            "gen_ai.agent.id": a.agent_id,
            "gen_ai.agent.name": name,
            "cardbus.task.id": node.task_id,
            "cardbus.task.attempt": a.attempt,
            "cardbus.attempt.outcome": a.outcome,
        }
        if node.capability:
            attrs["cardbus.task.capability"] = node.capability
        span = SpanRecord(
            trace_id=self.trace_id,
            span_id=span_id_for(dispatched.event_id),
            parent_span_id=task.span_id,
            name=f"invoke_agent {name}",
            kind="client",
            start=a.start,
            end=end,
            opening_event_id=dispatched.event_id,
            attributes=attrs,
            events=[],
        )
        result: ev.TaskResultSubmitted | None = None
        for step in steps:
            env = self.by_id.get(step.event_id)
            if (
                env is not None
                and isinstance(env.data, ev.TaskResultSubmitted)
                and step.time <= end
            ):
                result = env.data
            if step.kind in _ATTEMPT_KINDS and step.time <= end:
                span.events.append(self.event(step))
        if result is not None:
            attrs["gen_ai.usage.input_tokens"] = result.usage.input_tokens
            attrs["gen_ai.usage.output_tokens"] = result.usage.output_tokens
            attrs["cardbus.result.status"] = result.status
            self.tokens_in += tokens_in_range(result.usage.input_tokens)
            self.tokens_out += tokens_in_range(result.usage.output_tokens)
            if result.status == "failed":
                span.error = _error_type(result.error) if result.error else "agent_error"
                span.status_message = result.error or ""
        if span.error is None and a.outcome in _ERROR_OUTCOMES:
            span.error = self._outcome_error(steps, a)
            span.status_message = a.reason or a.outcome
        if span.error:
            attrs["error.type"] = span.error
        self.spans.append(span)

    def _outcome_error(self, steps: list[Step], a: AttemptSpan) -> str:
        for step in steps:
            env = self.by_id.get(step.event_id)
            if env is not None and isinstance(env.data, ev.TaskRejected):
                return env.data.reason
        if a.outcome == "timed_out":
            return "timeout"
        if a.outcome == "retry":
            return _error_type(a.reason.split(": ", 1)[-1] if a.reason else None)
        return a.outcome


_TERMINAL = frozenset({"completed", "failed", "cancelled", "halted"})


def _root_spans(
    root_id: str, events: Sequence[Envelope], agent_names: Mapping[str, str]
) -> list[SpanRecord]:
    timeline = build_timeline(events, root_id, root_id)
    by_id = {e.event_id: e for e in events}
    b = _Builder(root_id, by_id, agent_names)
    run = b.run_span(timeline.run, timeline.start, timeline.end)
    run_end = timeline.end
    for node in timeline.tasks:
        if node.steps:
            b.task_span(node, run.span_id, run_end)
    run.attributes["gen_ai.usage.input_tokens"] = b.tokens_in
    run.attributes["gen_ai.usage.output_tokens"] = b.tokens_out
    for span in b.spans:  # a run still open ends at its latest event
        run.end = max(run.end, span.end)
    return [run, *b.spans]


def trace_spans(
    events: Iterable[Envelope],
    agent_names: Mapping[str, str] | None = None,
    task_id: str | None = None,
) -> list[SpanRecord]:
    """Spans of every run whose events are given (grouped by ``correlation_id``).

    ``task_id`` keeps only that task's span and its descendants (same ids as in
    the whole run's export). ``agent_names`` maps agent ids to display names
    (see :func:`agent_names_from`); unknown agents are named by their id.
    Roots without a ``run.started`` or ``task.created`` (agent, plan and memory
    streams) are skipped.
    """
    by_root: dict[str, list[Envelope]] = {}
    runs: set[str] = set()  # roots with a run or a task: agent, plan, memory streams are not
    for env in events:
        by_root.setdefault(env.correlation_id, []).append(env)
        if isinstance(env.data, (ev.RunStarted, ev.TaskCreated)):
            runs.add(env.correlation_id)
    out: list[SpanRecord] = []
    for root_id, evs in by_root.items():
        if root_id not in runs:
            continue
        evs.sort(key=lambda e: e.position)
        out.extend(_root_spans(root_id, evs, agent_names or {}))
    if task_id is not None:
        out = _subtree(out, task_id)
    return out


def _subtree(spans: list[SpanRecord], task_id: str) -> list[SpanRecord]:
    top = next(
        (
            s
            for s in spans
            if s.name.startswith("task ") and s.attributes.get("cardbus.task.id") == task_id
        ),
        None,
    )
    if top is None:
        return []
    keep = {top.span_id}
    out = [top]
    for s in spans:  # parents come before children in trace_spans' order
        if s.parent_span_id in keep and s.span_id not in keep:
            keep.add(s.span_id)
            out.append(s)
    return out


def _ns(t: float) -> int:
    return round(t * 1_000_000_000)


def to_readable_spans(
    records: Iterable[SpanRecord], resource: Any = None, scope_version: str | None = None
) -> list[Any]:
    """SDK ``ReadableSpan`` objects for an exporter (``resource`` defaults to service cardbus)."""
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import Event, ReadableSpan
    from opentelemetry.sdk.util.instrumentation import InstrumentationScope
    from opentelemetry.trace import Link, SpanContext, SpanKind, TraceFlags
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
    from opentelemetry.trace.status import Status, StatusCode

    if resource is None:
        resource = Resource.create({"service.name": "cardbus"})
    scope = InstrumentationScope(SCOPE_NAME, scope_version)
    flags = TraceFlags(TraceFlags.SAMPLED)
    kinds = {"internal": SpanKind.INTERNAL, "client": SpanKind.CLIENT}
    propagator = TraceContextTextMapPropagator()
    out = []
    for r in records:
        ctx = SpanContext(r.trace_id, r.span_id, is_remote=False, trace_flags=flags)
        parent = (
            SpanContext(r.trace_id, r.parent_span_id, is_remote=False, trace_flags=flags)
            if r.parent_span_id
            else None
        )
        links = []
        if r.link_traceparent:
            from opentelemetry import trace

            linked = trace.get_current_span(
                propagator.extract({"traceparent": r.link_traceparent})
            ).get_span_context()
            if linked.is_valid:
                links.append(Link(linked, {"cardbus.link": "live_trace"}))
        status = (
            Status(StatusCode.ERROR, r.status_message or r.error)
            if r.error
            else Status(StatusCode.UNSET)
        )
        out.append(
            ReadableSpan(
                name=r.name,
                context=ctx,
                parent=parent,
                resource=resource,
                attributes=dict(r.attributes),
                events=[Event(e.name, dict(e.attributes), _ns(e.time)) for e in r.events],
                links=links,
                kind=kinds.get(r.kind, SpanKind.INTERNAL),
                status=status,
                start_time=_ns(r.start),
                end_time=_ns(r.end),
                instrumentation_scope=scope,
            )
        )
    return out
