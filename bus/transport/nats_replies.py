"""Replies on NATS: the acks of a reply consumer, and a partitioned member's reading of
the replies of the runs it holds (``NatsBus(reply_partitions=...)``).

Partitioned replies
-------------------
With several orchestrator members sharing the runs by partition
(``bus.orchestrator.partition``), a card says its run's partition in the header
``Cardbus-Partition`` and the agent's bus answers on
``cardbus.reply.<agent>.<task>.<partition>``. Each partition has one durable consumer,
``cardbus-replies-p<n>`` filtered to ``cardbus.reply.*.*.<n>``, shared by whichever
member holds the partition (as a Kafka partition's offset belongs to the partition, not
to a member): a member reads only its own runs' replies; the replies of a partition
nobody holds for a moment (its member died, its lease not lapsed yet) wait in its
consumer, and whoever takes the partition over reads them there. All partitions'
consumers are created before any member reads (``prepare``), so the interest-retention
stream keeps every reply. Each member's own consumer (``reply_durable``) is filtered to
the announcements (every member keeps the agents' leases) and the replies without a
partition (an agent of an earlier version: every member reads those, as before). The
default consumer ``cardbus-orchestrator``, which nobody reads on a partitioned log, is
deleted there, so nothing accumulates unread (a consumer of the previous layout, a
member's consumer without filters, is given its filters).

A partition's reply is acked once it is *settled* (``settle``: the orchestrator recorded
what it decided on it, or found nothing to record), not when it is taken: a member that
dies between taking a reply and writing its result leaves it unacked, and the
partition's next owner gets it again (after ``reply_ack_wait``). The consumer acks with
``AckAll``: one ack for the highest settled reply below every unsettled one. A member
that lets a partition go naks what it took and did not settle, so the next owner gets it
at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
from collections.abc import AsyncIterator, Iterable
from typing import TYPE_CHECKING, Any

import nats.js.errors
from nats.aio.msg import Msg
from nats.js import api as js_api

from cardbus.agents.cards import Reply
from cardbus.eventstore.nats.connection import TRANSPORT_ERRORS

if TYPE_CHECKING:
    from cardbus.bus.transport.nats import NatsBus

__all__ = [
    "ANNOUNCE_PREFIX",
    "ORCHESTRATOR_DURABLE",
    "PARTITION_CONSUMER",
    "PARTITION_HEADER",
    "REPLY_PREFIX",
    "REPLY_STREAM",
    "PartitionReplies",
    "ReplyAcks",
    "member_filters",
    "partition_consumer",
    "partition_reply_filter",
]

log = logging.getLogger(__name__)

REPLY_STREAM = "CARDBUS_REPLIES"
ORCHESTRATOR_DURABLE = "cardbus-orchestrator"  # the default orchestrator's reply consumer
REPLY_PREFIX = "cardbus.reply"
ANNOUNCE_PREFIX = "cardbus.announce"
#: a card's header naming its run's partition: the agent's replies carry it in their subject
PARTITION_HEADER = "Cardbus-Partition"
PARTITION_CONSUMER = "cardbus-replies-p"  # + <n>: the durable consumer of a partition's replies


def partition_reply_filter(p: int) -> str:
    """The replies of partition ``p``'s runs: ``cardbus.reply.<agent>.<task>.<p>``."""
    return f"{REPLY_PREFIX}.*.*.{p}"


def partition_consumer(p: int) -> str:
    return f"{PARTITION_CONSUMER}{p}"


def member_filters() -> list[str]:
    """What a partitioned member's own consumer reads: announcements, and replies without
    a partition (``cardbus.reply.<agent>.<task>``, from agents of an earlier version)."""
    return [f"{ANNOUNCE_PREFIX}.>", f"{REPLY_PREFIX}.*.*"]


