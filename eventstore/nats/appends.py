"""Appends to the log: per-task optimistic concurrency, atomic batches with group commit,
idempotency by event id (the README's "Running on NATS" section has the costs).

* The first message of an append carries ``Nats-Expected-Last-Subject-Sequence``
  (the stream sequence of the task's last event, 0 for a new task) with
  ``Nats-Expected-Last-Subject-Sequence-Subject: <prefix>.<task>.>``. The store
  caches each task's last (version, sequence, hash) and looks it up from the
  leader when the cache does not match the caller's expected version; the
  server is the judge, so a stale cache only costs a refused publish. A wrong
  last sequence (10071) becomes ``ConcurrencyError`` with the actual version.
* A multi-event append is one JetStream atomic batch (nats-server 2.12+,
  ADR-50), at most ``max_batch`` events; the appends that wait while a batch
  is in flight go out together as the next one (group commit: never two
  appends to one task in a batch, each with its own expected sequence). If the
  server refuses such a shared batch, each append is sent again alone. Without
  atomic batches each event is published expecting the one before (not atomic).
* ``Nats-Msg-Id`` = event id and the stream's duplicate window make a repeated
  append return the stored originals (``batch.check_replay``), so appends are
  safe to try again after a transient failure (store retries).
"""

from __future__ import annotations

import asyncio
import functools
import random
import uuid
from collections.abc import Sequence
from typing import NamedTuple

import msgspec
import nats.errors
import nats.js.errors

from cardbus.eventstore.batch import check_append_args, check_replay, seal_batch
from cardbus.eventstore.envelope import GENESIS_HASH, Envelope, NewEvent, decode_body
from cardbus.eventstore.errors import (
    ConcurrencyError,
    IdempotencyError,
    PayloadTooLarge,
    StoreUnavailable,
    ValidationError,
)
from cardbus.eventstore.nats.connection import is_transient, transient, translated
from cardbus.eventstore.nats.follow import offer_appended
from cardbus.eventstore.nats.reads import Reads
from cardbus.eventstore.nats.subjects import (
    MAX_SUBJECT_LEN,
    event_subjects,
    stream_filter,
)
from cardbus.eventstore.nats.wire import (
    BATCH_COMMIT,
    BATCH_ID,
    BATCH_SEQUENCE,
    ERR_BATCH_DUPLICATE_MSG_ID,
    ERR_BATCH_TOO_MANY_INFLIGHT,
    ERR_STREAM_NOT_FOUND,
    ERR_WRONG_LAST_SEQUENCE,
    EXPECTED_LAST_SUBJECT_SEQUENCE,
    EXPECTED_LAST_SUBJECT_SEQUENCE_SUBJECT,
    HASH_HEADER,
    MSG_ID,
    PubAck,
    decode_ack,
    envelope_of,
    publish,
)

__all__ = ["Appends", "Head"]

_MAYBE_STORED = "it may or may not be stored; appending the same events again is safe"


class Head(NamedTuple):
    """A task's last event: its version, stream sequence and hash."""

    version: int
    seq: int
    hash: str


_EMPTY_HEAD = Head(0, 0, GENESIS_HASH)
# more than the headers of an append can take: two subjects (MAX_SUBJECT_LEN), ids, a hash
_HEADROOM = 2 * MAX_SUBJECT_LEN + 1024


def _too_large(sealed: list[tuple[Envelope, bytes]], limit: int) -> PayloadTooLarge:
    return PayloadTooLarge(max(len(body) for _, body in sealed), limit)


class _Part:
    """One append's sealed events, ready for a batch."""

    __slots__ = ("filt", "head", "sealed", "stream", "subjects")

    def __init__(
        self,
        stream: str,
        filt: str,
        head: Head,
        sealed: list[tuple[Envelope, bytes]],
        subjects: list[str],
    ) -> None:
        self.stream = stream
        self.filt = filt
        self.head = head
        self.sealed = sealed
        self.subjects = subjects


