"""The orchestrator's working state: a fold over the log, nothing more.

``RunState.apply(envelope)`` is the only way it changes, so restarting the
orchestrator and replaying the log gives back exactly the state it had; the
version of every stream it has applied makes ``apply`` idempotent (an event
seen twice, once from our own append and once from the log, counts once).
"""

from __future__ import annotations

import collections
import contextlib
import heapq
import logging
import math
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar, overload

import msgspec

from cardbus.agents.cards import AgentCard
from cardbus.bus.orchestrator import budget as _budget
from cardbus.bus.orchestrator import limit_waits as _limit_waits
from cardbus.bus.orchestrator import loop_pause as _loop_pause
from cardbus.bus.orchestrator import waits as _waits
from cardbus.bus.orchestrator.empties import EMPTY, empty, plus, with_item
from cardbus.bus.orchestrator.hostloss import is_host_loss
from cardbus.bus.orchestrator.selection import AgentStat
from cardbus.eventstore import Envelope, TaskState, transition
from cardbus.eventstore import events as ev
from cardbus.eventstore.errors import IllegalTransition
from cardbus.eventstore.states import TERMINAL
from cardbus.projections.agent_stats import AgentStatsFold

__all__ = ["RunState", "RunView", "TaskView"]

log = logging.getLogger(__name__)


@dataclass(slots=True)
class TaskExtra:
    """The part of a ``TaskView`` few tasks ever have, each field read and written as the
    view's own (``task.under_review``): made at the first write of one of them."""

    # who cancelled it, when that stops its dependents too (``optional``): "run" for the
    # whole run's cancel, the dependency's task id for a cascade; "" otherwise
    cancel_cause: str = ""
    cancelled_by: str = ""  # task.cancelled's actor (who cancelled it)
    review_round: int = 0
    review: tuple[ev.ReviewIssue, ...] = ()
    under_review: str | None = None  # reviewer task id while a review runs
    output_in_review: Any = None
    supplement: Any = None
    waiting_for: str | None = None  # supplementary task id while it runs
    needs_input_rounds: int = 0
    approved: bool = False
    proposed_output: Any = None
    proposed_agent: str = ""
    has_proposal: bool = False  # an approval asked about an output in hand (a fan-out tie)
    previous_output: Any = None  # the output the latest revision was asked to improve
    quality_met: bool = True  # from task.completed: False if its review never passed
    open_issues: tuple[ev.ReviewIssue, ...] = ()
    # a child-run task: the child run of its current attempt and that attempt's deadline
    # (``task.child_started``; ``bus.orchestrator.child_runs``)
    child_root: str = ""
    child_deadline: float = 0.0
    # how that child ended, once it has: (finished, its outputs, its detail), kept here so
    # a child retired from memory, or left out of a snapshot, still settles the task
    child_end: tuple[str, Any, str] | None = None
    # agent -> (its run time left, its calls waiting) while model calls wait for the
    # provider's limit: the deadline stops meanwhile (``limit_waits``)
    limit_waits: Mapping[str, tuple[float, int]] = field(default_factory=empty)
    # a person's word awaited, with its deadline and who may answer (``waits``), and the
    # tool calls held for review, call -> (tool, arguments), a policy may answer
    wait: _waits.Waiting | None = None
    held: Mapping[str, tuple[str, Any]] = field(default_factory=empty)


T = TypeVar("T")


class _Rare(Generic[T]):
    """A ``TaskView`` field kept in its ``TaskExtra``: its default while the view has none,
    which a write of anything but that very default makes."""

    __slots__ = ("default", "name")

    def __init__(self, default: T) -> None:
        self.default = default
        self.name = ""

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    @overload
    def __get__(self, view: None, owner: type) -> _Rare[T]: ...

    @overload
    def __get__(self, view: TaskView, owner: type) -> T: ...

    def __get__(self, view: TaskView | None, owner: type) -> T | _Rare[T]:
        if view is None:
            return self
        extra = view.extra
        return self.default if extra is None else getattr(extra, self.name)

    def __set__(self, view: TaskView, value: T) -> None:
        extra = view.extra
        if extra is None:
            if value is self.default:  # None, "", 0, False, (), EMPTY: nothing to keep
                return
            extra = view.extra = TaskExtra()
        setattr(extra, self.name, value)


