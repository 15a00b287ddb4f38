"""What the orchestrator decides next, given the state folded from the log.

``Decider`` reads a ``RunState`` and writes into ``Decisions``: the events to
append per stream and the cards to send once those appends are durable
(invariant 2: the decision is logged, then it takes effect). It performs no
I/O, so every policy can be tested from a state and a clock.
"""

from __future__ import annotations

import hashlib
import random
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import msgspec

from cardbus.agents.cards import AgentCard, Reply, ResultCard, Review, Started, TaskCard
from cardbus.agents.embedding import DEFAULT_EMBEDDER, Embedder
from cardbus.agents.schema import schema_errors
from cardbus.bus.orchestrator import child_runs, loop_pause, optional, planning, questions
from cardbus.bus.orchestrator.budget import Budgets, refused_event
from cardbus.bus.orchestrator.cancel import run_not_completed
from cardbus.bus.orchestrator.context import fit_card
from cardbus.bus.orchestrator.deadlines import check_deadline
from cardbus.bus.orchestrator.liveness import Leases
from cardbus.bus.orchestrator.plan import resolve_inputs
from cardbus.bus.orchestrator.policy import Policy
from cardbus.bus.orchestrator.refusals import why_no_agent
from cardbus.bus.orchestrator.repeats import ignored_result
from cardbus.bus.orchestrator.retry import RetryPolicy
from cardbus.bus.orchestrator.reuse import ResultIndex
from cardbus.bus.orchestrator.runstate import RunState, RunView, TaskView
from cardbus.bus.orchestrator.selection import rank
from cardbus.bus.orchestrator.waits import check_expiry
from cardbus.eventstore import DEFAULT_MAX_EVENT_BYTES, TaskState
from cardbus.eventstore import events as ev
from cardbus.eventstore.batch import MAX_TOKENS, nesting_problem
from cardbus.eventstore.errors import ConfigError
from cardbus.eventstore.taskspec import restate

__all__ = ["Decider", "Decisions", "loop_hash"]

S = TaskState


@dataclass
class Decisions:
    events: dict[str, list[ev.Event]] = field(default_factory=dict)  # stream -> new events
    sends: dict[str, list[tuple[str, TaskCard]]] = field(default_factory=dict)  # stream -> cards
    deferred: list[Reply] = field(default_factory=list)  # replies for a task already touched
    busy: frozenset[str] = frozenset()  # streams with an append still in flight
    unroutable: list[ResultCard] = field(default_factory=list)  # results for no known task
    origins: dict[str, ResultCard] = field(default_factory=dict)  # stream -> result it records
    # Completions decided in this step, and the streams whose decisions rest on them:
    # appended after them, in the same write, and only if they were (Append.after).
    completed: dict[str, Any] = field(default_factory=dict)  # task id -> its output
    after: dict[str, set[str]] = field(default_factory=dict)  # stream -> streams it follows

    def add(self, stream: str, *events: ev.Event) -> None:
        self.events.setdefault(stream, []).extend(events)

    def touched(self, stream: str) -> bool:
        """A stream decided on in this step, or still being written: decide nothing more."""
        return stream in self.events or stream in self.busy

    def __bool__(self) -> bool:
        return bool(self.events)


def loop_hash(capability: str, inputs: Any) -> str:
    """Hash of (capability, normalized inputs): keys sorted, whitespace and case folded."""
    canon = msgspec.json.encode(_normalize(inputs), order="sorted")
    return hashlib.sha256(capability.encode() + b"\0" + canon).hexdigest()[:32]


