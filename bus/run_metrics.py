"""cardbus's own metrics, and the GenAI client metrics, from the events the orchestrator folds.

:class:`RunMetrics` is an orchestrator observer: it sees each event once, when it is newly
folded while the orchestrator runs (never the replay of the log at start-up), and only
events of the runs this orchestrator owns (its partitions), so a run's events are counted
once across the processes that share a log. Instruments, on the meter ``cardbus``:

=============================== ========= =========== ========================================
name                            kind      unit        one record per
=============================== ========= =========== ========================================
``cardbus.runs.finished``       counter   ``{run}``   run that ended, by ``cardbus.run.status``
``cardbus.run.duration``        histogram ``s``       run that ended (from its ``run.started``)
``cardbus.tasks.finished``      counter   ``{task}``  task that ended, by ``cardbus.task.status``
``cardbus.task.queue_wait``     histogram ``s``       attempt answered: dispatch to its start
``cardbus.task.retries``        counter   ``{retry}`` retry scheduled, by its reason
``cardbus.model.cost``          counter   ``{USD}``   live model call with a price
=============================== ========= =========== ========================================

plus ``gen_ai.client.token.usage`` and ``gen_ai.client.operation.duration``
(:mod:`cardbus.bus.genai_metrics`) per live model call. A replayed call (answered from the
journal) spent nothing and is not counted. What this process did not see is not made up:
the duration of a run started before it, or the queue wait of an attempt dispatched before
it, is not recorded (the run and its tasks are still counted when they end).

Attribute values are low-cardinality by design (statuses, capabilities, agent ids, model
names, the first word of a retry's reason): no task or run ids, which belong in traces.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from opentelemetry import metrics

from cardbus.bus import genai_metrics, meters
from cardbus.eventstore import events as ev
from cardbus.eventstore.envelope import Envelope

__all__ = ["RUN_DURATION_BUCKETS", "WAIT_BUCKETS", "RunMetrics"]

#: seconds: a run of a few tasks to one of a working day
RUN_DURATION_BUCKETS = [0.1, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1800, 3600, 7200, 28800]
#: seconds: a card taken at once to one that waited for an agent for minutes
WAIT_BUCKETS = [0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 900]

_TASK_TYPES = frozenset(ev.TASK_EVENT_TYPES)
_TASK_END: dict[type, str] = {
    ev.TaskCompleted: "completed",
    ev.TaskFailed: "failed",
    ev.TaskHalted: "halted",
    ev.TaskCancelled: "cancelled",
}


class _Instruments:
    def __init__(self, meter: metrics.Meter) -> None:
        self.runs = meter.create_counter(
            "cardbus.runs.finished", unit="{run}", description="Runs that ended, by status."
        )
        self.run_duration = meter.create_histogram(
            "cardbus.run.duration",
            unit="s",
            description="Time from a run's start to its end.",
            explicit_bucket_boundaries_advisory=RUN_DURATION_BUCKETS,
        )
        self.tasks = meter.create_counter(
            "cardbus.tasks.finished", unit="{task}", description="Tasks that ended, by status."
        )
        self.queue_wait = meter.create_histogram(
            "cardbus.task.queue_wait",
            unit="s",
            description="Time a dispatched card waited before an agent's handler started it.",
            explicit_bucket_boundaries_advisory=WAIT_BUCKETS,
        )
        self.retries = meter.create_counter(
            "cardbus.task.retries", unit="{retry}", description="Retries scheduled, by reason."
        )
        self.cost = meter.create_counter(
            "cardbus.model.cost",
            unit="{USD}",
            description="What live model calls cost, as priced when they were recorded.",
        )


def _short(reason: str) -> str:
    """The first word of a reason (``timeout: ...`` -> ``timeout``): low cardinality."""
    head = reason.split(":", 1)[0].strip()
    return head if head and " " not in head and len(head) <= 64 else "other"


class _Task:
    """What an open task's metrics need of its earlier events."""

    __slots__ = ("capability", "dispatched", "requested", "root_id")

    def __init__(self, root_id: str, capability: str) -> None:
        self.root_id = root_id
        self.capability = capability
        self.dispatched: dict[str, float] = {}  # agent -> the attempt's dispatch time
        # (execution, seq) -> (model asked for, provider, requested at)
        self.requested: dict[tuple[str, int], tuple[str, str, float]] = {}

    def attributes(self, **attrs: Any) -> dict[str, Any]:
        if self.capability:
            attrs["cardbus.task.capability"] = self.capability
        return attrs


