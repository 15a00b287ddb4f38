"""The console's ``/api/chunks``: a run's model answers as they are written (SSE).

The chunks (``agents.streaming``) come from the bus the console can hear: the
runtime it hosts (``cardbus ui --agent``: in process), or on a NATS log the
cluster's core subjects (``bus.transport.nats_chunks``). A console over a SQLite
log whose runs another process runs hears none (``/api/console`` says so in
``streaming``); the log still shows each answer when it is whole. Each frame is
``event: chunk`` with ``{task, attempt, call, seq, text, done}``; the page writes
them into its "Writing now" panel. Nothing of this is stored.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

import msgspec

from cardbus.agents.streaming import Chunk
from cardbus.bus.transport.interface import Bus

__all__ = ["chunk_frames"]

_encode = msgspec.json.Encoder().encode


async def chunk_frames(
    bus: Bus | None, root: str, stopping: asyncio.Event, heartbeat_s: float
) -> AsyncIterator[bytes]:
    """SSE frames of run ``root``'s chunks, with heartbeats, until the server stops."""
    if bus is None or not bus.carries_chunks:
        yield b"retry: 1000\n: connected\n\nevent: unavailable\ndata: {}\n\n"
        return
    queue: asyncio.Queue[Chunk] = asyncio.Queue(maxsize=10_000)

    def put(chunk: Chunk) -> None:
        with contextlib.suppress(asyncio.QueueFull):  # a stalled page drops a view, no more
            queue.put_nowait(chunk)

    # watching before the page hears "connected": from its open on, nothing is missed
    stop_watching = await bus.watch_chunks(put, root)
    yield b"retry: 1000\n: connected\n\n"
    stop = asyncio.ensure_future(stopping.wait())
    try:
        while True:
            got = asyncio.ensure_future(queue.get())
            done, _ = await asyncio.wait(
                {got, stop}, timeout=heartbeat_s, return_when=asyncio.FIRST_COMPLETED
            )
            if stop in done:
                got.cancel()
                return
            if got not in done:
                got.cancel()
                yield b": heartbeat\n\n"
                continue
            c = got.result()
            body = _encode(
                {
                    "task": c.task_id,
                    "attempt": c.attempt,
                    "call": c.call,
                    "seq": c.seq,
                    "text": c.text,
                    "done": c.done,
                    "agent": c.agent_id,
                }
            )
            yield b"event: chunk\ndata: %s\n\n" % body
    finally:
        stop.cancel()
        await stop_watching()
