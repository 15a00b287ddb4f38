"""Which orchestrator process decides which run: partitions of the roots, each held by a
lease in a NATS KV bucket.

Several orchestrator processes on one log all fold every event (any of them can accept a
submit and answer ``wait``), but a run's decisions are made only by the process that holds
its partition: ``partition_of(root_id)`` (a stable CRC-32 of the root id, the same in
every process) names one of ``partitions`` keys ``p.<n>`` in the bucket; the process whose
``create`` (revision 0) or ``update`` (at the revision it holds: compare-and-set) of that
key succeeded holds it, and renews it every third of ``lease_s``. The bucket's TTL is
``lease_s``: the key of a process that died (or stopped renewing) expires on the server,
and a live process creates it on its next round, then wakes those runs (``on_acquired``):
it has folded their events all along, so it goes on from the log as a restart does.
A run's replies reach the member holding its partition: its cards name the partition, the
agents answer on it, and each partition's replies wait in a consumer of their own,
read by whoever holds the partition and acked once settled (``bus.transport.
nats_replies``), so a member that dies before recording a result leaves it to the next
owner. A reply of an agent that names no partition (an earlier version) reaches every
member; one for a run another member decides is held for a while
(``Orchestrator.foreign_replies``) and, if that member dies before recording it, offered
by the next owner (``sort_held_replies``), so the attempt is not timed out and redone.

A process counts itself owner only until ``lease_s`` after it *sent* its latest successful
renewal (less a margin): the server's TTL starts when it receives the write, later, so
the old holder stops deciding before anyone else can take the key. A decision already in
flight when a lease lapses is still appended at the version it was decided on, so the
log's optimistic concurrency keeps a handover consistent.

A round's renewals (every held key, at its revision, and ``member.<id>``) go out as one
JetStream atomic batch with one acknowledgement where the server allows it (nats-server
2.12+; the bucket's stream gets ``allow_atomic``): stored all or none, each key still
checked at its own revision. If the server refuses the batch (a key lapsed and was taken),
nothing of it is stored and the keys are renewed one by one, each with its own answer.

Every process also renews ``member.<id>``; the live members share the partitions: each
holds at most ``ceil(partitions / members)``, releasing what is over its share (a new
member joined) and taking free ones up to it. A stopping process deletes its keys (its
member key purged, so its subject is gone: the others count members by the subjects and
read the keys only when those change), so the others take over at once rather than after
the lease. A member alone counts only when something else was stored in the bucket since
its latest count (its batch's first revision follows the last sequence that count saw,
or not): a member joining writes its key, and a key of another member that could expire
was counted; with others, every round counts (their renewals are stored in between).

The partition count and lease are written into the bucket's description: a process
started with others than the bucket's gets a ``ConfigError`` (two counts would give a
root two owners).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import re
import time
import zlib
from collections.abc import Callable, Iterable
from typing import Any

import nats.errors
import nats.js.errors
from nats.js.client import JetStreamContext
from nats.js.kv import KeyValue

from cardbus.agents.cards import ResultCard
from cardbus.eventstore import TaskState, new_id
from cardbus.eventstore.errors import ConfigError
from cardbus.eventstore.nats.subjects import partition_of
from cardbus.eventstore.nats.wire import BATCH_COMMIT, BATCH_ID, BATCH_SEQUENCE

__all__ = [
    "DEFAULT_PARTITIONS",
    "OWNERS_BUCKET",
    "Partitions",
    "check_settings",
    "partition_of",
    "sort_held_replies",
]

log = logging.getLogger(__name__)

OWNERS_BUCKET = "cardbus-owners"
DEFAULT_PARTITIONS = 32
MAX_PARTITIONS = 4096
_MARGIN = 0.9  # a holder stops deciding at 90% of the lease: clocks and scheduling slack
_MEMBER = re.compile(r"^[A-Za-z0-9_-]{1,64}$")  # one KV key token
_KV_ERRORS = (nats.errors.Error, nats.js.errors.Error, OSError, asyncio.TimeoutError)
_EXPECTED_LAST = "Nats-Expected-Last-Subject-Sequence"
_KV_TRANSIENT = (nats.js.errors.ServiceUnavailableError, nats.js.errors.ServerError)


def check_settings(
    partitions: int, lease_s: float, member: str | None = None, bucket: str = OWNERS_BUCKET
) -> str:
    """``ConfigError`` for a setting out of range; the member name (a new one for None)."""
    if isinstance(partitions, bool) or not isinstance(partitions, int):
        raise ConfigError(f"partitions must be an integer: {partitions!r}")
    if not 1 <= partitions <= MAX_PARTITIONS:
        raise ConfigError(f"partitions must be 1 to {MAX_PARTITIONS}: {partitions}")
    if (
        isinstance(lease_s, bool)
        or not isinstance(lease_s, (int, float))
        or not math.isfinite(lease_s)
        or not 0.5 <= lease_s <= 3600
    ):
        raise ConfigError(f"lease_s must be 0.5 to 3600 seconds: {lease_s!r}")
    member = member if member is not None else new_id().replace("-", "")
    if not isinstance(member, str) or not _MEMBER.match(member):
        raise ConfigError(f"member must be 1 to 64 of A-Z a-z 0-9 _ -: {member!r}")
    if not isinstance(bucket, str) or not _MEMBER.match(bucket):
        raise ConfigError(f"bucket must be 1 to 64 of A-Z a-z 0-9 _ -: {bucket!r}")
    return member


def sort_held_replies(
    held: Iterable[tuple[float, Any]],
    tasks: Any,
    owns: Callable[[str], bool],
    since: float,
) -> tuple[list[tuple[float, Any]], list[Any]]:
    """Replies held for runs another member decided: (those to keep holding, those to
    offer now). A reply is offered once its run is ours and its attempt still waits
    for it (its dead owner never recorded it: without it the attempt would only time
    out); one recorded already is dropped (offering it would log a duplicate), as is
    one received before ``since``; one for a task not folded here (yet) is kept.
    ``tasks``: the orchestrator's ``state.tasks``."""
    keep: list[tuple[float, Any]] = []
    offer: list[Any] = []
    for at, reply in held:
        task = tasks.get(getattr(reply, "task_id", ""))
        if at < since:
            continue
        if task is None or not owns(task.created.root_id):  # (not folded here yet)
            keep.append((at, reply))
        elif (
            task.state in (TaskState.DISPATCHED, TaskState.RUNNING)
            and getattr(reply, "attempt", None) == task.attempt
            and task.attempt not in task.settled
            and reply.agent_id not in task.results
            and (isinstance(reply, ResultCard) or task.state is TaskState.DISPATCHED)
        ):
            offer.append(reply)
    return keep, offer


