"""Live tracing with the OpenTelemetry API (never the SDK: tools and users configure that).

Spans, all on the tracer ``cardbus``::

    invoke_workflow                         INTERNAL  one per root run (submit .. run.* finish)
      task <capability>                     INTERNAL  task.created .. the task's end
        invoke_agent <agent name>           CLIENT    one attempt: task.dispatched .. outcome
          chat <model>                      CLIENT    a model call: model.requested .. answered
          execute_tool <tool>               INTERNAL  a tool call: tool.requested .. tool.called
          send cardbus.agent.<agent>        PRODUCER  the orchestrator hands a card to the bus
            process cardbus.agent.<agent>   CONSUMER  an agent worker takes the card (any process)
              invoke_agent <agent name>     INTERNAL  the agent's run, with gen_ai usage
        task <capability>                   INTERNAL  a review or supplementary task

The orchestrator's spans (workflow, task, attempt, and the attempt's model and
tool calls as the journal records them) are the ones ``cardbus export`` rebuilds
from the log, with the same ids, attributes and span events (:class:`RunTracing`),
so exporting a run traced live adds to its trace. A call answered from the
journal is a span of no duration naming the event it replays, without usage.

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

import collections
import os
import re
import time
from collections.abc import Awaitable, Callable, Coroutine, Iterator, Mapping, MutableMapping
from contextlib import contextmanager
from contextvars import ContextVar
from typing import TYPE_CHECKING, Any

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

from cardbus.eventstore import events as ev
from cardbus.projections import traces

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
# (trace id or None, span id) for the span being started, see _ChosenIds
_CHOSEN: ContextVar[tuple[int | None, int] | None] = ContextVar("cardbus_ids", default=None)


class _ChosenIds:
    """Wraps an SDK tracer's id generator: the ids in ``_CHOSEN`` when set (the workflow,
    task and attempt spans, whose ids derive from the log), its own otherwise."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner

    def generate_trace_id(self) -> int:
        chosen = _CHOSEN.get()
        if chosen is not None and chosen[0]:
            return chosen[0]
        return int(self.inner.generate_trace_id())

    def generate_span_id(self) -> int:
        chosen = _CHOSEN.get()
        return chosen[1] if chosen is not None else int(self.inner.generate_span_id())

    def is_trace_id_random(self) -> bool:
        return bool(getattr(self.inner, "is_trace_id_random", lambda: True)())


def tracer() -> trace.Tracer:
    """cardbus's tracer from the provider in use (made once per provider)."""
    provider = _provider if _provider is not None else trace.get_tracer_provider()
    cached = _tracers.get(id(provider))
    if cached is None or cached[0] is not provider:
        made = provider.get_tracer(TRACER_NAME)
        inner = getattr(made, "id_generator", None)  # the SDK's Tracer (only ours is wrapped)
        if inner is not None and not isinstance(inner, _ChosenIds):
            made.id_generator = _ChosenIds(inner)  # type: ignore[attr-defined]
        cached = (provider, made)
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


class _Run:
    """One traced run: its workflow span, its tasks' spans, its open attempts' spans."""

    __slots__ = ("attempts", "calls", "journals", "resumed", "seen", "span", "tasks")

    def __init__(self, span: Span, resumed: bool = False) -> None:
        self.span = span
        self.resumed = resumed  # started before a restart: its task spans are named, not open
        self.tasks: dict[str, Span] = {}  # open task spans
        self.seen: set[str] = set()  # every task of the run (their tool calls are no run events)
        self.attempts: dict[tuple[str, str], Span] = {}  # (task id, agent id) -> open attempt
        # the journal of each open task (its calls, folded as the log grows) and the spans
        # of its calls still open: call -> (span, task id, agent id)
        self.journals: dict[str, traces.JournalFold] = {}
        self.calls: dict[int, tuple[Span, Any, str, str]] = {}

    def task(self, task_id: str) -> Span | None:
        """The open span of a task; for a task created before a restart, its span's context
        (its id derives from the task id), so what follows joins the first trace."""
        span = self.tasks.get(task_id)
        if span is None and self.resumed and task_id and task_id not in self.seen:
            self.seen.add(task_id)
            ctx = self.span.get_span_context()
            span = self.tasks[task_id] = NonRecordingSpan(
                SpanContext(
                    ctx.trace_id,
                    traces.task_span_id(task_id),
                    is_remote=True,
                    trace_flags=ctx.trace_flags,
                )
            )
        return span


