"""A busy partitioned member's look by count (``members.py``): it lets go of the positions
it handed over while work never stops.

The echo-free member keeps every position it handed over from the lowest of its
partitions' read positions on (``yielded``: a read of a partition from its position
could return them again). A partition's read position moves only when a read of it
finds events: one written by this member alone (most of them: runs are placed in the
member's own partitions) or by nobody (often the shared one) never moves it while
the member is busy, and only the idle look (``member_bell.py``) lets go of what is
kept: under work that never stops, about 100 bytes a position without bound.

Past ``BUSY_LOOK_AFTER`` positions kept (and at most once in ``BUSY_LOOK_S``) the
member looks by count, reading no event: for each followed partition a position
``last`` of the log, then how many of the partition's events are stored from its
read position ``start`` on (``NatsEventStore._counts``: direct gets the server answers
in the order sent, each apart from writes). Counted after ``last`` was stored, that
count holds every event of the partition in ``[start, last]``, and any stored after
``last`` and before the count (the server answers one just after the other: a few
milliseconds for 20,000 events, the count walking their subjects).
The member has handed over some of those, each stored, never one twice: once as many
in ``[start, last]`` are handed over as were counted (at once, or as those on their
way come: appends acknowledged, others' events heard and read), every event of the
partition up to ``last`` has been, and its read position moves past ``last``; the
kept positions below the lowest read position are let go, as the idle look does.
An event stored between ``last`` and the count (or one never heard) keeps the count
above what is handed: that partition stays where it was until a later look counts
again. Nothing is read again, nothing is taken for handed over that was not.

A look is six messages a partition (two requests, each answered with a message and
the end of its batch, which says how many more match), about 100 for a member of 16
of 32 partitions (and the shared one), once every 20,000 events handed over while
busy. On the server each count walks the subjects stored from its start: about 60 ms
of nats-server CPU for such a look over 20,000 events (3 us an event, load 5), served
in the member's connection's read loop, so its appends sent meanwhile wait that long
once a look. A replicated stream is not counted this way (a replica may answer a
direct get, behind the leader): there the kept positions wait for an idle look, as
before.
"""

from __future__ import annotations

import asyncio

from cardbus.eventstore.errors import StoreUnavailable
from cardbus.eventstore.nats import NatsEventStore
from cardbus.eventstore.nats.connection import TRANSPORT_ERRORS
from cardbus.eventstore.nats.subjects import partition_filter

__all__ = ["BUSY_LOOK_AFTER", "BUSY_LOOK_S", "BusyLook"]

# positions kept (about 100 bytes each) past which a busy member looks by count
BUSY_LOOK_AFTER = 20_000
BUSY_LOOK_S = 1.0  # at most one look this often (while the kept stay past it)
_LOOK_ERRORS: tuple[type[BaseException], ...] = (StoreUnavailable, *TRANSPORT_ERRORS)


class BusyLook:
    """One echo-free member follower's looks by count; ``read_from`` is its partitions'
    read positions (partition token -> where its next read starts)."""

    def __init__(self, store: NatsEventStore, read_from: dict[str, int]) -> None:
        self.store = store
        self.read_from = read_from
        self.looks = 0  # looks made (tests, bench)
        self.moved = 0  # partitions whose read position a look moved (tests, bench)
        self._next = 0.0  # no look before this (loop time)
        self._lasts: dict[str, int] = {}  # partition token -> the log's position it counted at
        # partition token -> [its events counted in [start, last] and after, handed in
        # [start, last]], while some are still on their way (or one was stored after
        # ``last``: then until the next look)
        self._counts: dict[str, list[int]] = {}
        self._starts: dict[str, int] = {}  # partition token -> its read position counted from

    def due(self, kept: int) -> bool:
        """Whether to look now: past ``BUSY_LOOK_AFTER`` kept and none in the last
        ``BUSY_LOOK_S`` (its counts not settled yet are given up). (Each pass of the
        follower: the clock is read only past that many.)"""
        if kept <= BUSY_LOOK_AFTER:
            return False
        store = self.store
        return (
            asyncio.get_running_loop().time() >= self._next
            and store._direct_reads
            and store._replicas == 1
        )

    async def look(self, yielded: dict[int, str], known: int) -> bool:
        """Count (see the module docstring); whether a read position moved already.
        ``known``: a position stored (the last handed over)."""
        self._next = asyncio.get_running_loop().time() + BUSY_LOOK_S
        self.looks += 1
        store = self.store
        starts = dict(self.read_from)
        prefix = store.subject_prefix
        try:
            counted = await store._counts(
                known, [(partition_filter(prefix, tok), start) for tok, start in starts.items()]
            )
        except _LOOK_ERRORS:
            store._check_open()  # (closed: StoreClosed, as a read raises it)
            self._counts.clear()
            return False  # (a later look)
        # (nothing was handed over meanwhile: the follower waited for these answers)
        lasts = {tok: last for tok, (last, _) in zip(starts, counted, strict=True)}
        handed = dict.fromkeys(starts, 0)
        for pos, tok in yielded.items():
            if tok in handed and starts[tok] <= pos <= lasts[tok]:
                handed[tok] += 1
        self._lasts, self._starts = lasts, starts
        self._counts = {tok: [n, handed[tok]] for tok, (_, n) in zip(starts, counted, strict=True)}
        return any([self._settle(tok) for tok in list(self._counts)])

    def handed(self, pos: int, tok: str) -> bool:
        """(The follower handed ``pos`` of partition ``tok`` over.) Whether a read
        position moved."""
        c = self._counts.get(tok)
        if c is None or not self._starts[tok] <= pos <= self._lasts[tok]:
            return False
        c[1] += 1
        return self._settle(tok)

    def forget(self) -> None:
        """The partitions followed changed, or the idle look read them through: the counts
        of this look are given up (a partition may be followed anew, handed from its first
        event again)."""
        self._counts.clear()

    def _settle(self, tok: str) -> bool:
        counted, handed = self._counts[tok]
        if handed < counted:
            return False  # some on their way, or stored after ``last``
        del self._counts[tok]
        if handed > counted or tok not in self.read_from:  # (neither can be: let it be)
            return False
        last = self._lasts[tok]
        if self.read_from[tok] > last:
            return False
        self.read_from[tok] = last + 1
        self.moved += 1
        return True
