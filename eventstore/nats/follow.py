"""Following the log: ``subscribe``, catch-up then live, in stream sequence order, in one
of two ways.

* *Without our own echo* (a connection opened with ``no_echo``, as the store
  opens its own, and direct get): what this connection appended is handed to the
  follower by the append itself, with its position from the ack, so the
  server sends nothing back for it. What others append is read with direct
  get, when the follower learns of it: a core subscription on the log's
  subjects, which on a ``no_echo`` connection hears only other connections'
  publishes (a *hint*: it may be refused or not stored yet, so the stored
  messages are read, never the hint); a position below this connection's last
  acknowledged one that it did not write (a gap: read at once, up to that
  position); a reconnect; and, when nothing happened for ``heartbeat``
  seconds, the server itself: the follower arms its *doorbell* (``doorbell.py``,
  one consumer from its next position asked for one message), which tells what
  is stored there already and then answers when anything is (hints lost), so an
  idle follower reads nothing until something is there (a user not allowed
  consumers: a read instead, the wait doubling while those reads find nothing,
  up to 30 heartbeats). Every event
  yielded is the stored one at its position, in order, no gap, no duplicate.
  The server sends nothing for an own event and, for another writer's, the
  publish heard and the stored copy read (direct get batches, so a few events a
  request): with one writer one message an event fewer than a consumer, with
  two as many, with three or more writers following the whole log more.
* *Through a consumer* (a connection that echoes, no direct get, a user not
  allowed to subscribe to the log's subjects, or ``follow="consumer"``): an
  ephemeral pull consumer (AckNone, memory, R1) kept open with long-poll pulls
  and idle heartbeats, its consumer sequence tracked: on a gap, a missed
  heartbeat, a deleted consumer or a reconnect the consumer is recreated from
  the position after the last event yielded, so there is no gap and no
  duplicate. Bounded reads use the same consumer where direct get is not
  available (``reads.py``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import weakref
from collections.abc import AsyncIterator, Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Any

import msgspec
import nats.errors
from nats.aio.msg import Msg
from nats.js import api as js_api

from cardbus.eventstore.envelope import Envelope
from cardbus.eventstore.errors import StoreUnavailable
from cardbus.eventstore.nats.connection import (
    TRANSPORT_ERRORS,
    is_transient,
    on_reconnected,
    transient,
)
from cardbus.eventstore.nats.doorbell import Doorbell
from cardbus.eventstore.nats.subjects import all_filter
from cardbus.eventstore.nats.wire import (
    HEARTBEAT,
    MSG_ID,
    NO_MESSAGES,
    REQUEST_TIMEOUT,
    StoreBase,
    Stored,
    description,
    envelope_of,
    next_msg,
    status,
    stored_of,
)

log = logging.getLogger(__name__)

__all__ = [
    "IDLE_READ_MAX_HEARTBEATS",
    "EphemeralConsumer",
    "Follows",
    "OwnAppends",
    "consumer_refused",
    "echoes",
    "offer_appended",
]


class _ConsumerLost(Exception):
    """The consumer behind a reader is gone or lost messages: recreate it.

    Control flow inside this module: the follow loop recreates the consumer, a
    bounded read gets a transient ``StoreUnavailable`` (a store retry) instead.
    """


class EphemeralConsumer:
    """One ephemeral pull consumer on ``filt`` (one filter or several: nats-server 2.10+
    ``filter_subjects``) from stream sequence ``start``."""

    def __init__(self, store: StoreBase, filt: str | Sequence[str], start: int) -> None:
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
            filter_subject=self.filt if isinstance(self.filt, str) else None,
            filter_subjects=None if isinstance(self.filt, str) else list(self.filt),
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


# -- following without our own echo ------------------------------------------------------

_OWN_CAP = 100_000  # own events held for a follower behind; beyond, it reads them back
_HINTS_CAP = 10_000  # other writers' event ids awaited; beyond, one read settles them
_GAP_GRACE = 0.002  # an own append acked after a later one is handed over this late at most
_HINT_TRIES = 8  # reads for a hinted event not stored yet: 1 ms doubling, ~0.25 s in all
# an idle follower looks at least every this many heartbeats: for hints lost with no
# reconnect (one wakes it at once: ``on_reconnected``), so rarely needed; at 8 it was
# two of the few messages a second an idle runtime exchanges. It is the doorbell's
# expiry too (then armed again), and the longest wait of the idle reads without one
IDLE_READ_MAX_HEARTBEATS = 30

# connection -> the followers on it; every store on the connection hands its appends over
_FOLLOWERS: weakref.WeakKeyDictionary[Any, list[_Follower]] = weakref.WeakKeyDictionary()


class _Follower:
    """One ``subscribe`` without echo: its own envelopes by position, and what it knows."""

    __slots__ = ("closed", "hinted", "hints", "key", "known", "next", "offered", "own", "wake")

    def __init__(self, key: tuple[str, str], start: int) -> None:
        self.key = key  # (stream name, subject prefix)
        self.next = start  # the position to yield next
        self.own: dict[int, Envelope] = {}  # appended through this connection, >= next
        self.known = 0  # the highest position an append on this connection was acked at
        self.hinted: set[str] = set()  # event ids others published that no read had yet
        self.hints = 0  # others' publishes heard since the last read
        self.offered = False  # an append was handed over since the follower last looked
        self.wake = asyncio.Event()
        self.closed = False

    def offer(self, envs: Iterable[Envelope]) -> None:
        own, start = self.own, self.next
        for env in envs:
            p = env.position
            if p >= start and len(own) < _OWN_CAP:
                own[p] = env
            if p > self.known:
                self.known = p
        self.offered = True
        self.wake.set()

    async def on_hint(self, msg: Msg) -> None:
        # (no id: not a cardbus append; looked for as long as an id would be)
        event_id = (msg.headers or {}).get(MSG_ID) or ""
        if len(self.hinted) < _HINTS_CAP:
            self.hinted.add(event_id)
        self.hints += 1
        self.wake.set()

    async def close(self) -> None:  # (the store's close: the loop sees the store closed)
        self.closed = True
        self.wake.set()


def offer_appended(nc: Any, key: tuple[str, str], envs: list[Envelope]) -> None:
    """Hand the envelopes an append on ``nc`` stored to the followers on ``nc``."""
    followers = _FOLLOWERS.get(nc)
    if followers:
        for f in followers:
            if f.key == key:
                f.offer(envs)


class OwnAppends:
    """The envelopes the appends on ``store``'s connection stored, by position, from
    ``start`` on (``own``), as an echo-free follower is handed them; ``wake`` is set at
    each. ``close`` when done."""

    def __init__(self, store: StoreBase, start: int) -> None:
        self._follower = _Follower((store.stream_name, store.subject_prefix), start)
        self._nc = store.nc
        _FOLLOWERS.setdefault(store.nc, []).append(self._follower)
        self.own = self._follower.own
        self.wake = self._follower.wake

    def close(self) -> None:
        with contextlib.suppress(ValueError, KeyError):
            _FOLLOWERS[self._nc].remove(self._follower)


def echoes(nc: Any) -> bool:
    """Whether the server sends this connection its own publishes."""
    return not (getattr(nc, "options", None) or {}).get("no_echo")


def consumer_refused(nc: Any) -> bool:
    """Whether the server refused this connection a consumer (its user may not create one:
    the request times out, the refusal comes as the connection's last error)."""
    err = str(getattr(nc, "last_error", None) or "").lower()
    return "permissions violation" in err and "consumer" in err


_FOLLOW_ERRORS: tuple[type[BaseException], ...] = (_ConsumerLost, *TRANSPORT_ERRORS)
_READ_ERRORS: tuple[type[BaseException], ...] = (StoreUnavailable, *TRANSPORT_ERRORS)


class Follows(StoreBase):
    """``subscribe``: the part of ``NatsEventStore`` that follows the log."""

    read_batch: int
    follow: str
    _direct_reads: bool

    if TYPE_CHECKING:  # (reads.py; NatsEventStore has both parts)

        async def _read_direct(
            self, filt: str, start: int, limit: int | None, target: int
        ) -> list[Stored]: ...

    async def subscribe(self, from_position: int = 0) -> AsyncIterator[Envelope]:
        self._check_open()
        hints = await self._hint_subscription() if self._echo_free() else None
        if hints is None:
            source = self._subscribe_consumer(from_position)
        else:
            source = self._subscribe_echo_free(from_position, *hints)
        async for env in source:
            yield env

    def _echo_free(self) -> bool:
        return self.follow == "auto" and self._direct_reads and not echoes(self.nc)

    async def _hint_subscription(self) -> tuple[_Follower, Any] | None:
        """A follower listening to other connections' publishes on the log, or None when
        this connection may not subscribe to them (then: the consumer)."""
        filt = all_filter(self.subject_prefix)
        follower = _Follower((self.stream_name, self.subject_prefix), 1)
        try:
            sub = await self.nc.subscribe(
                filt,
                cb=follower.on_hint,
                pending_msgs_limit=1_000_000,
                pending_bytes_limit=1 << 30,
            )
            await self.nc.flush(max(1, round(self.request_timeout)))
        except TRANSPORT_ERRORS as e:
            log.debug("no subscription to %s (%r): following through a consumer", filt, e)
            return None
        err = self.nc.last_error
        if err is not None and "permissions violation" in str(err).lower() and filt in str(err):
            log.info("not allowed to subscribe to %s: following through a consumer", filt)
            with contextlib.suppress(Exception):
                await sub.unsubscribe()
            return None
        return follower, sub

    async def _subscribe_echo_free(
        self, from_position: int, f: _Follower, sub: Any
    ) -> AsyncIterator[Envelope]:
        """See the module docstring: own appends handed over, the rest read."""
        loop = asyncio.get_running_loop()
        filt = all_filter(self.subject_prefix)
        f.next = max(from_position, 1)
        followers = _FOLLOWERS.setdefault(self.nc, [])
        followers.append(f)
        self._readers.add(f)
        # a reconnect wakes the follower at once: it reads what others appended meanwhile
        unhook = on_reconnected(self.nc, f.wake.set)
        own = f.own
        catch_up = True  # read until a short page: the stored events first, after reconnects
        gap_since = -1.0
        hint_tries = 0
        hint_due = 0.0
        idle_since = loop.time()
        quiet_s = self.heartbeat  # the idle read's wait: doubles while it finds nothing
        reconnects = self.nc.stats.get("reconnects", 0)
        failures = 0
        limit = 1000
        # idle: wait on the server (doorbell.py) rather than read; None: it cannot (then
        # the idle reads, backing off, as before)
        bell: Doorbell | None = (doorbell := Doorbell(self, filt, f.wake))
        bell_expires = IDLE_READ_MAX_HEARTBEATS * self.heartbeat
        bell_off_until = 0.0
        arm_now = False
        try:
            with contextlib.suppress(*TRANSPORT_ERRORS):  # (else at its first arming)
                await doorbell.listen()
            while True:
                while own:  # what this connection appended, in order
                    env = own.pop(f.next, None)
                    if env is None:
                        break
                    f.next += 1
                    yield env
                self._check_open()
                now = loop.time()
                offered = f.offered
                if offered:
                    f.offered = False
                    idle_since = now
                    quiet_s = self.heartbeat
                if self.nc.stats.get("reconnects", 0) != reconnects:
                    reconnects = self.nc.stats.get("reconnects", 0)
                    catch_up = True  # others' publishes while away were not heard
                target = 0
                read = catch_up
                if f.known >= f.next:  # a position before our last ack that is not ours
                    if gap_since < 0:
                        gap_since = now
                    elif now - gap_since >= _GAP_GRACE:
                        read, target = True, f.known
                else:
                    gap_since = -1.0
                if not read and (f.hints or f.hinted) and now >= hint_due:
                    read = True
                armed = bell is not None and bell.armed
                if bell is not None and armed:
                    overdue = now - bell.armed_at > bell_expires + 2 * self.heartbeat
                    if bell.expired and not (read or offered or f.hints or bell.rang or overdue):
                        # its request expired with nothing stored: asked again as it is
                        with contextlib.suppress(Exception):  # (else disarmed: armed anew)
                            await bell.again(bell_expires)
                        if bell.armed:
                            continue
                        armed, arm_now = False, True
                    elif read or offered or f.hints or bell.rang or bell.ended or overdue:
                        # stored (rang): read; activity: awake anyway; the request over
                        # without a message (expiry): armed again at once
                        rang, again = bell.rang, bell.ended or overdue
                        await bell.disarm()
                        armed = False
                        if not (read or rang):
                            arm_now = again
                            continue
                        read = True
                idle_read = not read and not armed and (arm_now or now - idle_since >= quiet_s)
                if idle_read and bell is not None and now >= bell_off_until:
                    arm_now = False
                    try:  # the look the idle read was, then the server's answer
                        if await bell.arm(f.next, bell_expires) == 0:
                            continue
                        idle_read, read = False, True  # something is there already
                    except Exception as e:  # the read below looks instead
                        self._check_open()
                        if not is_transient(e) or consumer_refused(self.nc):
                            log.info("following %s without a doorbell (%r)", filt, e)
                            await bell.close()
                            bell = None
                        else:  # (a server restarting, an election): idle reads meanwhile
                            log.debug("following %s: no doorbell now (%r)", filt, e)
                            bell_off_until = loop.time() + bell_expires
                if idle_read:
                    read = True  # nothing for a while: anything lost in a disconnect?
                if not read:
                    waits = [idle_since + quiet_s - now]
                    if bell is not None and bell.armed:  # (its expiry answers long before)
                        waits = [bell.armed_at + bell_expires + 2 * self.heartbeat - now]
                    if gap_since >= 0:
                        waits.append(gap_since + _GAP_GRACE - now)
                    if f.hints or f.hinted:
                        waits.append(hint_due - now)
                    f.wake.clear()
                    # (asyncio.timeout: wait_for would run the wait as a task of its own,
                    # two more loop iterations at each wake-up)
                    with contextlib.suppress(TimeoutError):
                        async with asyncio.timeout(max(min(waits), 0.0005)):
                            await f.wake.wait()
                    continue
                f.hints = 0
                try:
                    page = await self._read_direct(filt, f.next, limit, target)
                except _READ_ERRORS as e:
                    self._check_open()
                    if isinstance(e, StoreUnavailable) and not is_transient(e):
                        raise
                    failures += 1
                    log.debug("following %s: read failed (%r); again", filt, e)
                    pause = min(0.02 * 2 ** min(failures, 7), 2.0) * (1 + random.random() / 4)
                    await asyncio.sleep(pause)
                    continue
                failures = 0
                idle_since = loop.time()
                # an idle read that found nothing: the next one waits twice as long, up to
                # IDLE_READ_MAX_HEARTBEATS heartbeats (a read every second was most of an idle
                # follower's work). Only what was appended while disconnected, with
                # nothing heard since, waits for it: the next hint or own append wakes
                # the follower, which sees the reconnect and reads everything first.
                quiet_s = (
                    min(quiet_s * 2, IDLE_READ_MAX_HEARTBEATS * self.heartbeat)
                    if idle_read and not page
                    else self.heartbeat
                )
                for m in page:
                    if m.seq < f.next:
                        continue
                    env = envelope_of(m)  # a poison message is named, never skipped
                    if f.hinted:
                        f.hinted.discard(m.msg_id)
                    f.next = m.seq + 1
                    yield env
                catch_up = len(page) >= limit
                if target and not catch_up:
                    f.next = max(f.next, target + 1)  # all up to the ack was in the read
                if own and min(own) < f.next:
                    for p in [p for p in own if p < f.next]:
                        del own[p]
                if f.hinted and not catch_up:  # heard, not stored yet (or refused): look again
                    hint_tries += 1
                    if hint_tries > _HINT_TRIES:
                        f.hinted.clear()
                        hint_tries = 0
                    hint_due = loop.time() + 0.001 * 2 ** (hint_tries - 1)
                else:
                    hint_tries = 0
        finally:
            if bell is not None:
                with contextlib.suppress(Exception):
                    await bell.close()
            if unhook is not None:
                unhook()
            self._readers.discard(f)
            with contextlib.suppress(ValueError):
                followers.remove(f)
            with contextlib.suppress(Exception):
                await sub.unsubscribe()

    async def _subscribe_consumer(self, from_position: int) -> AsyncIterator[Envelope]:
        async for env in self.follow_filtered([all_filter(self.subject_prefix)], from_position):
            yield env

    async def follow_filtered(
        self,
        filters: Sequence[str],
        from_position: int = 1,
        opened: Callable[[EphemeralConsumer], None] | None = None,
    ) -> AsyncIterator[Envelope]:
        """The events matching any of ``filters`` (``subjects.partition_filter``, ...) from
        ``from_position``, forever, through one consumer (recreated as ``subscribe``'s).
        ``opened`` is told of each consumer made: closing it (``EphemeralConsumer.close``)
        ends this iterator, so its caller can follow other filters from where it stopped."""
        next_position = max(from_position, 1)
        failures = 0
        # what this connection appends is handed over by the append (as to the echo-free
        # follower): the consumer still delivers it, in order, but it is not decoded again
        mine = _Follower((self.stream_name, self.subject_prefix), next_position)
        own = mine.own
        followers = _FOLLOWERS.setdefault(self.nc, [])
        followers.append(mine)
        try:
            while True:
                self._check_open()
                reader = EphemeralConsumer(self, list(filters), next_position)
                if opened is not None:
                    opened(reader)
                try:
                    await reader.open()
                    async for msg in reader.follow(self.read_batch, self.heartbeat):
                        failures = 0
                        seq = msg.metadata.sequence.stream
                        if seq < next_position:
                            continue  # already yielded (defensive: consumers restart at next)
                        env = own.pop(seq, None) if own else None
                        if env is None:
                            env = envelope_of(stored_of(msg))
                        next_position = mine.next = seq + 1
                        while own:  # own appends before it outside the filters: never come
                            first = next(iter(own))
                            if first >= seq:
                                break
                            del own[first]
                        yield env
                except Exception as e:
                    if reader.closed and opened is not None:
                        return  # closed by the caller: it follows on with other filters
                    if not isinstance(e, _FOLLOW_ERRORS):
                        raise
                    failures += 1
                    log.debug("subscription consumer lost (%r); recreating at %d", e, next_position)
                finally:
                    await reader.close()
                self._check_open()
                pause = min(0.02 * 2 ** min(failures, 7), 2.0) * (1 + random.random() / 4)
                await asyncio.sleep(pause)
        finally:
            with contextlib.suppress(ValueError):
                followers.remove(mine)
