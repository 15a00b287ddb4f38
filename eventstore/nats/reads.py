"""Bounded reads of the log: ``read_stream``, ``read_correlation``, ``read_all``,
``last_position`` and ``verify``.

A read is a subject filter (``subjects.py``) read with JetStream *direct get*
batches (``$JS.API.DIRECT.GET``, nats-server 2.11+, a stream with
``allow_direct``): up to 1000 messages an answer, no consumer to create. On a
replicated stream the read first asks the leader for the sequence of the last
matching message and goes on until it has come (a replica may answer a few ms
behind), so it sees every append acknowledged before it began. Without direct
get (an older server, a user not allowed to use it) a read pulls an
ephemeral consumer (``follow.py``) to that sequence instead.

``_counts`` counts instead of reading (a busy partitioned member's look,
``bus.runtime.member_busy``): for each filter the log's last position, then how
many messages of it are stored from a start on, direct gets sent together that the
server answers in that order.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from typing import Any

import msgspec
import nats.js.errors
from nats.aio.msg import Msg

from cardbus.eventstore.envelope import ChainProblem, Envelope, verify_chain
from cardbus.eventstore.errors import StoreUnavailable
from cardbus.eventstore.nats.connection import is_transient, transient, translated
from cardbus.eventstore.nats.follow import EphemeralConsumer
from cardbus.eventstore.nats.subjects import (
    all_filter,
    correlation_filter,
    stream_filter,
    stream_of_subject,
)
from cardbus.eventstore.nats.wire import (
    END_OF_BATCH,
    ERR_STREAM_NOT_FOUND,
    HASH_HEADER,
    MSG_ID,
    NO_MESSAGES,
    NUM_PENDING,
    SEQUENCE,
    STATUS,
    SUBJECT,
    StoreBase,
    Stored,
    description,
    envelope_of,
    stored_of,
)

__all__ = ["Reads"]

log = logging.getLogger(__name__)


class _DirectCall:
    """One direct-get batch request in flight: the messages so far, then the end."""

    __slots__ = ("done", "msgs")

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.msgs: list[Stored] = []
        self.done: asyncio.Future[int] = loop.create_future()  # -> messages still pending


class Reads(StoreBase):
    """The reading part of ``NatsEventStore``."""

    _replicas: int
    # Bounded reads go through the stream's direct get when the stream allows it
    # (see _setup_direct_reads); else through a short-lived consumer.
    _direct_reads: bool
    _direct_sub: Any
    _direct_prefix: str
    _direct_calls: dict[str, _DirectCall]
    _direct_next: int

    def _init_reads(self) -> None:
        self._replicas = 1
        self._direct_reads = False
        self._direct_sub = None
        self._direct_prefix = ""
        self._direct_calls = {}
        self._direct_next = 0

    # -- the API -------------------------------------------------------------------------

    async def read_stream(self, stream: str, from_version: int = 1) -> list[Envelope]:
        if not isinstance(stream, str) or not stream:
            return []
        filt = stream_filter(self.subject_prefix, stream)
        envs = [envelope_of(m) for m in await self._retry(lambda: self._read(filt))]
        return [e for e in envs if e.version >= from_version]

    async def read_all(self, from_position: int = 0, limit: int = 1000) -> list[Envelope]:
        filt = all_filter(self.subject_prefix)
        msgs = await self._retry(lambda: self._read(filt, max(from_position, 1), limit))
        return [envelope_of(m) for m in msgs]

    async def read_correlation(self, correlation_id: str) -> list[Envelope]:
        if not isinstance(correlation_id, str):
            return []
        filt = correlation_filter(self.subject_prefix, correlation_id, self.partitions)
        msgs = await self._retry(lambda: self._read(filt))
        return [e for e in map(envelope_of, msgs) if e.correlation_id == correlation_id]

    async def read_last(self, stream: str) -> Envelope | None:
        """The task's last event (None: it has none), from the stream leader: one lookup
        in the server's subject index, where ``read_stream`` walks the log's blocks from
        the task's first event (a direct get with a wildcard filter reads message by
        message)."""
        self._check_open()
        if not isinstance(stream, str) or not stream:
            return None
        filt = stream_filter(self.subject_prefix, stream)
        return await self._retry(lambda: self._last_event(filt))

    async def _last_event(self, filt: str) -> Envelope | None:
        with translated(f"cannot read the end of {filt!r}", error=transient, refused=transient):
            try:
                raw = await self._js.get_msg(self.stream_name, subject=filt)
            except nats.js.errors.NotFoundError as e:
                if e.err_code == ERR_STREAM_NOT_FOUND:
                    raise StoreUnavailable(f"stream {self.stream_name!r} is gone") from e
                return None
        stored = Stored(
            int(raw.seq or 0),
            raw.subject or "",
            raw.data or b"",
            (raw.headers or {}).get(HASH_HEADER, ""),
            (raw.headers or {}).get(MSG_ID, ""),
        )
        return envelope_of(stored)

    async def last_position(self) -> int:
        self._check_open()
        return await self._retry(self._last_position)

    async def verify(self, stream: str | None = None) -> list[ChainProblem]:
        prefix = self.subject_prefix
        filt = all_filter(prefix) if stream is None else stream_filter(prefix, stream)
        by_stream: dict[str, list[tuple[int, bytes, str]]] = {}
        for m in await self._retry(lambda: self._read(filt)):
            key = stream if stream is not None else stream_of_subject(prefix, m.subject)
            row = (m.seq, bytes(m.data), m.hash)
            by_stream.setdefault(key, []).append(row)
        problems: list[ChainProblem] = []
        for s, rows in by_stream.items():
            problems.extend(verify_chain(rows, s))
        return sorted(problems, key=lambda p: p.position)

    # -- one consistent read ---------------------------------------------------------------

    async def _read(self, filt: str, start: int = 1, limit: int | None = None) -> list[Stored]:
        """Messages matching ``filt`` from stream sequence ``start``: a consistent bounded read.

        On a replicated stream the leader first tells the sequence of the last
        matching message (``target``); the read, which may be served by a
        replica a few ms behind the leader, goes on until it has that one, so every
        append acknowledged before the read began is in it (read-your-writes
        in a cluster too). An R1 stream has only its leader to answer.
        """
        self._check_open()
        if limit is not None and limit <= 0:
            return []
        if self._direct_reads and self._replicas == 1:
            target = 0  # the leader answers itself: nothing to wait for
        else:
            target = await self._last_seq(filt)
            if target < start:
                return []
        if self._direct_reads:
            return await self._read_direct(filt, start, limit, target)
        return await self._read_consumer(filt, start, limit, target)

    async def _read_consumer(
        self, filt: str, start: int, limit: int | None, target: int
    ) -> list[Stored]:
        """The read through an ephemeral consumer, pulled to ``target``."""
        reader = EphemeralConsumer(self, filt, start)
        try:
            with translated(f"cannot read {filt!r}", error=transient, refused=transient):
                await reader.open()
                out: list[Stored] = []
                loop = asyncio.get_running_loop()
                deadline = loop.time() + self.request_timeout
                while limit is None or len(out) < limit:
                    if out and out[-1].seq >= target:
                        break
                    want = 1000 if limit is None else min(limit - len(out), 1000)
                    got = await reader.pull_now(want)
                    if got:
                        out.extend(map(stored_of, got))
                        continue
                    if loop.time() > deadline:  # the replica never caught up with the leader
                        raise transient(f"read of {filt!r}: consumer stuck before {target}")
                    await asyncio.sleep(0.002)  # a replica behind the leader: it will catch up
                return out
        finally:
            await reader.close()

    async def _read_direct(
        self, filt: str, start: int, limit: int | None, target: int
    ) -> list[Stored]:
        """The read through direct get batches of up to 1000 messages (no consumer).

        ``target`` (0: none) is the last sequence the leader had; without one
        the read ends when the server says nothing more matches.
        """
        out: list[Stored] = []
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.request_timeout
        seq = start
        while limit is None or len(out) < limit:
            want = 1000 if limit is None else min(limit - len(out), 1000)
            request: dict[str, Any] = {"seq": seq, "next_by_subj": filt, "batch": want}
            if target:
                request["up_to_seq"] = target
            got, pending = await self._direct_batch(request)
            out.extend(got)
            if got:
                seq = got[-1].seq + 1
            if target:
                if seq > target:
                    break
                if not got:
                    if loop.time() > deadline:  # the replica never caught up with the leader
                        raise transient(f"read of {filt!r}: stuck before {target}")
                    await asyncio.sleep(0.002)  # a replica behind the leader: it will catch up
            elif not got or not pending:
                break
        return out

    # -- direct get ------------------------------------------------------------------------

    async def _setup_direct_reads(self) -> None:
        """Use direct get for reads if this connection may (a probe read of one message)."""
        nc = self.nc
        if self._direct_sub is None:
            self._direct_prefix = nc.new_inbox()
            try:
                with translated("cannot subscribe for direct reads", error=transient):
                    self._direct_sub = await nc.subscribe(
                        f"{self._direct_prefix}.*",
                        cb=self._on_direct,
                        pending_msgs_limit=1_000_000,
                        pending_bytes_limit=1 << 30,
                    )
            except StoreUnavailable as e:
                log.debug("no direct reads: %r", e)
                return
        probe = {"seq": 1, "next_by_subj": all_filter(self.subject_prefix), "batch": 1}
        try:
            await self._direct_batch(probe, timeout=min(self.request_timeout, 2.0))
        except StoreUnavailable as e:
            if not is_transient(e):
                raise
            # e.g. a user whose permissions lack $JS.API.DIRECT.GET: consumers still work
            log.info("reading %s through consumers (no direct get: %s)", self.stream_name, e)
            return
        self._direct_reads = True

    async def _direct_batch(
        self, request: dict[str, Any], timeout: float | None = None
    ) -> tuple[list[Stored], int]:
        """One direct get batch: the messages, and how many more match after them."""
        self._direct_next += 1
        token = str(self._direct_next)
        call = _DirectCall(asyncio.get_running_loop())
        self._direct_calls[token] = call
        filt = request.get("next_by_subj")
        try:
            with translated(f"cannot read {filt!r}", error=transient, refused=transient):
                await self.nc.publish(
                    f"$JS.API.DIRECT.GET.{self.stream_name}",
                    msgspec.json.encode(request),
                    reply=f"{self._direct_prefix}.{token}",
                )
                try:
                    pending = await asyncio.wait_for(call.done, timeout or self.request_timeout)
                except TimeoutError as e:
                    raise transient(f"no answer to a direct read of {filt}") from e
        finally:
            del self._direct_calls[token]
        return call.msgs, pending

    async def _counts(
        self, known: int, filters: Sequence[tuple[str, int]]
    ) -> list[tuple[int, int]]:
        """(An R1 stream with direct get.) For each ``(filter, start)``: a position ``last``
        of the log, and how many messages matching ``filter`` are stored at ``start`` or
        after, counted when everything up to ``last`` was stored (and perhaps more);
        ``known``: a position stored already.

        Two direct gets a filter, all sent together: the message at ``known`` and how many
        follow it (``last``: the server's count of every message, no filter to match), then
        the filter's first message from ``start`` and how many more match. nats-server
        serves one connection's direct gets one after the other in the order sent (in its
        read loop, or the stream's queue when routed), each apart from writes (the stream's
        isolation lock), so each count is taken just after its ``last`` (a count walks the
        subjects stored from ``start``: counts one after the other would leave the later
        ones further from a single ``last``). Gaps (deleted messages) only make ``last``
        lower. Six messages a filter."""
        loop = asyncio.get_running_loop()
        requests: list[dict[str, Any]] = []
        for f, start in filters:
            requests.append({"seq": max(known, 1), "batch": 1})
            requests.append({"seq": max(start, 1), "next_by_subj": f, "batch": 1})
        calls: list[tuple[str, _DirectCall]] = []
        for _ in requests:
            self._direct_next += 1
            calls.append((str(self._direct_next), _DirectCall(loop)))
        self._direct_calls.update(calls)
        try:
            with translated("cannot count the log", error=transient, refused=transient):
                for (token, _), request in zip(calls, requests, strict=True):
                    await self.nc.publish(
                        f"$JS.API.DIRECT.GET.{self.stream_name}",
                        msgspec.json.encode(request),
                        reply=f"{self._direct_prefix}.{token}",
                    )
                try:
                    async with asyncio.timeout(self.request_timeout):
                        pending = [await call.done for _, call in calls]
                except TimeoutError as e:
                    raise transient("no answer to a count of the log") from e
        finally:
            for token, call in calls:
                del self._direct_calls[token]
                if not call.done.done():
                    call.done.cancel()
                elif not call.done.cancelled():
                    call.done.exception()  # (one not awaited after another's failure)
        out = []
        for i in range(0, len(calls), 2):
            at, counted = calls[i][1].msgs, calls[i + 1][1].msgs
            last = at[-1].seq + pending[i] if at else 0
            out.append((last, len(counted) + pending[i + 1]))
        return out

    async def _on_direct(self, msg: Msg) -> None:
        call = self._direct_calls.get(msg.subject[len(self._direct_prefix) + 1 :])
        if call is None or call.done.done():
            return  # a late answer to a read that gave up
        headers = msg.headers or {}
        status = headers.get(STATUS) if not msg.data else None
        if status is None:
            try:
                seq = int(headers[SEQUENCE])
            except (KeyError, ValueError):
                call.done.set_exception(transient(f"direct get without a sequence: {headers}"))
                return
            call.msgs.append(
                Stored(
                    seq,
                    headers.get(SUBJECT, ""),
                    msg.data,
                    headers.get(HASH_HEADER, ""),
                    headers.get(MSG_ID, ""),
                )
            )
        elif status == END_OF_BATCH:
            left = headers.get(NUM_PENDING, "0")
            call.done.set_result(int(left) if left.isdigit() else 0)
        elif status == NO_MESSAGES:  # nothing (more) matches
            call.done.set_result(0)
        else:
            why = f"{status} {description(msg)}"
            call.done.set_exception(transient(f"direct get refused: {why}"))

    def _close_reads(self) -> None:
        for call in list(self._direct_calls.values()):
            if not call.done.done():
                call.done.set_exception(StoreUnavailable("the event store is closed"))

    # -- the leader's view -----------------------------------------------------------------

    async def _last_seq(self, filt: str) -> int:
        """Stream sequence of the last message matching ``filt`` (0 if none), from the leader."""
        with translated(f"cannot read the end of {filt!r}", error=transient, refused=transient):
            try:
                raw = await self._js.get_msg(self.stream_name, subject=filt)
            except nats.js.errors.NotFoundError as e:
                if e.err_code == ERR_STREAM_NOT_FOUND:
                    raise StoreUnavailable(f"stream {self.stream_name!r} is gone") from e
                return 0
        return int(raw.seq or 0)

    async def _last_position(self) -> int:
        with translated("cannot read stream info", error=transient, refused=transient):
            info = await self._js.stream_info(self.stream_name)
        return int(info.state.last_seq or 0) if info.state.messages else 0