def _normalize(value: Any) -> Any:
    if isinstance(value, str):
        # runs of whitespace to one space: str.split() splits on exactly what the
        # pattern \s+ matches (str.isspace), at a third of re.sub's cost
        return " ".join(value.lower().split())
    if isinstance(value, dict):
        return {str(k): _normalize(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_normalize(v) for v in value]
    return value


class Decider:
    def __init__(
        self,
        state: RunState,
        policy: Policy,
        now: float,
        embedder: Embedder | None = None,
        rng: random.Random | None = None,
        busy: frozenset[str] = frozenset(),
        event_limit: int = DEFAULT_MAX_EVENT_BYTES - 8192,
        leases: Leases | None = None,
        lost_attempts: dict[tuple[str, int], str] | None = None,
        dispatching: bool = True,
        budgets: Budgets | None = None,
        results: ResultIndex | None = None,
        place: Callable[[str], int] | None = None,
    ) -> None:
        """``results``: stored results a pending task may be answered from (``reuse``);
        ``leases``: which agents are live (None: every registered agent);
        ``lost_attempts``: (task, attempt) whose agent is known gone -> why (``hostloss``);
        ``dispatching``: False for an orchestrator stopping (its agents go with it);
        ``budgets``: the budget checks before a dispatch (None: a run's ledger, unpriced);
        ``place``: a root's partition, where members share the runs (``child_runs``)."""
        self.budgets = budgets
        self.place = place
        self.results = results
        self.leases = leases
        self.lost_attempts = lost_attempts or {}  # they time out now
        self.dispatching = dispatching
        self.state = state
        self.policy = policy
        self.now = now
        self.embedder = embedder or DEFAULT_EMBEDDER
        self.rng = rng or random.Random()
        self.d = Decisions(busy=busy)
        self._loop_here: Counter[tuple[str, str]] = Counter()  # (root, loop hash) this step
        self.event_limit = event_limit  # an event bigger than this is never decided

    # -- replies from agents -------------------------------------------------

    def on_reply(self, reply: Reply) -> None:
        if isinstance(reply, Started):
            task = self.state.tasks.get(reply.task_id)
            if task is not None and self.d.touched(task.task_id):
                self.d.deferred.append(reply)  # e.g. the dispatch is still being written
                return
            if task is not None and reply.agent_id not in task.assigned:
                self._refuse(task, reply, "started")
            elif (
                task is not None
                and task.state in (S.DISPATCHED, S.RUNNING)
                and reply.attempt == task.attempt
                and reply.agent_id in task.dispatched_to
            ):
                self._redelivered(task, reply)  # first: it compares with what is recorded
                if task.state is S.DISPATCHED:
                    self.d.add(task.task_id, ev.TaskStarted(**_started_fields(reply)))
            return
        if not isinstance(reply, ResultCard):
            return
        task = self.state.tasks.get(reply.task_id)
        if task is None:
            self.d.unroutable.append(reply)  # no stream to record it in: a bad message
            return
        problem = result_problem(reply)
        if problem:  # out of range for the log and its folds: a failed result saying why
            reply = msgspec.structs.replace(
                reply,
                status="failed",
                output=None,
                usage=ev.Usage(),
                error=problem,
                reason="invalid_result",
                notes="",
                supplement_inputs={},
            )
        if self.d.touched(task.task_id) and not self._only_started(task.task_id, reply.attempt):
            self.d.deferred.append(reply)
            return
        if reply.agent_id not in task.assigned:
            self._refuse(task, reply, "result")  # misaddressed: never its task
            return
        if (
            task.terminal
            or reply.attempt != task.attempt
            or reply.attempt in task.settled
            or reply.agent_id not in task.dispatched_to
            or reply.agent_id in task.results
            or task.state not in (S.DISPATCHED, S.RUNNING)
        ):
            ignored = ignored_result(task, reply)  # None: the recorded reply delivered again
            if ignored is not None:
                self.d.add(task.task_id, ignored)
            return
        submitted = ev.TaskResultSubmitted(
            attempt=reply.attempt,
            agent_id=reply.agent_id,
            status=reply.status,
            output=reply.output,
            confidence=reply.confidence,
            needs_retry=reply.needs_retry,
            notes=reply.notes,
            error=reply.error,
            usage=reply.usage,
            duration_s=reply.duration_s,
            replica_id=reply.replica_id,
            host=reply.host,
            pid=reply.pid,
            delivery=reply.delivery,
        )
        self._redelivered(task, reply)  # first: it compares with what is recorded
        # An answer with no Started before it (a fast agent sends none) is not preceded
        # by a TaskStarted: the start is implied by the result, which says who ran it,
        # where and on which delivery (README "Why no implied task.started").
        self.d.add(task.task_id, submitted)
        self.d.origins[task.task_id] = reply
        results = {**task.results, reply.agent_id: submitted}
        match reply.status:
            case "rejected":
                self.d.add(
                    task.task_id,
                    ev.TaskRejected(
                        attempt=reply.attempt,
                        agent_id=reply.agent_id,
                        reason=reply.reason or "rejected",
                        detail=reply.notes,
                    ),
                )
            case "failed":
                if len(task.dispatched_to) > 1:
                    if len(results) == len(task.dispatched_to):
                        self._settle_fanout(task, results)
                    return
                if reply.reason in ("tool_effect_unknown", "tool_review"):  # a person's word
                    detail = reply.error or ""
                    asked = ev.ApprovalRequested(reason=reply.reason, detail=detail)
                    self.d.add(task.task_id, asked)
                    return
                if reply.reason == "budget_exceeded":  # a model call refused (budget.refused)
                    self._over_budget(task, reply.error or "")
                    return
                # the agent's own reason (llm_timeout, ...) for the retry policy, if it gave one
                self._fail_attempt(task, reply.reason or "agent_error", reply.error or "")
            case "needs_input":
                self._needs_input(task, reply)
            case _:
                if len(task.dispatched_to) > 1:
                    if len(results) == len(task.dispatched_to):
                        self._settle_fanout(task, results)
                    return
                if reply.needs_retry:  # the agent asks for another attempt: honoured
                    detail = reply.notes or "the agent asked for a retry"
                    self._fail_attempt(task, "needs_retry", detail)
                    return
                self._accept_output(task, reply.agent_id, reply.output, reply.confidence)

    def _redelivered(self, task: TaskView, reply: Started | ResultCard) -> None:
        """A Started or result of a delivery not seen yet (> 1): the card was redelivered."""
        decided = max(
            (e.delivery for e in self.d.events.get(task.task_id, []) if isinstance(e, _WHO)),
            default=0,
        )
        if reply.delivery > 1 and reply.delivery > max(task.delivered, decided):
            self.d.add(
                task.task_id,
                ev.TaskRedelivered(
                    attempt=reply.attempt,
                    agent_id=reply.agent_id,
                    delivery=reply.delivery,
                    replica_id=reply.replica_id,
                    host=reply.host,
                    pid=reply.pid,
                ),
            )

    def _refuse(self, task: TaskView, reply: ResultCard | Started, kind: str) -> None:
        """A reply from an agent no attempt of the task was sent to: recorded, not acted on.

        (The transport vouched that the agent named is its sender; on NATS a reply
        naming another agent than its sender never gets here: ``Bus.on_refused``.)
        """
        self.d.add(
            task.task_id,
            ev.ReplyRefused(
                kind=kind,
                claimed_agent_id=reply.agent_id,
                sender=reply.agent_id,
                reason=f"task {task.task_id!r} was never dispatched to {reply.agent_id!r}",
                task_id=task.task_id,
                attempt=reply.attempt,
            ),
        )

    def _only_started(self, task_id: str, attempt: int) -> bool:
        """This step decided only that ``attempt`` started: its result can join that append
        (an instant agent's Started and result arrive together: one write, not two)."""
        decided = self.d.events.get(task_id)
        return (
            task_id not in self.d.busy
            and decided is not None
            and all(
                isinstance(e, (ev.TaskStarted, ev.TaskRedelivered)) and e.attempt == attempt
                for e in decided
            )
        )

    def _accept_output(self, task: TaskView, agent_id: str, output: Any, confidence: float) -> None:
        problem = self._output_problem(task, agent_id, output)
        if problem:
            self._fail_attempt(task, "output_schema_mismatch", problem)
            return
        self._deliver(task, agent_id, output, confidence)

    def _deliver(self, task: TaskView, agent_id: str, output: Any, confidence: float) -> None:
        """A valid output: to its reviewer if the task has one, else the task is done."""
        created = task.created
        if created.review_by:
            review_id = f"{task.task_id}~review{task.review_round + 1}"
            self.d.add(
                review_id,
                self._subtask(
                    task,
                    "review",
                    capability=created.review_by,
                    goal=f"Review the output of: {created.goal or created.capability}",
                    inputs=review_inputs(output, created),
                    checklist=list(created.checklist),
                    fanout=created.reviewers,  # cross-checking: each to another agent
                    review_quorum=created.review_quorum,
                ),
            )
            return
        self.d.add(
            task.task_id,
            ev.TaskCompleted(
                attempt=task.attempt, agent_id=agent_id, output=output, confidence=confidence
            ),
        )
        run = self.state.runs.get(task.created.root_id)
        if run is not None and run.started.budget_tokens is None:
            # dependents may go on in this step (their writes follow this one); not
            # under a token budget, which this result's usage counts against first
            self.d.completed[task.task_id] = output

    def _output_problem(self, task: TaskView, agent_id: str, output: Any) -> str:
        card = self.state.agents.get(agent_id)
        spec = card.capability(task.created.capability) if card else None
        if spec is None or not spec.output_schema:
            return ""
        return "; ".join(schema_errors(output, spec.output_schema)[:5])

    def _settle_fanout(self, task: TaskView, results: dict[str, ev.TaskResultSubmitted]) -> None:
        good = []
        for r in results.values():
            if r.status == "completed" and not self._output_problem(task, r.agent_id, r.output):
                good.append(r)
        if not good:
            self._fail_attempt(task, "all_candidates_failed", "")
            return
        if task.created.role == "review":  # cross-checking reviewers: their verdicts combine
            self._accept_output(task, *_combined_review(good, task.created.review_quorum))
            return
        good.sort(key=lambda r: -r.confidence)
        best = good[0]
        tied = [r for r in good if abs(r.confidence - best.confidence) < 1e-9]
        # equal outputs (canonical JSON) agree: only different outputs at the top tie
        if len({_canonical_json(r.output) for r in tied}) > 1:
            if (task.created.tie_policy or self.policy.tie_policy) == "approval":
                self.d.add(
                    task.task_id,
                    ev.ApprovalRequested(reason="conflict_tie", proposed_output=best.output),
                )
            else:
                self._fail_attempt(task, "conflict_tie", f"{len(tied)} results tied")
            return
        self._accept_output(task, best.agent_id, best.output, best.confidence)

    def _needs_input(self, task: TaskView, reply: ResultCard) -> None:
        if task.needs_input_rounds >= self.policy.max_needs_input_rounds:
            self._fail(task, "needs_input_unanswered", reply.missing or "")
            return
        capability = reply.supplement_capability
        if not capability:
            self._fail(task, "needs_input_unanswered", f"no capability named for {reply.missing}")
            return
        supp_id = f"{task.task_id}~input{task.needs_input_rounds + 1}"
        self.d.add(
            task.task_id,
            ev.TaskNeedsInput(
                attempt=reply.attempt,
                agent_id=reply.agent_id,
                missing=reply.missing or "",
                supplementary_task_id=supp_id,
            ),
        )
        self.d.add(
            supp_id,
            self._subtask(
                task,
                "supplement",
                capability=capability,
                goal=reply.missing or "",
                inputs=dict(reply.supplement_inputs),
            ),
        )

    @staticmethod
    def _subtask(task: TaskView, role: str, **spec: Any) -> ev.TaskCreated:
        """A task the orchestrator adds for ``task`` (its review, or input it asked for):
        in the same run, with the same timeout and retry settings."""
        c = task.created
        return ev.TaskCreated(
            root_id=c.root_id,
            parent_id=task.task_id,
            timeout_s=c.timeout_s,
            max_attempts=c.max_attempts,
            retry=c.retry,
            role=role,
            **spec,
        )

    def retry_policy(self, created: ev.TaskCreated) -> RetryPolicy:
        """The retry policy a task runs with: ``Policy.retry`` with the task's own settings,
        and its logged attempt budget."""
        return self.policy.retry.overridden_by(created.retry, max_attempts=created.max_attempts)

    def _fail_attempt(self, task: TaskView, reason: str, error: str) -> None:
        failures = task.failures + 1
        try:
            retry = self.retry_policy(task.created)
        except ConfigError as e:  # settings no submit would log (a hand-written event)
            self._fail(task, "invalid_retry_policy", f"{reason}: {e}")
            return
        if not retry.retries(failures, reason):
            self._fail(task, reason, error)
            return
        delay = retry.delay_s(failures, self.rng.random())
        self.d.add(
            task.task_id,
            ev.TaskRetryScheduled(
                attempt=task.attempt + 1,
                delay_s=round(delay, 4),
                reason=f"{reason}: {error}" if error else reason,
                not_before=self.now + delay,
            ),
        )

    def _over_budget(self, task: TaskView, detail: str) -> None:
        """A task stopped by a budget: it waits for approval (the plan's ``on_budget``),
        or fails ``budget_exceeded`` (never retried: it would be refused again)."""
        run = self.state.runs.get(task.created.root_id)
        if run is not None and run.started.on_budget == "approval":
            asked = ev.ApprovalRequested(reason="budget_exceeded", detail=detail[:2000])
            self.d.add(task.task_id, asked)
            return
        self._fail(task, "budget_exceeded", detail[:2000])

    def _fail(self, task: TaskView, reason: str, error: str) -> None:
        self.d.add(task.task_id, ev.TaskFailed(reason=reason, error=error, attempts=task.attempt))

    # -- advancing runs ------------------------------------------------------

    def advance(self, run: RunView) -> None:
        if run.finished is not None:
            return
        if run.started.parent_root is not None:  # a child run: its parent_close (child_runs)
            child_runs.close_orphaned(self, run)
        if run.stopped_by:  # a person stopped a paused run (loop_pause)
            self._halt(run, "loop_detected", f"stopped by {run.stopped_by} after a pause")
            return
        budget = run.started.budget_tokens
        if budget is not None and run.tokens > budget:
            self._halt(run, "budget_exceeded", f"{run.tokens} tokens used of {budget}")
            return
        for task_id in list(run.tasks):
            task = self.state.tasks[task_id]
            if task.terminal or self.d.touched(task_id):
                continue
            self._advance_task(run, task)
            if run.finished is not None or self._halting(run):
                return
        if run.started.planning is not None:
            self._plan(run)
        self._maybe_finish(run)

    def _halting(self, run: RunView) -> bool:
        return any(isinstance(e, ev.RunHalted) for e in self.d.events.get(run.root_id, []))

    def _advance_task(self, run: RunView, task: TaskView) -> None:
        match task.state:
            case S.PENDING:
                blocker = self._blocking_dep(task)
                if blocker is not None:
                    dep = self.state.tasks[blocker]
                    self.d.add(
                        task.task_id,
                        ev.TaskCancelled(reason=f"dependency_{dep.state}", cause_task_id=blocker),
                    )
                    return
                if not self._deps_done(task) or self.now < task.not_before:
                    return
                self._follow_completed(task.task_id, task.created.deps)
                if questions.asks_person(task.created):  # a person answers it, not an agent
                    questions.ask(self, task)
                    return
                if task.created.requires_approval and not task.approved:
                    self.d.add(task.task_id, ev.ApprovalRequested(reason="requires_approval"))
                    return
                if self.results is not None and task.attempt == 0 and self._reused(run, task):
                    return
                self._dispatch(run, task)
            case S.NEEDS_REVISION:
                self._dispatch(run, task)
            case S.NEEDS_INPUT:
                supp = self.state.tasks.get(task.waiting_for or "")
                if supp is None or not supp.terminal:
                    return
                if supp.state is S.COMPLETED:
                    self.d.add(
                        task.task_id,
                        ev.InputProvided(supplementary_task_id=supp.task_id, output=supp.output),
                    )
                else:
                    why = f"{supp.reason}: {supp.error}" if supp.error else supp.reason
                    self._fail(task, "supplementary_task_failed", why)  # and why it failed
            case S.DISPATCHED | S.RUNNING:
                if task.under_review:
                    self._after_review(task)
                elif task.approved and task.has_proposal:
                    # a human settled the tie: the output goes on as any other would
                    # (validated when it was proposed), to review if the task has one
                    agent = task.proposed_agent or "approval"
                    self._deliver(task, agent, task.proposed_output, 0.0)
                elif task.child_root:  # a child-run task: its child run works for it
                    child_runs.follow(self, run, task)
                elif task.attempt not in task.settled:
                    check_deadline(self, task)
            case S.AWAITING_APPROVAL:  # a person's word, maybe with a deadline (waits)
                check_expiry(self, run, task)
            case _:
                pass

    def _after_review(self, task: TaskView) -> None:
        reviewer = self.state.tasks.get(task.under_review or "")
        if reviewer is None or not reviewer.terminal:
            return
        output = task.output_in_review
        # the agent whose output is in review (of several, with a fan-out)
        agent_id = (
            task.proposed_agent
            if task.has_proposal and task.proposed_agent
            else next(
                (a for a, r in task.results.items() if r.output == output),
                next(iter(task.dispatched_to), ""),
            )
        )
        produced = task.results.get(agent_id)
        confidence = produced.confidence if produced is not None else 0.0  # the producer's
        if reviewer.state is not S.COMPLETED:
            self.d.add(
                task.task_id,
                ev.TaskCompleted(
                    attempt=task.attempt,
                    agent_id=agent_id,
                    output=output,
                    confidence=confidence,
                    quality_met=False,
                ),
            )
            return
        try:
            review = msgspec.convert(reviewer.output, Review)
        except msgspec.ValidationError:
            review = Review(passed=False)
        if review.passed:
            self.d.add(
                task.task_id,
                ev.TaskCompleted(
                    attempt=task.attempt, agent_id=agent_id, output=output, confidence=confidence
                ),
            )
        elif task.review_round < task.created.max_review_rounds:
            self.d.add(
                task.task_id,
                ev.RevisionRequested(
                    round=task.review_round + 1,
                    reviewer_task_id=reviewer.task_id,
                    issues=list(review.issues),
                ),
            )
        else:
            self.d.add(
                task.task_id,
                ev.TaskCompleted(
                    attempt=task.attempt,
                    agent_id=agent_id,
                    output=output,
                    confidence=confidence,
                    quality_met=False,
                    open_issues=list(review.issues),
                ),
            )

    def _selectable(self, run: RunView) -> list[AgentCard]:
        """The agents a dispatch of ``run`` may choose from: live ones, of the run's named
        agents when it names some."""
        named = set(run.started.agents)
        return [
            a
            for a in self.state.agents.values()
            if (not named or a.agent_id in named)
            and (self.leases is None or self.leases.live(a.agent_id, self.now))
        ]

    def _awaited(self, run: RunView, capability: str) -> bool:
        """An unconfirmed agent (in the log, not yet renewed) that could do it: wait for it.

        So is one whose lease or grace has run out but whose ``agent.deregistered`` is
        not written yet (the loop's next sweep writes it): failing the task first would
        tell, in the log, of a task that found no agent while a capable one was still
        registered (seen on a busy machine, where a grace ran out before a decision)."""
        if self.leases is None:
            return False
        leases, now = self.leases, self.now
        named = set(run.started.agents)
        return any(
            (leases.waiting(a.agent_id, now) or leases.lapsed([a.agent_id], now))
            and a.capability(capability) is not None
            for a in self.state.agents.values()
            if not named or a.agent_id in named
        )

    def _deps(self, task: TaskView) -> list[TaskView]:
        return [self.state.tasks[d] for d in task.created.deps if d in self.state.tasks]

    def _deps_done(self, task: TaskView) -> bool:
        """Every dependency completed, or (an optional one) ended with its output absent."""
        deps = self._deps(task)
        done = self.d.completed
        return len(deps) == len(task.created.deps) and all(
            d.state is S.COMPLETED or d.task_id in done or optional.is_absent(d) for d in deps
        )

    def _follow_completed(self, stream: str, on: list[str]) -> None:
        """``stream``'s decisions rest on these completions of this step: write them after."""
        follows = {t for t in on if t in self.d.completed}
        if follows:
            self.d.after.setdefault(stream, set()).update(follows)

    def _blocking_dep(self, task: TaskView) -> str | None:
        for d in self._deps(task):
            if optional.blocks(d):  # an optional one that ended leaves its output absent
                return d.task_id
        return None

    def card_for(self, task: TaskView, attempt: int) -> TaskCard:
        """Exactly what the agent sees: its inputs, with only its declared deps resolved."""
        done = self.d.completed
        deps = self._deps(task)
        outputs = {d.task_id: done.get(d.task_id, d.output) for d in deps}
        absent = optional.absent_deps(deps)
        inputs = resolve_inputs(task.created.inputs, outputs, {}, frozenset(absent))
        return restate(
            task.created,
            TaskCard,
            task_id=task.task_id,
            inputs=inputs,
            deps=list(task.created.deps),
            attempt=attempt,
            # the latest review rides on every attempt of the revision, retries included
            review=list(task.review),
            previous_output=task.previous_output if task.review else None,
            supplement=task.supplement,
            absent=absent,
            priority=run.started.priority
            if (run := self.state.runs.get(task.created.root_id))
            else 0,
        )

    def _reused(self, run: RunView, task: TaskView) -> bool:
        """Answered from a result kept in long-term memory (``reuse``): no dispatch."""
        assert self.results is not None
        inputs = self.card_for(task, 1).inputs
        done = self.results.answer(run.started, task.created, task.task_id, inputs, self.now)
        if done is None:
            return False
        self.d.add(task.task_id, done)
        if run.started.budget_tokens is None:  # dependents may go on in this step
            self.d.completed[task.task_id] = done.output
        return True

    def _dispatch(self, run: RunView, task: TaskView) -> None:
        if not self.dispatching:
            return  # left pending for whoever carries on
        if loop_pause.holds(self, run):
            return  # paused for a person: nothing more goes out until they answer
        if task.created.child is not None:  # no agent: a run of its own (child_runs)
            child_runs.start(self, run, task)
            return
        attempt = task.attempt + 1
        card = self.card_for(task, attempt)
        c = task.created
        # context budget: fit upstream outputs into the capable agents' max input size
        agents = self._selectable(run)
        card, trimmed = fit_card(card, c.inputs, agents, self.policy.context_policy)
        candidates = rank(
            agents,
            c.capability,
            c.goal,
            card.inputs,
            c.constraints,
            c.timeout_s,
            stats=self.state,
            embedder=self.embedder,
            weights=self.policy.weights,
            exclude=frozenset(task.excluded),
            penalty=lambda agent: (
                1.0  # this task failed on it in this run: a retry prefers another agent
                if agent in task.failed_on
                else self.state.failure_penalty(
                    agent, c.capability, self.now, self.policy.failure_half_life_s
                )
            ),
        )
        if not candidates:
            if self._awaited(run, c.capability):
                return  # an agent from the log may renew its lease: the task waits for it
            why = why_no_agent(self, task, card, run)
            self._fail(task, *optional.no_agent_failure(card.absent, self.state.tasks, why))
            return
        h = loop_hash(
            c.capability, [card.inputs, card.supplement, msgspec.to_builtins(card.review)]
        )
        if (h, task.task_id) not in run.loop_seen and task.task_id not in run.loop_pass:
            # tasks with this hash in the log, and those dispatched earlier in this step
            count = run.loop_counts[h] + self._loop_here[(run.root_id, h)] + 1
            if count > self.policy.loop_threshold:
                detail = f"{c.capability} with the same inputs on {count} tasks"
                if self.policy.on_loop == "pause":  # a person decides (loop_pause)
                    loop_pause.pause(self, run, task, h, count, card.inputs, detail)
                else:
                    self._halt(run, "loop_detected", detail)
                return
            self._loop_here[(run.root_id, h)] += 1
        if self.budgets is not None and self.budgets.applies(run):
            # before the dispatch: a scope that has spent its cap dispatches nothing more
            agent = candidates[0].agent_id
            refusal = self.budgets.at_cap(run, task, agent)
            if refusal is not None:
                decision = run.started.on_budget
                if decision == "fail" and refusal.scope == "run":
                    self._halt(run, "budget_exceeded", refusal.reason)
                    return
                refused = refused_event(
                    refusal,
                    task_id=task.task_id,
                    agent_id=agent,
                    attempt=attempt,
                    action="dispatch",
                    decision=decision,
                )
                self.d.add(task.task_id, refused)
                self._over_budget(task, refusal.reason)
                return
        sent = msgspec.json.encode(card.inputs, order="sorted")
        digest = hashlib.sha256(sent).hexdigest()
        # what the agent receives, on the dispatch: inline when small, else its digest alone
        inline = card.inputs if len(sent) <= ev.DISPATCH_INPUTS_INLINE else None
        # schedule-to-start; the task's timeout_s runs from its start (``deadlines``)
        deadline = self.now + self.policy.queue_timeout_s
        if trimmed is not None:
            self.d.add(task.task_id, trimmed)  # recorded with the dispatch it shaped
        for i, chosen in enumerate(candidates[: max(1, c.fanout)]):
            self.d.add(
                task.task_id,
                ev.TaskDispatched(
                    attempt=attempt,
                    agent_id=chosen.agent_id,
                    score=chosen.score,
                    candidates=candidates[:5],
                    deadline=deadline,
                    timeout_s=c.timeout_s,
                    inputs_digest=digest,
                    loop_hash=h if i == 0 else "",
                    inputs=inline,
                    inputs_bytes=len(sent),
                    absent=list(card.absent),
                ),
            )
            self.d.sends.setdefault(task.task_id, []).append((chosen.agent_id, card))

    def _halt(self, run: RunView, reason: str, detail: str) -> None:
        # a completion decided in this step stands; the halt is written after it
        done_here = [t for t in run.tasks if t in self.d.completed]
        live = [
            t for t in run.tasks if not self.state.tasks[t].terminal and t not in self.d.completed
        ]
        if run.root_id in self.d.busy or any(t in self.d.busy for t in live):
            # a write to one of its streams is in flight: halting now would race
            # it (and lose the TaskHalted to a ConcurrencyError); the condition
            # holds on the next step, so halt then
            return
        child_runs.drop_decided(self.d, run.root_id)  # a child decided here: never started
        for stream, events in list(self.d.events.items()):
            first = events[0]
            if isinstance(first, ev.TaskCreated) and first.root_id == run.root_id:
                del self.d.events[stream]  # a subtask decided in this step: never start it
        for task_id in live:
            # keep the facts already decided (a result that arrived), drop the rest
            kept = [e for e in self.d.events.pop(task_id, []) if isinstance(e, _FACTS)]
            self.d.sends.pop(task_id, None)
            self.d.after.pop(task_id, None)
            self.d.add(task_id, *kept, ev.TaskHalted(reason=reason, detail=detail))
            self._follow_completed(task_id, done_here)
        self.d.add(run.root_id, ev.RunHalted(reason=reason, detail=detail))
        self._follow_completed(run.root_id, done_here)

    def _maybe_finish(self, run: RunView) -> None:
        tasks = [self.state.tasks[t] for t in run.tasks]
        done = self.d.completed
        if (
            not tasks
            or any(not t.terminal and t.task_id not in done for t in tasks)
            or self.d.touched(run.root_id)
        ):
            return
        if any(t not in self.state.tasks for t in run.expected):
            return  # the plan's tasks are still being created
        if run.planning_open():
            return  # planning: the rounds decide (self._plan)
        plan_tasks = {name: self.state.tasks[tid] for name, tid in run.names.items()}
        # optional plan tasks that ended without completing do not fail the run (optional)
        failing, degraded = optional.outcome(plan_tasks, done)
        spec = run.started.planning
        if failing and spec is not None and planning.replans_used(run) < spec.replan_on_failure:
            self._planning_round(run, errors=[], previous=self._accepted_proposal(run))
            return
        self._follow_completed(run.root_id, run.tasks)
        if failing:
            failed = optional.not_completed(plan_tasks, done)  # the absent ones too
            detail = _failed_detail(plan_tasks, set(failed))  # cancelled: says so (cancel)
            self.d.add(run.root_id, run_not_completed(plan_tasks, failed, detail))
        else:
            completed = optional.completion(plan_tasks, done, degraded)
            size = len(msgspec.json.encode(completed))
            if size > self.event_limit:  # it could never be stored: fail, never retry
                self.d.add(
                    run.root_id,
                    ev.RunFailed(
                        reason="result_too_large",
                        detail=f"run.completed would be {size} bytes, over the event size"
                        f" limit ({self.event_limit} bytes); each output is in its task's"
                        " task.completed",
                    ),
                )
                return
            self.d.add(run.root_id, completed)

    # -- planning a goal (see bus.orchestrator.planning) ----------------------

    def _plan(self, run: RunView) -> None:
        """The next planning decision of a goal run: a round, its verdict, or the plan's tasks."""
        if run.finished is not None or self.d.touched(run.root_id):
            return
        latest = len(run.planners)
        if run.accepted and run.accepted[-1].round == latest:
            if any(t not in self.state.tasks for t in run.accepted[-1].task_ids.values()):
                self._create_accepted(run, run.accepted[-1])
            return
        if not run.planners:
            if not run.started.task_ids:
                self._planning_round(run, errors=[], previous=None)
            return
        if latest in run.refusals:
            previous = run.proposals.get(latest)
            self._planning_round(
                run,
                errors=list(run.refusals[latest].errors),
                previous=previous.proposal if previous else None,
            )
            return
        if latest in run.proposals:
            return  # its verdict is written with it: never here
        planner = self.state.tasks.get(run.planners[-1])
        if planner is None:
            return
        if planner.task_id in self.d.completed:
            output = self.d.completed[planner.task_id]
            self._follow_completed(run.root_id, [planner.task_id])
        elif planner.state is S.COMPLETED:
            output = planner.output
        elif planner.terminal:
            self.d.add(
                run.root_id,
                ev.RunFailed(
                    reason="planning_failed",
                    failed_tasks=[planner.task_id],
                    detail=planning.planning_failure(planner)[:2000],
                ),
            )
            return
        else:
            return
        self._judge(run, latest, planner, output)

    def _judge(self, run: RunView, round: int, planner: TaskView, output: Any) -> None:
        spec = run.started.planning or ev.PlanningSpec()
        agent = next(
            (a for a, r in planner.results.items() if r.output == output),
            next(iter(planner.dispatched_to), ""),
        )
        proposed, plan, errors = planning.judge_proposal(
            output,
            run,
            self.state,
            self.policy,
            round=round,
            planner_task_id=planner.task_id,
            agent_id=agent,
            event_limit=self.event_limit,
        )
        if plan is None:
            events: list[ev.Event] = [proposed, ev.PlanRefused(round=round, errors=errors)]
            used = round - planning.episode_start(run, round) + 1
            if used >= spec.max_plan_rounds:
                events.append(
                    ev.RunFailed(
                        reason="plan_invalid",
                        failed_tasks=[],
                        detail=f"{used} proposals refused; the last: " + "; ".join(errors),
                    )
                )
            self.d.add(run.root_id, *events)
            return
        superseded = []
        if run.accepted or planning.planned_before(run):
            done = planning.completed_names(run, self.state)
            superseded = [t for n, t in run.names.items() if n not in done]
        ids = planning.accepted_task_ids(plan, run, round)
        self.d.add(
            run.root_id,
            proposed,
            ev.PlanAccepted(round=round, task_ids=ids, superseded=superseded),
        )

    def _accepted_proposal(self, run: RunView) -> Any:
        if not run.accepted:
            return None
        proposed = run.proposals.get(run.accepted[-1].round)
        return proposed.proposal if proposed else None

    def _planning_round(self, run: RunView, errors: list[str], previous: Any) -> None:
        """A planning task for the next round (the decision that starts it)."""
        round = len(run.planners) + 1
        task_id = planning.planner_task_id(run.root_id, round)
        if self.d.touched(task_id) or task_id in self.state.tasks:
            return
        inputs = planning.planning_inputs(
            run, self.state, errors=errors, previous=previous, limit_bytes=self.event_limit // 2
        )
        created = planning.planning_task(run, inputs, self.policy)
        if len(msgspec.json.encode(created)) > self.event_limit:
            self.d.add(
                run.root_id,
                ev.RunFailed(
                    reason="planning_failed",
                    detail="the planning card (the agents' cards and schemas) is over the"
                    f" event size limit ({self.event_limit} bytes)",
                ),
            )
            return
        self.d.add(task_id, created)

    def _create_accepted(self, run: RunView, accepted: ev.PlanAccepted) -> None:
        """The accepted plan's tasks, once the acceptance is in the log."""
        try:
            created = planning.created_tasks(run, self.state, accepted, self.policy)
        except Exception as e:  # a log written by another version: fail, never wedge
            self.d.add(
                run.root_id,
                ev.RunFailed(reason="plan_invalid", detail=f"accepted plan unusable: {e}"[:2000]),
            )
            return
        for task_id, data in created.items():
            if task_id not in self.state.tasks and not self.d.touched(task_id):
                self.d.add(task_id, data)


_FACTS = (ev.TaskStarted, ev.TaskResultSubmitted, ev.TaskResultIgnored, ev.TaskRedelivered)
_WHO = (ev.TaskStarted, ev.TaskResultSubmitted, ev.TaskRedelivered)


def _started_fields(reply: Started | ResultCard) -> dict[str, Any]:
    """A TaskStarted's fields from the reply that started it: the attempt and who ran it."""
    return {
        "attempt": reply.attempt,
        "agent_id": reply.agent_id,
        "replica_id": reply.replica_id,
        "host": reply.host,
        "pid": reply.pid,
        "delivery": reply.delivery,
    }


def review_inputs(output: Any, created: ev.TaskCreated) -> dict[str, Any]:
    """A reviewer's inputs: the draft, the task's goal, and its checklist when it has one."""
    inputs: dict[str, Any] = {"draft": output, "goal": created.goal}
    if created.checklist:
        inputs["checklist"] = list(created.checklist)
    return inputs


def _canonical_json(value: Any) -> bytes:
    return msgspec.json.encode(value, order="sorted")


def _combined_review(results: list[ev.TaskResultSubmitted], quorum: str) -> tuple[str, Any, float]:
    """Several reviewers' verdicts as one ``Review``: passed if all (or a majority) passed;
    the issues of those that did not. Returns (agent, output, confidence) for the review."""
    reviews = []
    for r in results:
        try:
            reviews.append(msgspec.convert(r.output, Review))
        except msgspec.ValidationError:
            reviews.append(Review(passed=False))
    passes = sum(rv.passed for rv in reviews)
    passed = passes == len(reviews) if quorum == "all" else 2 * passes > len(reviews)
    issues: list[ev.ReviewIssue] = []
    for rv in reviews:
        for issue in rv.issues if not rv.passed else []:
            if issue not in issues:
                issues.append(issue)
    combined = msgspec.to_builtins(Review(passed=passed, issues=[] if passed else issues))
    best = max(results, key=lambda r: r.confidence)
    return best.agent_id, combined, best.confidence


def result_problem(reply: ResultCard) -> str:
    """Why a result cannot be taken as it came ('' if it can): token counts outside
    0..MAX_TOKENS, or an output or supplement nested deeper than MAX_DEPTH."""
    usage = reply.usage
    for name in ("input_tokens", "output_tokens"):
        n = getattr(usage, name, None)
        if type(n) is not int or not 0 <= n <= MAX_TOKENS:
            return f"usage.{name} must be an int in 0..{MAX_TOKENS} (MAX_TOKENS), got {n!r}"[:300]
    return nesting_problem(reply.output, what="output") or nesting_problem(
        reply.supplement_inputs, what="supplement_inputs"
    )


def _failed_detail(plan_tasks: dict[str, TaskView], failed: set[str]) -> str:
    """Each failed plan task and why: ``draft: attempts_exhausted (agent error: ...)``."""
    parts = []
    for name, task in sorted(plan_tasks.items()):
        if task.task_id in failed:
            why = task.reason or (task.state.value if task.state else "not created")
            if task.error:
                why += f" ({task.error[:200]})"
            parts.append(f"{name}: {why}")
    return "; ".join(parts)
