"""Following the log: ``subscribe`` on an ephemeral pull consumer (AckNone, memory, R1),
catch-up then live, in stream sequence order.

The consumer is kept open with long-poll pulls and idle heartbeats, and its
consumer sequence is tracked: on a gap, a missed heartbeat, a deleted consumer
or a reconnect the consumer is recreated from the position after the last
event yielded, so there is no gap and no duplicate. Bounded reads use the same
consumer where direct get is not available (``reads.py``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
from collections.abc import AsyncIterator
from typing import Any

import msgspec
import nats.errors
from nats.aio.msg import Msg
from nats.js import api as js_api

from cardbus.eventstore.envelope import Envelope
from cardbus.eventstore.nats.connection import TRANSPORT_ERRORS, transient
from cardbus.eventstore.nats.subjects import all_filter
from cardbus.eventstore.nats.wire import (
    HEARTBEAT,
    NO_MESSAGES,
    REQUEST_TIMEOUT,
    StoreBase,
    description,
    envelope_of,
    next_msg,
    status,
    stored_of,
)

log = logging.getLogger(__name__)

__all__ = ["EphemeralConsumer", "Follows"]


class _ConsumerLost(Exception):
    """The consumer behind a reader is gone or lost messages: recreate it.

    Control flow inside this module: the follow loop recreates the consumer, a
    bounded read gets a transient ``StoreUnavailable`` (a store retry) instead.
    """


class EphemeralConsumer:
    """One ephemeral pull consumer on ``filt`` from stream sequence ``start``."""

    def __init__(self, store: StoreBase, filt: str, start: int) -> None:
        self.store = store
        self.filt = filt
        self.start = max(start, 1)
        self.consumer: str | None = None
        self.sub: Any = None
        self.inbox = ""
        self.last_dseq = 0
        self.closed = False

    async def open(self) -> int:
        """Create the consumer; the number of messages it has to deliver now."""
        store = self.store
        nc = store.nc
        self.inbox = nc.new_inbox()
        store._readers.add(self)
        self.sub = await nc.subscribe(
            self.inbox, pending_msgs_limit=1_000_000, pending_bytes_limit=1 << 30
        )
        config = js_api.ConsumerConfig(
            deliver_policy=js_api.DeliverPolicy.BY_START_SEQUENCE,
            opt_start_seq=self.start,
            ack_policy=js_api.AckPolicy.NONE,
            filter_subject=self.filt,
            mem_storage=True,
            num_replicas=1,
            inactive_threshold=max(10.0, store.heartbeat * 10),
            max_waiting=4,
        )
        info = await store._js.add_consumer(store.stream_name, config)
        self.consumer = info.name
        return int(info.num_pending or 0)

    async def _next_request(self, batch: int, **extra: Any) -> None:
        if self.consumer is None:
            raise _ConsumerLost("no consumer")
        subject = f"$JS.API.CONSUMER.MSG.NEXT.{self.store.stream_name}.{self.consumer}"
        await self.store.nc.publish(
            subject, msgspec.json.encode({"batch": batch, **extra}), reply=self.inbox
        )

    async def _next(self, timeout: float) -> Msg:
        try:
            return await next_msg(self.sub, timeout)
        except asyncio.CancelledError:
            if self.closed:  # the store closed this reader under us: not our task's cancel
                raise _ConsumerLost("reader closed") from None
            raise
        except nats.errors.ConnectionClosedError as e:
            raise _ConsumerLost("connection closed") from e

    def _check_data(self, msg: Msg) -> None:
        dseq = msg.metadata.sequence.consumer
        if self.last_dseq and dseq != self.last_dseq + 1:
            raise _ConsumerLost(f"consumer sequence gap: {self.last_dseq} -> {dseq}")
        self.last_dseq = dseq

    async def pull_now(self, batch: int) -> list[Msg]:
        """Whatever is available now, up to ``batch`` messages (for a bounded read)."""
        try:
            return await self._pull_now(batch)
        except _ConsumerLost as e:
            raise transient(f"read of {self.filt!r} interrupted: {e}") from e

    async def _pull_now(self, batch: int) -> list[Msg]:
        await self._next_request(batch, no_wait=True)
        out: list[Msg] = []
        timeout = self.store.request_timeout
        while len(out) < batch:
            try:
                msg = await self._next(timeout)
            except nats.errors.TimeoutError as e:
                raise _ConsumerLost("no answer to a pull request") from e
            code = status(msg)
            if code is None:
                self._check_data(msg)
                out.append(msg)
            elif code == HEARTBEAT:
                continue
            elif code in (NO_MESSAGES, REQUEST_TIMEOUT):
                break
            else:
                raise _ConsumerLost(f"pull refused: {code} {description(msg)}")
        return out

    async def follow(self, batch: int, heartbeat: float) -> AsyncIterator[Msg]:
        """Every message, forever: long-poll pulls with idle heartbeats."""
        expires = max(heartbeat * 5, 1.0)
        while True:
            await self._next_request(
                batch,
                expires=int(expires * 1e9),
                idle_heartbeat=int(heartbeat * 1e9),
            )
            remaining = batch
            while remaining > 0:
                try:
                    msg = await self._next(heartbeat * 3)
                except nats.errors.TimeoutError as e:
                    raise _ConsumerLost("missed heartbeats") from e
                code = status(msg)
                if code is None:
                    self._check_data(msg)
                    remaining -= 1
                    yield msg
                elif code == HEARTBEAT:
                    continue
                elif code in (NO_MESSAGES, REQUEST_TIMEOUT) or "Exceeded" in description(msg):
                    break  # this pull request is over; the next one follows
                else:
                    raise _ConsumerLost(f"pull ended: {code} {description(msg)}")

    async def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        self.store._readers.discard(self)
        nc = self.store.nc
        if self.sub is not None:
            # Wake a reader waiting in another task (store.close): it sees ``closed``.
            waiting = getattr(self.sub, "_pending_next_msgs_calls", None) or {}
            for call in list(waiting.values()):
                call.cancel()
            with contextlib.suppress(Exception):
                await self.sub.unsubscribe()
        if self.consumer is not None and not nc.is_closed:
            # Fire and forget: the consumer also expires by itself when inactive.
            with contextlib.suppress(Exception):
                await nc.publish(
                    f"$JS.API.CONSUMER.DELETE.{self.store.stream_name}.{self.consumer}", b""
                )


_FOLLOW_ERRORS: tuple[type[BaseException], ...] = (_ConsumerLost, *TRANSPORT_ERRORS)


class Follows(StoreBase):
    """``subscribe``: the part of ``NatsEventStore`` that follows the log."""

    read_batch: int

    async def subscribe(self, from_position: int = 0) -> AsyncIterator[Envelope]:
        next_position = max(from_position, 1)
        failures = 0
        while True:
            self._check_open()
            reader = EphemeralConsumer(self, all_filter(self.subject_prefix), next_position)
            try:
                await reader.open()
                async for msg in reader.follow(self.read_batch, self.heartbeat):
                    failures = 0
                    stored = stored_of(msg)
                    seq = stored.seq
                    if seq < next_position:
                        continue  # already yielded (defensive: consumers restart at next)
                    env = envelope_of(stored)
                    next_position = seq + 1
                    yield env
            except _FOLLOW_ERRORS as e:
                failures += 1
                log.debug("subscription consumer lost (%r); recreating at %d", e, next_position)
            finally:
                await reader.close()
            self._check_open()
            await asyncio.sleep(min(0.02 * 2 ** min(failures, 7), 2.0) * (1 + random.random() / 4))