class Partitions:
    """This process's share of the runs; ``owns(root_id)`` is the orchestrator's hook."""

    def __init__(
        self,
        js: JetStreamContext,
        partitions: int = DEFAULT_PARTITIONS,
        lease_s: float = 6.0,
        *,
        member: str | None = None,
        bucket: str = OWNERS_BUCKET,
        replicas: int = 1,
        on_acquired: Callable[[], None] | None = None,
        on_change: Callable[[frozenset[int]], None] | None = None,
    ) -> None:
        member = check_settings(partitions, lease_s, member, bucket)
        self.js = js
        self.partitions = partitions
        self.lease_s = float(lease_s)
        self.member = member
        self.bucket = bucket
        self.replicas = replicas
        self.on_acquired = on_acquired
        self.on_change = on_change  # told the partitions held after every round
        self.members = 1  # live members seen in the latest round
        self._kv: KeyValue | None = None
        self._member_names: frozenset[str] | None = None  # member keys seen last round
        self._live = 1  # of which live (not deleted)
        # the bucket's last sequence when the members were counted (and after this member's
        # batches stored right after it): nothing else stored since, the count holds
        self._counted_to: int | None = None
        self._batch: tuple[int, int] | None = None  # the latest round's batch: revisions
        self._atomic = False  # the bucket's stream takes atomic batches: one renewal batch
        self._batches = 0
        self._batch_prefix = f"lease-{new_id()[:8]}-"
        self._revision: dict[int, int] = {}  # partition -> the revision of our lease
        self._until: dict[int, float] = {}  # partition -> monotonic time our lease is good to
        start = zlib.crc32(member.encode()) % partitions  # members try different ones first
        self._order = [(start + i) % partitions for i in range(partitions)]
        self._loop: asyncio.Task[None] | None = None
        # the round under way, if one is: a second round at once would update a lease at
        # the revision the first just replaced, fail, and forget a partition it holds
        self._under_way: asyncio.Future[None] | None = None

    # -- the hook ----------------------------------------------------------------

    def owns(self, root_id: str) -> bool:
        """Whether this process may decide run ``root_id`` now."""
        return self._until.get(partition_of(root_id, self.partitions), 0.0) > time.monotonic()

    @property
    def holding(self) -> frozenset[int]:
        """The partitions this process has a lease revision of (renewed or not yet lapsed
        elsewhere): what it follows and folds."""
        return frozenset(self._revision)

    @property
    def held(self) -> frozenset[int]:
        """The partitions whose lease this process holds now."""
        now = time.monotonic()
        return frozenset(p for p, until in self._until.items() if until > now)

    # -- lifecycle ---------------------------------------------------------------

    async def start(self) -> None:
        """Open (or create) the bucket, take a first share, then renew in the background."""
        self._kv = await self._open()
        self._atomic = await self._allow_atomic()
        await self.round()
        self._loop = asyncio.create_task(self._renew(), name="partition-leases")

    async def stop(self) -> None:
        """Stop renewing and give every lease back, so the others take over at once."""
        if self._loop is not None:
            self._loop.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._loop
            self._loop = None
        if self._kv is None:
            return
        await asyncio.gather(*(self._release(p) for p in sorted(self._revision)))
        try:  # the key's subject goes, so the others' next round sees one member fewer
            await self.js.purge_stream(
                f"KV_{self.bucket}", subject=f"$KV.{self.bucket}.member.{self.member}"
            )
        except _KV_ERRORS:  # (purges not allowed: a delete marker, read as gone)
            with contextlib.suppress(*_KV_ERRORS):
                await self._kv.delete(f"member.{self.member}")

    async def _open(self) -> KeyValue:
        description = (
            f"cardbus run ownership: partitions={self.partitions} lease_s={self.lease_s:g}"
        )
        for _ in range(3):
            try:
                info = await self.js.stream_info(f"KV_{self.bucket}")
            except nats.js.errors.NotFoundError:
                try:
                    return await self.js.create_key_value(
                        bucket=self.bucket,
                        ttl=self.lease_s,
                        history=1,
                        description=description,
                        replicas=self.replicas,
                    )
                except nats.js.errors.BadRequestError:
                    continue  # created by another process meanwhile: look at its settings
            if info.config.description != description:
                raise ConfigError(
                    f"the bucket {self.bucket!r} says {info.config.description!r}, this process"
                    f" {description!r}: every orchestrator on a log needs the same partitions"
                    " and lease"
                )
            return await self.js.key_value(self.bucket)
        raise ConfigError(f"the bucket {self.bucket!r} could not be opened")

    async def _allow_atomic(self) -> bool:
        """Whether the bucket's stream takes atomic batches (turned on where it can be)."""
        stream = f"KV_{self.bucket}"
        try:
            info = await self.js.stream_info(stream)
            if not getattr(info.config, "allow_atomic", None):
                info.config.allow_atomic = True  # (an older nats-py sends it not: False below)
                info = await self.js.update_stream(info.config)
        except _KV_ERRORS as e:  # an older server, or not allowed: one update per key
            log.debug("partition renewals one by one (%s: %r)", stream, e)
            return False
        return bool(getattr(info.config, "allow_atomic", None))

    async def _renew(self) -> None:
        loop = asyncio.get_running_loop()
        began = loop.time()
        while True:
            # every third of the lease from when the last round began, not after it ended:
            # a round slowed by load (a dozen KV requests) no longer pushes the next one
            # late, towards the lease's end
            await asyncio.sleep(max(0.0, began + self.lease_s / 3 - loop.time()))
            began = loop.time()
            try:
                await self.round()
            except asyncio.CancelledError:
                raise
            except Exception as e:  # the server away: leases lapse by themselves, retry
                log.warning("partition leases not renewed: %r %s", e, getattr(e, "description", ""))

    # -- one round ---------------------------------------------------------------

    async def round(self) -> None:
        """Renew what is held, then release or take partitions towards this member's share.

        A call while a round is under way waits for that round instead of racing it (on a
        loaded machine the renewal loop's rounds run back to back). A round's requests go
        out together where one does not need another's answer: each one waited for costs
        the leases that much of their margin."""
        if self._under_way is not None:
            await asyncio.shield(self._under_way)  # ended, failed or cancelled: its state
            return
        under_way = self._under_way = asyncio.get_running_loop().create_future()
        try:
            await self._round()
        finally:
            self._under_way = None
            under_way.set_result(None)

    async def _round(self) -> None:
        kv = self._kv
        if kv is None:
            raise ConfigError("Partitions.round before start")
        me = self.member.encode()
        sent = time.monotonic()
        held = sorted(self._revision)
        # the members are counted while the renewals go (one round trip, not two), but
        # only once this member's own key is there (a first round counts after it); alone,
        # only if the batch's revisions show something else stored (then after them)
        alone = self._live == 1 and self._counted_to is not None and self._atomic and bool(held)
        counting = (
            asyncio.ensure_future(self._live_members(kv))
            if self._member_names is not None and not alone
            else None
        )
        try:
            results = await self._renewals(kv, held, me)
        except BaseException:
            if counting is not None:
                counting.cancel()
            raise
        announced, *outcomes = results
        acquired = False
        for p, outcome in zip(held, outcomes, strict=True):
            if isinstance(outcome, int):
                # lapsed here meanwhile (a late round): its replies were held, as if another
                # member had it, so they are offered again as on an acquisition
                acquired |= self._until.get(p, 0.0) <= time.monotonic()
                self._revision[p] = outcome
                self._until[p] = sent + self.lease_s * _MARGIN
            elif isinstance(outcome, nats.js.errors.KeyWrongLastSequenceError):
                self._forget(p)  # it lapsed and someone else has it (or it is gone)
            elif not isinstance(outcome, _KV_ERRORS):
                raise outcome
            # a transport error: the lease lapses by itself unless the next round renews it
        if isinstance(announced, BaseException):  # the renewals above are kept all the same
            if counting is not None:
                counting.cancel()
            raise announced
        if counting is not None:
            self.members = max(1, await counting)
        elif not self._only_ours_since_count():
            self.members = max(1, await self._live_members(kv))
        if self._only_ours_since_count():
            assert self._batch is not None
            self._counted_to = self._batch[1]
        share = -(-self.partitions // self.members)
        mine = [p for p in self._order if p in self._revision]
        # over the share (a member joined): the last ones go
        await asyncio.gather(*(self._release(p) for p in mine[share:]))
        if len(self._revision) < share:
            acquired |= await self._take(kv, share)
        if self.on_change is not None:
            self.on_change(self.holding)
        if acquired and self.on_acquired is not None:
            self.on_acquired()  # their runs are looked at now

    def _only_ours_since_count(self) -> bool:
        """Whether this round's batch is stored right after what the member count saw."""
        batch, counted = self._batch, self._counted_to
        return batch is not None and counted is not None and batch[0] == counted + 1

    async def _renewals(
        self, kv: KeyValue, held: list[int], me: bytes
    ) -> list[int | BaseException]:
        """The member key's and each held key's new revision (or why not), in that order."""
        self._batch = None
        together = await self._renew_together(held, me) if self._atomic and held else None
        if together is not None:
            return together
        return await asyncio.gather(
            kv.put(f"member.{self.member}", me),
            *(kv.update(_key(p), me, last=self._revision[p]) for p in held),
            return_exceptions=True,
        )

    async def _renew_together(self, held: list[int], me: bytes) -> list[int | BaseException] | None:
        """The round's renewals as one atomic batch: the member key, then each held key
        at its revision; the outcomes as ``gather`` gives them (the new revisions, or the
        transport error for all), or None if the server refused the batch (nothing of it
        stored: the keys are then renewed one by one, each with its own answer)."""
        nc = self.js._nc
        self._batches += 1
        batch_id = f"{self._batch_prefix}{self._batches}"
        messages = [(f"member.{self.member}", None), *((_key(p), self._revision[p]) for p in held)]
        try:
            for n, (key, last) in enumerate(messages, 1):
                headers = {BATCH_ID: batch_id, BATCH_SEQUENCE: str(n)}
                if last is not None:
                    headers[_EXPECTED_LAST] = str(last)
                subject = f"$KV.{self.bucket}.{key}"
                if n < len(messages):  # nothing awaited but the commit's ack
                    await nc.publish(subject, me, headers=headers)
                else:
                    headers[BATCH_COMMIT] = "1"
                    ack = await self.js.publish(subject, me, headers=headers)
        except nats.js.errors.APIError as e:
            if isinstance(e, _KV_TRANSIENT):
                return [e for _ in messages]
            log.debug("partition renewals refused together, one by one now: %r", e)
            return None
        except _KV_ERRORS as e:  # the server away: the leases lapse unless renewed
            return [e for _ in messages]
        first = ack.seq - len(messages) + 1  # a batch is stored in one piece, in order
        self._batch = (first, ack.seq)
        return list(range(first, first + len(messages)))

    async def _take(self, kv: KeyValue, share: int) -> bool:
        """Create free partitions' keys (absent, expired or deleted) up to ``share``."""
        others = [p for p in self._order if p not in self._revision]
        found = await asyncio.gather(*(kv.get(_key(p)) for p in others), return_exceptions=True)
        free = []
        for p, entry in zip(others, found, strict=True):
            if not isinstance(entry, nats.js.errors.NotFoundError):  # held, or not known
                if isinstance(entry, BaseException) and not isinstance(entry, _KV_ERRORS):
                    raise entry
                continue
            free.append(p)
        took = False
        while free and len(self._revision) < share:
            # as many creates at once as the share has room for: never more held than it
            tried, free = free[: share - len(self._revision)], free[share - len(self._revision) :]
            sent = time.monotonic()
            created = await asyncio.gather(
                *(kv.create(_key(p), self.member.encode()) for p in tried),
                return_exceptions=True,
            )
            for p, revision in zip(tried, created, strict=True):
                if isinstance(revision, int):
                    self._revision[p] = revision
                    self._until[p] = sent + self.lease_s * _MARGIN
                    took = True
                elif not isinstance(
                    revision, (nats.js.errors.KeyWrongLastSequenceError, *_KV_ERRORS)
                ):
                    raise revision
                # else another member was quicker (or the server away): the next one is tried
        return took

    async def _live_members(self, kv: KeyValue) -> int:
        """Members whose key is there and not deleted (a stopped member deletes its own).

        Not ``kv.keys()``: its watcher waits for the last pending key, which never comes
        when a key expires meanwhile (a lease lapsing), and that round would hang."""
        info = await self.js.stream_info(
            f"KV_{self.bucket}", subjects_filter=f"$KV.{self.bucket}.member.>"
        )
        names = frozenset(s.rsplit(".", 1)[1] for s in (info.state.subjects or {}))
        self._counted_to = int(info.state.last_seq or 0)
        if names == self._member_names:
            # The same keys as last round: the same members. A member that stops purges
            # its key (its subject is gone) and a dead one's expires, so a change shows
            # here; only a delete marker (of an earlier version's member) stays until it
            # expires, within a lease
            return self._live
        found = await asyncio.gather(
            *(kv.get(f"member.{n}") for n in names), return_exceptions=True
        )
        self._member_names = names
        self._live = sum(not isinstance(f, BaseException) for f in found)
        return self._live

    async def _release(self, p: int) -> None:
        """Stop deciding the partition first, then delete its key (at our revision only)."""
        revision = self._revision.get(p)
        self._forget(p)
        if revision is not None and self._kv is not None:
            with contextlib.suppress(*_KV_ERRORS):
                await self._kv.delete(_key(p), last=revision)

    def _forget(self, p: int) -> None:
        self._revision.pop(p, None)
        self._until.pop(p, None)


def _key(p: int) -> str:
    return f"p.{p}"
