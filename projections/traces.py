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

What an attempt asked models and tools (the journal, ``AttemptSpan.calls``)
are its children, per the OpenTelemetry GenAI conventions::

        invoke_agent {agent name}  (CLIENT)
          chat {model}             (CLIENT)    model.requested .. model.answered
          execute_tool {tool}      (INTERNAL)  tool.requested .. tool.called

with ``gen_ai.operation.name``, ``gen_ai.request.model``, ``gen_ai.response.model``,
``gen_ai.usage.input_tokens`` / ``output_tokens`` (a chat), ``gen_ai.tool.name`` and
``gen_ai.tool.call.id`` (the call's idempotency key), ``error.type`` on a failure,
and the journal's coordinates (``cardbus.journal.seq``, ``.execution``, ``.status``).
A call answered from the journal is a span of no duration that names the event it
replays (``cardbus.journal.replayed_from``) and carries no usage: nothing was spent.
The prompt and the answer (``gen_ai.input.messages`` / ``gen_ai.output.messages``, a
tool's ``gen_ai.tool.call.arguments`` / ``.result``) are added only when
``OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT`` is ``true`` (and the log kept
them, see ``AccessPolicy``). The provider (``gen_ai.provider.name``) is the one
``model.requested`` recorded (the client's, see ``OpenAIChatLLM.provider``); a replayed
call has its source's.

Lifecycle facts become span events: on the attempt span ``task.started``,
``task.result_submitted``, ``task.rejected``, ``task.timed_out``,
``tool.effect_unknown`` (with ``cardbus.journal.decision``); on the task
span ``task.retry_scheduled``, ``task.revision_requested``,
``task.approval_requested|granted|denied``, ``task.needs_input``,
``task.input_provided``, ``task.result_ignored``, ``task.failed``,
``task.cancelled``, ``task.halted``; on the workflow span the ``run.*`` and
``plan.*`` events. Every span event carries ``cardbus.event.id``.

Ids are deterministic, so exporting the same run twice (or a task, then its
whole run) gives the same ids and a tracing backend sees one trace, not two:

* trace id = the first 16 bytes of ``sha256(root id)``;
* span id = the first 8 bytes of ``sha256(event id)`` of an attempt's opening
  event (``task.dispatched``), of a call's (``model.requested``, ``tool.requested``;
  a replayed call's ``model.answered`` / ``tool.called``); a task's is
  ``sha256("task:" + task id)`` and the workflow's ``sha256("run:" + root id)``:
  known without reading the log (the workflow's before ``run.started`` is written,
  whose envelope names it; a task's by an orchestrator that resumes a run from a
  snapshot).

Live tracing (``bus.telemetry.RunTracing``) opens its spans with the same ids
and the same span events (:func:`span_event`), so a run traced live and then
exported is one trace, each exported span the twin of a live one.

Times are the recorded times (``recorded_at``) of the events, so a run from
last week is sent with last week's times.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import msgspec

from cardbus.eventstore import events as ev
from cardbus.eventstore.batch import tokens_in_range
from cardbus.eventstore.envelope import Envelope
from cardbus.eventstore.trace_ids import span_id_for, trace_id_for
from cardbus.projections.replay import (
    AttemptSpan,
    Call,
    EffectUnknown,
    JournalFold,
    ModelCall,
    Step,
    TaskNode,
    ToolCall,
    _step,
    build_timeline,
)

__all__ = [
    "CAPTURE_CONTENT",
    "EffectUnknown",
    "JournalFold",
    "ModelCall",
    "ToolCall",
    "SCOPE_NAME",
    "SpanEventRecord",
    "SpanRecord",
    "agent_names_from",
    "call_attributes",
    "call_span_id",
    "call_span_name",
    "capture_content",
    "event_home",
    "input_messages",
    "output_messages",
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
_ATTEMPT_KINDS = frozenset(
    {"started", "result_submitted", "rejected", "timed_out", "tool.effect_unknown"}
)
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
        case ev.ToolEffectUnknown():
            attrs["gen_ai.tool.name"] = data.tool
            attrs["gen_ai.tool.call.id"] = data.idempotency_key
            attrs["cardbus.journal.decision"] = data.decision
            attrs["cardbus.journal.requested_event_id"] = data.requested_event_id
    if extra:
        attrs.update(extra)
    return SpanEventRecord(name=step.type.rsplit(".", 1)[0], time=step.time, attributes=attrs)


# -- the journal's calls as GenAI spans ---------------------------------------------

#: the standard switch for recording prompts and answers on GenAI spans
CAPTURE_CONTENT = "OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT"


def capture_content() -> bool:
    """True when ``OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT`` is ``true``."""
    return os.environ.get(CAPTURE_CONTENT, "").strip().lower() == "true"


def call_span_id(call: ModelCall | ToolCall) -> int:
    """A call's span id: from its request event, or (replayed) its answer event."""
    if isinstance(call, ModelCall):
        return span_id_for(call.requested_event_id or call.answered_event_id)
    return span_id_for(call.requested_event_id or call.called_event_id)


def call_span_name(call: ModelCall | ToolCall) -> str:
    """``chat {model}`` or ``execute_tool {tool}``."""
    if isinstance(call, ModelCall):
        return f"chat {call.model or call.response_model}".rstrip()
    return f"execute_tool {call.tool}"


def _text_part(text: str) -> dict[str, Any]:
    return {"type": "text", "content": text}


def _tool_call_part(c: Any) -> dict[str, Any]:
    fn = c.get("function") if isinstance(c.get("function"), dict) else {}
    arguments = c.get("arguments", fn.get("arguments"))
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments)
        except ValueError:
            pass
    return {
        "type": "tool_call",
        "id": c.get("id"),
        "name": c.get("name") or fn.get("name"),
        "arguments": arguments,
    }


def _message(m: dict[str, Any]) -> dict[str, Any]:
    role = str(m.get("role") or "user")
    content = m.get("content")
    parts: list[dict[str, Any]] = []
    if role == "tool":
        parts.append(
            {"type": "tool_call_response", "id": m.get("tool_call_id"), "response": content}
        )
    elif isinstance(content, str):
        if content:
            parts.append(_text_part(content))
    elif isinstance(content, list):
        for part in content:
            if isinstance(part, dict) and isinstance(part.get("text"), str):
                parts.append(_text_part(part["text"]))
    for c in m.get("tool_calls") or ():
        if isinstance(c, dict):
            parts.append(_tool_call_part(c))
    return {"role": role, "parts": parts}


def input_messages(request: Any) -> list[dict[str, Any]]:
    """A model request as the GenAI input messages (``role`` and ``parts``)."""
    if not isinstance(request, dict):
        return []
    messages = request.get("messages")
    if isinstance(messages, list):
        return [_message(m) for m in messages if isinstance(m, dict)]
    out: list[dict[str, Any]] = []
    if isinstance(request.get("system"), str) and request["system"]:
        out.append({"role": "system", "parts": [_text_part(request["system"])]})
    if isinstance(request.get("prompt"), str):
        out.append({"role": "user", "parts": [_text_part(request["prompt"])]})
    return out


def output_messages(answer: Any) -> list[dict[str, Any]]:
    """A completion as the GenAI output messages (``role``, ``parts``, ``finish_reason``)."""
    if not isinstance(answer, dict):
        return []
    parts: list[dict[str, Any]] = []
    if isinstance(answer.get("text"), str) and answer["text"]:
        parts.append(_text_part(answer["text"]))
    called = [c for c in answer.get("tool_calls") or () if isinstance(c, dict)]
    parts += [_tool_call_part(c) for c in called]
    finish = str(answer.get("finish_reason") or ("tool_call" if called else "stop"))
    finish = _FINISH.get(finish, finish)
    return [{"role": "assistant", "parts": parts, "finish_reason": finish}]


#: OpenAI's finish reasons -> the GenAI conventions' (``tool_calls`` is ``tool_call`` there)
_FINISH = {"tool_calls": "tool_call", "function_call": "tool_call"}


def _json_text(value: Any) -> str:
    try:
        return msgspec.json.encode(value).decode()
    except (TypeError, ValueError):
        return json.dumps(value, default=repr)


def call_attributes(
    call: ModelCall | ToolCall, task_id: str, capture: bool | None = None
) -> dict[str, Any]:
    """The span attributes of a call (content only when ``capture``, default: the env)."""
    capture = capture_content() if capture is None else capture
    attrs: dict[str, Any] = {
        "cardbus.task.id": task_id,
        "cardbus.task.attempt": call.attempt,
        "cardbus.journal.seq": call.seq,
        "cardbus.journal.execution": call.execution,
        "cardbus.journal.status": call.status,
    }
    if call.agent_id:
        attrs["gen_ai.agent.id"] = call.agent_id
    if call.replayed_from:
        attrs["cardbus.journal.replayed_from"] = call.replayed_from
    if isinstance(call, ModelCall):
        attrs["gen_ai.operation.name"] = "chat"
        if call.provider:  # Required on chat spans (recorded since model.requested had it)
            attrs["gen_ai.provider.name"] = call.provider
        if call.model:
            attrs["gen_ai.request.model"] = call.model
        if call.response_model:
            attrs["gen_ai.response.model"] = call.response_model
        if call.status == "answered":  # a replayed call spent nothing
            attrs["gen_ai.usage.input_tokens"] = call.input_tokens
            attrs["gen_ai.usage.output_tokens"] = call.output_tokens
            if call.cost_usd is not None:  # as the orchestrator priced it when recorded
                attrs["cardbus.cost.usd"] = call.cost_usd
        if call.error is not None:
            attrs["error.type"] = call.error_type or "error"
        if capture and call.prompt is not None:
            attrs["gen_ai.input.messages"] = _json_text(input_messages(call.prompt))
        if capture and call.answer is not None:
            attrs["gen_ai.output.messages"] = _json_text(output_messages(call.answer))
        return attrs
    attrs["gen_ai.operation.name"] = "execute_tool"
    attrs["gen_ai.tool.name"] = call.tool
    attrs["gen_ai.tool.type"] = "function"
    if call.idempotency_key:
        attrs["gen_ai.tool.call.id"] = call.idempotency_key
        attrs["cardbus.journal.idempotency_key"] = call.idempotency_key
    if call.error is not None:
        attrs["error.type"] = call.error_type or "tool_error"
    if capture and call.arguments is not None:
        attrs["gen_ai.tool.call.arguments"] = _json_text(call.arguments)
    if capture and call.result is not None and call.error is None:
        attrs["gen_ai.tool.call.result"] = _json_text(call.result)
    return attrs


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
        self.capture = capture_content()
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
                    if data.degraded:  # done without these optional tasks' outputs
                        span.attributes["cardbus.run.degraded"] = list(data.degraded)
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
        self.call_spans(node, node.calls, span)
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
        self.call_spans(node, a.calls, span)

    def call_spans(self, node: TaskNode, calls: Sequence[Call], parent: SpanRecord) -> None:
        """A span per model or tool call, under ``parent`` (open ones end with it)."""
        for call in calls:
            if isinstance(call, EffectUnknown):
                continue  # a span event of the attempt (tool.effect_unknown)
            end = call.end if call.end is not None else max(parent.end, call.start)
            attrs = call_attributes(call, node.task_id, self.capture)
            self.spans.append(
                SpanRecord(
                    trace_id=self.trace_id,
                    span_id=call_span_id(call),
                    parent_span_id=parent.span_id,
                    name=call_span_name(call),
                    kind="client" if isinstance(call, ModelCall) else "internal",
                    start=call.start,
                    end=end,
                    attributes=attrs,
                    events=[],
                    error=attrs.get("error.type"),
                    status_message=call.error or "",
                    opening_event_id=(
                        call.requested_event_id
                        or (
                            call.answered_event_id
                            if isinstance(call, ModelCall)
                            else call.called_event_id
                        )
                    ),
                )
            )

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
    parents: dict[str, tuple[str, str]] = {}  # a child run's root -> (parent root, parent task)
    for env in events:
        by_root.setdefault(env.correlation_id, []).append(env)
        if isinstance(env.data, (ev.RunStarted, ev.TaskCreated)):
            runs.add(env.correlation_id)
        if isinstance(env.data, ev.RunStarted) and env.data.parent_root is not None:
            parents[env.correlation_id] = (env.data.parent_root, env.data.parent_task or "")
    out: list[SpanRecord] = []
    for root_id, evs in by_root.items():
        if root_id not in runs:
            continue
        evs.sort(key=lambda e: e.position)
        spans = _root_spans(root_id, evs, agent_names or {})
        if root_id in parents:
            _under_parent(spans, root_id, parents)
        out.extend(spans)
    if task_id is not None:
        out = _subtree(out, task_id)
    return out


def _under_parent(
    spans: list[SpanRecord], root_id: str, parents: Mapping[str, tuple[str, str]]
) -> None:
    """A child run's spans join its parent's trace: the trace id of the topmost run of
    its lineage, and its run span under the span of the parent task that started it."""
    top, seen = root_id, {root_id}
    while top in parents and parents[top][0] not in seen:  # a cycle is bad data: stop there
        top = parents[top][0]
        seen.add(top)
    for span in spans:
        span.trace_id = trace_id_for(top)
    spans[0].parent_span_id = task_span_id(parents[root_id][1])  # spans[0]: the run's


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
