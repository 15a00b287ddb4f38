"""Tool calls under review: a proposed call held until a person's word.

A tool whose review policy (``Tool.review``: ``always``, ``never`` or a function of the
arguments) asks for it is not called when the model proposes it. The journal writes a
``tool.review_requested`` (the tool, the proposed arguments, the tool's input schema and
the model's text that proposed it) before any effect, and the attempt ends with
``ToolUnderReview`` (reason ``tool_review``): the task waits in ``awaiting_approval``,
durably, like an unknown effect (``bus.orchestrator.effects``).

:func:`answer_review` is the person's word, written to the log from outside the decision
loop (the command line, the console, the MCP server), as ``answer_approval`` is: a
``tool.review_answered`` (``approve``, ``edit`` with arguments checked against the tool's
schema, or ``refuse`` with a reason) with the person as its actor, then, once no review of
the task is open, the ``approval.granted`` that resumes it. The next attempt meets the
same proposal (replayed from the journal): approved, the tool runs (with the edited
arguments); refused, the model gets the refusal as the tool's answer and goes on.

A review is named by its ``call``: the digest of the tool and the proposed arguments, so
every attempt that proposes the same call meets the same answer.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from cardbus.bus.orchestrator.runstate import RunState
from cardbus.bus.orchestrator.waits import require_approver, run_start
from cardbus.eventstore import ConcurrencyError, EventStore, NewEvent, TaskState
from cardbus.eventstore import events as ev
from cardbus.eventstore.errors import CardbusError, StreamNotFound, ValidationError

__all__ = ["DECISIONS", "Review", "ReviewRefused", "answer_review", "open_reviews"]

#: what a person may answer a review with
DECISIONS = ("approve", "edit", "refuse")
_TRIES = 10


class ReviewRefused(ValidationError):
    """An answer to a review that cannot be taken (edited arguments that break the
    tool's schema, naming the field); the review stays open."""


@dataclass(slots=True)
class Review:
    """A tool call under review, and its answer once given (``decision`` "": none yet)."""

    task_id: str
    call: str
    tool: str
    arguments: Any
    schema: dict[str, Any]
    text: str
    attempt: int
    decision: str = ""
    by: str = ""
    edited: Any = None
    reason: str = ""

    @property
    def runs_with(self) -> Any:
        """The arguments the tool runs with: the edited ones, else those proposed."""
        return self.edited if self.decision == "edit" else self.arguments


def fold_review(reviews: dict[str, Review], data: ev.Event) -> None:
    """Fold one event into ``reviews`` (call -> review); other events are ignored."""
    match data:
        case ev.ToolReviewRequested():
            if data.call not in reviews:
                reviews[data.call] = Review(
                    task_id=data.task_id,
                    call=data.call,
                    tool=data.tool,
                    arguments=data.arguments,
                    schema=data.schema,
                    text=data.text,
                    attempt=data.attempt,
                )
        case ev.ToolReviewAnswered():
            review = reviews.get(data.call)
            if review is not None and not review.decision:  # the first word stands
                review.decision, review.by = data.decision, data.by
                review.edited, review.reason = data.arguments, data.reason
        case _:
            pass


async def open_reviews(store: EventStore, task_id: str) -> list[Review]:
    """The tool calls of ``task_id`` waiting for a person's review, oldest first."""
    events = await store.read_stream(task_id)
    if not events:
        raise StreamNotFound(task_id)
    reviews: dict[str, Review] = {}
    for env in events:
        fold_review(reviews, env.data)
    return [r for r in reviews.values() if not r.decision]


async def answer_review(
    store: EventStore,
    task_id: str,
    decision: str,
    *,
    by: str,
    call: str = "",
    arguments: dict[str, Any] | None = None,
    reason: str = "",
) -> list[Review]:
    """Answer the open review(s) of ``task_id``: ``approve``, ``edit`` (with
    ``arguments``, checked against the tool's schema) or ``refuse`` (with ``reason``).

    ``call`` names one review (its call digest or a unique prefix) when several are open;
    ``call="all"`` answers every open one alike (the calls of one turn together). Raises
    ``ReviewRefused`` naming the field for an edit that breaks the schema (the review
    stays open), ``CardbusError`` when nothing waits or ``call`` is ambiguous,
    ``StreamNotFound`` for an unknown task. Returns the reviews answered.
    """
    if decision not in DECISIONS:
        raise ReviewRefused(f"a review is answered {', '.join(DECISIONS)}; got {decision!r}")
    if decision == "edit" and not isinstance(arguments, dict):
        raise ReviewRefused("an edit gives the arguments the tool runs with (a JSON object)")
    if decision == "refuse" and not reason.strip():
        raise ReviewRefused("a refusal gives its reason (the model gets it as the answer)")
    for attempt in range(_TRIES):
        events = await store.read_stream(task_id)
        if not events:
            raise StreamNotFound(task_id)
        state = RunState()
        reviews: dict[str, Review] = {}
        for env in await run_start(store, events[0].correlation_id, task_id):
            state.apply(env)  # the run's wait policies: who may answer (``waits``)
        for env in events:
            state.apply(env)
            fold_review(reviews, env.data)
        task = state.tasks.get(task_id)
        waiting = [r for r in reviews.values() if not r.decision]
        if task is None or task.state is not TaskState.AWAITING_APPROVAL or not waiting:
            current = task.state if task else "unknown"
            raise CardbusError(f"task {task_id!r} has no tool call under review (it is {current})")
        require_approver(task, by)  # escalated by a deadline: only its approvers
        chosen = _pick(task_id, waiting, call)
        out: list[ev.Event] = []
        for review in chosen:
            if decision == "edit":
                _check(review, arguments)
            out.append(
                ev.ToolReviewAnswered(
                    task_id=task_id,
                    tool=review.tool,
                    call=review.call,
                    decision=decision,
                    by=by,
                    proposed=review.arguments,
                    arguments=arguments if decision == "edit" else None,
                    reason=reason,
                )
            )
        if len(chosen) == len(waiting):  # none left open: the task runs again
            out.append(ev.ApprovalGranted(by=by, resume="pending", note=f"review: {decision}"))
        root = events[0].correlation_id
        try:
            await store.append(
                task_id, [NewEvent(data=d, correlation_id=root, actor=by) for d in out], len(events)
            )
            return chosen
        except ConcurrencyError:  # another writer first: decided again on what it wrote
            if attempt == _TRIES - 1:
                raise
    raise AssertionError("unreachable")  # pragma: no cover


def _pick(task_id: str, waiting: list[Review], call: str) -> list[Review]:
    if call == "all":
        return waiting
    if not call:
        if len(waiting) == 1:
            return waiting
        named = ", ".join(f"{r.call[:12]} ({r.tool})" for r in waiting)
        raise CardbusError(f"{len(waiting)} tool calls of {task_id} wait; name one or all: {named}")
    found = [r for r in waiting if r.call.startswith(call)]
    if len(found) != 1:
        named = ", ".join(f"{r.call[:12]} ({r.tool})" for r in waiting)
        what = "names none" if not found else "names several"
        raise CardbusError(f"call {call!r} {what} of the calls of {task_id} under review: {named}")
    return found


def _check(review: Review, arguments: Any) -> None:
    """Edited arguments against the tool's input schema: refused naming the field."""
    if not review.schema:
        return
    import jsonschema  # here: the commands that only list or read pay nothing for it

    validator = jsonschema.Draft202012Validator(review.schema)
    errors = sorted(validator.iter_errors(arguments), key=lambda e: list(e.absolute_path))
    if errors:
        first = errors[0]
        field = ".".join(str(p) for p in first.absolute_path) or "(arguments)"
        raise ReviewRefused(f"{review.tool}: field {field!r}: {first.message}")
