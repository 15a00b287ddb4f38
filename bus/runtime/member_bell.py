"""An idle partitioned member's wait on the server for what it did not hear (``members.py``).

The member reads others' events of its partitions when it hears their publishes
(*hints*). For a hint lost without a reconnect it used to look at the log's last
position after a heartbeat with nothing heard, then after 2, 4, ... up to 30 heartbeats,
and read every followed partition when the log had grown: four looks in the first 15 s
of every idle spell. Now it arms a doorbell (``eventstore.nats.doorbell``) over the
partitions it follows (``filter_subjects``), from the first position it has not read
them all through: the server answers when anything is stored there, whoever wrote it,
and the member reads nothing until then (or the request's expiry, 30 heartbeats, then
asked again: ``Doorbell.again``).

Arming tells how many events of those partitions are stored from that position on
(``num_pending``). The member knows the positions it has handed over there (heard and
read, or its own appends): as many means nothing was missed, and the bell is armed again
after the last of them, where nothing is stored yet (the first look after work, instead
of a read of every partition); more means something was not heard, and every followed
partition is read, as the old look did.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Sequence

from cardbus.eventstore.nats import NatsEventStore
from cardbus.eventstore.nats.connection import TRANSPORT_ERRORS, is_transient
from cardbus.eventstore.nats.doorbell import Doorbell
from cardbus.eventstore.nats.follow import IDLE_READ_MAX_HEARTBEATS, consumer_refused

__all__ = ["MemberBell"]

log = logging.getLogger(__name__)

# how often a look may find its count matched by events handed over meanwhile before it
# reads instead (a busy log: the member is awake anyway)
_COUNTS = 2


class MemberBell:
    """One echo-free member follower's doorbell; ``wake`` is the follower's."""

    def __init__(self, store: NatsEventStore, wake: asyncio.Event) -> None:
        self.store = store
        self.bell: Doorbell | None = Doorbell(store, [], wake)
        self.expires = IDLE_READ_MAX_HEARTBEATS * store.heartbeat
        # an armed bell with no answer this long after its arming (its request or the
        # answer lost): armed again
        self.overdue_s = self.expires + 2 * store.heartbeat
        self._off_until = 0.0  # after a transient failure to arm: the old looks until then

    async def listen(self) -> None:
        """Subscribe to the doorbell's answers now, not as the first idle spell begins
        (``Doorbell.listen``); a failure leaves it to the first arming."""
        if self.bell is not None:
            with contextlib.suppress(*TRANSPORT_ERRORS):
                await self.bell.listen()

    @property
    def armed(self) -> bool:
        return self.bell is not None and self.bell.armed

    @property
    def deadline(self) -> float:
        """(Armed.) When to stop waiting for an answer and arm again."""
        assert self.bell is not None
        return self.bell.armed_at + self.overdue_s

    def answered(self, now: float) -> bool:
        """(Armed.) Whether the server answered, or should have by now."""
        bell = self.bell
        assert bell is not None
        return bell.rang or bell.ended or now >= self.deadline

    def expired(self, now: float) -> bool:
        """(Armed.) Whether its request expired with nothing stored, in time: ``again``."""
        bell = self.bell
        assert bell is not None
        return bell.expired and not bell.rang and now < self.deadline

    async def again(self) -> bool:
        """(Armed, ``expired``.) Ask the same consumer again; False if that failed (then
        disarmed: a look arms it anew)."""
        bell = self.bell
        assert bell is not None
        try:
            await bell.again(self.expires)
        except Exception as e:
            log.debug("doorbell not asked again (%r): armed anew", e)
            return False
        return True

    async def stop(self, now: float) -> tuple[str | None, bool]:
        """Disarm: the subject of the message that rang it (None: none), and whether to
        arm again at once (its request ended without one, or never answered)."""
        bell = self.bell
        assert bell is not None
        subject = bell.subject if bell.rang else None
        again = bell.ended or now >= self.deadline
        await bell.disarm()
        return subject, again and subject is None

    async def look(
        self, filters: Sequence[str], start: int, handed: Callable[[int], tuple[int, int]]
    ) -> tuple[bool, int] | None:
        """Arm over ``filters`` from ``start`` (everything of them before it has been read):
        (armed, the position everything of them is read through now), or None if there is
        no doorbell (a user not allowed consumers, a server restarting: the old look).

        ``handed(start)``: how many events of ``filters`` at ``start`` or after the
        member has handed over, and the last one's position."""
        bell = self.bell
        loop = asyncio.get_running_loop()
        if bell is None or loop.time() < self._off_until:
            return None
        bell.filt = list(filters)
        try:
            for _ in range(_COUNTS):
                pending = await bell.arm(start, self.expires)
                if not pending:
                    return True, start - 1
                count, last = handed(start)
                if count != pending:  # stored and not handed over: read them all
                    return False, start - 1
                start = last + 1  # all handed over: armed after the last of them
            return False, start - 1
        except Exception as e:
            self.store._check_open()
            if not is_transient(e) or consumer_refused(self.store.nc):
                log.info("partitions followed without a doorbell (%r)", e)
                await self.close()
            else:  # (a server restarting, an election): the old looks meanwhile
                log.debug("partitions followed without a doorbell now (%r)", e)
                self._off_until = loop.time() + self.expires
            return None

    async def close(self) -> None:
        bell, self.bell = self.bell, None
        if bell is not None:
            await bell.close()
