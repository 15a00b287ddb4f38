"""A run's events folded into an A2A ``Task``: the A2A task *is* the run.

``TaskFold`` applies a run's envelopes (``store.read_correlation(root_id)``,
then ``store.subscribe``) one by one and answers, for each, the A2A stream
events it causes (a ``TaskStatusUpdateEvent`` with a short agent message, a
``TaskArtifactUpdateEvent`` when a plan task completes); ``task()`` is the
A2A ``Task`` as of the events applied so far. ``tasks/get``, a stream and a
resubscribe all use it, so they agree, and after a restart they are rebuilt
from the log alone.

What comes from where in the log:

* the task id is the run's root id; the context id and the first user
  message are in ``run.started``'s ``session["a2a"]``;
* an answer to an approval is ``task.approval_granted``/``denied`` by the
  name the request authenticated as, its ``note`` the message's text and
  id (:func:`approval_note`; logs before names had ``by = "a2a:<message
  id>"``); an answer to a question (``AskPerson``: a ``user_input`` task that
  waits, ``bus.orchestrator.questions``) is its ``question.answered``, with the
  message's id when it came over A2A (logs before typed questions: the result of
  the question's task submitted by the gateway's ``a2a-user`` agent, its notes
  naming the message and who answered, :func:`answer_notes`): both read back as
  the user's messages in the history;
* a task input-required for a question says so in its status message: the
  question's text, and a data part ``{"question": {...}}`` with its task id, text,
  JSON Schema, choices and default (:func:`question_part`);
* every other step is an agent message ``evt-<event id>`` in the history;
* each plan task's result is an artifact with its output as a data part, and,
  for a run asked for with a text goal, a text part beside it
  (:func:`result_text`), for a client that reads only text.

State (A2A v1.0 names): a finished run is COMPLETED, FAILED (failed or
halted) or CANCELED (cancelled through A2A); a run with a task awaiting
approval or a question to the user is INPUT_REQUIRED; a run with a task
dispatched or running is WORKING; else SUBMITTED.
"""

from __future__ import annotations

import datetime as _dt
import json
from dataclasses import dataclass
from typing import Any

from a2a.types import (
    Artifact,
    Message,
    Part,
    Role,
    Task,
    TaskArtifactUpdateEvent,
    TaskState,
    TaskStatus,
    TaskStatusUpdateEvent,
)
from google.protobuf import struct_pb2
from google.protobuf.json_format import ParseDict
from google.protobuf.timestamp_pb2 import Timestamp

from cardbus.bus.orchestrator.questions import question_of
from cardbus.bus.orchestrator.runstate import RunState
from cardbus.eventstore import Envelope
from cardbus.eventstore import TaskState as CardbusState
from cardbus.eventstore import events as ev

__all__ = [
    "CANCEL_REASON",
    "USER_AGENT_ID",
    "USER_CAPABILITY",
    "Question",
    "TaskFold",
    "answer_notes",
    "approval_note",
    "data_part",
    "question_part",
    "result_text",
    "split_answer_notes",
    "split_approval_note",
]

#: the gateway's stand-in for the human at the other end of an A2A task
USER_AGENT_ID = "a2a-user"
_MARK = "\n[a2a message "


def approval_note(text: str, message_id: str) -> str:
    """The note of an approval answered over A2A: the message's text, and its id (which
    the task's history shows it under)."""
    return f"{text}{_MARK}{message_id}]"


_BY = "\n[answered by "


def answer_notes(message_id: str, actor: str) -> str:
    """The notes of a question's answer over A2A: the message's id and who answered."""
    return f"a2a:{message_id}{_BY}{actor}]"


def split_answer_notes(notes: str) -> tuple[str | None, str | None]:
    """(message id, who answered) of :func:`answer_notes` (who: None in logs before
    names); (None, None) for other notes."""
    if not notes.startswith("a2a:"):
        return None, None
    head, mark, rest = notes[4:].rpartition(_BY)
    if mark and rest.endswith("]"):
        return head, rest[:-1]
    return notes[4:], None


def split_approval_note(note: str) -> tuple[str, str | None]:
    """(text, message id) of an :func:`approval_note`; (note, None) for another note."""
    text, mark, rest = note.rpartition(_MARK)
    if not mark or not rest.endswith("]"):
        return note, None
    return text, rest[:-1]


