"""In-process ``Bus``: asyncio queues of encoded cards; the embedded default."""

from __future__ import annotations

import asyncio
import collections
import contextlib
import contextvars
import inspect
import logging
from collections.abc import AsyncIterator

import msgspec

from cardbus.agents import requests as rq
from cardbus.agents.cards import (
    CancelNotice,
    Reply,
    TaskCard,
    decode_cancel_notice,
    decode_reply,
    decode_task_card,
    encode,
)
from cardbus.agents.streaming import Chunk
from cardbus.bus.transport.interface import (
    Bus,
    CancelHandler,
    CardHandler,
    ChunkHandler,
    RequestHandler,
    StopWatching,
)
from cardbus.eventstore.errors import BusError, DecodeError

__all__ = ["InProcessBus"]

log = logging.getLogger(__name__)


class _Consumer:
    """One ``consume`` (or ``consume_many``) call: a handler, how many more of its cards
    may run at once, and copies of the context it was called in.

    Each card runs in a context of its consumer's, as it did in a resident task of its
    own: not in the sender's context. Not in a fresh copy per card either (a handler's
    context variables may refer back to its task, as the worker's ``RUN_CLOCK`` does: a
    copy per card would leave a cycle per card for the collector to find): a card that
    ends gives its context back for the next one, so there are as many copies as cards
    ever ran at once, not one per unit of ``max_concurrency`` (issue 34: with 20,000,
    the idle units' contexts, entries and handlers were most of the objects the
    collector walked). Cards running at once never share one: the worker's per-card
    variables (``RUN_CLOCK``, ``CHUNK_SINK``) are set in it."""

    __slots__ = ("contexts", "free", "handler", "origin")

    def __init__(self, handler: CardHandler, origin: contextvars.Context, free: int) -> None:
        self.handler = handler
        self.origin = origin  # never run in: copied for each card beyond the kept ones
        self.contexts: list[contextvars.Context] = []  # of no running card: reused
        self.free = free  # cards it may still take at once

    def context(self) -> contextvars.Context:
        return self.contexts.pop() if self.contexts else self.origin.copy()


class _Inbox:
    """An agent's cards not taken yet, and its consumers with room for one more."""

    __slots__ = ("idle", "pending")

    def __init__(self) -> None:
        self.pending: collections.deque[tuple[bytes, int]] = collections.deque()
        # taken from the left, given back on the right: replicas share the work in turn
        self.idle: collections.deque[_Consumer] = collections.deque()


