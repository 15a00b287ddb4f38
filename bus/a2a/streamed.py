"""Model answers as they are written, on an A2A stream: artifact updates that append.

While a run is followed (``SendStreamingMessage``, ``SubscribeToTask``), each
chunk of a model call of the run (``agents.streaming``, from the gateway's bus)
becomes a ``TaskArtifactUpdateEvent`` of the artifact ``<task>~<attempt>~<call>~stream``
(named after the plan task, text parts): the first piece seen of a call opens it
(``append`` false), the next ones append to it, the call's end closes it
(``last_chunk``). These artifacts are a live view: they are never in ``GetTask``
(the log keeps the call's one answer, and the task's result is the plan task's
own artifact when it completes).

:func:`merged` interleaves the log's envelopes and the chunks as they come.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

from a2a.types import Artifact, Part, TaskArtifactUpdateEvent

from cardbus.agents.streaming import Chunk
from cardbus.bus.a2a.fold import TaskFold

__all__ = ["ChunkArtifacts", "merged"]


class ChunkArtifacts:
    """The artifact updates of one followed run's chunks (see the module doc)."""

    def __init__(self, fold: TaskFold) -> None:
        self.fold = fold
        self._open: set[str] = set()

    def update(self, chunk: Chunk) -> TaskArtifactUpdateEvent | None:
        artifact_id = f"{chunk.task_id}~{chunk.attempt}~{chunk.call}~stream"
        appending = artifact_id in self._open
        if chunk.done:
            if not appending:
                return None  # nothing of it was shown: nothing to close
            self._open.discard(artifact_id)
        else:
            self._open.add(artifact_id)
        names = {tid: name for name, tid in self._names().items()}
        name = names.get(chunk.task_id, chunk.task_id)
        return TaskArtifactUpdateEvent(
            task_id=self.fold.root_id,
            context_id=self.fold.context_id,
            artifact=Artifact(
                artifact_id=artifact_id,
                name=f"{name} (streaming)",
                parts=[Part(text=chunk.text, media_type="text/plain")],
            ),
            append=appending,
            last_chunk=chunk.done,
        )

    def _names(self) -> dict[str, str]:
        run = self.fold.state.runs.get(self.fold.root_id)
        return dict(run.names) if run else {}


async def merged(events: AsyncIterator[Any], chunks: asyncio.Queue[Chunk]) -> AsyncIterator[Any]:
    """The envelopes of ``events`` and the chunks put in ``chunks``, as each comes."""
    pending: asyncio.Task[Any] | None = None
    waiting: asyncio.Task[Chunk] | None = None
    try:
        while True:
            if pending is None:
                pending = asyncio.ensure_future(anext(events))
            if waiting is None:
                waiting = asyncio.ensure_future(chunks.get())
            done, _ = await asyncio.wait({pending, waiting}, return_when=asyncio.FIRST_COMPLETED)
            if waiting in done:
                yield waiting.result()
                waiting = None
            if pending in done:
                try:
                    env = pending.result()
                except StopAsyncIteration:
                    return
                finally:
                    pending = None
                yield env
    finally:
        for task in (pending, waiting):
            if task is not None:
                task.cancel()
                with contextlib.suppress(BaseException):
                    await task
        with contextlib.suppress(Exception):
            await events.aclose()  # type: ignore[attr-defined]