class ReplyAcks:
    """Acks of a reply consumer with ``AckAll``: one ack, at most every ``interval`` seconds,
    acknowledging every reply up to it.

    Taken mode (``settles=False``, a member's own consumer and an unpartitioned
    orchestrator's): the ack is for the reply *taken* with the highest stream sequence.
    Safe because the replies are taken in the order they are delivered, and JetStream
    delivers a consumer's new messages in stream order (a redelivery only after
    ``ack_wait``): every message before one taken was delivered before it, so was taken
    before it. Settled mode (a partition's consumer): for the highest reply *settled*
    below every reply taken and not settled yet.

    Except what a predecessor (a process of the same consumer that stopped, or the
    partition's previous owner) had delivered and not acked: found at bind (the
    consumer's ack floor below what it delivered), nothing is acked until each of those
    has been redelivered and taken (or, should one never come back, for two
    ``ack_wait``).
    """

    interval = 0.02
    #: (taken mode) an ack owed only for announcements (lease renewals) waits this long
    #: (at most a quarter of the consumer's ack wait): one ack for many rounds of an idle
    #: runtime's renewals rather than one a round. A renewal delivered again after a
    #: crash is a renewal again: harmless.
    announce_interval = 5.0

    def __init__(self, bus: NatsBus, info: js_api.ConsumerInfo, settles: bool = False) -> None:
        self.bus = bus
        self.durable = info.name
        self.settles = settles
        if settles:  # a member's share of the replies spread over its partitions' consumers:
            self.interval = 0.1  # each ack covers more (2 members: 2.3 acks a run at 20 ms)
        self.mine = 0  # (taken mode) replies taken since the last ack
        self.latest: Msg | None = None  # the reply taken with the highest stream sequence
        self.latest_seq = 0
        self.open: dict[int, Msg] = {}  # (settled mode) stream seq -> taken, not settled
        self.done: dict[int, Msg] = {}  # (settled mode) settled, not acked yet
        self.released = False
        self.unsent = ""  # the ack subject of the last reply taken, not sent yet
        self.timer: asyncio.Handle | None = None
        self.due: float | None = None  # when ``timer`` fires (loop time)
        loop = asyncio.get_running_loop()
        self.loop = loop
        delivered = int(getattr(info.delivered, "stream_seq", 0) or 0)
        floor = int(getattr(info.ack_floor, "stream_seq", 0) or 0)
        outstanding = int(info.num_ack_pending or 0)
        # (hold) the predecessor's unacked deliveries: stream sequences up to `delivered`
        self.hold_upto = delivered if outstanding and delivered > floor else 0
        self.hold_left = outstanding
        self.hold_seen: set[int] = set()
        # (the consumer's own ack wait: whoever made it may have set another than ours)
        ack_wait = float(getattr(info.config, "ack_wait", None) or bus.reply_ack_wait)
        self.announce_interval = min(self.announce_interval, ack_wait / 4)
        self.hold_until = loop.time() + 2 * ack_wait + 5
        if self.hold_upto:
            bus._spawn(self._watch_hold(), "reply-hold")

    async def _watch_hold(self) -> None:
        """While holding, look at the consumer every half second: the predecessor may yet
        ack some of what it had (one letting a partition go acks what it settled, then
        hands the rest back), and those never come here."""
        while self._holding():
            await asyncio.sleep(0.5)
            try:
                info = await self.bus._js.consumer_info(REPLY_STREAM, self.durable)
            except Exception:  # (the server away: the next look)
                continue
            if int(getattr(info.ack_floor, "stream_seq", 0) or 0) >= self.hold_upto:
                self.hold_left = 0
            else:  # what waits for an ack and is not ours is the predecessor's
                ours = len(self.open) + len(self.done) + self.mine
                self.hold_left = min(self.hold_left, int(info.num_ack_pending or 0) - ours)
            if not self._holding():
                self._soon()

    def taken(self, msg: Msg) -> None:
        seq = stream_seq(msg.reply)
        if self.settles:
            self.open[seq] = msg
            self.done.pop(seq, None)  # (a redelivery of one settled and not acked yet)
        else:
            self.mine += 1
            if seq >= self.latest_seq:  # (a redelivery of an older one: the newer ack covers it)
                self.latest, self.latest_seq = msg, seq
        if self.hold_upto and 0 < seq <= self.hold_upto and seq not in self.hold_seen:
            self.hold_seen.add(seq)
            self.hold_left -= 1
        if not self.settles:
            if not msg.subject.startswith(ANNOUNCE_PREFIX + "."):
                self._soon(self.interval)
            elif self.due is not None and self.due - self.loop.time() < self.announce_interval / 2:
                # an ack owed for a while goes with this round of renewals, in this
                # wake-up, not in one of its own half a round later (sooner: never later)
                self._soon(0.0)
            else:
                self._soon(self.announce_interval)

    def settled(self, msg: Msg) -> None:
        """(Settled mode) The orchestrator is done with ``msg``'s reply."""
        seq = stream_seq(msg.reply)
        if self.released or self.open.pop(seq, None) is None:
            return
        self.done[seq] = msg
        self._soon()

    def _soon(self, interval: float | None = None) -> None:
        """Flush within ``interval`` (the class's by default) unless it is due sooner."""
        if self._holding():
            return
        at = self.loop.time() + (self.interval if interval is None else interval)
        if self.timer is not None:
            if self.due is not None and self.due <= at:
                return
            self.timer.cancel()
        # (the due time is kept here: uvloop gives a handle due within half a millisecond
        # as a plain Handle, which has no when())
        self.timer, self.due = self.loop.call_at(at, self.flush), at

    def _holding(self) -> bool:
        if self.hold_upto and (self.hold_left <= 0 or self.loop.time() >= self.hold_until):
            self.hold_upto = 0
            self.hold_seen = set()
        return bool(self.hold_upto)

    def flush(self) -> None:
        if self.timer is not None:
            self.timer.cancel()
            self.timer, self.due = None, None
        if self._holding():
            return
        msg: Msg | None
        if self.settles:
            floor = min(self.open, default=math.inf)
            below = [s for s in self.done if s < floor]
            if not below:
                return
            msg = self.done[max(below)]
            for s in below:
                del self.done[s]
        else:
            msg, self.latest, self.mine = self.latest, None, 0
        if msg is None or not msg.reply:
            return
        self.unsent = msg.reply
        self.bus._spawn(self._send(), "reply-ack")

    async def _send(self) -> None:
        subject, self.unsent = self.unsent, ""
        if subject and not self.bus.nc.is_closed:
            with contextlib.suppress(*TRANSPORT_ERRORS):
                await self.bus.nc.publish(subject, b"+ACK")

    async def drain(self) -> None:
        """Ack what was taken (settled) now (the bus is closing)."""
        self.flush()
        await self._send()

    async def release(self) -> None:
        """(Settled mode) The partition goes: ack what is settled below every unsettled
        reply, hand back (nak) the rest, so its next owner gets it at once (one settled
        above an unsettled one comes back too: recorded once, the next time a duplicate);
        no ack from here after this."""
        self.flush()
        await self._send()
        self.released = True
        # (settled above one that is not: an ack for it would ack that one too)
        left = sorted({**self.open, **self.done}.items())
        self.open, self.done = {}, {}
        for _, msg in left:
            with contextlib.suppress(*TRANSPORT_ERRORS):
                await msg.nak()


