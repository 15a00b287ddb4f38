"""What the store's parts exchange with JetStream: header names, status codes, API error
codes, the publish ack, a stored message; and the base class holding the
state they share.

Names come from nats-py where it defines them (``nats.js.api.Header``,
``nats.js.api.StatusCode``); the rest are JetStream's own (ADR-31 direct get,
ADR-50 atomic batches), written here once.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from typing import Any, NamedTuple, TypeVar

import msgspec
import nats.errors
from nats.aio.client import Client as NatsClient
from nats.aio.msg import Msg
from nats.js import JetStreamContext
from nats.js.api import Header, StatusCode

from cardbus.eventstore.envelope import Envelope, decode_body
from cardbus.eventstore.errors import DecodeError, StoreClosed
from cardbus.eventstore.nats.connection import retry_transient

__all__ = [
    "BATCH_COMMIT",
    "BATCH_ID",
    "BATCH_SEQUENCE",
    "DESCRIPTION",
    "END_OF_BATCH",
    "ERR_BATCH_DUPLICATE_MSG_ID",
    "ERR_BATCH_TOO_MANY_INFLIGHT",
    "ERR_NO_MESSAGE_FOUND",
    "ERR_STREAM_NOT_FOUND",
    "ERR_WRONG_LAST_SEQUENCE",
    "EXPECTED_LAST_SUBJECT_SEQUENCE",
    "EXPECTED_LAST_SUBJECT_SEQUENCE_SUBJECT",
    "HASH_HEADER",
    "HEARTBEAT",
    "MSG_ID",
    "NO_MESSAGES",
    "NUM_PENDING",
    "PubAck",
    "REQUEST_TIMEOUT",
    "RequestMux",
    "SEQUENCE",
    "STATUS",
    "SUBJECT",
    "Stored",
    "StoreBase",
    "decode_ack",
    "description",
    "envelope_of",
    "next_msg",
    "publish",
    "status",
    "stored_of",
]

T = TypeVar("T")

# -- headers -------------------------------------------------------------------------

HASH_HEADER = "Cardbus-Hash"  # the sha256 of the stored body (ours)
MSG_ID = Header.MSG_ID.value
EXPECTED_LAST_SUBJECT_SEQUENCE = Header.EXPECTED_LAST_SUBJECT_SEQUENCE.value
STATUS = Header.STATUS.value
DESCRIPTION = Header.DESCRIPTION.value
# Not in nats-py's Header: the subject filter the expected sequence applies to (ADR-31)...
EXPECTED_LAST_SUBJECT_SEQUENCE_SUBJECT = "Nats-Expected-Last-Subject-Sequence-Subject"
# ... atomic batches (ADR-50; nats-py names them only from 2.16 on, and cardbus supports
# nats-py 2.9+, so they are spelled out here; a test checks they agree) ...
BATCH_ID = "Nats-Batch-Id"
BATCH_SEQUENCE = "Nats-Batch-Sequence"
BATCH_COMMIT = "Nats-Batch-Commit"
# ... and the headers of a direct get answer.
SEQUENCE = "Nats-Sequence"
SUBJECT = "Nats-Subject"
NUM_PENDING = "Nats-Num-Pending"

# -- status codes of header-only messages ----------------------------------------------

HEARTBEAT = StatusCode.CONTROL_MESSAGE.value  # 100: idle heartbeat / flow control
NO_MESSAGES = StatusCode.NO_MESSAGES.value  # 404: nothing (more) matches
REQUEST_TIMEOUT = StatusCode.REQUEST_TIMEOUT.value  # 408: a pull request expired
END_OF_BATCH = "204"  # a direct get batch is complete (not in nats-py's StatusCode)

# -- JetStream API error codes we act on ------------------------------------------------

ERR_WRONG_LAST_SEQUENCE = 10071
ERR_NO_MESSAGE_FOUND = 10037
ERR_STREAM_NOT_FOUND = 10059
ERR_BATCH_DUPLICATE_MSG_ID = 10201
ERR_BATCH_TOO_MANY_INFLIGHT = 10210


class PubAck(msgspec.Struct):
    """The fields of a JetStream publish ack we use (decoded in one go, unknown ones skipped)."""

    seq: int = 0
    duplicate: bool = False
    error: dict[str, Any] | None = None


decode_ack = msgspec.json.Decoder(PubAck).decode


class Stored(NamedTuple):
    """One stored message as a read returns it."""

    seq: int
    subject: str
    data: bytes
    hash: str
    msg_id: str = ""  # the Nats-Msg-Id header: the event id (checked by ``audit``)


def stored_of(msg: Msg) -> Stored:
    """A message a consumer delivered (its stream sequence is in the reply subject)."""
    headers = msg.headers or {}
    return Stored(
        msg.metadata.sequence.stream,
        msg.subject,
        msg.data,
        headers.get(HASH_HEADER, ""),
        headers.get(MSG_ID, ""),
    )


def status(msg: Msg) -> str | None:
    """The status of a header-only message (heartbeat, end of batch...), else None."""
    if msg.headers and not msg.data:
        return msg.headers.get(STATUS)
    return None


def description(msg: Msg) -> str:
    return (msg.headers or {}).get(DESCRIPTION, "")


async def next_msg(sub: Any, timeout: float) -> Msg:
    """``sub.next_msg`` without its per-call task when a message is already queued."""
    queue = getattr(sub, "_pending_queue", None)
    if queue is not None and not sub._conn.is_closed:
        try:
            msg: Msg = queue.get_nowait()
        except asyncio.QueueEmpty:
            pass
        else:
            sub._pending_size -= len(msg.data)
            queue.task_done()
            return msg
    return await sub.next_msg(timeout=timeout)


async def publish(
    nc: NatsClient,
    subject: str,
    payload: bytes,
    reply: str = "",
    headers: dict[str, str] | None = None,
) -> None:
    """``nc.publish`` with the header block written in one join: nats-py checks and
    encodes each header key by key (a fifth of an append's client CPU on the log's
    publishes: about 10 µs a message with four headers against 2.5).

    Only where nothing would differ: a connected client, a payload within its limit, a
    subject without white space and no line break in a header (one would end the block
    early: the join's line breaks are counted). Anything else, or a nats-py without the
    internals used, goes through ``nc.publish``, which checks and raises as ever."""
    send = getattr(nc, "_send_command", None)
    if headers and send is not None and nc.is_connected and len(payload) <= nc.max_payload:
        lines = "".join([f"{k}: {v}\r\n" for k, v in headers.items()])
        if lines.count("\n") == len(headers) and len(subject.split()) == 1:
            hdr = f"NATS/1.0\r\n{lines}\r\n".encode()
            head = f"HPUB {subject} {reply} {len(hdr)} {len(hdr) + len(payload)}\r\n"
            stats = nc.stats
            stats["out_msgs"] += 1
            stats["out_bytes"] += len(payload)
            await send(b"".join((head.encode(), hdr, payload, b"\r\n")))
            flush = getattr(nc, "_flush_queue", None)
            if flush is not None and flush.empty():
                await nc._flush_pending()
            return
    await nc.publish(subject, payload, reply=reply, headers=headers)


NO_RESPONDERS = "503"  # a request nobody subscribes to (no stream captures the subject)


class RequestMux:
    """Requests with one answer each (JetStream publishes and API calls) on one wildcard
    reply subscription, lighter than ``nc.request``: a counter for the reply token and
    one timer for all the deadlines, no per-request subject validation, inbox or timer.

    ``request`` raises ``nats.errors.TimeoutError`` after ``timeout`` seconds,
    ``NoRespondersError`` on a 503 answer, and ``ConnectionClosedError`` once closed.
    """

    def __init__(self, nc: NatsClient, timeout: float) -> None:
        self.nc = nc
        self.timeout = timeout
        self._prefix = ""
        self._sub: Any = None
        self._next = 0
        # token -> (future, deadline), in the order made: every request has one timeout,
        # so the first ones expire first
        self._calls: OrderedDict[str, tuple[asyncio.Future[Msg], float]] = OrderedDict()
        self._sweeper: asyncio.TimerHandle | None = None
        self._opening: asyncio.Future[None] | None = None
        self.closed = False

    async def _open(self) -> None:
        if self._opening is None:
            self._opening = asyncio.ensure_future(self._subscribe())
        await asyncio.shield(self._opening)

    async def _subscribe(self) -> None:
        prefix = self.nc.new_inbox()
        try:
            self._sub = await self.nc.subscribe(
                f"{prefix}.*",
                cb=self._on_answer,
                pending_msgs_limit=1_000_000,
                pending_bytes_limit=1 << 30,
            )
        except BaseException:
            self._opening = None
            raise
        self._prefix = prefix

    async def request(
        self, subject: str, body: bytes, headers: dict[str, str] | None = None
    ) -> Msg:
        if self.closed:
            raise nats.errors.ConnectionClosedError
        if not self._prefix:
            await self._open()
        self._next += 1
        token = str(self._next)
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Msg] = loop.create_future()
        self._calls[token] = (future, loop.time() + self.timeout)
        if self._sweeper is None:
            self._sweeper = loop.call_later(self.timeout, self._sweep)
        try:
            await publish(self.nc, subject, body, f"{self._prefix}.{token}", headers)
            msg = await future
        finally:
            self._calls.pop(token, None)
        if not msg.data and msg.headers and msg.headers.get(STATUS) == NO_RESPONDERS:
            raise nats.errors.NoRespondersError
        return msg

    async def _on_answer(self, msg: Msg) -> None:
        calls = self._calls
        call = calls.pop(msg.subject[len(self._prefix) + 1 :], None)
        if call is not None and not call[0].done():
            call[0].set_result(msg)
        if not calls and self._sweeper is not None:
            # nothing left to time out: no wake-up for it (an idle runtime's CPU is its
            # wake-ups; the next request sets the timer again)
            self._sweeper.cancel()
            self._sweeper = None

    def _sweep(self) -> None:
        self._sweeper = None
        calls = self._calls
        now = asyncio.get_running_loop().time()
        while calls:
            token, (future, deadline) = next(iter(calls.items()))
            if deadline > now:
                self._sweeper = asyncio.get_running_loop().call_later(
                    deadline - now + 0.01, self._sweep
                )
                return
            del calls[token]
            if not future.done():
                future.set_exception(nats.errors.TimeoutError())

    async def close(self) -> None:
        self.closed = True
        if self._sweeper is not None:
            self._sweeper.cancel()
            self._sweeper = None
        for future, _ in self._calls.values():
            if not future.done():
                future.set_exception(nats.errors.ConnectionClosedError())
        self._calls.clear()
        if self._sub is not None:
            with contextlib.suppress(Exception):
                await self._sub.unsubscribe()


class StoreBase:
    """What every part of ``NatsEventStore`` (reads, appends, follow) works with."""

    nc: NatsClient
    _js: JetStreamContext
    _mux: RequestMux  # publishes and their acks
    stream_name: str
    subject_prefix: str
    partitions: int  # the stream's partition count (subjects.py)
    request_timeout: float
    heartbeat: float
    _closed: bool
    _readers: set[Any]  # open readers (ephemeral consumers, followers), closed with the store

    store_retry_timeout: float

    async def _retry(self, op: Callable[[], Awaitable[T]]) -> T:
        """Store retries: ``op`` tried again after transient failures (reconnects, leader
        elections) with backoff for up to ``store_retry_timeout`` seconds; after that
        they are ``StoreUnavailable``.

        Appends are safe to try again whole: a first try that was stored after all
        is found again by its event ids and returned.
        """
        return await retry_transient(
            op,
            within=self.store_retry_timeout,
            stopped=lambda: self._closed or self.nc.is_closed,
        )

    def _check_open(self) -> None:
        if self._closed:
            raise StoreClosed("the event store is closed")
        if self.nc.is_closed:
            raise StoreClosed("the NATS connection is closed")


def envelope_of(msg: Stored) -> Envelope:
    """The envelope of a stored message; a poison message is named, never skipped."""
    seq = msg.seq
    try:
        return decode_body(msg.data, position=seq, hash=msg.hash, max_bytes=1 << 62)
    except DecodeError as e:
        where = f"position {seq} ({msg.subject})"
        if type(e) is DecodeError:
            raise DecodeError(f"event at {where}: {e}") from e
        e.add_note(f"at {where}")
        raise
