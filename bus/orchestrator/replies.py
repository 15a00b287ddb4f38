"""An agent's reply, decided: ``Started`` and ``ResultCard`` into events.

A part of ``Decider`` (``decisions``). ``on_reply`` records a start or a result of
the attempt in flight: a redelivery is noted, a reply from an agent the card was
never sent to is refused, a repeat or a late answer is ignored (``repeats``), a
result out of range for the log becomes a failed one saying why; the result
then goes to ``attempts`` (retried, delivered, reviewed). A reply for a task
this step already touched waits for the next step.
"""

from __future__ import annotations

from typing import Any

import msgspec

from cardbus.agents.cards import Reply, ResultCard, Started
from cardbus.bus.orchestrator.attempts import Attempts
from cardbus.bus.orchestrator.repeats import ignored_result
from cardbus.bus.orchestrator.runstate import TaskView
from cardbus.eventstore import TaskState
from cardbus.eventstore import events as ev
from cardbus.eventstore.batch import MAX_TOKENS, nesting_problem

__all__ = ["Replies", "result_problem"]

S = TaskState


class Replies(Attempts):
    """Agents' replies into events (state: ``Decider``)."""

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