class InProcessBus(Bus):
    """Consumers start no task of their own: a card sent to a consumer with room starts
    one, which takes the next card as long as there is one, then ends. An agent with a
    ``max_concurrency`` of thousands (``bus.consume_many``) costs one entry with as many
    slots, not as many resident tasks (or idle entries) that the garbage collector would
    walk at every collection (most of a busy step's collector time, issue 34)."""

    def __init__(self, max_deliver: int = 5) -> None:
        self.max_deliver = max_deliver
        self._inboxes: dict[str, _Inbox] = {}
        self._replies: asyncio.Queue[bytes] = asyncio.Queue()
        self._consumers: set[asyncio.Task[None]] = set()  # consumers running a card
        self._closed = False
        self._request_handler: RequestHandler | None = None
        self._cancel_watchers: dict[str, list[CancelHandler]] = {}
        self._serving: set[asyncio.Future[rq.AgentResponse]] = set()  # requests answering
        # chunk watchers: run root (None: every run) -> handlers; empty: nothing published
        self._chunk_watchers: dict[str | None, list[ChunkHandler]] = {}

    def _inbox(self, agent_id: str) -> _Inbox:
        inbox = self._inboxes.get(agent_id)
        if inbox is None:
            inbox = self._inboxes[agent_id] = _Inbox()
        return inbox

    async def consume(self, agent_id: str, handler: CardHandler) -> None:
        await self.consume_many(agent_id, handler, 1)

    async def consume_many(self, agent_id: str, handler: CardHandler, n: int) -> None:
        if n < 1:
            raise BusError(f"consume_many needs n >= 1, got {n!r}")
        inbox = self._inbox(agent_id)
        inbox.idle.append(_Consumer(handler, contextvars.copy_context(), n))
        self._start(agent_id, inbox)  # cards sent before anyone consumed

    def _put(self, agent_id: str, data: bytes, delivered: int) -> None:
        inbox = self._inbox(agent_id)
        inbox.pending.append((data, delivered))
        self._start(agent_id, inbox)

    def _start(self, agent_id: str, inbox: _Inbox) -> None:
        """Give each waiting card an idle consumer while there are both."""
        if self._closed:
            return
        while inbox.pending and inbox.idle:
            # the card goes with the consumer: left in the inbox, every idle consumer
            # would be started for it before the first one took it
            first = inbox.pending.popleft()
            consumer = inbox.idle.popleft()
            consumer.free -= 1
            if consumer.free:  # room for more: its turn again after the other replicas
                inbox.idle.append(consumer)
            context = consumer.context()
            task = asyncio.create_task(
                self._run_consumer(agent_id, inbox, consumer, context, first), context=context
            )
            self._consumers.add(task)
            task.add_done_callback(self._consumers.discard)

    async def _run_consumer(
        self,
        agent_id: str,
        inbox: _Inbox,
        consumer: _Consumer,
        context: contextvars.Context,
        first: tuple[bytes, int],
    ) -> None:
        subject = f"cardbus.agent.{agent_id}"
        message: tuple[bytes, int] | None = first
        while message is not None:  # the cards this slot takes before it is free again
            await self._deliver(subject, inbox, consumer.handler, *message)
            message = inbox.pending.popleft() if inbox.pending else None
        # no card left: the slot (and its context) is free for the next card sent
        consumer.contexts.append(context)
        consumer.free += 1
        if consumer.free == 1:  # it had no room: back in turn
            inbox.idle.append(consumer)

    async def _deliver(
        self, subject: str, inbox: _Inbox, handler: CardHandler, data: bytes, delivered: int
    ) -> None:
        try:
            card = decode_task_card(data)
        except DecodeError as e:
            await self._bad(subject, data, str(e))
            return
        if delivered:  # a redelivery (the first delivery is 0 here, 1 on the card)
            card = msgspec.structs.replace(card, delivery=delivered + 1)
        try:
            await handler(card)
        except asyncio.CancelledError:
            raise  # closed (or the handler was): this consumer is gone, as its task
        except Exception as e:  # at least once: give the card to a replica again
            if delivered + 1 < self.max_deliver:
                inbox.pending.append((data, delivered + 1))
            else:
                await self._bad(subject, data, f"handler failed {delivered + 1} times: {e!r}")

    async def send_task(self, agent_id: str, card: TaskCard) -> None:
        if self._closed:
            raise BusError("the bus is closed")
        self._put(agent_id, encode(card), 0)

    async def send_raw(self, agent_id: str, data: bytes) -> None:
        """Put raw bytes in an inbox (for tests of malformed messages)."""
        self._put(agent_id, data, 0)

    async def reply(self, message: Reply) -> None:
        if self._closed:
            raise BusError("the bus is closed")
        self._replies.put_nowait(encode(message))

    async def reply_raw(self, data: bytes) -> None:
        self._replies.put_nowait(data)

    async def replies(self) -> AsyncIterator[Reply]:
        while True:
            data = await self._replies.get()
            try:
                yield decode_reply(data)
            except DecodeError as e:
                await self._bad("cardbus.reply", data, str(e))

    async def cancel_attempt(self, notice: CancelNotice) -> None:
        if self._closed:
            return
        notice = decode_cancel_notice(encode(notice))  # across the codec, as on the wire
        for handler in self._cancel_watchers.get(notice.agent_id, ()):
            try:
                handler(notice)
            except Exception:  # one worker's bug must not keep the notice from the others
                log.exception("cancel notice handler failed for %s", notice.agent_id)

    async def watch_cancels(self, agent_id: str, handler: CancelHandler) -> None:
        self._cancel_watchers.setdefault(agent_id, []).append(handler)

    # -- chunks: in process, straight to the watchers' handlers ------------------------

    carries_chunks = True
    local_delivery = True  # a send puts the card in its consumer's queue, nothing more

    def chunks_watched(self, root_id: str) -> bool:
        watchers = self._chunk_watchers
        return bool(watchers) and (None in watchers or root_id in watchers)

    async def publish_chunk(self, chunk: Chunk) -> None:
        for key in (None, chunk.root_id):
            for handler in list(self._chunk_watchers.get(key, ())):
                try:
                    handler(chunk)
                except Exception:  # a watcher's bug must not break the model call
                    log.exception("chunk handler failed for %s", chunk.root_id)

    async def watch_chunks(self, handler: ChunkHandler, root_id: str | None = None) -> StopWatching:
        self._chunk_watchers.setdefault(root_id, []).append(handler)

        async def stop() -> None:
            handlers = self._chunk_watchers.get(root_id, [])
            if handler in handlers:
                handlers.remove(handler)
            if not handlers:
                self._chunk_watchers.pop(root_id, None)

        return stop

    async def serve_requests(self, handler: RequestHandler) -> None:
        self._request_handler = handler

    async def request(self, request: rq.AgentRequest, timeout: float = 30.0) -> rq.AgentResponse:
        """Both directions cross the codec, as they would cross the network."""
        handler = self._request_handler
        if self._closed or handler is None:
            raise BusError("no orchestrator serves agent requests on this bus")
        subject = f"cardbus.req.{request.agent_id}"
        try:
            decoded = rq.decode_request(rq.encode(request))
        except DecodeError as e:
            await self._bad(subject, b"", str(e))
            raise BusError(f"request cannot be sent: {e}") from e
        # the orchestrator's side runs on its own, as across the network: a handler
        # cancelled meanwhile (its task was) does not cut a tool call off before it
        # is recorded (tool.called), nor does a request that timed out here
        serving = asyncio.ensure_future(handler(decoded))
        self._serving.add(serving)
        serving.add_done_callback(self._served)
        try:
            response = await asyncio.wait_for(asyncio.shield(serving), timeout)
        except TimeoutError as e:
            raise BusError(f"no answer to request {request.request_id} in {timeout:g}s") from e
        except asyncio.CancelledError:
            raise
        except Exception as e:  # the server's bug reaches the agent as a bus error
            raise BusError(f"request {request.request_id} failed on the server: {e!r}") from e
        try:
            return rq.decode_response(rq.encode(response))
        except DecodeError as e:
            raise BusError(f"bad answer to request {request.request_id}: {e}") from e

    def _served(self, serving: asyncio.Future[rq.AgentResponse]) -> None:
        self._serving.discard(serving)
        if not serving.cancelled():
            serving.exception()  # retrieved: its caller may have gone (cancelled, timed out)

    async def _bad(self, subject: str, data: bytes, reason: str) -> None:
        log.warning("bad message on %s: %s", subject, reason)
        if self.on_bad_message is not None:
            result = self.on_bad_message(subject, data, reason)
            if inspect.isawaitable(result):
                await result

    async def close(self) -> None:
        self._closed = True
        self._request_handler = None
        self._cancel_watchers.clear()
        self._chunk_watchers.clear()
        for serving in list(self._serving):  # what nobody waits for any more
            serving.cancel()
        running = list(self._consumers)
        for task in running:
            task.cancel()
        for task in running:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        self._consumers.clear()