#: the capability an agent names in ``NeedsInput(missing, capability=...)`` to ask the user
USER_CAPABILITY = "user_input"
CANCEL_REASON = "cancelled_via_a2a"
_S = CardbusState
_TERMINAL = {
    TaskState.TASK_STATE_COMPLETED,
    TaskState.TASK_STATE_FAILED,
    TaskState.TASK_STATE_CANCELED,
    TaskState.TASK_STATE_REJECTED,
}


def data_part(value: Any) -> Part:
    return Part(data=ParseDict(value, struct_pb2.Value()), media_type="application/json")


def _text(text: str) -> Part:
    return Part(text=text, media_type="text/plain")


#: an output's field that is its text, in this order, when it has one
TEXT_FIELDS = ("text", "answer", "report", "summary", "content", "result", "message")


def result_text(output: Any) -> str:
    """A task's output as the text part of its artifact: a string as it is; an object's
    text field (:data:`TEXT_FIELDS`) if it has one; else the output as indented JSON."""
    if isinstance(output, str):
        return output
    if isinstance(output, dict):
        for key in TEXT_FIELDS:
            value = output.get(key)
            if isinstance(value, str) and value.strip():
                return value
    return json.dumps(output, indent=2, ensure_ascii=False, default=str)


def _stamp(unix: float) -> Timestamp:
    ts = Timestamp()
    ts.FromDatetime(_dt.datetime.fromtimestamp(unix, _dt.UTC))
    return ts


@dataclass(frozen=True)
class Question:
    """What an input-required task waits for: an approval, a typed question (``spec``:
    its task id, text, schema, choices, default), or input for a question of a log
    before typed questions."""

    task_id: str  # the task awaiting approval, or the question's supplementary task
    kind: str  # "approval" | "question" | "input"
    text: str
    attempt: int = 0
    spec: Any = None


def question_part(q: Question) -> Part:
    """The data part of an input-required status that carries a question's schema."""
    return data_part({"question": q.spec})