# slots: thousands of open tasks and runs are held at once; an instance without a
# __dict__ is a quarter of the size and its fields are quicker to read
@dataclass(slots=True)
class TaskView:
    task_id: str
    created: ev.TaskCreated
    state: TaskState | None = None
    attempt: int = 0  # number of the latest dispatched attempt
    failures: int = 0  # attempts that failed, timed out or broke the output schema
    host_losses: int = 0  # attempts that died with the runtime's process (``hostloss``)
    # Mappings and sets are values (``empties``), replaced (never changed) on a write:
    # most tasks of a waiting run are never dispatched, and the shared empty mapping or
    # frozenset, or the shared set of one agent, is no object of its own
    dispatched_to: Mapping[str, float] = field(default_factory=empty)  # agent -> deadline
    assigned: frozenset[str] = frozenset()  # every agent any attempt was sent to
    results: Mapping[str, ev.TaskResultSubmitted] = field(default_factory=empty)  # this attempt
    # every result recorded, as (attempt, agent, replica, delivery): the same reply delivered
    # again is known as such (``repeats``)
    answered: frozenset[tuple[int, str, str, int]] = frozenset()
    settled: frozenset[int] = frozenset()  # attempts already decided
    excluded: frozenset[str] = frozenset()  # agents that rejected this task
    # agents an attempt of this task failed on (a reason with a failure weight): within the
    # run each counts as a full recent failure for the retries (selection's penalty)
    failed_on: frozenset[str] = frozenset()
    # Tuples, replaced (never changed) on a write like the frozensets: a waiting task has
    # none of them, and the shared empty tuple costs nothing where a list each was 56 bytes
    rejections: tuple[str, ...] = ()  # "agent: reason (detail)", latest 5
    not_before: float = 0.0
    output: Any = None
    reason: str = ""
    error: str = ""  # what the failure says beyond its reason (task.failed's error)
    delivered: int = 0  # the highest delivery count recorded for the current attempt
    # the current attempt's limit from its start (0: its dispatch's deadline is the one),
    # and the agents that took its card (task.started, or a result): ``deadlines``
    start_to_close_s: float = 0.0
    started: frozenset[str] = frozenset()
    # what few tasks ever have (a review, a question, an approval, a child run, a person's
    # wait, a cancel's cause): in one object made at the first such write, read through the
    # fields below (``TaskExtra``); None for a waiting run's tasks, 170 bytes less each
    extra: TaskExtra | None = None

    cancel_cause = _Rare[str]("")
    cancelled_by = _Rare[str]("")
    review_round = _Rare[int](0)
    review = _Rare[tuple[ev.ReviewIssue, ...]](())
    under_review = _Rare[str | None](None)
    output_in_review = _Rare[Any](None)
    supplement = _Rare[Any](None)
    waiting_for = _Rare[str | None](None)
    needs_input_rounds = _Rare[int](0)
    approved = _Rare[bool](False)
    proposed_output = _Rare[Any](None)
    proposed_agent = _Rare[str]("")
    has_proposal = _Rare[bool](False)
    previous_output = _Rare[Any](None)
    quality_met = _Rare[bool](True)
    open_issues = _Rare[tuple[ev.ReviewIssue, ...]](())
    child_root = _Rare[str]("")
    child_deadline = _Rare[float](0.0)
    child_end = _Rare[tuple[str, Any, str] | None](None)
    limit_waits = _Rare[Mapping[str, tuple[float, int]]](EMPTY)
    wait = _Rare[_waits.Waiting | None](None)
    held = _Rare[Mapping[str, tuple[str, Any]]](EMPTY)

    @property
    def terminal(self) -> bool:
        return self.state in TERMINAL


