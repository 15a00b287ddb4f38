"""``cardbus run --follow``: every step of the run as it is logged, and the text of its
model calls as it is written.

:class:`Follow` is handed to :class:`~cardbus.tools.progress.RunProgress`: it says
each model call and tool call of the run's tasks (from the log, as any other
step), and prints the chunks of the run's model answers (``agents.streaming``,
from the runtime's bus) on the line of the call that writes them, so a long
answer is read while it is written. The chunks are a view: the line the log's
``model.answered`` gives is printed when it comes, whatever was shown before.

The order printed is the order things happened. The pieces travel on the bus,
at once, while the call's ``model.requested`` is appended while the model works
and reaches the log's follower later: shown as they come, the text would precede
the line saying the model was asked. So the pieces of a task attempt's n-th
streamed call are held until the log has shown n model calls of that attempt
asked (every streamed call is asked in the log first; a call replayed from the
journal is not asked again and streams nothing), then printed, and from then on
as they come. Pieces of different calls never share a line: a piece of another
call than the open line's ends that line and starts one naming its task.
"""

from __future__ import annotations

import sys
from collections.abc import Callable

from cardbus.agents.streaming import Chunk
from cardbus.bus.transport.interface import Bus, StopWatching
from cardbus.eventstore import Envelope
from cardbus.eventstore import events as ev

__all__ = ["Follow"]


class Follow:
    """Steps and streamed text of one run, on one output (see the module doc)."""

    def __init__(self, bus: Bus, write: Callable[[str], None] | None = None) -> None:
        self.bus = bus
        self.write = write or _stdout
        self.root_id: str | None = None
        self._open: tuple[str, int, int] | None = None  # the call whose line is open
        # model calls the log has shown asked, by (task, attempt); the pieces of a call
        # beyond that count wait in _held, by (task, attempt, call), in arrival order
        self._asked: dict[tuple[str, int], int] = {}
        self._held: dict[tuple[str, int, int], list[Chunk]] = {}
        self._stop: StopWatching | None = None
        self.chunks = 0  # pieces printed

    async def start(self) -> None:
        if self.bus.carries_chunks:
            self._stop = await self.bus.watch_chunks(self._on_chunk)

    async def stop(self) -> None:
        if self._stop is not None:
            await self._stop()
            self._stop = None
        self._close()
        # pieces of a call the log never showed asked (the run ended first): a view
        # only, and printed now they would be out of order; the log has what happened
        self._held.clear()

    def line(self, text: str) -> None:
        """A whole line (a step), after the streamed text it interrupts."""
        self._close()
        self.write(text + "\n")

    def _close(self) -> None:
        if self._open is not None:
            self._open = None
            self.write("\n")

    def _on_chunk(self, chunk: Chunk) -> None:
        if self.root_id is not None and chunk.root_id != self.root_id:
            return  # another run's
        if chunk.call > self._asked.get((chunk.task_id, chunk.attempt), 0):
            # the log has not shown this call asked yet: its text waits for that line
            self._held.setdefault((chunk.task_id, chunk.attempt, chunk.call), []).append(chunk)
            return
        self._show(chunk)

    def _asked_one(self, task_id: str, attempt: int) -> None:
        """The log showed one more model call of the attempt asked: print what it freed."""
        asked = self._asked[(task_id, attempt)] = self._asked.get((task_id, attempt), 0) + 1
        freed = sorted(k for k in self._held if k[:2] == (task_id, attempt) and k[2] <= asked)
        for key in freed:
            for chunk in self._held.pop(key):
                self._show(chunk)

    def _show(self, chunk: Chunk) -> None:
        call = (chunk.task_id, chunk.attempt, chunk.call)
        if chunk.done:
            if self._open == call:
                self._close()
            return
        if self._open != call:
            self._close()
            self.write(f"  {chunk.task_id} writes: ")
            self._open = call
        self.chunks += 1
        self.write(chunk.text.replace("\n", "\n    "))

    def step(self, env: Envelope) -> None:
        """The line an event of the run says, if it is a step of a model or tool call."""
        data = env.data
        name = env.stream
        if isinstance(data, ev.ModelRequested):
            model = f" {data.model}" if data.model else ""
            self.line(f"  {name}: asks its model{model}")
            self._asked_one(data.task_id, data.attempt)
        elif isinstance(data, ev.ModelAnswered):
            if data.error:
                self.line(f"  {name}: the model failed: {data.error}")
            else:
                tokens = data.input_tokens + data.output_tokens
                self.line(f"  {name}: the model answered ({tokens} tokens)")
        elif isinstance(data, ev.ToolCalled):
            how = f"failed: {data.error}" if data.error else "done"
            self.line(f"  {name}: tool {data.tool} {how}")


def _stdout(text: str) -> None:
    sys.stdout.write(text)
    sys.stdout.flush()