class TaskFold:
    def __init__(self, root_id: str) -> None:
        self.root_id = root_id
        self.state = RunState()
        self.context_id = root_id
        self.history: list[Message] = []
        self.artifacts: list[Artifact] = []
        self.position = 0
        self.found = False
        self.updated = 0.0
        self._status = TaskState.TASK_STATE_SUBMITTED
        # the run was asked for in words (a text goal, no data part): its results are
        # given in words too, beside the data, for a client that reads only text parts
        self.text_goal = False

    # -- folding ------------------------------------------------------------------

    def apply(self, env: Envelope) -> list[Any]:
        """Fold one of the run's envelopes in; the A2A stream events it causes."""
        if env.correlation_id != self.root_id or not self.state.apply(env):
            return []
        self.position = max(self.position, env.position)
        self.updated = env.recorded_at or self.updated
        out: list[Any] = []
        data = env.data
        if isinstance(data, ev.RunStarted) and env.stream == self.root_id:
            self.found = True
            a2a = data.session.get("a2a") if isinstance(data.session, dict) else None
            if isinstance(a2a, dict):
                self.context_id = str(a2a.get("context_id") or self.root_id)
                first = a2a.get("message")
                if isinstance(first, dict):
                    msg = ParseDict(first, Message(), ignore_unknown_fields=True)
                    msg.task_id, msg.context_id = self.root_id, self.context_id
                    self.history.append(msg)
                    kinds = {p.WhichOneof("content") for p in msg.parts}
                    self.text_goal = "text" in kinds and "data" not in kinds
        message = self._message(env)
        if message is not None:
            self.history.append(message)
        artifact = self._artifact(env)
        if artifact is not None:
            self.artifacts.append(artifact)
            out.append(
                TaskArtifactUpdateEvent(
                    task_id=self.root_id,
                    context_id=self.context_id,
                    artifact=artifact,
                    last_chunk=True,
                )
            )
        status = self.status_state()
        if (message is not None and message.role == Role.ROLE_AGENT) or status != self._status:
            self._status = status
            out.append(
                TaskStatusUpdateEvent(
                    task_id=self.root_id, context_id=self.context_id, status=self._task_status()
                )
            )
        return out

    def _names(self) -> dict[str, str]:
        run = self.state.runs.get(self.root_id)
        return {tid: name for name, tid in run.names.items()} if run else {}

    def _label(self, stream: str) -> str:
        return self._names().get(stream, stream)

    def _message(self, env: Envelope) -> Message | None:
        data, who = env.data, self._label(env.stream)
        role = Role.ROLE_AGENT
        parts: list[Part] | None = None
        message_id = f"evt-{env.event_id}"
        match data:
            case ev.RunStarted():
                text = f"run started: {len(data.task_ids)} tasks"
            case ev.TaskDispatched():
                text = f"{who}: dispatched to {data.agent_id} (attempt {data.attempt})"
            case ev.ChildRunStarted():
                text = f"{who}: child run {data.child_root} started (attempt {data.attempt})"
            case ev.TaskStarted() if not data.implied:
                text = f"{who}: {data.agent_id} started (attempt {data.attempt})"
            case ev.QuestionAnswered() if data.message_id:  # over A2A: the user's message
                role, message_id = Role.ROLE_USER, data.message_id
                parts = [data_part(data.answer)]
                text = ""
            case ev.QuestionAnswered():
                door = f" from the {data.door}" if data.door else ""
                text = f"{who}: answered by {data.by}{door}: {json.dumps(data.answer)}"
            case ev.TaskResultSubmitted() if data.agent_id == USER_AGENT_ID:
                role = Role.ROLE_USER
                message_id = split_answer_notes(data.notes)[0] or message_id
                parts = [data_part(data.output)]
                text = ""
            case ev.TaskRejected():
                text = f"{who}: rejected by {data.agent_id}: {data.reason} {data.detail}".rstrip()
            case ev.TaskTimedOut():
                text = f"{who}: attempt {data.attempt} on {data.agent_id} timed out"
            case ev.TaskRetryScheduled():
                text = f"{who}: retry {data.attempt} in {data.delay_s:.1f}s ({data.reason})"
            case ev.TaskNeedsInput():
                text = f"{who}: needs input: {data.missing}"
            case ev.ApprovalRequested():
                text = f"{who}: awaits approval ({data.reason})"
            case ev.ApprovalGranted() | ev.ApprovalDenied() if data.by.startswith("a2a:"):
                role, message_id = Role.ROLE_USER, data.by[4:]  # a log before names
                text = data.note
            case ev.ApprovalGranted() | ev.ApprovalDenied() if split_approval_note(data.note)[1]:
                role = Role.ROLE_USER
                text, answered = split_approval_note(data.note)
                message_id = answered or message_id
            case ev.ApprovalGranted():
                text = f"{who}: approved by {data.by}"
            case ev.ApprovalDenied():
                text = f"{who}: denied by {data.by}"
            case ev.RevisionRequested():
                text = f"{who}: revision {data.round} requested"
            case ev.TaskCompleted():
                text = f"{who}: completed by {data.agent_id}"
            case ev.TaskFailed():
                text = f"{who}: failed: {data.reason} {data.error}".rstrip()
            case ev.TaskCancelled():
                text = f"{who}: cancelled ({data.reason})"
            case ev.TaskHalted():
                text = f"{who}: halted ({data.reason})"
            case ev.RunCompleted() if data.degraded:  # still a completed task (optional)
                text = f"run completed, degraded: without {', '.join(data.degraded)}"
                text += f" ({data.detail})" if data.detail else ""
            case ev.RunCompleted():
                text = "run completed"
            case ev.RunFailed() if data.cancelled:
                text = "run cancelled" + (f" by {data.cancelled_by}" if data.cancelled_by else "")
            case ev.RunFailed():
                text = f"run failed: {data.reason} {', '.join(data.failed_tasks)}".rstrip()
            case ev.RunHalted():
                text = f"run halted: {data.reason} {data.detail}".rstrip()
            case _:
                return None
        return Message(
            message_id=message_id,
            context_id=self.context_id,
            task_id=self.root_id,
            role=role,
            parts=parts if parts is not None else [_text(text)],
            metadata={"cardbus": {"type": env.type, "stream": env.stream}},
        )

    def _artifact(self, env: Envelope) -> Artifact | None:
        if not isinstance(env.data, ev.TaskCompleted):
            return None
        name = self._names().get(env.stream)
        if name is None:  # a review or supplementary task: not one of the plan's results
            return None
        parts = [data_part(env.data.output)]
        if self.text_goal:
            parts.append(_text(result_text(env.data.output)))
        return Artifact(artifact_id=name, name=name, parts=parts)

    # -- reading ------------------------------------------------------------------

    def questions(self) -> list[Question]:
        """What the run waits for from the user, oldest first."""
        run = self.state.runs.get(self.root_id)
        if run is None or run.finished is not None:
            return []
        out = []
        for tid in run.tasks:
            task = self.state.tasks.get(tid)
            if task is None:
                continue
            asked = question_of(task)
            if asked is not None and asked.open:
                out.append(Question(tid, "question", asked.question, spec=asked.as_dict()))
            elif task.state is _S.AWAITING_APPROVAL:
                goal = task.created.goal or task.created.capability
                out.append(
                    Question(tid, "approval", f"{self._label(tid)} ({goal}) awaits approval")
                )
            elif (
                task.state in (_S.DISPATCHED, _S.RUNNING)
                and USER_AGENT_ID in task.dispatched_to
                and task.attempt not in task.settled
            ):
                out.append(Question(tid, "input", task.created.goal, task.attempt))
        return out

    def status_state(self) -> Any:  # a TaskState value
        run = self.state.runs.get(self.root_id)
        if run is None:
            return TaskState.TASK_STATE_SUBMITTED
        if run.finished == "completed":
            return TaskState.TASK_STATE_COMPLETED
        if run.finished == "cancelled":  # run.failed with cancelled: whoever cancelled it
            return TaskState.TASK_STATE_CANCELED
        if run.finished is not None:
            if any(
                self.state.tasks[t].state is _S.CANCELLED
                and self.state.tasks[t].reason == CANCEL_REASON
                for t in run.tasks
                if t in self.state.tasks
            ):
                return TaskState.TASK_STATE_CANCELED
            return TaskState.TASK_STATE_FAILED
        if self.questions():
            return TaskState.TASK_STATE_INPUT_REQUIRED
        live = [self.state.tasks[t].state for t in run.tasks if t in self.state.tasks]
        if any(s not in (_S.PENDING, None) for s in live):
            return TaskState.TASK_STATE_WORKING
        return TaskState.TASK_STATE_SUBMITTED

    @property
    def terminal(self) -> bool:
        return self.status_state() in _TERMINAL

    @property
    def interrupted(self) -> bool:
        return self.status_state() == TaskState.TASK_STATE_INPUT_REQUIRED

    def timestamp_ns(self) -> int:
        """The status timestamp (``status.timestamp``) in nanoseconds; 0 before any event."""
        return _stamp(self.updated).ToNanoseconds() if self.updated else 0

    def _task_status(self) -> TaskStatus:
        state = self.status_state()
        status = TaskStatus(state=state)
        if self.updated:
            status.timestamp.CopyFrom(_stamp(self.updated))
        text = ""
        asked: list[Question] = []
        if state == TaskState.TASK_STATE_INPUT_REQUIRED:
            asked = self.questions()
            text = "; ".join(q.text for q in asked)
        elif self.history and self.history[-1].role == Role.ROLE_AGENT:
            text = self.history[-1].parts[0].text
        if text:
            status.message.CopyFrom(
                Message(
                    message_id=f"status-{self.root_id}-{self.position}",
                    context_id=self.context_id,
                    task_id=self.root_id,
                    role=Role.ROLE_AGENT,
                    # a typed question: its schema rides beside the text, as data
                    parts=[_text(text), *(question_part(q) for q in asked if q.spec)],
                )
            )
        return status

    def task(self, history_length: int | None = None) -> Task:
        history = self.history if history_length is None else self.history[-history_length:]
        if history_length == 0:
            history = []
        return Task(
            id=self.root_id,
            context_id=self.context_id,
            status=self._task_status(),
            artifacts=self.artifacts,
            history=history,
            metadata={"cardbus": {"root_id": self.root_id, "position": self.position}},
        )