@dataclass(slots=True)
class RunView:
    root_id: str
    started: ev.RunStarted
    tasks: list[str] = field(default_factory=list)  # task ids in creation order
    names: dict[str, str] = field(default_factory=dict)  # plan task id -> task id
    tokens: int = 0
    # Like TaskView's: values replaced on a write; a waiting run plans nothing and starts
    # no child, and its empty mappings and tuples are the shared ones
    loop_counts: Mapping[str, int] = field(default_factory=empty)  # hash -> distinct tasks
    loop_seen: frozenset[tuple[str, str]] = frozenset()  # replaced on a write (TaskView)
    finished: str | None = None  # "completed" | "failed" | "halted" | "cancelled"
    finish_event: Any = None
    # a run planned from a goal (started.planning): its planning rounds, from the log
    planners: tuple[str, ...] = ()  # planning task ids, by round
    proposals: Mapping[int, ev.PlanProposed] = field(default_factory=empty)  # round -> it
    refusals: Mapping[int, ev.PlanRefused] = field(default_factory=empty)
    accepted: tuple[ev.PlanAccepted, ...] = ()
    expected: tuple[str, ...] = ()  # task ids the plan(s) will create
    position: int = 0  # of its run.started in the log: the order of admission (admission)
    budget: _budget.Ledger | None = None  # what it spent and holds, if it has budgets
    children: tuple[str, ...] = ()  # child runs its tasks started
    # a run paused for a person (``loop_pause``): the pause while open, who stopped it,
    # and the tasks a person let go on past the loop that paused it
    paused: ev.RunPaused | None = None
    stopped_by: str = ""
    loop_pass: frozenset[str] = frozenset()

    def planning_open(self) -> bool:
        """A goal run whose latest planning has not been accepted yet (or not begun)."""
        if self.started.planning is None:
            return False
        if not self.planners:
            return not self.started.task_ids
        return not self.accepted or self.accepted[-1].round != len(self.planners)


