"""A provider's limit shared by the members of a NATS cluster: each paces its share.

Every process paces its model calls with its own ``Pacer`` (``cardbus.agents.pacing``):
no call waits on a round trip to anyone. What the members share is *how much of the
limit each may use*: each one says, in the JetStream key-value bucket
``cardbus-limits``, how many calls of each limit it has waiting or under way (its
demand), and each paces ``its demand / the cluster's demand`` of the limit (a member
with nothing to send takes the share it would get if it had: ``1 / (members + 1)``).
So the cluster's pace stays within the limit, a busy member gets more than an idle one,
and the calls of two members' runs wait about as long.

Demands are put when they change, at most every ``period_s`` (not per call), and heard
by a plain core subscription to the bucket's subjects (``$KV.cardbus-limits.>``: each put
is a message there), after one read of what the bucket holds; a member that stops saying
anything for ``stale_s`` (it died) no longer counts. A member with no limit met yet
neither ticks nor puts anything: an idle runtime's pace share costs nothing (the watch it
used, a JetStream ordered consumer, woke it for idle heartbeats, and the tick twice a
second). A 429 that comes anyway is put too (``<limit>._hold``): every member
holds for its retry-after and halves its pace, as the one answered 429 does.

Keys: ``<limit id>.<member>`` and ``<limit id>._hold``, where the limit id is a digest
of (endpoint, model, key fingerprint); values are JSON with a wall-clock ``t`` (clocks
of a cluster's hosts agree to well within ``stale_s``).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import logging
import os
import re
import socket
import time
from typing import Any

import nats.errors
import nats.js.errors
from nats.aio.client import Client
from nats.js.kv import KeyValue

from cardbus.agents.pacing import LimitKey, Pacer, process_pacer

__all__ = ["IDLE_WEIGHT", "LIMITS_BUCKET", "PaceShare", "limit_id", "share_pace", "unshare_pace"]

log = logging.getLogger(__name__)

#: the key-value bucket the members' demands live in
LIMITS_BUCKET = "cardbus-limits"

#: what a member with no call waiting or under way counts as, in calls
IDLE_WEIGHT = 0.05

_KV_ERRORS = (nats.errors.Error, nats.js.errors.Error, asyncio.TimeoutError, OSError)


def limit_id(key: LimitKey) -> str:
    """A limit's key in the bucket: a digest (the key's parts hold dots and colons)."""
    return hashlib.sha256("\x1f".join(key).encode()).hexdigest()[:16]


def _member_name() -> str:
    raw = f"{socket.gethostname()}-{os.getpid()}-{os.urandom(3).hex()}"
    return re.sub(r"[^A-Za-z0-9_-]", "_", raw)


class PaceShare:
    """Keep ``pacer``'s share of each limit in step with the cluster's demand."""

    def __init__(
        self,
        nc: Client,
        pacer: Pacer,
        *,
        member: str | None = None,
        period_s: float | None = None,
        stale_s: float | None = None,
        bucket: str = LIMITS_BUCKET,
    ) -> None:
        """``period_s``: how often demands are put and shares recomputed (default: a
        120th of the pacer's minute, 0.5 s); ``stale_s``: after how long without a word a
        member no longer counts (default: 10 periods, at least 2 s)."""
        self.nc = nc
        self.pacer = pacer
        self.member = member or _member_name()
        self.period_s = period_s if period_s is not None else pacer.minute_s / 120
        self.stale_s = stale_s if stale_s is not None else max(2.0, 10 * self.period_s)
        self.bucket = bucket
        #: limit id -> member -> (demand, wall time said)
        self.demands: dict[str, dict[str, tuple[float, float]]] = {}
        self._said: dict[str, tuple[float, float]] = {}  # limit id -> (demand, when) put
        self._kv: KeyValue | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self._holds: set[asyncio.Task[None]] = set()
        self._starting: asyncio.Task[None] | None = None  # share_pace's start, under way
        self._sub: Any = None  # the core subscription to the bucket's subjects
        self._keyed = asyncio.Event()  # the pacer met a limit: the tick has work

    async def start(self) -> PaceShare:
        js = self.nc.jetstream()
        try:
            self._kv = await js.key_value(self.bucket)
        except nats.js.errors.BucketNotFoundError:
            try:
                self._kv = await js.create_key_value(
                    bucket=self.bucket, history=1, description="cardbus provider limits"
                )
            except nats.js.errors.BadRequestError:  # created by another member meanwhile
                self._kv = await js.key_value(self.bucket)
        # subscribed before the read of what is there: nothing put in between is missed
        # (a value heard twice is kept by its time, see _heard)
        self._sub = await self.nc.subscribe(f"$KV.{self.bucket}.>", cb=self._on_put)
        await self._read_bucket()
        self.pacer.on_rate_limited.append(self._rate_limited)
        self.pacer.on_new_key.append(self._new_key)
        if self.pacer.states:
            self._keyed.set()
        # the members learn a limit at about the same moment: no burst each on top
        self.pacer.start_empty = True
        self._tasks = [asyncio.create_task(self._tick_loop(), name="pace-share-tick")]
        return self

    async def _read_bucket(self) -> None:
        """What the bucket holds now, once (its watch ends at the last value)."""
        assert self._kv is not None
        watcher = await self._kv.watch(">")
        try:
            async for entry in watcher:
                if entry is None:  # the end of what was there
                    break
                deleted = entry.operation is not None or not entry.value
                self._heard(str(entry.key), None if deleted else entry.value)
        finally:
            with contextlib.suppress(*_KV_ERRORS):
                await watcher.stop()

    async def _on_put(self, msg: Any) -> None:
        prefix = f"$KV.{self.bucket}."
        if not msg.subject.startswith(prefix):
            return
        headers = msg.headers or {}
        # DEL or PURGE, or (nats-server 2.11+) a marker the server put when a value aged out
        gone = headers.get("KV-Operation") or headers.get("Nats-Marker-Reason")
        self._heard(msg.subject[len(prefix) :], None if gone else msg.data)

    async def stop(self) -> None:
        starting, self._starting = self._starting, None
        if starting is not None and starting is not asyncio.current_task():
            starting.cancel()
            with contextlib.suppress(asyncio.CancelledError, *_KV_ERRORS):
                await starting
        with contextlib.suppress(ValueError):
            self.pacer.on_rate_limited.remove(self._rate_limited)
        with contextlib.suppress(ValueError):
            self.pacer.on_new_key.remove(self._new_key)
        for task in [*self._tasks, *self._holds]:
            task.cancel()
        for task in [*self._tasks, *self._holds]:
            with contextlib.suppress(asyncio.CancelledError, *_KV_ERRORS):
                await task
        self._tasks = []
        sub, self._sub = self._sub, None
        if sub is not None:
            with contextlib.suppress(*_KV_ERRORS):
                await sub.unsubscribe()
        if self._kv is not None:  # say at once that this member asks for nothing more
            for lid in list(self._said):
                with contextlib.suppress(*_KV_ERRORS):
                    await self._kv.delete(f"{lid}.{self.member}")

    async def __aenter__(self) -> PaceShare:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    # -- shares ----------------------------------------------------------------------

    def share(self, lid: str, own: float, now: float) -> float:
        """This member's part of limit ``lid`` with ``own`` demand, as of wall time ``now``."""
        # a member with nothing to send counts as IDLE_WEIGHT of a call: the busy ones
        # keep nearly all of the limit, and one that starts sending starts slow (its
        # share grows at its next tick, the others' shrink as they hear it) rather than
        # at a share the others have not made room for
        others = [
            max(demand, IDLE_WEIGHT)
            for member, (demand, said) in self.demands.get(lid, {}).items()
            if member != self.member and now - said <= self.stale_s
        ]
        own = max(own, IDLE_WEIGHT)
        return own / (own + sum(others))

    def _new_key(self, key: LimitKey) -> None:
        """A limit first met here: its share from the start, not from the next tick."""
        share = self.share(limit_id(key), 0.0, time.time())
        self.pacer.state(key).set_share(share, self.pacer.clock())
        self._keyed.set()

    def _recompute(self) -> None:
        now = time.time()
        for key in list(self.pacer.states):
            lid = limit_id(key)
            own = self._said.get(lid, (0.0, 0.0))[0]
            self.pacer.set_share(key, self.share(lid, own, now))

    async def _tick_loop(self) -> None:
        await self._keyed.wait()  # no limit met yet: nothing to say, no share to keep
        while True:
            try:
                await self.tick()
            except asyncio.CancelledError:
                raise
            except _KV_ERRORS as e:  # the server away: pace on the shares known, retry
                log.warning("provider limit shares not put: %r", e)
            await asyncio.sleep(self.period_s)

    async def tick(self) -> None:
        """Put this member's demands that changed (or grow old), then recompute shares."""
        assert self._kv is not None
        now = time.time()
        puts = []
        for key in list(self.pacer.states):
            lid = limit_id(key)
            demand = float(self.pacer.demand(key))
            said, when = self._said.get(lid, (0.0, 0.0))
            if demand == said and now - when < self.stale_s / 3:
                continue  # said, and recently enough to count as alive
            self._said[lid] = (demand, now)
            value = json.dumps({"demand": demand, "t": now}).encode()
            puts.append(self._kv.put(f"{lid}.{self.member}", value))
        self._recompute()  # own demand first: no wait for the watch's echo
        await asyncio.gather(*puts)

    def _heard(self, key: str, raw: bytes | None) -> None:
        """A key's value (None: deleted), from the first read or a put heard since."""
        lid, _, member = key.partition(".")
        try:
            value = json.loads(raw) if raw else None
        except ValueError:
            return  # not ours to read: a share is never taken from it
        if member == "_hold":
            self._held(lid, value)
            return
        if not isinstance(value, dict) or member == self.member:
            gone = self.demands.get(lid, {}).pop(member, None)  # deleted, or our own echo
            if gone is not None:  # a member left: its part of the limit is free at once
                self._recompute()
            return
        demand, said = value.get("demand"), value.get("t")
        if isinstance(demand, (int, float)) and isinstance(said, (int, float)):
            known = self.demands.setdefault(lid, {})
            if member in known and known[member][1] > said:
                return  # the first read's older copy of a put heard already
            known[member] = (float(demand), float(said))
            self._recompute()

    # -- 429s ------------------------------------------------------------------------

    def _rate_limited(self, key: LimitKey, retry_after: float | None) -> None:
        if self._kv is None:
            return
        until = time.time() + (retry_after or 1.0)
        value = json.dumps({"until": until, "by": self.member, "t": time.time()}).encode()
        task = asyncio.ensure_future(self._kv.put(f"{limit_id(key)}._hold", value))
        self._holds.add(task)  # type: ignore[arg-type]
        task.add_done_callback(self._holds.discard)
        task.add_done_callback(lambda t: t.cancelled() or t.exception())

    def _held(self, lid: str, value: Any) -> None:
        if not isinstance(value, dict) or value.get("by") == self.member:
            return  # our own 429: already held
        until = value.get("until")
        if not isinstance(until, (int, float)):
            return
        seconds = until - time.time()
        if seconds <= 0:
            return  # an old hold, read when the watch began
        for key in list(self.pacer.states):
            if limit_id(key) == lid:
                self.pacer.hold(key, seconds)


_shared: dict[int, tuple[PaceShare, int]] = {}  # id(pacer) -> (its share, users)


async def share_pace(nc: Client, pacer: Pacer | None = None) -> PaceShare:
    """Share ``pacer`` (default: the process's) with the cluster on ``nc``; one
    ``PaceShare`` per pacer, however many runtimes in the process ask (a second would
    count the process twice). It starts in the background: nothing waits for the bucket
    (an agent's connection without the permission to use it would wait for a timeout),
    and if it cannot be used the process paces alone, as a warning says. Pair with
    ``unshare_pace``."""
    pacer = pacer if pacer is not None else process_pacer()
    held = _shared.get(id(pacer))
    if held is not None:
        _shared[id(pacer)] = (held[0], held[1] + 1)
        return held[0]
    share = PaceShare(nc, pacer)
    share._starting = asyncio.create_task(_start_quietly(share), name="pace-share-start")
    _shared[id(pacer)] = (share, 1)
    return share


async def _start_quietly(share: PaceShare) -> None:
    try:
        await share.start()
    except _KV_ERRORS as e:
        log.warning("provider limits paced by this process alone (bucket %s: %r)", share.bucket, e)
        await share.stop()


async def unshare_pace(share: PaceShare | None) -> None:
    """One user of ``share`` is done with it; the last stops it."""
    if share is None:
        return
    held = _shared.get(id(share.pacer))
    if held is None or held[0] is not share:
        return
    if held[1] > 1:
        _shared[id(share.pacer)] = (share, held[1] - 1)
        return
    del _shared[id(share.pacer)]
    await share.stop()
