"""What the store's parts exchange with JetStream: header names, status codes, API error
codes, the publish ack, a stored message; and the base class holding the
state they share.

Names come from nats-py where it defines them (``nats.js.api.Header``,
``nats.js.api.StatusCode``); the rest are JetStream's own (ADR-31 direct get,
ADR-50 atomic batches), written here once.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any, NamedTuple, TypeVar

import msgspec
from nats.aio.client import Client as NatsClient
from nats.aio.msg import Msg
from nats.js import JetStreamContext
from nats.js.api import Header, StatusCode

from cardbus.eventstore.envelope import Envelope, decode_body
from cardbus.eventstore.errors import DecodeError, StoreUnavailable
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
    "SEQUENCE",
    "STATUS",
    "SUBJECT",
    "Stored",
    "StoreBase",
    "decode_ack",
    "description",
    "envelope_of",
    "next_msg",
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


class StoreBase:
    """What every part of ``NatsEventStore`` (reads, appends, follow) works with."""

    nc: NatsClient
    _js: JetStreamContext
    stream_name: str
    subject_prefix: str
    request_timeout: float
    heartbeat: float
    _closed: bool
    _readers: set[Any]  # open ephemeral consumers, closed with the store

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
            raise StoreUnavailable("the event store is closed")
        if self.nc.is_closed:
            raise StoreUnavailable("the NATS connection is closed")


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