class RunState:
    """Runs, tasks, agents and per-agent statistics, as folded from the log."""

    def __init__(self, retain_finished: int | None = None) -> None:
        """``retain_finished``: keep at most that many finished runs (the latest), for a
        long-lived orchestrator; older ones are dropped with their tasks (the log has
        them). ``None`` keeps everything."""
        self.retain_finished = retain_finished
        # finished runs, oldest first, with the position of the event that finished each
        self._finished: collections.deque[tuple[str, int]] = collections.deque()
        # Every event up to here is folded (the orchestrator's, as its log follower hands
        # the log on): a finished run leaves memory only once its end is at or below it.
        # Forgotten sooner, its events coming back from a follower behind looked new
        # (their versions went with it) and were folded again: the run open again with no
        # tasks, every event of its tasks an anomaly (10,000 of them at 1,000 runs in
        # flight, the follower 26,000 positions behind). A state folded in log order (no
        # follower) has folded everything it was given: infinity.
        self.folded_floor: float = math.inf
        self.retire_at: float = math.inf  # the floor at which the next run is due to go
        self._plan_streams: dict[str, str] = {}  # root -> its plan's stream
        self.runs: dict[str, RunView] = {}
        self.open: dict[str, RunView] = {}  # runs not finished yet, in start order
        self.runs_changed = 0  # counts runs started and finished (admission recomputes)
        self.tasks: dict[str, TaskView] = {}
        self.agents: dict[str, AgentCard] = {}
        self.agent_leases: dict[str, float] = {}  # agent -> the lease_s it registered with
        self.plans: dict[str, str] = {}  # plan id -> root id
        self.plan_digests: dict[str, str] = {}  # plan id -> digest of its body (PlanConflict)
        self.versions: dict[str, int] = {}
        self.position = 0
        # (time, root): when a run has a deadline or backoff due, for the clock to look
        self.wakeups: list[tuple[float, str]] = []
        self._wake_limit = 1000
        self.on_wake: Callable[[float], None] | None = None  # told of each new wakeup
        self.on_open: Callable[[], None] | None = None  # told of each run opened (the clock)
        # the agent-statistics projection's counting rules: a timeout or an
        # output-schema mismatch is a failure, a rejection is not a run
        bounded = retain_finished is not None
        self._stats = AgentStatsFold(
            latency_window=1000 if bounded else None,
            forget_finished=bounded,
            capability_of=self._open_capability,  # no row per task until its dispatch
        )
        self.anomalies: collections.deque[str] = collections.deque(maxlen=1000)
        # failure reasons recorded in long-term memory, per (agent, capability): the latest
        # 20 of each, key -> (recorded at, reason); selection's recent-failure penalty
        self.failures: dict[tuple[str, str], collections.OrderedDict[str, tuple[float, str]]] = {}
        self._failure_keys: dict[str, tuple[str, str]] = {}

    def due(self, now: float) -> set[str]:
        """Open runs with a deadline or backoff that has come (each wakeup counts once)."""
        roots: set[str] = set()
        while self.wakeups and self.wakeups[0][0] <= now:
            root = heapq.heappop(self.wakeups)[1]
            if root in self.open:
                roots.add(root)
        return roots

    def _wake(self, at: float, root_id: str) -> None:
        heapq.heappush(self.wakeups, (at, root_id))
        if self.on_wake is not None:
            self.on_wake(at)
        if len(self.wakeups) > self._wake_limit:
            # runs that finished before their deadlines came leave their wakeups
            # behind: drop those (at most once per doubling, so cheap on average)
            self.wakeups = [w for w in self.wakeups if w[1] in self.open]
            heapq.heapify(self.wakeups)
            self._wake_limit = 2 * len(self.wakeups) + 1000

    # -- statistics read by selection ---------------------------------------

    def _open_capability(self, task_id: str) -> str | None:
        """The statistics' view of a task: its capability while it is known and open."""
        task = self.tasks.get(task_id)
        if task is None or task.state in TERMINAL:
            return None
        return task.created.capability

    def get(self, agent_id: str, capability: str) -> AgentStat:
        runs, success_rate, p50_s = self._stats.for_selection(agent_id, capability)
        if runs == 0:  # no outcome yet: selection's prior, with any latency seen
            return AgentStat(p50_s=p50_s)
        return AgentStat(runs=runs, success_rate=success_rate, p50_s=p50_s)

    def failure_penalty(
        self, agent_id: str, capability: str, now: float, half_life_s: float
    ) -> float:
        """``min(1, sum of weight(reason) * 0.5 ** (age / half_life_s))`` over the failures
        recorded for this agent on this capability (see ``selection``)."""
        recent = self.failures.get((agent_id, capability))
        if not recent:
            return 0.0
        total = 0.0
        for at, reason in recent.values():
            weight = _FAILURE_WEIGHT.get(reason.split(":", 1)[0].strip(), 0.0)
            total += weight * 0.5 ** (max(0.0, now - at) / half_life_s)
        return min(1.0, total)

    def _failure_record(self, at: float, data: ev.MemoryWritten) -> None:
        value = data.value if isinstance(data.value, dict) else {}
        agent, capability = str(value.get("agent_id") or ""), str(value.get("capability") or "")
        if not agent or not capability:
            return
        pair = (agent, capability)
        recent = self.failures.setdefault(pair, collections.OrderedDict())
        recent.pop(data.key, None)
        recent[data.key] = (at, str(value.get("reason") or ""))
        self._failure_keys[data.key] = pair
        while len(recent) > 20:
            self._failure_keys.pop(recent.popitem(last=False)[0], None)

    # -- the fold ------------------------------------------------------------

    def apply(self, env: Envelope) -> bool:
        """Apply one event; False if it was already applied (idempotent)."""
        stream, version = env.stream, env.version
        versions = self.versions
        if version <= versions.get(stream, 0):
            return False
        versions[stream] = version
        if env.position > self.position:  # not max(): this runs for every event
            self.position = env.position
        self._stats.apply(env)
        self._fold(env)
        return True

    @contextlib.contextmanager
    def tentatively(self, drafts: Sequence[Envelope]) -> Iterator[None]:
        """Fold a new run's first events for the length of the block, then forget them.

        The orchestrator decides a run's first step on it before its creation is
        written, so that the creation and the first dispatches share one commit.
        ``drafts`` may only create (``plan.submitted``, ``run.started``, a plan
        task's ``task.created``), each the first event of a stream this state
        has never seen: forgetting them is then exactly dropping those streams.
        The block must not await (nothing else may see or change the state).
        """
        roots = {env.stream for env in drafts if isinstance(env.data, ev.RunStarted)}
        if len({env.stream for env in drafts}) != len(drafts):
            raise ValueError("two drafts of one stream")
        for env in drafts:
            data = env.data
            fresh = env.version == 1 and env.stream not in self.versions
            if isinstance(data, ev.PlanSubmitted):
                fresh = fresh and data.plan_id not in self.plans
            elif isinstance(data, ev.TaskCreated):
                fresh = fresh and data.parent_id is None and data.root_id in roots
            elif not isinstance(data, ev.RunStarted):
                fresh = False
            if not fresh:
                raise ValueError(f"not a new stream's creation: {env.stream} {type(data)}")
        try:
            for env in drafts:
                self.versions[env.stream] = 1
                self._fold(env)  # not the statistics: nothing is counted of a draft
            yield
        finally:
            for env in drafts:
                data = env.data
                self.versions.pop(env.stream, None)
                self.tasks.pop(env.stream, None)
                if isinstance(data, ev.RunStarted):
                    self.runs.pop(env.stream, None)
                    self.open.pop(env.stream, None)
                elif isinstance(data, ev.PlanSubmitted):
                    self.plans.pop(data.plan_id, None)
                    self.plan_digests.pop(data.plan_id, None)
                    self._plan_streams.pop(data.root_id, None)

    def _fold(self, env: Envelope) -> None:
        data = env.data
        if type(data) in _TASK_TYPES:  # most events: tested first, by one set lookup
            self._apply_task(env)
        elif isinstance(data, ev.RunStarted):
            self._start_run(env.stream, data, env.position)
        elif type(data) in _limit_waits.FOLDED:  # a model call waiting for its limit
            task = self.tasks.get(env.stream)
            if task is not None:
                _limit_waits.fold(self, task, env)
        elif type(data) in _MODEL_TYPES:  # a journaled model call: held against budgets
            task = self.tasks.get(env.stream)
            run = self.runs.get(task.created.root_id) if task is not None else None
            if run is not None:
                self._fold_budgets(run, task, env)
        elif type(data) in _waits.FOLDED:  # a tool call held for review, or its answer
            _waits.fold_call(self, env)
        elif type(data) in _loop_pause.FOLDED:  # a run paused for a person, or the answer
            _loop_pause.fold(self, env)
        elif isinstance(data, (ev.PlanProposed, ev.PlanRefused, ev.PlanAccepted)):
            self._plan_event(env.stream, data)
        elif isinstance(data, ev.PlanSubmitted):
            self.plans[data.plan_id] = data.root_id
            if data.plan_digest:
                self.plan_digests[data.plan_id] = data.plan_digest
            self._plan_streams[data.root_id] = env.stream
        elif isinstance(data, ev.AgentRegistered):
            try:
                self.agents[data.agent_id] = msgspec.convert(data.card, AgentCard)
                self.agent_leases[data.agent_id] = data.lease_s
            except Exception as e:  # a bad card in the log must not stop the orchestrator
                self._anomaly(f"{env.event_id}: unreadable agent card: {e}")
        elif isinstance(data, ev.AgentDeregistered):
            self.agents.pop(data.agent_id, None)
        elif isinstance(data, (ev.RunCompleted, ev.RunFailed, ev.RunHalted)):
            run = self.runs.get(env.stream)
            if run is not None:
                run.finished = _finish(data)
                run.finish_event = data
                self.open.pop(env.stream, None)
                self.runs_changed += 1
                self._child_ended(run)
                self._retire(env.stream, env.position)
        elif isinstance(data, ev.MemoryWritten):
            if data.kind == "failure":
                self._failure_record(env.recorded_at, data)
        elif isinstance(data, ev.MemoryForgotten):
            pair = self._failure_keys.pop(data.key, None)
            if pair is not None and pair in self.failures:
                self.failures[pair].pop(data.key, None)

    def _child_ended(self, run: RunView) -> None:
        """A child run ended: its parent task (folded here, started it) keeps how."""
        parent = self.tasks.get(run.started.parent_task or "")
        if parent is not None and parent.child_root == run.root_id and run.finished:
            data = run.finish_event
            outputs = dict(data.outputs) if isinstance(data, ev.RunCompleted) else {}
            parent.child_end = (run.finished, outputs, str(getattr(data, "detail", "") or ""))

    def _plan_event(
        self, root_id: str, data: ev.PlanProposed | ev.PlanRefused | ev.PlanAccepted
    ) -> None:
        run = self.runs.get(root_id)
        if run is None:
            return
        if isinstance(data, ev.PlanProposed):
            run.proposals = with_item(run.proposals, data.round, data)
        elif isinstance(data, ev.PlanRefused):
            run.refusals = with_item(run.refusals, data.round, data)
        else:
            run.accepted += (data,)
            gone = set(data.superseded)
            run.names = {n: t for n, t in run.names.items() if t not in gone}
            run.expected += tuple(data.task_ids.values())

    def _anomaly(self, what: str) -> None:
        """An event the fold cannot use (the log is written by others too): kept and logged."""
        self.anomalies.append(what)
        log.warning("log anomaly: %s", what)

    def _start_run(self, root_id: str, data: ev.RunStarted, position: int = 0) -> None:
        run = RunView(
            root_id,
            data,
            tasks=[],
            expected=tuple(data.task_ids),
            position=position,
            budget=_budget.new_ledger(data),
        )
        self.runs_changed += 1
        # a backend may store a run's tasks before the run (append_many's order is free)
        for task_id in data.task_ids:
            task = self.tasks.get(task_id)
            if task is not None and task.created.root_id == root_id:
                run.tasks.append(task_id)
                if task.created.plan_id:
                    run.names[task.created.plan_id] = task_id
        self.runs[root_id] = self.open[root_id] = run
        if self.on_open is not None:
            self.on_open()

    def _apply_task(self, env: Envelope) -> None:
        data = env.data
        task = self.tasks.get(env.stream)
        if isinstance(data, ev.TaskCreated):
            task = TaskView(env.stream, data)
            self.tasks[env.stream] = task
            run = self.runs.get(data.root_id)
            if run is not None:
                run.tasks.append(env.stream)
                if data.plan_id:
                    run.names[data.plan_id] = env.stream
                elif data.role == "plan":
                    run.planners += (env.stream,)
            parent = self.tasks.get(data.parent_id or "")
            if parent is not None and data.role == "review":
                parent.under_review = env.stream
                parent.output_in_review = data.inputs.get("draft")
            elif parent is not None and data.role == "supplement":
                parent.waiting_for = env.stream
        if task is None:
            self._anomaly(f"{env.event_id}: event for unknown task {env.stream}")
            return
        try:
            task.state = transition(task.state, data)
        except IllegalTransition as e:
            self._anomaly(f"{env.event_id}: {e}")
            return
        fold = _TASK_FOLDS.get(type(data))
        if fold is not None:  # one lookup, not a match down a list of classes
            fold(self, task, self.runs.get(task.created.root_id), env, data)
        if type(data) in _budget.FOLDED:
            run = self.runs.get(task.created.root_id)
            if run is not None:
                self._fold_budgets(run, task, env)

    def _fold_budgets(self, run: RunView, task: TaskView | None, env: Envelope) -> None:
        """Into the run's ledger, and those of the runs above it (a child's spending is its
        parents' too: their caps bound it)."""
        if run.budget is not None:
            _budget.fold(run.budget, run, task, env)
        if run.started.parent_root is not None:
            for above in self.ancestors(run):
                if above.budget is not None:
                    _budget.fold(above.budget, above, task, env)

    def _retire(self, root_id: str, position: int) -> None:
        """Past ``retain_finished``, drop the oldest finished runs and their tasks (those
        ended at or below ``folded_floor``: ``retire_through``)."""
        if self.retain_finished is None:
            return
        self._finished.append((root_id, position))
        self.retire_through(self.folded_floor)

    def retire_through(self, floor: float) -> None:
        """Everything up to ``floor`` is folded: forget the oldest finished runs past
        ``retain_finished`` that ended at or below it; ``retire_at`` is then the floor at
        which the next one is due."""
        self.folded_floor = floor
        finished, keep = self._finished, self.retain_finished or 0
        while len(finished) > keep and finished[0][1] <= floor:
            self.forget(finished.popleft()[0])
        self.retire_at = finished[0][1] if len(finished) > keep else math.inf

    def forget(self, root_id: str) -> None:
        """Drop a run and its tasks (retired, or its partition went to another member);
        folding its events again from the first brings it back."""
        self.open.pop(root_id, None)
        old = self.runs.pop(root_id, None)
        plan_stream = self._plan_streams.pop(root_id, "")
        self.versions.pop(plan_stream, None)
        if old is not None:
            self.versions.pop(old.root_id, None)
            self.plans.pop(old.started.plan_id, None)
            self.plan_digests.pop(old.started.plan_id, None)
            for task_id in old.tasks:
                self.tasks.pop(task_id, None)
                self.versions.pop(task_id, None)

    def open_runs(self) -> list[RunView]:
        return list(self.open.values())

    def ancestors(self, run: RunView) -> list[RunView]:
        """The runs above a child run, nearest first (those folded here); [] for a run of
        its own. Their budgets count the child's spending and bound its calls."""
        out: list[RunView] = []
        seen = {run.root_id}
        parent = run.started.parent_root
        while parent is not None and parent not in seen:  # a cycle is bad data: stop
            above = self.runs.get(parent)
            if above is None:
                break
            out.append(above)
            seen.add(parent)
            parent = above.started.parent_root
        return out