class _Unit:
    """Appends that go to the log in one atomic batch, waiting for it (group commit): a
    multi-event append alone, or the appends of one ``append_many`` (together.py)."""

    __slots__ = ("done", "parts", "size", "streams")

    def __init__(self, parts: list[_Part], loop: asyncio.AbstractEventLoop) -> None:
        self.parts = parts
        self.size = sum(len(p.sealed) for p in parts)
        self.streams = {p.stream for p in parts}
        self.done: asyncio.Future[int] = loop.create_future()  # -> its first position

    def placed(self, first: int) -> list[list[Envelope]]:
        """Each part's envelopes at their positions, the unit stored from ``first`` on."""
        out = []
        for part in self.parts:
            out.append(
                [
                    msgspec.structs.replace(env, position=first + i)
                    for i, (env, _) in enumerate(part.sealed)
                ]
            )
            first += len(part.sealed)
        return out


class _Regroup(Exception):
    """The batch this append was part of was refused as a whole: send it alone."""


class Appends(Reads):
    """The writing part of ``NatsEventStore`` (it reads back stored copies of retries)."""

    max_event_bytes: int
    atomic: bool
    max_batch: int
    _heads: dict[str, Head]
    _waiting: list[_Unit]  # multi-event appends waiting for the next batch
    _committer: asyncio.Future[None] | None
    _batch_prefix: str
    _batches: int

    def _init_appends(self) -> None:
        self._batch_prefix = uuid.uuid4().hex[:16]
        self._batches = 0
        self._heads = {}
        self._waiting = []
        self._committer = None

    # -- the API -------------------------------------------------------------------------

    async def append(
        self, stream: str, events: Sequence[NewEvent], expected_version: int
    ) -> list[Envelope]:
        check_append_args(stream, events, expected_version)
        try:
            stored = await self._retry(lambda: self._append(stream, events, expected_version))
        except StoreUnavailable as e:
            if e.__cause__ is not None and is_transient(e.__cause__):  # gave up retrying
                e.add_note(f"append to {stream!r} not confirmed: {_MAYBE_STORED}")
            raise
        # the followers on this connection get them from here, not back from the server
        offer_appended(self.nc, (self.stream_name, self.subject_prefix), stored)
        return stored

    async def stream_version(self, stream: str) -> int:
        self._check_open()
        return (await self._retry(lambda: self._lookup_head(stream))).version

    # -- one try -------------------------------------------------------------------------

    async def _append(
        self, stream: str, events: Sequence[NewEvent], expected_version: int
    ) -> list[Envelope]:
        self._check_open()
        events = list(events)
        if len(events) > self.max_batch:
            raise ValidationError(
                f"{len(events)} events in one append: at most {self.max_batch} on NATS"
            )
        filt = stream_filter(self.subject_prefix, stream)
        subjects = event_subjects(self.subject_prefix, stream, events, self.partitions)
        for attempt in range(8):
            head = self._heads.get(stream)
            if head is None and expected_version == 0 and attempt == 0:
                # A new stream (the caller says so): no lookup, the server checks it.
                head = _EMPTY_HEAD
            elif head is None or head.version != expected_version:
                head = await self._lookup_head(stream)
            if head.version != expected_version:
                return await self._replay_or_conflict(stream, events, expected_version, head)
            sealed = seal_batch(
                stream, events, expected_version, head.version, head.hash, self.max_event_bytes
            )
            too_large = functools.partial(_too_large, sealed, self.nc.max_payload)
            with translated(f"append to {stream!r}", error=transient, too_large=too_large):
                try:
                    if len(sealed) == 1:
                        return await self._publish_one(
                            stream, events, sealed[0], subjects[0], filt, head
                        )
                    if self.atomic:
                        return await self._publish_batch(stream, sealed, subjects, filt, head)
                    return await self._publish_sequential(stream, sealed, subjects, filt, head)
                except nats.js.errors.APIError as e:
                    # The codes JetStream answers an append with that are not failures.
                    code = e.err_code
                    if code == ERR_WRONG_LAST_SEQUENCE:
                        self._heads.pop(stream, None)
                        actual = await self._lookup_head(stream)
                        if actual.version == expected_version and attempt < 7:
                            continue  # our cached head was stale, not the caller: try again
                        return await self._replay_or_conflict(
                            stream, events, expected_version, actual, cause=e
                        )
                    if code == ERR_BATCH_DUPLICATE_MSG_ID:
                        stored = await self._stored_copies(stream, events)
                        if not stored:
                            raise IdempotencyError(
                                "an event id of this append is already stored in another stream"
                            ) from e
                        check_replay(stored, events, stream)
                        return stored
                    if code == ERR_BATCH_TOO_MANY_INFLIGHT and attempt < 7:
                        await asyncio.sleep(0.01 * 2**attempt * (1 + random.random()))
                        continue
                    raise  # translated: unavailable (a transient failure) or refused
        raise transient(f"append to {stream!r}: JetStream kept refusing, try again")

    def _headers(self, env: Envelope, first: bool, filt: str, head: Head) -> dict[str, str]:
        h = {MSG_ID: env.event_id, HASH_HEADER: env.hash}
        if first:
            h[EXPECTED_LAST_SUBJECT_SEQUENCE] = str(head.seq)
            h[EXPECTED_LAST_SUBJECT_SEQUENCE_SUBJECT] = filt
        return h

    def _check_size(self, body: bytes, headers: dict[str, str], subject: str) -> None:
        limit = self.nc.max_payload
        if len(body) + _HEADROOM <= limit:
            return  # (our headers: ids, a hash, a subject filter of at most MAX_SUBJECT_LEN)
        overhead = 12 + sum(len(k) + len(v) + 4 for k, v in headers.items())
        if len(body) + overhead > limit:
            raise PayloadTooLarge(len(body), max(limit - overhead, 0))

    async def _request(self, subject: str, body: bytes, headers: dict[str, str]) -> PubAck:
        try:
            msg = await self._mux.request(subject, body, headers)
        except nats.errors.NoRespondersError as e:
            raise transient(f"no JetStream stream answers on {subject!r}") from e
        try:
            ack = decode_ack(msg.data)
        except msgspec.DecodeError as e:
            raise transient(f"not a JetStream ack on {subject!r}: {msg.data[:100]!r}") from e
        if ack.error is not None:
            raise nats.js.errors.APIError.from_error(ack.error)
        return ack

    async def _publish_one(
        self,
        stream: str,
        events: list[NewEvent],
        sealed: tuple[Envelope, bytes],
        subject: str,
        filt: str,
        head: Head,
    ) -> list[Envelope]:
        env, body = sealed
        headers = self._headers(env, True, filt, head)
        self._check_size(body, headers, subject)
        ack = await self._request(subject, body, headers)
        if ack.duplicate:  # stored before (a store retry): hand back the original
            original = await self._get_by_seq(ack.seq)
            check_replay([original], events, stream)
            return [original]
        placed = msgspec.structs.replace(env, position=ack.seq)
        self._remember(stream, Head(env.version, ack.seq, env.hash))
        return [placed]

    # -- atomic batches and group commit ---------------------------------------------------

    async def _publish_batch(
        self,
        stream: str,
        sealed: list[tuple[Envelope, bytes]],
        subjects: list[str],
        filt: str,
        head: Head,
    ) -> list[Envelope]:
        """A multi-event append as (part of) one atomic batch: see :meth:`_commit_groups`."""
        part = _Part(stream, filt, head, sealed, subjects)
        self._check_sizes(part)
        [out] = await self._commit_unit(_Unit([part], asyncio.get_running_loop()))
        return out

    def _check_sizes(self, part: _Part) -> None:
        """``PayloadTooLarge`` if an event of ``part`` cannot be published with its headers."""
        limit = self.nc.max_payload
        if any(len(body) + _HEADROOM > limit for _, body in part.sealed):
            for (_, body), subject, h in zip(
                part.sealed, part.subjects, self._batch_headers([part]), strict=True
            ):
                self._check_size(body, h, subject)

    async def _commit_unit(self, unit: _Unit) -> list[list[Envelope]]:
        """Store ``unit`` in the next atomic batch (alone if the group it went in was
        refused): each part's envelopes at their positions. Raises what the server
        answers the unit alone with."""
        self._waiting.append(unit)
        if self._committer is None:
            self._committer = asyncio.ensure_future(self._commit_groups())
        try:
            first = await unit.done
        except _Regroup:  # the group it was in was refused: this unit alone says why
            ack = await self._send_group(unit.parts)
            first = ack.seq - unit.size + 1
        out = unit.placed(first)
        for part, envs in zip(unit.parts, out, strict=True):
            last = envs[-1]
            self._remember(part.stream, Head(last.version, last.position, last.hash))
        return out

    async def _commit_groups(self) -> None:
        """Group commit: the multi-event appends waiting while a batch is in flight go out
        together as the next atomic batch, at most one part per task stream and at most
        ``max_batch`` messages.

        Each part keeps its own expected-sequence check on its task's subjects, and
        the batch is stored whole or not at all, so each append still is. A file-backed
        stream syncs the disk once per batch, so this is one sync for many appends.
        If the server refuses a group of several parts (one part's check or duplicate
        id), each part is sent again alone and gets its own answer.
        """
        try:
            while self._waiting:
                group: list[_Unit] = []
                rest: list[_Unit] = []
                streams: set[str] = set()
                size = 0
                for unit in self._waiting:
                    if unit.done.done():
                        continue  # its caller gave up (cancelled) before it was sent
                    if not streams.isdisjoint(unit.streams) or (
                        group and size + unit.size > self.max_batch
                    ):
                        rest.append(unit)  # two appends to one task never share a batch
                        continue
                    group.append(unit)
                    streams |= unit.streams
                    size += unit.size
                self._waiting = rest
                if not group:
                    continue
                try:
                    ack = await self._send_group([p for u in group for p in u.parts])
                except BaseException as e:
                    refused = isinstance(e, nats.js.errors.APIError | nats.errors.MaxPayloadError)
                    for unit in group:
                        if unit.done.done():
                            continue
                        if len(group) > 1 and refused:
                            unit.done.set_exception(_Regroup())
                        elif isinstance(e, Exception):
                            unit.done.set_exception(e)
                        else:  # this task is cancelled (the loop is ending)
                            unit.done.set_exception(StoreUnavailable("append interrupted"))
                    if not isinstance(e, Exception):
                        raise
                    continue
                first = ack.seq - size + 1
                for unit in group:
                    if not unit.done.done():
                        unit.done.set_result(first)
                    first += unit.size
        finally:
            self._committer = None
            if self._closed:
                self._close_appends()

    def _batch_headers(self, group: list[_Part]) -> list[dict[str, str]]:
        self._batches += 1
        batch_id = f"{self._batch_prefix}{self._batches}"  # unique: a random part, a count
        out: list[dict[str, str]] = []
        for part in group:
            for i, (env, _) in enumerate(part.sealed):
                h = self._headers(env, i == 0, part.filt, part.head)
                h[BATCH_ID] = batch_id
                h[BATCH_SEQUENCE] = str(len(out) + 1)
                out.append(h)
        out[-1][BATCH_COMMIT] = "1"
        return out

    async def _send_group(self, group: list[_Part]) -> PubAck:
        """Publish the parts as one atomic batch; the commit's ack."""
        headers = self._batch_headers(group)
        messages = [
            (subject, body)
            for part in group
            for (_, body), subject in zip(part.sealed, part.subjects, strict=True)
        ]
        # Pipelined: nothing is awaited but the commit's ack; one flush sends them all.
        for (subject, body), h in zip(messages[:-1], headers, strict=False):
            await publish(self.nc, subject, body, headers=h)
        subject, body = messages[-1]
        return await self._request(subject, body, headers[-1])

    async def _publish_sequential(
        self,
        stream: str,
        sealed: list[tuple[Envelope, bytes]],
        subjects: list[str],
        filt: str,
        head: Head,
    ) -> list[Envelope]:
        """Fallback without atomic batches: each event expects the one before (not atomic)."""
        out: list[Envelope] = []
        seq = head.seq
        for (env, body), subject in zip(sealed, subjects, strict=True):
            h = self._headers(env, True, filt, Head(0, seq, ""))
            self._check_size(body, h, subject)
            ack = await self._request(subject, body, h)
            if ack.duplicate:
                raise IdempotencyError(f"event id {env.event_id} is already stored")
            seq = ack.seq
            out.append(msgspec.structs.replace(env, position=seq))
            self._remember(stream, Head(env.version, seq, env.hash))
        return out

    def _close_appends(self) -> None:
        for unit in self._waiting:
            if not unit.done.done():
                unit.done.set_exception(StoreUnavailable("the event store is closed"))
        self._waiting = []

    # -- conflicts, retries of stored events, heads -----------------------------------------

    async def _replay_or_conflict(
        self,
        stream: str,
        events: list[NewEvent],
        expected_version: int,
        actual: Head,
        cause: BaseException | None = None,
    ) -> list[Envelope]:
        """A version mismatch: a repeat of stored events returns them, anything else
        conflicts."""
        if actual.version > 0:
            stored = await self._stored_copies(stream, events)
            if stored:
                check_replay(stored, events, stream)
                return stored
        raise ConcurrencyError(stream, expected_version, actual.version) from cause

    async def _stored_copies(self, stream: str, events: list[NewEvent]) -> list[Envelope]:
        """The stored envelopes of this stream carrying any of the events' ids, in order."""
        ids = {e.event_id for e in events}
        envs = map(envelope_of, await self._read(stream_filter(self.subject_prefix, stream)))
        found = {env.event_id: env for env in envs if env.event_id in ids}
        return [found[e.event_id] for e in events if e.event_id in found]

    def _remember(self, stream: str, head: Head) -> None:
        old = self._heads.get(stream)
        if old is None or head.version >= old.version:
            if len(self._heads) >= 100_000:
                self._heads.clear()
            self._heads[stream] = head

    async def _lookup_head(self, stream: str) -> Head:
        """The task's last event, read from the stream leader."""
        filt = stream_filter(self.subject_prefix, stream)
        with translated(f"cannot read the head of {stream!r}", error=transient, refused=transient):
            try:
                raw = await self._js.get_msg(self.stream_name, subject=filt)
            except nats.js.errors.NotFoundError as e:
                if e.err_code == ERR_STREAM_NOT_FOUND:
                    raise StoreUnavailable(f"stream {self.stream_name!r} is gone") from e
                self._heads.pop(stream, None)
                return _EMPTY_HEAD
        body = raw.data or b""
        env = decode_body(body, max_bytes=1 << 62)
        stored_hash = (raw.headers or {}).get(HASH_HEADER, "")
        head = Head(env.version, raw.seq or 0, stored_hash)
        self._remember(stream, head)
        return head

    async def _get_by_seq(self, seq: int) -> Envelope:
        with translated(f"cannot read position {seq}", error=transient, refused=transient):
            raw = await self._js.get_msg(self.stream_name, seq=seq)
        return decode_body(
            raw.data or b"",
            position=seq,
            hash=(raw.headers or {}).get(HASH_HEADER, ""),
            max_bytes=1 << 62,
        )
