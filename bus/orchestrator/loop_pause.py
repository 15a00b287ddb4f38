"""A loop that pauses the run for a person instead of halting it (``Policy.on_loop="pause"``).

Loop detection (the same capability and inputs on more than ``Policy.loop_threshold``
tasks of a run) halts the run by default. With ``on_loop="pause"`` the decider writes a
``run.paused`` instead, with the loop's evidence (the task about to be sent, its
capability and inputs, the tasks already sent with them), and sends nothing more of the
run until a person answers. Tasks already out go on; their results are recorded.

:func:`answer_pause` is the person's word, written to the run's stream from outside the
decision loop (``cardbus approve RUN`` / ``cardbus deny RUN``), as ``answer_approval`` is:
a ``run.pause_answered`` with the person as its actor: ``resume`` (the paused task goes
on, past the loop: with a note, or with ``inputs`` merged over its own, which the fold
gives it from then on), or ``stop`` (the decider halts the run, ``loop_detected``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import msgspec

from cardbus.eventstore import ConcurrencyError, Envelope, EventStore, NewEvent
from cardbus.eventstore import events as ev
from cardbus.eventstore.errors import CardbusError, StreamNotFound, ValidationError

if TYPE_CHECKING:
    from cardbus.bus.orchestrator.dispatch import Dispatching
    from cardbus.bus.orchestrator.runstate import RunState, RunView, TaskView

__all__ = [
    "DECISIONS",
    "FOLDED",
    "answer_pause",
    "answer_word",
    "fold",
    "holds",
    "open_pause",
    "pause",
]

#: what a person may answer a paused run with
DECISIONS = ("resume", "stop")
#: the run events folded here
FOLDED = frozenset({ev.RunPaused, ev.RunPauseAnswered})
_TRIES = 10
_CLOSE = (ev.RunPauseAnswered, ev.RunCompleted, ev.RunFailed, ev.RunHalted)


def fold(state: RunState, env: Envelope) -> None:
    """A pause opens; an answer closes it (and lets the paused task past the loop, with
    the inputs the person gave merged over its own), or stops the run."""
    run = state.runs.get(env.stream)
    if run is None:
        return
    data = env.data
    if isinstance(data, ev.RunPaused):
        run.paused = data
        return
    if not isinstance(data, ev.RunPauseAnswered) or run.paused is None:
        return  # an answer to no open pause (a second answer): the first stands
    paused, run.paused = run.paused, None
    if data.decision == "stop":
        run.stopped_by = data.by or "?"
        return
    run.loop_pass |= {paused.task_id}
    task = state.tasks.get(paused.task_id)
    if task is not None and data.inputs and isinstance(task.created.inputs, dict):
        task.created = _with_inputs(task.created, data.inputs)


def _with_inputs(created: ev.TaskCreated, inputs: dict[str, Any]) -> ev.TaskCreated:
    return msgspec.structs.replace(created, inputs={**created.inputs, **inputs})


def holds(decider: Dispatching, run: RunView) -> bool:
    """The run is paused (in the log, or decided in this step): dispatch nothing.

    While the run's own stream is being written (its append in flight), a pause may be
    in it, not folded yet: a step deciding meanwhile (another reply came) would send the
    very task the pause holds, on loop counts that miss the dispatches in flight too. So
    under ``on_loop="pause"`` nothing is sent until that write is folded (the run's stream
    is written rarely: its start, its plans, its end, a pause)."""
    if run.paused is not None:
        return True
    if decider.policy.on_loop == "pause" and run.root_id in decider.d.busy:
        return True
    return any(isinstance(e, ev.RunPaused) for e in decider.d.events.get(run.root_id, []))


def pause(
    decider: Dispatching,
    run: RunView,
    task: TaskView,
    loop_hash: str,
    count: int,
    inputs: Any,
    detail: str,
) -> None:
    """Pause the run on a loop, with its evidence, instead of halting it."""
    if holds(decider, run) or decider.d.touched(run.root_id):
        return  # one pause at a time; a write to the run's stream in flight: next step
    sent = {t for h, t in run.loop_seen if h == loop_hash}
    sent |= {  # and those sent with them in this same step
        stream
        for stream, events in decider.d.events.items()
        if any(isinstance(e, ev.TaskDispatched) and e.loop_hash == loop_hash for e in events)
    }
    decider.d.add(
        run.root_id,
        ev.RunPaused(
            reason="loop_detected",
            task_id=task.task_id,
            detail=detail,
            capability=task.created.capability,
            loop_hash=loop_hash,
            count=count,
            inputs=inputs,
            tasks=sorted(sent)[:50],
        ),
    )


def open_pause(events: list[Envelope]) -> ev.RunPaused | None:
    """The open pause of a run, from its stream's events (None: not paused)."""
    current: ev.RunPaused | None = None
    for env in events:
        if isinstance(env.data, ev.RunPaused):
            current = env.data
        elif isinstance(env.data, _CLOSE):
            current = None
    return current


async def answer_pause(
    store: EventStore,
    root_id: str,
    decision: str,
    *,
    by: str,
    note: str = "",
    inputs: dict[str, Any] | None = None,
) -> ev.RunPaused:
    """Resume (``inputs``: merged over the paused task's own) or stop a paused run.

    Raises ``ValidationError`` for a bad decision or inputs, ``CardbusError`` when the
    run is not paused, ``StreamNotFound`` for an unknown run. Returns the pause answered.
    """
    if decision not in DECISIONS:
        raise ValidationError(f"a pause is answered {', '.join(DECISIONS)}; got {decision!r}")
    if inputs is not None and (decision != "resume" or not isinstance(inputs, dict)):
        raise ValidationError("inputs go with resume, as a JSON object of the task's inputs")
    for attempt in range(_TRIES):
        events = await store.read_stream(root_id)
        if not events:
            raise StreamNotFound(root_id)
        paused = open_pause(events)
        if paused is None:
            raise CardbusError(f"run {root_id!r} is not paused")
        answer = ev.RunPauseAnswered(
            decision=decision, by=by, task_id=paused.task_id, note=note, inputs=inputs
        )
        try:
            new = NewEvent(data=answer, correlation_id=root_id, actor=by)
            await store.append(root_id, [new], len(events))
            return paused
        except ConcurrencyError:  # another writer first: decided again on what it wrote
            if attempt == _TRIES - 1:
                raise
    raise AssertionError("unreachable")  # pragma: no cover


async def answer_word(
    store: EventStore,
    the_id: str,
    granted: bool,
    by: str,
    note: str = "",
    inputs: dict[str, Any] | None = None,
) -> str:
    """A person's yes or no to what ``the_id`` waits for: a run's pause (resume or stop,
    ``inputs`` for the task it holds) or a task's approval. Returns what it did:
    ``resumed``, ``stopped``, ``approved`` or ``denied`` (``cardbus approve``/``deny``,
    the console)."""
    from cardbus.bus.orchestrator.approvals import answer_approval

    first = await store.read_stream(the_id)
    if first and isinstance(first[0].data, ev.RunStarted):
        decision = "resume" if granted else "stop"
        await answer_pause(store, the_id, decision, by=by, note=note, inputs=inputs)
        return "resumed" if granted else "stopped"
    if inputs is not None:
        raise ValidationError("inputs go with a paused run (approve the run, not a task)")
    await answer_approval(store, the_id, granted, by, note)
    return "approved" if granted else "denied"