def _finish(data: object) -> str:
    if isinstance(data, ev.RunCompleted):
        return "completed"
    if isinstance(data, ev.RunHalted):
        return "halted"
    return "cancelled" if getattr(data, "cancelled", False) else "failed"


_TASK_TYPES = frozenset(ev.TASK_EVENT_TYPES)
_MODEL_TYPES = frozenset({ev.ModelRequested, ev.ModelAnswered})

# How each task event changes its TaskView (after the state transition), by type


def _dispatched(
    state: RunState, task: TaskView, run: RunView | None, env: Envelope, data: ev.TaskDispatched
) -> None:
    if data.attempt != task.attempt:
        task.attempt = data.attempt
        task.dispatched_to = task.results = task.limit_waits = EMPTY
        task.delivered = 0
        task.started = frozenset()
    task.start_to_close_s = data.timeout_s
    task.dispatched_to = with_item(task.dispatched_to, data.agent_id, data.deadline)
    task.assigned = plus(task.assigned, data.agent_id)
    state._wake(data.deadline, task.created.root_id)
    key = (data.loop_hash, env.stream)
    if run is not None and data.loop_hash and key not in run.loop_seen:
        run.loop_seen |= {key}
        run.loop_counts = with_item(
            run.loop_counts, data.loop_hash, run.loop_counts.get(data.loop_hash, 0) + 1
        )