class RunTracing:
    """The orchestrator's spans, the tree ``cardbus export`` draws from the log::

        invoke_workflow                     submit .. run.completed|failed|halted
          task {capability}                 task.created .. completed|failed|halted|cancelled
            invoke_agent {agent}  CLIENT    task.dispatched .. the attempt's outcome
              send cardbus.agent.<agent>    the card handed to the bus (worker spans below)
            task {capability}               a review or supplementary task, under its task

    with the same ids (trace id ``sha256(root)[:16]``, span ids from the root, the task
    id and the dispatch's event id, see ``projections.traces``) and span events, so
    exporting a run traced live lands in the same trace. The ids are chosen through the SDK tracer's
    ``id_generator`` (other API implementations keep their own ids). Fed by the
    events the orchestrator applies (:meth:`on_event`); cheap no-ops without an SDK.
    """

    def __init__(self, agent_name: Callable[[str], str] | None = None) -> None:
        self._runs: dict[str, _Run] = {}
        self._agent_name = agent_name or (lambda agent_id: agent_id)
        # task.created of runs not traced (yet): a child run's tasks are stored before its
        # run.started (``child_runs``), which then opens its span under its parent task's
        # and replays them; the latest roots only (others' runs are never traced here)
        self._early: collections.OrderedDict[str, list[Envelope]] = collections.OrderedDict()

    def start_run(self, root_id: str, plan_id: str | None = None, goal: str = "") -> None:
        if not enabled() or root_id in self._runs:
            return
        trace_id, span_id = _ids(root_id)
        span = _start("invoke_workflow", None, SpanKind.INTERNAL, trace_id, span_id)
        if span.is_recording():
            span.set_attributes(
                {"gen_ai.operation.name": "invoke_workflow", "cardbus.root_id": root_id}
            )
            if plan_id:
                span.set_attribute("cardbus.plan_id", plan_id)
            if goal:
                span.set_attribute("cardbus.run.goal", goal)
        self._runs[root_id] = _Run(span)

    def resume_run(self, root_id: str, traceparent: str | None = None) -> None:
        """Rejoin the trace of a run started before a restart: its workflow and task spans
        (ids derived from the root and the log) become the parents of what follows, though
        this process cannot end them (the export from the log draws the whole run)."""
        if not enabled() or root_id in self._runs:
            return
        trace_id = traces.trace_id_for(root_id)
        ctx = parse_traceparent(traceparent)
        if ctx is None or ctx.trace_id != trace_id:  # traced before ids were derived: keep it
            flags = TraceFlags(TraceFlags.SAMPLED)
            ctx = ctx or SpanContext(
                trace_id, traces.workflow_span_id(root_id), is_remote=True, trace_flags=flags
            )
        self._runs[root_id] = _Run(NonRecordingSpan(ctx), resumed=True)

    def traceparent(self, root_id: str) -> str | None:
        """What to store in the envelope of an event of ``root_id``'s run."""
        if not self._runs:
            return current_traceparent() if enabled() else None
        run = self._runs.get(root_id)
        if run is None:
            return current_traceparent()
        return format_traceparent(run.span.get_span_context())

    def context(self, root_id: str, task_id: str = "", agent_id: str = "") -> Any:
        """The context to start a span in: the open attempt's, else the task's, else the run's."""
        run = self._runs.get(root_id)
        if run is None:
            return None
        span = run.attempts.get((task_id, agent_id)) or run.tasks.get(task_id) or run.span
        return trace.set_span_in_context(span)

    def on_event(self, env: Envelope) -> None:
        """Follow the log: open, annotate and end the run's task and attempt spans."""
        if not self._runs:
            return
        run = self._runs.get(env.correlation_id)
        data = env.data
        if run is None:
            self._not_traced(env)
            return
        t = round(env.recorded_at * 1e9)
        if isinstance(data, (ev.RunCompleted, ev.RunFailed, ev.RunHalted)):
            self._end_run(env.stream, run, env, t)
            return
        if type(data) not in _TASK_TYPES:  # the run's (run.*, plan.*) or a task's tool call
            owner = getattr(data, "task_id", None)
            if isinstance(data, _JOURNAL_TYPES) and owner in run.seen:
                self._journal(run, env, str(owner), t)
                return
            run_event = owner not in run.seen and not isinstance(data, ev.RunStarted)
            if run_event and run.span.is_recording():
                _add_event(run.span, traces.span_event(env))
            return
        task_id = env.stream
        if isinstance(data, ev.TaskCreated):
            run.seen.add(task_id)
            parent = run.task(data.parent_id or "") or run.span
            run.tasks[task_id] = self._task_span(env, data, parent, t)
            return
        task = run.task(task_id)
        if task is None:
            return
        if isinstance(data, ev.TaskDispatched):
            run.attempts[(task_id, data.agent_id)] = self._attempt_span(env, data, task, t)
            return
        record = traces.span_event(env)
        kind = record.name.split(".", 1)[-1]
        home = traces.event_home(kind)
        agent = getattr(data, "agent_id", None)
        attempt = run.attempts.get((task_id, agent)) if isinstance(agent, str) else None
        if home == "attempt" and attempt is not None and attempt.is_recording():
            _add_event(attempt, record)
        elif home == "task" and task.is_recording():
            _add_event(task, record)
        match data:
            case ev.TaskResultSubmitted() if attempt is not None and attempt.is_recording():
                _record_usage(attempt, data)
            case ev.TaskRejected() | ev.TaskTimedOut():
                span = run.attempts.pop((task_id, data.agent_id), None)
                _end_calls(run, task_id, data.agent_id, t)
                if span is not None:
                    error = data.reason if isinstance(data, ev.TaskRejected) else "timeout"
                    why = traces.span_event(env).attributes.get("cardbus.reason", error)
                    _end(span, t, "rejected" if error != "timeout" else "timed_out", error, why)
            case ev.TaskCompleted():
                for (tid, agent_id), span in list(run.attempts.items()):
                    if tid == task_id:
                        del run.attempts[(tid, agent_id)]
                        _end_calls(run, tid, agent_id, t)
                        done = "completed" if agent_id == data.agent_id else "superseded"
                        _end(span, t, done)
                _end_task(run, task_id, t, "completed")
            case _:
                outcome = _CLOSE_ALL.get(type(data))
                if outcome is not None:
                    reason = str(record.attributes.get("cardbus.reason", outcome))
                    fault = _outcome_error(outcome, data)
                    for tid, agent_id in [k for k in run.attempts if k[0] == task_id]:
                        _end_calls(run, tid, agent_id, t)
                        _end(run.attempts.pop((tid, agent_id)), t, outcome, fault, reason)
                if isinstance(data, (ev.TaskFailed, ev.TaskHalted, ev.TaskCancelled)):
                    status = record.name.split(".", 1)[-1]
                    why = str(record.attributes.get("cardbus.reason", data.reason))
                    _end_task(run, task_id, t, status, data.reason, why)

    def _journal(self, run: _Run, env: Envelope, task_id: str, t: int) -> None:
        """A journaled call: its span opens with its request and ends with its answer (a
        replayed one opens and ends at once); an unknown effect is an attempt's span event."""
        data = env.data
        journal = run.journals.get(task_id)
        if journal is None:
            journal = run.journals[task_id] = traces.JournalFold()
        call = journal.apply(env)
        agent_id = str(getattr(data, "agent_id", ""))
        attempt = run.attempts.get((task_id, agent_id))
        if isinstance(call, traces.EffectUnknown):
            if attempt is not None and attempt.is_recording():
                _add_event(attempt, traces.span_event(env))
            return
        if call is None:
            return
        open_call = run.calls.get(id(call))
        if open_call is None:
            parent = attempt or run.task(task_id)
            if parent is None:
                return
            span = _start(
                traces.call_span_name(call),
                trace.set_span_in_context(parent),
                SpanKind.CLIENT if isinstance(call, traces.ModelCall) else SpanKind.INTERNAL,
                None,
                traces.call_span_id(call),
                round(call.start * 1e9),
            )
            open_call = run.calls[id(call)] = (span, call, task_id, agent_id)
        if call.end is not None:
            del run.calls[id(call)]
            _end_call(open_call[0], call, task_id, t)

    def _not_traced(self, env: Envelope) -> None:
        """An event of a run not traced here: a child run of a traced run starts its span
        (under the span of its parent task, in its parent's trace) with its run.started,
        and its tasks created before it join it; other runs' events are let go."""
        data = env.data
        if isinstance(data, ev.TaskCreated) and data.parent_id is None:
            self._early.setdefault(env.correlation_id, []).append(env)
            while len(self._early) > _EARLY_ROOTS:
                self._early.popitem(last=False)
            return
        if not isinstance(data, ev.RunStarted):
            return
        early = self._early.pop(env.stream, [])
        parent = self._runs.get(data.parent_root or "")
        if parent is None:
            return
        above = parent.task(data.parent_task or "") or parent.span
        span = _start(
            "invoke_workflow",
            trace.set_span_in_context(above),
            SpanKind.INTERNAL,
            above.get_span_context().trace_id,
            traces.workflow_span_id(env.stream),
            round(env.recorded_at * 1e9),
        )
        if span.is_recording():
            span.set_attributes(
                {
                    "gen_ai.operation.name": "invoke_workflow",
                    "cardbus.root_id": env.stream,
                    "cardbus.plan_id": data.plan_id,
                    "cardbus.run.parent_root": data.parent_root or "",
                    "cardbus.run.parent_task": data.parent_task or "",
                }
            )
        self._runs[env.stream] = _Run(span)
        for created in early:
            self.on_event(created)

    def _task_span(self, env: Envelope, data: ev.TaskCreated, parent: Span, t: int) -> Span:
        ctx = trace.set_span_in_context(parent)
        span = _start(
            f"task {data.capability or 'unknown'}",
            ctx,
            SpanKind.INTERNAL,
            None,
            traces.task_span_id(env.stream),
            t,
        )
        if span.is_recording():
            attrs: dict[str, Any] = {
                "cardbus.task.id": env.stream,
                "cardbus.root_id": env.correlation_id,
            }
            if data.capability:
                attrs["cardbus.task.capability"] = data.capability
            if data.parent_id:
                attrs["cardbus.task.parent_id"] = data.parent_id
            if data.role:
                attrs["cardbus.task.role"] = data.role
            span.set_attributes(attrs)
        return span

    def _attempt_span(self, env: Envelope, data: ev.TaskDispatched, task: Span, t: int) -> Span:
        name = self._agent_name(data.agent_id) or data.agent_id
        span = _start(
            f"invoke_agent {name}",
            trace.set_span_in_context(task),
            SpanKind.CLIENT,
            None,
            traces.span_id_for(env.event_id),
            t,
        )
        if span.is_recording():
            span.set_attributes(
                {
                    "gen_ai.operation.name": "invoke_agent",
                    "gen_ai.agent.id": data.agent_id,
                    "gen_ai.agent.name": name,
                    "cardbus.task.id": env.stream,
                    "cardbus.task.attempt": data.attempt,
                }
            )
        return span

    def _end_run(self, root_id: str, run: _Run, env: Envelope, t: int) -> None:
        del self._runs[root_id]
        status = env.type.split(".")[1]
        for task_id, agent_id in list(run.attempts):
            _end_calls(run, task_id, agent_id, t)
        for span in run.attempts.values():
            _end(span, t, "open")
        for span in run.tasks.values():
            _end(span, t, "open", attribute="cardbus.task.status")
        span = run.span
        if span.is_recording():
            _add_event(span, traces.span_event(env))
            span.set_attribute("cardbus.run.status", status)
            if isinstance(env.data, ev.RunCompleted) and env.data.degraded:  # optional tasks
                span.set_attribute("cardbus.run.degraded", list(env.data.degraded))
            reason = getattr(env.data, "reason", None)
            if isinstance(env.data, (ev.RunFailed, ev.RunHalted)):
                span.set_attribute("error.type", str(reason or status))
                span.set_status(Status(StatusCode.ERROR, str(reason or "")))
        span.end(end_time=t)

    def send_task(self, bus: Bus, agent_id: str, card: TaskCard) -> Awaitable[None]:
        """``bus.send_task`` inside a PRODUCER span (under the attempt's) that the card carries."""
        if not enabled():
            return bus.send_task(agent_id, card)
        return send_task(bus, agent_id, card, self.context(card.root_id, card.task_id, agent_id))

    def close(self) -> None:
        """End the spans of runs still open (the orchestrator stops before they finish)."""
        for run in self._runs.values():
            for span, *_ in run.calls.values():
                span.end()
            for span in [*run.attempts.values(), *run.tasks.values(), run.span]:
                if span.is_recording():
                    span.set_attribute("cardbus.run.status", "open")
                span.end()
        self._runs.clear()


