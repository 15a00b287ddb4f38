"""What the orchestrator decides next, given the state folded from the log.

``Decider`` reads a ``RunState`` and writes into ``Decisions``: the events to
append per stream and the cards to send once those appends are durable
(invariant 2: the decision is logged, then it takes effect). It performs no
I/O, so every policy can be tested from a state and a clock.

This module holds ``advance``: what each task of a run needs now (by its state)
and whether the run is finished. The class is carved by role into parts it
inherits, each a sibling module:

* ``attempts`` (``Attempts``, the base): how an attempt ends: retried, failed,
  delivered to its reviewer or completed, fan-out and review verdicts settled;
* ``replies`` (``Replies``): an agent's ``Started`` or result into events;
* ``dispatch`` (``Dispatching``): a task's card, its agent and the guards
  (context, loops, budgets) before ``task.dispatched``; a run halted;
* ``planning_rounds`` (``PlanningRounds``): a goal run planned round by round.

``decided`` holds ``Decisions``, what one step decided.
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Callable, Set

import msgspec

from cardbus.agents.embedding import DEFAULT_EMBEDDER, Embedder
from cardbus.bus.orchestrator import child_runs, optional, planning, questions
from cardbus.bus.orchestrator.budget import Budgets
from cardbus.bus.orchestrator.cancel import run_not_completed
from cardbus.bus.orchestrator.deadlines import check_deadline
from cardbus.bus.orchestrator.decided import Decisions
from cardbus.bus.orchestrator.dispatch import Dispatching, loop_hash
from cardbus.bus.orchestrator.liveness import Leases
from cardbus.bus.orchestrator.planning_rounds import PlanningRounds
from cardbus.bus.orchestrator.policy import Policy
from cardbus.bus.orchestrator.replies import Replies
from cardbus.bus.orchestrator.reuse import ResultIndex
from cardbus.bus.orchestrator.runstate import RunState, RunView, TaskView
from cardbus.bus.orchestrator.waits import check_expiry
from cardbus.eventstore import DEFAULT_MAX_EVENT_BYTES, TaskState
from cardbus.eventstore import events as ev

__all__ = ["Decider", "Decisions", "loop_hash"]

S = TaskState


class Decider(Replies, Dispatching, PlanningRounds):
    """One step's decisions on ``state`` at ``now``: ``on_reply`` for each reply, ``advance``
    for each run something happened to; what it decided is ``d``."""

    def __init__(
        self,
        state: RunState,
        policy: Policy,
        now: float,
        embedder: Embedder | None = None,
        rng: random.Random | None = None,
        busy: Set[str] = frozenset(),
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
        tasks, d = self.state.tasks, self.d  # looked up once: every run, every task, every step
        for task_id in list(run.tasks):
            task = tasks[task_id]
            if task.terminal or d.touched(task_id):
                continue
            self._advance_task(run, task)
            if run.finished is not None or self._halting(run):
                return
        if run.started.planning is not None:
            self._plan(run)
        self._maybe_finish(run)

    def _halting(self, run: RunView) -> bool:
        events = self.d.events.get(run.root_id)  # most runs: none decided in this step
        return events is not None and any(isinstance(e, ev.RunHalted) for e in events)

    def _advance_task(self, run: RunView, task: TaskView) -> None:
        match task.state:
            case S.PENDING:
                blocker, deps_done = self._dep_check(task)
                if blocker is not None:
                    dep = self.state.tasks[blocker]
                    self.d.add(
                        task.task_id,
                        ev.TaskCancelled(reason=f"dependency_{dep.state}", cause_task_id=blocker),
                    )
                    return
                if not deps_done or self.now < task.not_before:
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

    def _maybe_finish(self, run: RunView) -> None:
        done, tasks = self.d.completed, self.state.tasks  # most runs: a task still open
        for t in run.tasks:
            if not tasks[t].terminal and t not in done:
                return
        if not run.tasks or self.d.touched(run.root_id):
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
