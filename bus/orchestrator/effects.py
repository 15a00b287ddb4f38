"""An operator's third answer to an unknown tool effect: it happened, and this was its result.

A journaled tool call whose effect is unknown (``tool.effect_unknown`` ``ask``:
the process died during it, or an attempt that differs from the recorded one
asks for a call an earlier attempt made, with the same key) stops its task
until an operator's word (``bus.orchestrator.journal``). ``answer_approval``
gives two answers: approve (the call runs again, with its key) or deny (the
task is cancelled). :func:`record_effect_done` gives the third: the effect
happened. It writes a ``tool.called`` for that call, with the result the
operator gives (or, with none given, confirms the one the log has),
``recorded_by`` the operator and the operator as the event's actor; then, when
no other call of the task waits, the ``approval.granted`` that resumes it. The
next attempt replays that result like any recorded one: the model gets it as
the tool's answer, and the tool does not run.

Like ``answer_approval`` it writes to the log, never to an orchestrator: the
orchestrator that owns the run folds it.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any

import msgspec

from cardbus.bus.orchestrator.journal import _Step, _TaskJournal, inline_size
from cardbus.bus.orchestrator.runstate import RunState
from cardbus.eventstore import NewEvent, TaskState
from cardbus.eventstore import events as ev
from cardbus.eventstore.errors import CardbusError, ConcurrencyError, StreamNotFound

__all__ = ["NO_RESULT", "UnknownEffect", "record_effect_done", "unknown_effects"]

#: ``record_effect_done(result=NO_RESULT)``: confirm the result the log has for the call
NO_RESULT: Any = object()

_encoder = msgspec.json.Encoder(order="sorted")
_TRIES = 5  # reads of the task's stream before a write that keeps losing races gives up


@dataclass(frozen=True, slots=True)
class UnknownEffect:
    """A tool call of a task waiting for an operator's word.

    ``call`` is its ``tool.requested`` event id; ``key`` its idempotency key;
    ``arguments`` as the log keeps them (None: a digest only); ``result`` the
    result the log has for it (``has_result``: an earlier attempt's call met again
    after a first difference), which ``record_effect_done`` confirms when given none.
    """

    task_id: str
    call: str
    tool: str
    key: str
    attempt: int
    arguments: Any
    has_result: bool
    result: Any


async def unknown_effects(store: Any, task_id: str) -> list[UnknownEffect]:
    """The tool calls of ``task_id`` waiting for an operator's word, oldest first."""
    _, _, waiting = await _read(store, task_id)
    return [_effect(task_id, s) for s in waiting]


async def record_effect_done(
    store: Any,
    task_id: str,
    *,
    by: str,
    result: Any = NO_RESULT,
    call: str = "",
    note: str = "",
) -> UnknownEffect:
    """Record that the unknown effect of a tool call of ``task_id`` happened, with
    ``result`` as its result (``NO_RESULT``: the one the log has, which must exist).

    ``call`` names the call (its ``tool.requested`` id, or its idempotency key, or a
    unique prefix of either) when several wait; one waiting call needs none. Raises
    ``CardbusError`` when the task does not wait for an operator's word on a tool call,
    when ``call`` names none of those waiting (or is needed), and when no result is
    given for a call the log has none for; ``StreamNotFound`` for an unknown task.
    Returns the call recorded.

    The asking attempt's last journal writes (a parallel sibling's result) may land
    after the task asked: a write that lost the race to one is decided again on the
    log as it then is (``ConcurrencyError`` only if that keeps happening).
    """
    for tries in range(1, _TRIES + 1):
        try:
            return await _record_done(store, task_id, by, result, call, note)
        except ConcurrencyError:
            if tries == _TRIES:
                raise
    raise AssertionError("unreachable")  # pragma: no cover


async def _record_done(
    store: Any, task_id: str, by: str, result: Any, call: str, note: str
) -> UnknownEffect:
    envs, root, waiting = await _read(store, task_id)
    step = _pick(task_id, waiting, call)
    if result is NO_RESULT:
        if not step.has_answer:
            raise CardbusError(
                f"the log has no result for {step.tool} (call {step.requested_id}): give the"
                " result the effect had (--result JSON)"
            )
        result = step.answer
    try:
        data = _encoder.encode(result)
    except (TypeError, ValueError, msgspec.EncodeError) as e:
        raise CardbusError(f"the result must be JSON: {e}") from e
    called = ev.ToolCalled(
        task_id=task_id,
        agent_id=step.agent,
        tool=step.tool,
        arguments=step.request,
        result=result,
        attempt=step.attempt,
        arguments_digest=step.arguments_digest,
        result_digest=hashlib.sha256(data).hexdigest(),
        result_bytes=inline_size(result),
        execution=step.execution,
        seq=step.seq,
        idempotency_key=step.key,
        recorded_by=by,
    )
    out: list[ev.Event] = [called]
    if len(waiting) == 1:  # the last call waiting: the task resumes (else it waits on)
        out.append(ev.ApprovalGranted(by=by, resume="pending", note=note))
    await store.append(
        task_id, [NewEvent(data=d, correlation_id=root, actor=by) for d in out], len(envs)
    )
    return _effect(task_id, step)


async def _read(store: Any, task_id: str) -> tuple[list[Any], str, list[_Step]]:
    envs = await store.read_stream(task_id)
    if not envs:
        raise StreamNotFound(task_id)
    state = RunState()
    journal = _TaskJournal(keep_requests=True)
    for env in envs:
        state.apply(env)
        journal.fold(env)
    task = state.tasks.get(task_id)
    if task is None or task.state is not TaskState.AWAITING_APPROVAL or not journal.asked:
        current = task.state if task else "unknown"
        raise CardbusError(
            f"task {task_id!r} does not wait for an operator's word on a tool call (it is"
            f" {current})"
        )
    return envs, envs[0].correlation_id, list(journal.asked)


def _pick(task_id: str, waiting: list[_Step], call: str) -> _Step:
    if not call:
        if len(waiting) == 1:
            return waiting[0]
        named = ", ".join(f"{s.requested_id} ({s.tool})" for s in waiting)
        raise CardbusError(f"{len(waiting)} tool calls of {task_id} wait; name one: {named}")
    found = [s for s in waiting if s.requested_id.startswith(call) or s.key.startswith(call)]
    if len(found) != 1:
        named = ", ".join(f"{s.requested_id} ({s.tool})" for s in waiting)
        what = "names none" if not found else "names several"
        raise CardbusError(f"call {call!r} {what} of the calls of {task_id} waiting: {named}")
    return found[0]


def _effect(task_id: str, step: _Step) -> UnknownEffect:
    return UnknownEffect(
        task_id=task_id,
        call=step.requested_id,
        tool=step.tool,
        key=step.key,
        attempt=step.attempt,
        arguments=step.request,
        has_result=step.has_answer,
        result=step.answer if step.has_answer else None,
    )
