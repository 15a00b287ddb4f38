"""How an attempt ends: what ``Decider`` decides on an attempt's outcome.

A part of ``Decider`` (``decisions``), the base the others build on. A failure is
retried after a backoff or fails the task (``retry``); a budget stops the task
(waiting for approval, or failing); an output is checked against its schema and
delivered: to its reviewer when the task has one, else the task completes (and
its dependents may go on in the same step). Fan-out results are settled (the
best, a tie, cross-checking reviewers' verdicts combined); input a task asked for
becomes a supplementary task; a reviewer's verdict completes the task, asks for a
revision, or completes it with its open issues.
"""

from __future__ import annotations

import random
from collections.abc import Mapping
from typing import Any

import msgspec

from cardbus.agents.cards import ResultCard, Review
from cardbus.agents.schema import schema_errors
from cardbus.bus.orchestrator.decided import Decisions
from cardbus.bus.orchestrator.policy import Policy
from cardbus.bus.orchestrator.retry import RetryPolicy
from cardbus.bus.orchestrator.runstate import RunState, TaskView
from cardbus.eventstore import TaskState
from cardbus.eventstore import events as ev
from cardbus.eventstore.errors import ConfigError

__all__ = ["Attempts", "review_inputs"]

S = TaskState


class Attempts:
    """An attempt's outcome: retried, failed, delivered, reviewed (state: ``Decider``)."""

    state: RunState
    policy: Policy
    now: float
    rng: random.Random
    d: Decisions
    event_limit: int  # an event bigger than this is never decided

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
        self._complete(task, agent_id, output, confidence)
        run = self.state.runs.get(task.created.root_id)
        if run is not None and run.started.budget_tokens is None:
            # dependents may go on in this step (their writes follow this one); not
            # under a token budget, which this result's usage counts against first
            self.d.completed[task.task_id] = output

    def _complete(
        self, task: TaskView, agent_id: str, output: Any, confidence: float, **review: Any
    ) -> None:
        """The task's current attempt completed with ``output`` (``review``: what its
        review left, ``quality_met`` and ``open_issues``)."""
        self.d.add(
            task.task_id,
            ev.TaskCompleted(
                attempt=task.attempt,
                agent_id=agent_id,
                output=output,
                confidence=confidence,
                **review,
            ),
        )

    def _output_problem(self, task: TaskView, agent_id: str, output: Any) -> str:
        card = self.state.agents.get(agent_id)
        spec = card.capability(task.created.capability) if card else None
        if spec is None or not spec.output_schema:
            return ""
        return "; ".join(schema_errors(output, spec.output_schema)[:5])

    def _settle_fanout(self, task: TaskView, results: Mapping[str, ev.TaskResultSubmitted]) -> None:
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
            self._complete(task, agent_id, output, confidence, quality_met=False)
            return
        try:
            review = msgspec.convert(reviewer.output, Review)
        except msgspec.ValidationError:
            review = Review(passed=False)
        if review.passed:
            self._complete(task, agent_id, output, confidence)
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
            self._complete(
                task,
                agent_id,
                output,
                confidence,
                quality_met=False,
                open_issues=list(review.issues),
            )

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

    def _follow_completed(self, stream: str, on: list[str]) -> None:
        """``stream``'s decisions rest on these completions of this step: write them after."""
        follows = {t for t in on if t in self.d.completed}
        if follows:
            self.d.after.setdefault(stream, set()).update(follows)


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