_TASK_TYPES = frozenset(ev.TASK_EVENT_TYPES)
_JOURNAL_TYPES = (
    ev.ModelRequested,
    ev.ModelAnswered,
    ev.ToolRequested,
    ev.ToolCalled,
    ev.ToolEffectUnknown,
)
_CLOSE_ALL: dict[type, str] = {
    ev.RevisionRequested: "revision",
    ev.TaskRetryScheduled: "retry",
    ev.TaskFailed: "failed",
    ev.TaskHalted: "halted",
    ev.TaskCancelled: "cancelled",
    ev.TaskNeedsInput: "needs_input",
    ev.ApprovalRequested: "awaiting_approval",
}
_ERROR_OUTCOMES = frozenset({"retry", "failed", "halted", "cancelled"})


def _outcome_error(outcome: str, data: Any) -> str | None:
    if outcome not in _ERROR_OUTCOMES:
        return None
    reason = str(getattr(data, "reason", "") or outcome)
    if outcome == "retry":
        head = reason.split(":", 1)[0].strip()
        return head if head and " " not in head and len(head) <= 64 else "error"
    return outcome


_EARLY_ROOTS = 256  # runs whose task.created wait for their run.started (RunTracing)


def _ids(root_id: str) -> tuple[int, int]:
    return traces.trace_id_for(root_id), traces.workflow_span_id(root_id)


