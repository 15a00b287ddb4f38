"""The lease renewals of a process's workers: one grid, one task, one wakeup a round.

Every worker announces again every third of its lease (``bus.runtime.worker``). The
workers of a process with the same lease renew at the same instants of one grid
(``renewal_wait``: a random phase per process, so processes do not all renew at once),
and since an idle runtime's CPU is mostly its wakeups, they renew from one task: a
round is one timer and one task step for all of them (it was one of each per worker:
three timers and three task steps for the three agents of ``bench/idle_bench.py``),
their announcements leaving in one write as before.

A worker joins the round of its period as it starts and renews first on the first
instant at least half a period later (at most half the lease after its announcement,
so it does not renew a lease it has just taken); it leaves as it stops, and the task
ends with the last one. A renewal that fails is left to the next instant (the lease has
room for two more); a worker whose bus is closed leaves. The members renew one after
the other: a publish that waits in its bus (nats-py only when its outgoing buffer is
full) holds the round's next ones that long. A worker stopping while its renewal is on
its way says it goes offline only once that renewal is out.
"""

from __future__ import annotations

import asyncio
import random
import weakref
from collections.abc import Awaitable, Callable

__all__ = ["RenewalRound", "renewal_round", "renewal_wait"]

#: this process's place on the renewal grid (``renewal_wait``): the workers of one
#: process renew together, those of different processes not all at the same moment
_RENEWAL_PHASE = random.random()


def renewal_wait(now: float, period: float) -> float:
    """How long from ``now`` (the loop's clock) to this process's next renewal instant
    of ``period``, the same instant for every worker renewing as often. A wakeup a
    hair early (the loop runs timers up to its clock's resolution ahead) does not renew
    twice: under a millisecond to go counts as this instant, the next one is waited for."""
    wait = (_RENEWAL_PHASE * period - now) % period
    return wait if wait > 1e-3 else wait + period


#: renews one worker's lease once; False: its bus is closed (it leaves the round)
Renew = Callable[[], Awaitable[bool]]


class RenewalRound:
    """The workers of one event loop renewing every ``period``, from one task."""

    def __init__(self, period: float) -> None:
        self.period = period
        self._members: dict[object, tuple[Renew, float]] = {}  # who -> (renew, from when)
        self._task: asyncio.Task[None] | None = None

    def join(self, who: object, renew: Renew) -> None:
        """``who`` renews with ``renew`` from the first instant half a period on."""
        loop = asyncio.get_running_loop()
        self._members[who] = (renew, loop.time() + self.period / 2)
        if self._task is None or self._task.done():
            self._task = loop.create_task(self._run(), name="lease-renewals")

    def leave(self, who: object) -> None:
        self._members.pop(who, None)
        if not self._members and self._task is not None:
            self._task.cancel()  # (no wakeup left for nobody)
            self._task = None

    def _next(self, now: float) -> float:
        """The first instant of the grid a member is due at: none woken for nobody (a
        member that just joined waits half a period)."""
        period = self.period
        return min(
            (t := max(since, now)) + renewal_wait(t, period) for _, since in self._members.values()
        )

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        while self._members:
            await asyncio.sleep(self._next(loop.time()) - loop.time())
            now = loop.time()
            for who, (renew, since) in list(self._members.items()):
                if since > now + 1e-3 or who not in self._members:
                    continue  # joined less than half a period ago (or left meanwhile)
                try:
                    if not await renew():
                        self._members.pop(who, None)
                except Exception:  # a hiccup: the next renewal may pass
                    pass


_ROUNDS: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[float, RenewalRound]] = (
    weakref.WeakKeyDictionary()
)


def renewal_round(period: float) -> RenewalRound:
    """The running loop's round of ``period`` (made on first use)."""
    rounds = _ROUNDS.setdefault(asyncio.get_running_loop(), {})
    found = rounds.get(period)
    if found is None:
        found = rounds[period] = RenewalRound(period)
    return found