class RunMetrics:
    """Records the metrics of the runs an orchestrator owns, fed its folded events.

    ``owns(root_id)``: whether this orchestrator decides that run (None: every run);
    ``state``: the orchestrator's ``RunState``, where the capability of a task created
    before this process started (a resumed run) is found (its ``tasks``, read each time:
    a snapshot's restore replaces that table).
    """

    def __init__(self, owns: Callable[[str], bool] | None = None, state: Any = None) -> None:
        self._owns = owns
        self._state = state
        self._run_started: dict[str, float] = {}  # root -> its run.started's time
        self._tasks: dict[str, _Task] = {}  # the open tasks seen

    def _task(self, task_id: str, root_id: str) -> _Task:
        task = self._tasks.get(task_id)
        if task is None:
            view = self._state.tasks.get(task_id) if self._state is not None else None
            capability = view.created.capability if view is not None else ""
            task = self._tasks[task_id] = _Task(root_id, capability)
        return task

    def observe(self, env: Envelope) -> None:
        """Fold one event (an orchestrator observer)."""
        if not meters.enabled():
            return
        if self._owns is not None and not self._owns(env.correlation_id):
            return
        data = env.data
        t = env.recorded_at
        match data:
            case ev.RunStarted():
                self._run_started[env.stream] = t
                return
            case ev.RunCompleted() | ev.RunFailed() | ev.RunHalted():
                self._run_ended(env.stream, data, t)
                return
            case ev.ModelRequested() | ev.ModelAnswered():
                task_id = data.task_id
            case _ if type(data) in _TASK_TYPES:
                task_id = env.stream
            case _:
                return
        task = self._task(task_id, env.correlation_id)
        match data:
            case ev.ModelRequested():
                task.requested[(data.execution, data.seq)] = (data.model, data.provider, t)
            case ev.ModelAnswered():
                self._answered(task, data, t)
            case ev.TaskCreated():
                task.capability = data.capability
            case ev.TaskDispatched():
                task.dispatched[data.agent_id] = t
            case ev.TaskResultSubmitted():
                self._result(task, data, t)
            case ev.TaskRejected() | ev.TaskTimedOut():
                task.dispatched.pop(data.agent_id, None)
            case ev.TaskRetryScheduled():
                attrs = task.attributes(**{"cardbus.retry.reason": _short(data.reason)})
                self._made().retries.add(1, attrs)
            case _:
                status = _TASK_END.get(type(data))
                if status is not None:
                    del self._tasks[task_id]
                    attrs = task.attributes(**{"cardbus.task.status": status})
                    self._made().tasks.add(1, attrs)

    def _made(self) -> _Instruments:
        made: _Instruments = meters.instruments(_Instruments)
        return made

    def _answered(self, task: _Task, data: ev.ModelAnswered, t: float) -> None:
        asked = task.requested.pop((data.execution, data.seq), None)
        if data.replayed_from is not None:  # answered from the journal: nothing spent
            return
        # a request folded before this process started is not known: its model and provider
        # are left out, not guessed from the answer
        model, provider, at = asked if asked is not None else ("", "", t)
        genai_metrics.record_model_call(
            provider=provider,
            request_model=model,
            response_model=data.model,
            duration_s=data.latency_s if data.latency_s > 0 else t - at,
            input_tokens=data.input_tokens,
            output_tokens=data.output_tokens,
            error_type=(data.error_type or "error") if data.error is not None else None,
        )
        if data.cost_usd is not None and data.error is None:
            attrs = {"gen_ai.agent.id": data.agent_id}
            if provider:
                attrs["gen_ai.provider.name"] = provider
            if model:
                attrs["gen_ai.request.model"] = model
            self._made().cost.add(max(0.0, float(data.cost_usd)), attrs)

    def _result(self, task: _Task, data: ev.TaskResultSubmitted, t: float) -> None:
        dispatched = task.dispatched.pop(data.agent_id, None)
        if dispatched is None:  # dispatched before this process started: not seen
            return
        # the handler's start: the result's arrival less the time it ran (durations each
        # measured on one host, so no two hosts' clocks are compared)
        wait = max(0.0, t - data.duration_s - dispatched)
        self._made().queue_wait.record(wait, task.attributes(**{"gen_ai.agent.id": data.agent_id}))

    def _run_ended(self, root_id: str, data: Any, t: float) -> None:
        if isinstance(data, ev.RunCompleted):
            status = "completed"
        elif isinstance(data, ev.RunHalted):
            status = "halted"
        else:
            status = "cancelled" if data.cancelled else "failed"
        attrs: dict[str, Any] = {"cardbus.run.status": status}
        if isinstance(data, ev.RunCompleted):
            attrs["cardbus.run.degraded"] = bool(data.degraded)
        for task_id in [k for k, task in self._tasks.items() if task.root_id == root_id]:
            del self._tasks[task_id]  # tasks the run's end left open: nothing more comes
        made = self._made()
        made.runs.add(1, attrs)
        started = self._run_started.pop(root_id, None)
        if started is not None:
            made.run_duration.record(max(0.0, t - started), attrs)