def _start(
    name: str,
    context: otel_context.Context | None,
    kind: SpanKind,
    trace_id: int | None,
    span_id: int,
    start_time: int | None = None,
) -> Span:
    """A span started with the ids asked for (when the tracer takes chosen ids)."""
    token = _CHOSEN.set((trace_id, span_id))
    try:
        return tracer().start_span(name, context=context, kind=kind, start_time=start_time)
    finally:
        _CHOSEN.reset(token)


def _end(
    span: Span,
    t: int,
    outcome: str,
    error: str | None = None,
    message: str = "",
    attribute: str = "cardbus.attempt.outcome",
) -> None:
    if span.is_recording():
        span.set_attribute(attribute, outcome)
        if error:
            span.set_attribute("error.type", error)
            span.set_status(Status(StatusCode.ERROR, message or error))
    span.end(end_time=t)


def _end_task(
    run: _Run, task_id: str, t: int, status: str, error: str | None = None, message: str = ""
) -> None:
    span = run.tasks.pop(task_id, None)
    run.journals.pop(task_id, None)
    if span is not None:
        _end(span, t, status, error, message, attribute="cardbus.task.status")


def _end_call(span: Span, call: Any, task_id: str, t: int) -> None:
    if span.is_recording():
        attrs = traces.call_attributes(call, task_id)
        span.set_attributes(attrs)
        if "error.type" in attrs:
            span.set_status(Status(StatusCode.ERROR, call.error or attrs["error.type"]))
    span.end(end_time=t)