def _started(
    state: RunState,
    task: TaskView,
    run: RunView | None,
    env: Envelope,
    data: ev.TaskStarted | ev.TaskRedelivered,
) -> None:
    if data.attempt == task.attempt:
        task.delivered = max(task.delivered, data.delivery)
        agent = data.agent_id
        if task.start_to_close_s > 0 and agent in task.dispatched_to and agent not in task.started:
            # taken: the deadline is now its start plus the task's limit (``deadlines``)
            task.started = plus(task.started, agent)
            task.dispatched_to = with_item(
                task.dispatched_to, agent, env.recorded_at + task.start_to_close_s
            )
            state._wake(task.dispatched_to[agent], task.created.root_id)


def _result(
    state: RunState,
    task: TaskView,
    run: RunView | None,
    env: Envelope,
    data: ev.TaskResultSubmitted,
) -> None:
    if data.replica_id:
        task.answered |= {(data.attempt, data.agent_id, data.replica_id, data.delivery)}
    if data.attempt == task.attempt:
        task.results = with_item(task.results, data.agent_id, data)
        task.started = plus(task.started, data.agent_id)
        task.delivered = max(task.delivered, data.delivery)
    if run is not None:
        # a negative count from a broken agent must not buy budget back
        tokens = max(0, data.usage.input_tokens) + max(0, data.usage.output_tokens)
        run.tokens += tokens
        if run.started.parent_root is not None:  # a child's tokens are its parents' too
            for above in state.ancestors(run):
                above.tokens += tokens


