"""Chunks of model answers on NATS: core subjects, never JetStream (``agents.streaming``).

* ``cardbus.chunk.<agent>.<root>``: one :class:`~cardbus.agents.streaming.Chunk`
  (JSON), published by the agent running the call (its permissions let it publish
  only under its own id: a chunk whose body names another agent or run than its
  subject is dropped), heard by whoever watches the run. Not persisted: a watcher
  that is not subscribed misses it, and nothing else does (the log has the answer).
* ``cardbus.watching``: watchers say which run they watch (``{"root": id or "*",
  "ttl_s": s}``) when they start and every third of ``ttl_s``; agents keep the
  runs watched until then, so a chunk of a run nobody watches is never published.
  ``cardbus.watching.ask``: an agent starting asks watchers to say it now.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from typing import Any

import msgspec
from nats.aio.client import Client as NatsClient
from nats.aio.msg import Msg

from cardbus.agents.streaming import Chunk, decode_chunk
from cardbus.bus.transport.interface import ChunkHandler, StopWatching
from cardbus.eventstore.nats import encode_token

__all__ = ["CHUNK_PREFIX", "WATCHING_ASK", "WATCHING_SUBJECT", "NatsChunks", "chunk_subject"]

log = logging.getLogger(__name__)

CHUNK_PREFIX = "cardbus.chunk"
WATCHING_SUBJECT = "cardbus.watching"
WATCHING_ASK = "cardbus.watching.ask"
_ANY = "*"


class _Watching(msgspec.Struct):
    root: str
    ttl_s: float


def chunk_subject(agent_id: str, root_id: str) -> str:
    return f"{CHUNK_PREFIX}.{encode_token(agent_id)}.{encode_token(root_id)}"


class NatsChunks:
    """Both sides of the chunk channel on one connection (see the module doc)."""

    def __init__(self, nc: NatsClient, ttl_s: float = 3.0) -> None:
        self.nc = nc
        self.ttl_s = ttl_s
        self._watched: dict[str, float] = {}  # root (or "*") -> until (monotonic)
        self._hearing: Any = None
        self._subs: list[Any] = []
        self._tasks: set[asyncio.Task[None]] = set()

    # -- agent side ----------------------------------------------------------------

    def watched(self, root_id: str) -> bool:
        watched = self._watched
        if not watched:  # nobody watches anything: one check, nothing else
            return False
        now = time.monotonic()
        return watched.get(root_id, 0.0) > now or watched.get(_ANY, 0.0) > now

    async def hear(self) -> None:
        if self._hearing is not None:
            return

        async def on_watching(msg: Msg) -> None:
            try:
                said = msgspec.json.decode(msg.data, type=_Watching)
            except msgspec.DecodeError:
                return  # not ours to judge: a view, not a record
            now = time.monotonic()
            ttl = min(max(said.ttl_s, 0.0), 60.0)
            self._watched = {
                **{k: v for k, v in self._watched.items() if v > now},
                said.root: now + ttl,
            }

        self._hearing = await self.nc.subscribe(WATCHING_SUBJECT, cb=on_watching)
        await self.nc.publish(WATCHING_ASK, b"")  # watchers already there: say so now

    async def publish(self, chunk: Chunk) -> None:
        with contextlib.suppress(Exception):  # best effort: a chunk lost is a view lost
            await self.nc.publish(
                chunk_subject(chunk.agent_id, chunk.root_id), msgspec.json.encode(chunk)
            )

    # -- watcher side --------------------------------------------------------------

    async def watch(self, handler: ChunkHandler, root_id: str | None) -> StopWatching:
        token = encode_token(root_id) if root_id else None
        subject = f"{CHUNK_PREFIX}.*.{token}" if token else f"{CHUNK_PREFIX}.>"
        said = msgspec.json.encode(_Watching(root_id or _ANY, self.ttl_s))

        async def on_chunk(msg: Msg) -> None:
            try:
                chunk = decode_chunk(msg.data)
            except msgspec.DecodeError:
                log.warning("bad chunk on %s", msg.subject)
                return
            if msg.subject != chunk_subject(chunk.agent_id, chunk.root_id):
                log.warning("chunk on %s names another sender or run", msg.subject)
                return
            try:
                handler(chunk)
            except Exception:
                log.exception("chunk handler failed on %s", msg.subject)

        async def on_ask(msg: Msg) -> None:
            with contextlib.suppress(Exception):
                await self.nc.publish(WATCHING_SUBJECT, said)

        sub = await self.nc.subscribe(subject, cb=on_chunk)
        ask = await self.nc.subscribe(WATCHING_ASK, cb=on_ask)

        async def renew() -> None:
            while True:
                with contextlib.suppress(Exception):
                    await self.nc.publish(WATCHING_SUBJECT, said)
                await asyncio.sleep(self.ttl_s / 3)

        await self.nc.flush()  # subscribed before we say we watch: nothing sent is missed
        task = asyncio.create_task(renew(), name="cardbus-watching")
        self._tasks.add(task)
        self._subs += [sub, ask]

        async def stop() -> None:
            task.cancel()
            self._tasks.discard(task)
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
            for s in (sub, ask):
                if s in self._subs:
                    self._subs.remove(s)
                with contextlib.suppress(Exception):
                    await s.unsubscribe()

        return stop

    async def close(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        for task in list(self._tasks):
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        self._tasks.clear()
        subs = [*self._subs, *([self._hearing] if self._hearing is not None else [])]
        for s in subs:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(s.unsubscribe(), 2.0)
        self._subs.clear()
        self._hearing = None