def _end_calls(run: _Run, task_id: str, agent_id: str, t: int) -> None:
    """End the spans of an attempt's calls still open (no answer came) with the attempt."""
    for key, (span, call, tid, aid) in list(run.calls.items()):
        if (tid, aid) == (task_id, agent_id):
            del run.calls[key]
            _end_call(span, call, tid, t)


def _add_event(span: Span, record: traces.SpanEventRecord) -> None:
    span.add_event(record.name, dict(record.attributes), round(record.time * 1e9))


def _record_usage(span: Span, data: ev.TaskResultSubmitted) -> None:
    span.set_attributes(
        {
            "gen_ai.usage.input_tokens": data.usage.input_tokens,
            "gen_ai.usage.output_tokens": data.usage.output_tokens,
            "cardbus.result.status": data.status,
        }
    )
    if data.status == "failed":
        error = data.error or ""
        head = error.split(":", 1)[0].strip()
        span.set_attribute("error.type", head if head and " " not in head else "agent_error")
        span.set_status(Status(StatusCode.ERROR, error))


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

    async def traced(card: TaskCard) -> None:
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

    def handle(card: TaskCard) -> Awaitable[None]:
        # a plain function: untraced, the handler's own coroutine is the one awaited (an
        # ``async def`` here would add a coroutine to create and step for every card)
        return handler(card) if not enabled() else traced(card)

    return handle


