"""Model answers as they are written: chunks on an ephemeral side channel, never in the log.

A model call that streams (``OpenAIChatLLM`` inside a worker) hands each piece of
text to the :class:`ChunkSink` of the attempt it runs in (:data:`CHUNK_SINK`, set by
the worker around the handler). The sink asks its bus whether anyone watches the
run, per chunk, and publishes a :class:`Chunk` only then: a call nobody watches
publishes nothing. Chunks are a view, not a record: the log keeps one
``model.answered`` with the whole answer, so the journal, costs and replay are
what they are without streaming, and a chunk lost (a watcher that joined late, a
NATS reconnect) loses nothing but a view.

Watchers (the console, the A2A gateway, ``cardbus run --follow``) subscribe with
``Bus.watch_chunks``; on the embedded runtime the channel is in process, on NATS a
core subject (``cardbus.chunk.<agent>.<root>``, ``bus.transport.nats_chunks``).

The agents layer knows no bus: the sink is built by the worker from two callables.
"""

from __future__ import annotations

import contextvars
from collections.abc import Awaitable, Callable

import msgspec

__all__ = ["CHUNK_SINK", "CallStream", "Chunk", "ChunkSink", "current_sink", "decode_chunk"]


class Chunk(msgspec.Struct, frozen=True, tag_field="type", tag="chunk"):
    """One piece of a model answer being written.

    ``call``: which streamed model call of the attempt (from 1), ``seq``: the piece's
    number in that call (from 0; a watcher that missed some sees a gap). ``done``: the
    call's last message (its ``text`` is empty); a call that failed ends without one.
    """

    task_id: str
    attempt: int
    root_id: str
    agent_id: str
    call: int
    seq: int
    text: str
    done: bool = False


_decoder = msgspec.json.Decoder(Chunk)


def decode_chunk(data: bytes) -> Chunk:
    """A chunk from the wire; ``msgspec.DecodeError`` (a ``ValueError``) if it is not one."""
    return _decoder.decode(data)


class CallStream:
    """The chunks of one model call: ``send`` each piece of text as it comes."""

    __slots__ = ("_sink", "call", "seq")

    def __init__(self, sink: ChunkSink, call: int) -> None:
        self._sink = sink
        self.call = call
        self.seq = 0

    async def send(self, text: str) -> None:
        """Publish ``text`` if someone watches the run now; nothing otherwise (one lookup)."""
        seq = self.seq
        self.seq += 1
        sink = self._sink
        if not text or not sink.watched(sink.root_id):
            return
        await sink.publish(
            Chunk(sink.task_id, sink.attempt, sink.root_id, sink.agent_id, self.call, seq, text)
        )

    async def end(self) -> None:
        """Say the call's answer is whole (its ``model.answered`` follows)."""
        sink = self._sink
        if self.seq and sink.watched(sink.root_id):
            await sink.publish(
                Chunk(
                    sink.task_id,
                    sink.attempt,
                    sink.root_id,
                    sink.agent_id,
                    self.call,
                    self.seq,
                    "",
                    True,
                )
            )


class ChunkSink:
    """Where the model calls of one attempt send their chunks (see the module doc)."""

    __slots__ = ("agent_id", "attempt", "calls", "publish", "root_id", "task_id", "watched")

    def __init__(
        self,
        publish: Callable[[Chunk], Awaitable[None]],
        watched: Callable[[str], bool],
        task_id: str,
        attempt: int,
        root_id: str,
        agent_id: str,
    ) -> None:
        self.publish = publish
        self.watched = watched
        self.task_id = task_id
        self.attempt = attempt
        self.root_id = root_id
        self.agent_id = agent_id
        self.calls = 0

    def call(self) -> CallStream:
        """The stream of the next model call."""
        self.calls += 1
        return CallStream(self, self.calls)


#: the sink of the attempt being handled (None: outside a worker, or on a bus without
#: a chunk channel: a model call then does not stream unless told to)
CHUNK_SINK: contextvars.ContextVar[ChunkSink | None] = contextvars.ContextVar(
    "cardbus_chunk_sink", default=None
)


def current_sink() -> ChunkSink | None:
    return CHUNK_SINK.get()
