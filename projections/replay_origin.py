"""A re-run's replayed calls, filled in from the recorded run they replay.

A call answered from the journal names the event it replays (``replayed_from``).
On a retry that event is in the same task stream, and :class:`JournalFold` fills
the call in as it folds. A re-run (``cardbus rerun``, offline or with ``--task``)
replays the calls of *another* run: its task's ``task.created`` names the task of
the recorded run (``origin``), and the replayed events are in that task's stream,
which the re-run's own events do not hold. Without this module its timeline shows
the prompts, answers, arguments and results it was answered with as "(not kept)"
though the log has them.

:func:`origin_sources` reads the origin's stream (and its origin's, for a re-run of
a re-run) and returns each recorded call by the id of the event that answered it;
:func:`fill_replayed` copies what a replayed call lacks from its source. The
origin's events are verified like any other read of the store (invariant 11: the
journal's own digests were checked when the re-run was answered from them).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

from cardbus.eventstore import events as ev
from cardbus.eventstore.errors import StreamNotFound
from cardbus.eventstore.store import EventStore
from cardbus.projections.replay import Call, JournalFold, ModelCall, TaskNode, ToolCall

__all__ = ["fill_replayed", "fill_timeline_replays", "origin_of", "origin_sources"]

#: how many re-runs of re-runs are followed back (a cycle cannot occur; this bounds the reads)
MAX_ORIGIN_DEPTH = 16


def origin_of(events: Iterable[object]) -> str | None:
    """The ``origin`` a task's ``task.created`` names (None: not a re-run's task)."""
    for env in events:
        data = getattr(env, "data", None)
        if isinstance(data, ev.TaskCreated):
            return data.origin
    return None


async def origin_sources(store: EventStore, origin: str | None) -> dict[str, Call]:
    """Each call the origin chain of a task recorded, by the id of its ``model.answered``
    or ``tool.called`` event; deepest origins first, so a replayed source is filled in."""
    folds: list[JournalFold] = []
    seen: set[str] = set()
    while origin and origin not in seen and len(seen) < MAX_ORIGIN_DEPTH:
        seen.add(origin)
        try:
            events = await store.read_stream(origin)
        except StreamNotFound:
            break  # a log cut short, or a task that was never written: nothing to fill in
        fold = JournalFold()
        for env in events:
            fold.apply(env)
        folds.append(fold)
        origin = origin_of(events)
    sources: dict[str, Call] = {}
    for fold in reversed(folds):  # the recorded run's own first, then what replayed it
        fill_replayed(fold.calls, sources)
        sources.update(fold.by_answer)
        sources.update(fold.by_called)
    return sources


def fill_replayed(calls: Iterable[Call], sources: dict[str, Call]) -> None:
    """Give each replayed call that lacks them its source's prompt and answer (a model
    call) or arguments and result (a tool call); calls already filled in are left alone."""
    for call in calls:
        if not isinstance(call, ModelCall | ToolCall) or not _unfilled(call):
            continue
        source = sources.get(call.replayed_from or "")
        if isinstance(call, ModelCall) and isinstance(source, ModelCall):
            call.model = source.model or call.model
            call.prompt, call.answer = source.prompt, source.answer
            call.request_bytes = source.request_bytes
            call.tools_offered = list(source.tools_offered)
            call.error, call.error_type = source.error, source.error_type
        elif isinstance(call, ToolCall) and isinstance(source, ToolCall):
            call.arguments = source.arguments if call.arguments is None else call.arguments
            call.result, call.error = source.result, source.error
            call.error_type = source.error_type


async def fill_timeline_replays(
    store: EventStore, tasks: Iterable[TaskNode], events: Iterable[object]
) -> None:
    """Fill in the replayed calls of a timeline's tasks (and their subtasks) whose
    sources are in their origin's stream; ``events``: the timeline's, for the origins."""
    origins: dict[str, str] = {}
    for env in events:
        data = getattr(env, "data", None)
        if isinstance(data, ev.TaskCreated) and data.origin:
            origins[getattr(env, "stream", "")] = data.origin

    def walk(nodes: Iterable[TaskNode]) -> Iterator[TaskNode]:
        for n in nodes:
            yield n
            yield from walk(n.children)

    for node in walk(tasks):
        origin = origins.get(node.task_id)
        calls = [*node.calls, *(c for s in node.spans for c in s.calls)]
        if origin is None or not any(_unfilled(c) for c in calls):
            continue
        fill_replayed(calls, await origin_sources(store, origin))


def _unfilled(call: Call) -> bool:
    if isinstance(call, ModelCall):
        return call.status == "replayed" and call.prompt is None and call.answer is None
    if isinstance(call, ToolCall):
        return call.status == "replayed" and call.result is None and call.error is None
    return False  # an unknown effect: nothing replayed