def invoke_agent(
    agent: type[Agent], card: TaskCard, llm: LLM | None
) -> Coroutine[Any, Any, ResultCard]:
    """``agent.run(card, llm)`` in a ``handle <name>`` span with the agent's attributes.

    Not a second ``invoke_agent``: the GenAI conventions' agent invocation is the
    orchestrator's attempt span (CLIENT, dispatch to outcome, live and exported), one per
    attempt; this INTERNAL span is the handler's own work inside it, named apart so that
    a backend counting ``invoke_agent`` spans counts each attempt once.

    A plain function returning the coroutine to await: untraced, that is ``agent.run``'s
    own (no wrapping coroutine per card)."""
    if not enabled():
        return agent.run(card, llm)
    return _invoke_traced(agent, card, llm)


async def _invoke_traced(agent: type[Agent], card: TaskCard, llm: LLM | None) -> ResultCard:
    name = agent.name or agent.agent_id
    parent = None
    if not trace.get_current_span().get_span_context().is_valid:
        parent = context_from_traceparent(card.traceparent)
    with tracer().start_as_current_span(
        f"handle {name}", context=parent, kind=SpanKind.INTERNAL
    ) as span:
        recording = span.is_recording()
        if recording:
            span.set_attributes(
                {
                    "cardbus.operation.name": "handle",
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
        began = time.monotonic()
        try:
            result = await agent.run(card, llm)
        except BaseException:  # cancelled (a hung handler let go, a worker stopping)
            if recording:
                _past_deadline(span, card, began)
            raise
        if recording:
            _record_result(span, result)
            if result.status != "failed":
                _past_deadline(span, card, began)
        return result


def _past_deadline(span: Span, card: TaskCard, began: float) -> None:
    """An attempt that ran past its deadline (the orchestrator has timed it out): an error."""
    took = time.monotonic() - began
    if card.timeout_s and took > card.timeout_s:
        span.set_attribute("error.type", "timeout")
        deadline = f"{card.timeout_s * 1000:.0f}ms"
        span.set_status(
            Status(StatusCode.ERROR, f"ran {took * 1000:.0f}ms, past its {deadline} deadline")
        )


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