class PartitionReplies:
    """A partitioned member's replies: its own consumer's and those of the partitions it
    holds, as one iterator (see the module docstring)."""

    def __init__(self, bus: NatsBus, partitions: int) -> None:
        self.bus = bus
        self.partitions = partitions
        self.want: frozenset[int] = frozenset()
        self.readers: dict[int, asyncio.Task[None]] = {}
        self.acks: dict[int, ReplyAcks] = {}
        self.queue: asyncio.Queue[tuple[int, Msg]] = asyncio.Queue()  # (-1: own consumer)
        self.unsettled: dict[int, tuple[ReplyAcks, Msg, Reply]] = {}  # id(reply) ->
        self.prepared = False
        self._releases: set[asyncio.Task[None]] = set()

    def config(self, p: int) -> js_api.ConsumerConfig:
        durable = partition_consumer(p)
        config = self.bus._reply_config(durable)
        config.filter_subject = partition_reply_filter(p)
        config.inactive_threshold = None  # the partition's, whoever holds it: kept
        return config

    async def prepare(self) -> None:
        """Every partition's consumer exists (before anyone reads: the interest-retention
        stream keeps each reply from then on); this member's consumer is filtered to
        announcements and unpartitioned replies; the default consumer is gone."""
        bus = self.bus
        await asyncio.gather(
            *(
                bus._transient(
                    lambda p=p: bus._bind_config(REPLY_STREAM, self.config(p)),  # type: ignore[misc]
                    f"create the reply consumer of partition {p}",
                )
                for p in range(self.partitions)
            )
        )
        own = bus._reply_config(bus.reply_durable)
        own.filter_subjects = member_filters()
        await bus._transient(lambda: self._filtered(own), "filter the member's reply consumer")
        if bus.reply_durable != ORCHESTRATOR_DURABLE:  # nobody reads it on a partitioned log
            await bus._transient(self._drop_default, "delete the default reply consumer")
        self.prepared = True

    async def _drop_default(self) -> None:
        with contextlib.suppress(nats.js.errors.NotFoundError):
            await self.bus._js.delete_consumer(REPLY_STREAM, ORCHESTRATOR_DURABLE)

    async def _filtered(self, config: js_api.ConsumerConfig) -> None:
        """Create the member's consumer, or give one of the previous layout (no filter)
        its filters (an update; deleted and made again if the server refuses it: it
        starts again from what the stream holds)."""
        js = self.bus._js
        name = config.durable_name or ""
        try:
            info = await js.consumer_info(REPLY_STREAM, name)
        except nats.js.errors.NotFoundError:
            with contextlib.suppress(nats.js.errors.BadRequestError):
                await js.add_consumer(REPLY_STREAM, config)
            return
        if sorted(info.config.filter_subjects or []) == sorted(config.filter_subjects or []):
            return
        try:
            await js.add_consumer(REPLY_STREAM, config)  # an update of its filters
        except nats.js.errors.BadRequestError:
            await js.delete_consumer(REPLY_STREAM, name)
            await js.add_consumer(REPLY_STREAM, config)

    def hold(self, partitions: Iterable[int]) -> None:
        """Read the replies of ``partitions`` from now (``Partitions.on_change``)."""
        self.want = frozenset(p for p in partitions if 0 <= p < self.partitions)
        for p in [p for p in self.readers if p not in self.want]:
            reader = self.readers.pop(p)
            reader.cancel()
            acks = self.acks.pop(p, None)
            if acks is not None:
                for key in [k for k, v in self.unsettled.items() if v[0] is acks]:
                    del self.unsettled[key]
                task = asyncio.ensure_future(self._let_go(reader, acks))
                self._releases.add(task)
                task.add_done_callback(self._releases.discard)
        if self.prepared:
            for p in sorted(self.want - set(self.readers)):
                self.readers[p] = asyncio.ensure_future(self._read(p))

    @staticmethod
    async def _let_go(reader: asyncio.Task[None], acks: ReplyAcks) -> None:
        """Hand a partition's replies back once its reader is gone: its pull unsubscribed
        first (the server takes the unsubscription before the naks, sent after it on the
        same connection), a reply handed back is not delivered to this member's pull
        request still pending on the server, where nobody would read it (it waited out
        the ack wait: seen in a full suite at load ~8)."""
        await asyncio.wait({reader})
        await acks.release()

    async def _read(self, p: int) -> None:
        bus = self.bus
        durable = partition_consumer(p)
        info = await bus._until_done(
            lambda: bus._js.consumer_info(REPLY_STREAM, durable), f"look up {durable}"
        )
        self.acks[p] = ReplyAcks(bus, info, settles=True)
        async for msg in bus._pull(REPLY_STREAM, durable, bus.reply_batch):
            self.queue.put_nowait((p, msg))

    async def _read_own(self) -> None:
        async for msg in self.bus._pull(REPLY_STREAM, self.bus.reply_durable, self.bus.reply_batch):
            self.queue.put_nowait((-1, msg))

    async def replies(self, own_acks: ReplyAcks | None) -> AsyncIterator[Reply]:
        bus = self.bus
        if not self.prepared:
            await self.prepare()
            self.hold(self.want)
        own = asyncio.ensure_future(self._read_own())
        try:
            while True:
                p, msg = await self.queue.get()
                acks = own_acks if p < 0 else self.acks.get(p)
                if p >= 0 and (acks is None or acks.released or p not in self.readers):
                    with contextlib.suppress(*TRANSPORT_ERRORS):
                        await msg.nak()  # let go meanwhile: its next owner has it now
                    continue
                reply = await bus._checked_reply(msg, acks)
                if reply is None:
                    if acks is not None and acks.settles:
                        acks.settled(msg)
                    continue
                if acks is not None and acks.settles:
                    acks.taken(msg)
                    self.unsettled[id(reply)] = (acks, msg, reply)
                    yield reply
                    continue
                yield reply
                if acks is None:  # a consumer of an earlier version (explicit acks)
                    with contextlib.suppress(*TRANSPORT_ERRORS):
                        await msg.ack()
                else:
                    acks.taken(msg)
        finally:
            own.cancel()
            for task in self.readers.values():
                task.cancel()

    def settle(self, replies: Iterable[Any]) -> None:
        for reply in replies:
            entry = self.unsettled.pop(id(reply), None)
            if entry is not None:
                entry[0].settled(entry[1])

    async def close(self) -> None:
        for task in self.readers.values():
            task.cancel()
        self.readers.clear()
        for acks in list(self.acks.values()):
            with contextlib.suppress(Exception):
                await asyncio.wait_for(acks.release(), 2.0)
        self.acks.clear()
        self.unsettled.clear()


def _ack_field(reply: str, v1: int) -> int:
    """A number of a JetStream ack subject (what ``msg.metadata`` parses, without the rest):
    ``$JS.ACK.<stream>.<consumer>.<delivered>.<stream seq>.<consumer seq>.<time>.<pending>``
    (``v1``: its token index), or with ``<domain>.<account hash>`` after ``ACK`` and a
    token at the end; 0 if it is not one."""
    tokens = reply.split(".")
    try:
        return int(tokens[v1] if len(tokens) == 9 else tokens[v1 + 2])
    except (IndexError, ValueError):
        return 0


def stream_seq(reply: str) -> int:
    return _ack_field(reply, 5)


def left_after(reply: str) -> int:
    """How many messages the consumer still had for others after this one."""
    return _ack_field(reply, 8)