def _child_started(
    state: RunState, task: TaskView, run: RunView | None, env: Envelope, data: ev.ChildRunStarted
) -> None:
    task.attempt = data.attempt
    task.dispatched_to = task.results = EMPTY
    task.delivered = 0
    task.started = frozenset()
    task.child_root = data.child_root
    task.child_deadline = data.deadline
    task.child_end = None
    child = state.runs.get(data.child_root)
    if child is not None and child.finished:  # it ended before this was folded (a crash)
        state._child_ended(child)
    if run is not None and data.child_root not in run.children:
        run.children += (data.child_root,)
    if data.deadline:
        state._wake(data.deadline, task.created.root_id)


def _rejected(
    state: RunState, task: TaskView, run: RunView | None, env: Envelope, data: ev.TaskRejected
) -> None:
    task.excluded = plus(task.excluded, data.agent_id)
    why = f"{data.agent_id}: {data.reason}" + (f" ({data.detail})" if data.detail else "")
    task.rejections = (*task.rejections[-4:], why[:500])
    task.settled = plus(task.settled, data.attempt)


def _retry_scheduled(
    state: RunState, task: TaskView, run: RunView | None, env: Envelope, data: ev.TaskRetryScheduled
) -> None:
    task.settled = plus(task.settled, task.attempt)
    if is_host_loss(data.reason):  # not the agent's: spends no attempt (``hostloss``)
        task.host_losses += 1
    else:
        task.failures += 1
    task.not_before = data.not_before
    task.reason = data.reason
    if _FAILURE_WEIGHT.get(data.reason.split(":", 1)[0].strip(), 0.0) > 0:
        for agent in task.dispatched_to:
            task.failed_on = plus(task.failed_on, agent)
    state._wake(data.not_before, task.created.root_id)


def _timed_out(
    state: RunState, task: TaskView, run: RunView | None, env: Envelope, data: ev.TaskTimedOut
) -> None:
    task.settled = plus(task.settled, data.attempt)


