"""Typed questions to a person: asked durably, answered from any door, validated.

An agent raises ``AskPerson(question, schema, choices=..., default=...)``
(``agents.questions``): the orchestrator makes it a supplementary task of capability
``user_input`` whose inputs are the question's spec, as for any ``NeedsInput``. Such a task
is never dispatched: :func:`ask` writes ``approval.requested`` (reason ``question``) on it,
so it waits in ``awaiting_approval``, durably (a restart, SQLite or NATS, finds it there).

:func:`answer_question` is the person's answer, written from outside the decision loop (the
console, ``cardbus answer``, the A2A gateway), as ``answer_approval`` is: checked against
the schema (and the choices) with ``jsonschema``; refused with :class:`QuestionRefused`
naming the field when it does not fit (nothing is written, the question stays open); else
``question.answered`` (the answer, who gave it, from which door) then ``task.completed``
with the answer as output, in one append. The orchestrator folds them like any other
writer's events: the asking task gets ``input.provided`` and runs again with the answer as
its ``supplement``. A person may also decline (``answer_approval`` denied): the asking task
fails ``supplementary_task_failed``.

A plan's ``waits["question"]`` gives questions a deadline (``bus.orchestrator.waits``):
on expiry an escalation lets only the approvers it names answer (``NotAnApprover`` for
anyone else), ``deny`` declines, ``fail`` fails the question (so the asking task), and
``approve`` answers with the question's default (:func:`by_default`): a
``question.answered`` with ``door`` ``deadline`` and ``by`` ``policy:deadline``, never a
person's name. A question with no default (or one that no longer fits) cannot be
answered by rule: it fails ``wait_expired`` saying so, as ``fail`` would, rather than
waiting for ever after its last step.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from cardbus.agents.questions import USER_INPUT
from cardbus.bus.orchestrator.runstate import RunState, TaskView
from cardbus.bus.orchestrator.waits import BY, require_approver, run_start
from cardbus.eventstore import ConcurrencyError, Envelope, EventStore, NewEvent, TaskState
from cardbus.eventstore import events as ev
from cardbus.eventstore.errors import CardbusError, StreamNotFound, ValidationError

if TYPE_CHECKING:
    from cardbus.bus.orchestrator.decisions import Decider

__all__ = [
    "PERSON",
    "Question",
    "QuestionRefused",
    "answer_question",
    "ask",
    "asks_person",
    "by_default",
    "check_answer",
    "open_questions",
    "question_of",
]

#: the agent id of a completion a person's answer wrote
PERSON = "person"
#: the reason of the ``approval.requested`` a question waits under
REASON = "question"
#: the door of an answer a deadline's policy gave (``waits``), not a person
DEADLINE = "deadline"
_TRIES = 10


class QuestionRefused(ValidationError):
    """An answer that does not fit the question (``field`` names where: ``amount``,
    ``(answer)`` for the whole); the question stays open."""

    def __init__(self, message: str, field: str = "(answer)") -> None:
        super().__init__(message)
        self.field = field


@dataclass(slots=True)
class Question:
    """A question to a person, as its task carries it (``agents.questions.question_spec``)."""

    task_id: str
    root_id: str
    asked_by: str  # the task that asked (the question task's parent)
    question: str
    schema: dict[str, Any] = field(default_factory=dict)
    choices: list[Any] | None = None
    default: Any = None
    has_default: bool = False
    open: bool = True

    def as_dict(self) -> dict[str, Any]:
        """What a door shows: the console's form, ``cardbus answer``, A2A's data part."""
        out = {
            "task_id": self.task_id,
            "root_id": self.root_id,
            "asked_by": self.asked_by,
            "question": self.question,
            "schema": self.schema,
            "choices": self.choices,
        }
        if self.has_default:
            out["default"] = self.default
        return out


def asks_person(created: ev.TaskCreated) -> bool:
    """Whether a task is a question to a person (never dispatched to an agent)."""
    return created.capability == USER_INPUT


def question_of(task: TaskView) -> Question | None:
    """The question ``task`` asks (None for a task that asks none). A free-text question
    (``NeedsInput(..., capability="user_input")`` with inputs of its own) takes any answer."""
    c = task.created
    if not asks_person(c):
        return None
    inputs = c.inputs if isinstance(c.inputs, dict) else {}
    text = inputs.get("question")
    schema = inputs.get("schema")
    choices = inputs.get("choices")
    return Question(
        task_id=task.task_id,
        root_id=c.root_id,
        asked_by=c.parent_id or "",
        question=text if isinstance(text, str) and text else (c.goal or "input wanted"),
        schema=schema if isinstance(schema, dict) else {},
        choices=list(choices) if isinstance(choices, list) else None,
        default=inputs.get("default"),
        has_default="default" in inputs,
        open=task.state is TaskState.AWAITING_APPROVAL,
    )


def ask(decider: Decider, task: TaskView) -> None:
    """The decision for a pending question task: it waits for a person (the log says so)."""
    q = question_of(task)
    detail = q.question if q is not None else ""
    decider.d.add(task.task_id, ev.ApprovalRequested(reason=REASON, detail=detail[:1000]))


def check_answer(q: Question, answer: Any) -> None:
    """``answer`` against the question's schema and choices; ``QuestionRefused`` naming the
    field when it does not fit."""
    import jsonschema  # here: the commands that only list or read pay nothing for it

    validator = jsonschema.Draft202012Validator(q.schema)
    errors = sorted(validator.iter_errors(answer), key=lambda e: list(e.absolute_path))
    if errors:
        first = errors[0]
        path = [str(p) for p in first.absolute_path]
        if first.validator == "required" and isinstance(first.instance, dict):
            missing = [k for k in first.validator_value if k not in first.instance]
            path += missing[:1]  # the field that is missing, not the object that lacks it
        name = ".".join(path) or "(answer)"
        raise QuestionRefused(f"field {name!r}: {first.message}", name)
    if q.choices is not None and answer not in q.choices:
        shown = ", ".join(repr(c) for c in q.choices)
        raise QuestionRefused(f"field '(answer)': {answer!r} is not one of the choices: {shown}")


def by_default(task: TaskView, note: str) -> list[ev.Event]:
    """The events of a deadline's ``approve`` step on a question: answered with its
    default by the policy (door ``deadline``), or failed ``wait_expired`` naming what is
    missing when there is no default to give (the asking task then fails
    ``supplementary_task_failed``, as for a declined question)."""
    q = question_of(task)
    problem = ""
    if q is None or not q.has_default:
        problem = "the question has no default to answer with"
    else:
        try:
            check_answer(q, q.default)
        except QuestionRefused as e:  # a hand-written spec: its default was never checked
            problem = f"the question's default does not fit it: {e}"
    if problem:
        error = f"{note}: {problem}; give it a default (AskPerson(..., default=...))"
        return [ev.TaskFailed(reason="wait_expired", error=error, attempts=task.attempt)]
    assert q is not None
    return [
        ev.QuestionAnswered(
            task_id=task.task_id, answer=q.default, by=BY, door=DEADLINE, defaulted=True
        ),
        ev.TaskCompleted(attempt=task.attempt, agent_id=BY, output=q.default, confidence=1.0),
    ]


def _fold(events: list[Envelope]) -> RunState:
    state = RunState()
    for env in events:
        state.apply(env)
    return state


async def open_questions(store: EventStore, ident: str) -> list[Question]:
    """The open questions ``ident`` names: a question's own task, the task that asked, or
    the run (its root id); oldest first. ``StreamNotFound`` for an unknown id."""
    first = await store.read_stream(ident, 1)
    if not first:
        raise StreamNotFound(ident)
    state = _fold(await store.read_correlation(first[0].correlation_id))
    out = []
    for task in state.tasks.values():
        q = question_of(task)
        if q is not None and q.open and ident in (q.task_id, q.asked_by, q.root_id):
            out.append(q)
    return out


async def answer_question(
    store: EventStore,
    ident: str,
    answer: Any = None,
    *,
    by: str,
    door: str = "api",
    message_id: str = "",
    use_default: bool = False,
) -> tuple[Question, Any]:
    """Answer the open question ``ident`` names (see :func:`open_questions`) with
    ``answer`` (``use_default``: the question's default), as ``by``.

    Raises ``QuestionRefused`` naming the field for an answer that does not fit (nothing
    written: the question stays open), ``NotAnApprover`` when a deadline escalated the
    question to others (``waits``), ``CardbusError`` when no question is open there or
    several are (name one by its task id), ``StreamNotFound`` for an unknown id. Returns the
    question answered and the answer recorded.
    """
    for attempt in range(_TRIES):
        waiting = await open_questions(store, ident)
        if not waiting:
            raise CardbusError(f"{ident!r} has no open question")
        if len(waiting) > 1:
            named = ", ".join(f"{q.task_id} ({q.question})" for q in waiting)
            raise CardbusError(f"{len(waiting)} questions wait under {ident!r}; name one: {named}")
        q = waiting[0]
        given = answer
        if use_default:
            if not q.has_default:
                raise QuestionRefused("the question has no default: give an answer")
            given = q.default
        check_answer(q, given)
        events = await store.read_stream(q.task_id)
        # its run's wait policy first: who may answer after an escalation
        state = _fold([*await run_start(store, q.root_id, q.task_id), *events])
        task = state.tasks.get(q.task_id)
        if task is None or task.state is not TaskState.AWAITING_APPROVAL:
            continue  # answered or declined meanwhile: look again
        require_approver(task, by)
        out: list[ev.Event] = [
            ev.QuestionAnswered(
                task_id=q.task_id,
                answer=given,
                by=by,
                door=door,
                message_id=message_id,
                defaulted=use_default,
            ),
            ev.TaskCompleted(attempt=task.attempt, agent_id=PERSON, output=given, confidence=1.0),
        ]
        root = events[0].correlation_id
        try:
            await store.append(
                q.task_id,
                [NewEvent(data=d, correlation_id=root, actor=by) for d in out],
                len(events),
            )
            return q, given
        except ConcurrencyError:  # another writer first: decided again on what it wrote
            if attempt == _TRIES - 1:
                raise
    raise CardbusError(f"{ident!r}: the question was answered or declined meanwhile")