def _needs_input(
    state: RunState, task: TaskView, run: RunView | None, env: Envelope, data: ev.TaskNeedsInput
) -> None:
    task.settled = plus(task.settled, data.attempt)
    task.waiting_for = data.supplementary_task_id
    task.needs_input_rounds += 1


def _input_provided(
    state: RunState, task: TaskView, run: RunView | None, env: Envelope, data: ev.InputProvided
) -> None:
    task.waiting_for = None
    task.supplement = data.output


def _revision_requested(
    state: RunState, task: TaskView, run: RunView | None, env: Envelope, data: ev.RevisionRequested
) -> None:
    task.settled = plus(task.settled, task.attempt)
    task.previous_output = task.output_in_review
    task.review_round = data.round
    task.review = tuple(data.issues)
    task.under_review = None


def _approval_requested(
    state: RunState, task: TaskView, run: RunView | None, env: Envelope, data: ev.ApprovalRequested
) -> None:
    # asked with results in hand: the output itself awaits approval (it
    # may be None); asked before any dispatch: the task itself does
    # (an unknown tool effect asks whether to run the task again, not about an output)
    task.has_proposal = bool(task.results) and data.reason not in (
        "tool_effect_unknown",
        "tool_review",  # a proposed tool call under review: the task runs again once answered
        "budget_exceeded",  # a model call was refused: the task runs again once approved
    )
    task.proposed_output = data.proposed_output
    task.proposed_agent = next(  # who produced it (a fan-out tie)
        (a for a, r in task.results.items() if r.output == data.proposed_output), ""
    )
    _waits.requested(state, task, run, env, data)  # its deadline, if its kind has one


def _approval_granted(
    state: RunState, task: TaskView, run: RunView | None, env: Envelope, data: ev.ApprovalGranted
) -> None:
    task.approved = True
    task.wait = None


def _denied(
    state: RunState, task: TaskView, run: RunView | None, env: Envelope, data: ev.ApprovalDenied
) -> None:
    # cancelled by a person: why, for a run's detail (a failed run's, a degraded one's)
    task.reason = "approval_denied"
    task.wait = None
    task.error = f"by {data.by}" + (f": {data.note}" if data.note else "")


def _completed(
    state: RunState, task: TaskView, run: RunView | None, env: Envelope, data: ev.TaskCompleted
) -> None:
    task.settled = plus(task.settled, task.attempt)
    task.output = data.output
    task.quality_met = data.quality_met
    task.open_issues = tuple(data.open_issues)
    task.under_review = None


def _ended(
    state: RunState,
    task: TaskView,
    run: RunView | None,
    env: Envelope,
    data: ev.TaskFailed | ev.TaskCancelled | ev.TaskHalted,
) -> None:
    task.settled = plus(task.settled, task.attempt)
    task.reason = data.reason
    task.error = data.error if isinstance(data, ev.TaskFailed) else ""
    if isinstance(data, ev.TaskCancelled):
        task.cancel_cause = "run" if data.whole_run else data.cause_task_id or ""
        task.cancelled_by = env.actor or ""


_TASK_FOLDS: dict[type, Callable[[RunState, TaskView, RunView | None, Envelope, Any], None]] = {
    ev.TaskDispatched: _dispatched,
    ev.ChildRunStarted: _child_started,
    ev.TaskStarted: _started,
    ev.TaskRedelivered: _started,
    ev.TaskResultSubmitted: _result,
    ev.TaskRejected: _rejected,
    ev.TaskRetryScheduled: _retry_scheduled,
    ev.TaskTimedOut: _timed_out,
    ev.TaskNeedsInput: _needs_input,
    ev.InputProvided: _input_provided,
    ev.RevisionRequested: _revision_requested,
    ev.ApprovalRequested: _approval_requested,
    ev.ApprovalGranted: _approval_granted,
    ev.ApprovalDenied: _denied,
    ev.WaitExpired: _waits.expired,
    ev.TaskCompleted: _completed,
    ev.TaskFailed: _ended,
    ev.TaskCancelled: _ended,
    ev.TaskHalted: _ended,
}

# how much a recorded failure of each reason counts against the agent (selection)
_FAILURE_WEIGHT = {
    "timeout": 1.0,
    "agent_lost": 1.0,
    "queue_timeout": 0.5,  # the agent was busy, not broken
    "agent_error": 0.5,
    "output_schema_mismatch": 0.5,
    "all_candidates_failed": 0.5,
}
