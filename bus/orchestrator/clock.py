"""The orchestrator's clock: it sleeps until the next moment something may be due.

Three things come due with time alone: a run's deadline or backoff (``RunState.wakeups``),
an agent's lease (``Leases.next_lapse``), and the sweep, which every ``Policy.sweep_s``
looks at every open run, a safety net for any wait the wakeups do not name. The clock
sleeps until the soonest of them (never less than ``Policy.tick_s``), or until a new
wakeup comes earlier, and then puts what came due on the decision queue.

The sweep is for open runs only: with none open it does not count, so an idle
orchestrator sleeps until a lease may lapse (never, for the embedded runtime's pinned
agents) or until a run opens (``run_opened``) or a lease or grace is given that ends
sooner than its sleep (``Leases.on_lease``), which wake it. Ticking every ``tick_s``
an idle orchestrator woke 50 times a second for nothing, and sweeping every second
with nothing open it still woke once a second. The last open run's end (``observe``)
wakes it at once, in the step that folded it, to sleep again with nothing due: it slept
until the sweep that run had set, one more wake-up of an idle process a second after its
work; a wakeup (deadline, backoff) left behind by a run that ended is not slept until.
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import math
import time
from collections.abc import Callable

from cardbus.bus.orchestrator.liveness import Leases
from cardbus.bus.orchestrator.policy import Policy
from cardbus.bus.orchestrator.runstate import RunState
from cardbus.eventstore import events as ev
from cardbus.eventstore.envelope import Envelope

__all__ = ["Clock"]


class Clock:
    """Wakes ``put(sweep)``, ``put(due)`` and ``put(lapsed)`` when each comes due."""

    def __init__(
        self,
        policy: Policy,
        state: RunState,
        leases: Leases,
        put: Callable[[object], None],
        items: tuple[object, object, object],
    ) -> None:
        """``items``: what is put for a sweep, for wakeups due and for lapsed leases."""
        self.policy = policy
        self.state = state
        self.leases = leases
        self.put = put
        self.sweep_item, self.due_item, self.lapsed_item = items
        self.due = 0.0  # wall time the clock sleeps until
        self._event = asyncio.Event()
        state.on_wake = self.wake_at
        state.on_open = self.run_opened
        leases.on_lease = self.wake_at

    def wake_at(self, at: float) -> None:
        """A new deadline or backoff at ``at``: wake the clock if it sleeps past it."""
        if at < self.due:
            self._event.set()

    def run_opened(self) -> None:
        """A run opened: the sweep counts again (the clock may sleep with none open)."""
        self.wake_at(time.time() + self.policy.sweep_s)

    def observe(self, env: Envelope) -> None:
        """(An observer of the events folded) the last open run ended: nothing may be due
        any more but a lease, so the clock sleeps anew rather than wake for the sweep."""
        if not self.state.open and isinstance(env.data, _RUN_ENDS):
            self._event.set()

    async def run(self) -> None:
        last_sweep = time.monotonic()
        while True:
            delay = self.delay(last_sweep)
            self.due = time.time() + delay
            self._event.clear()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(None if math.isinf(delay) else delay):
                    await self._event.wait()
            if not self.state.open:
                last_sweep = time.monotonic()  # the sweep's period starts with a run open
            if self.state.open and time.monotonic() - last_sweep >= self.policy.sweep_s:
                last_sweep = time.monotonic()
                self.put(self.sweep_item)
            elif self.state.wakeups and self.state.wakeups[0][0] <= time.time():
                self.put(self.due_item)
            if self.leases.lapsed(list(self.state.agents), time.time()):
                self.put(self.lapsed_item)

    def delay(self, last_sweep: float) -> float:
        """Seconds until the soonest wakeup, lease lapse or (with a run open) sweep."""
        now = time.time()
        sweep = math.inf
        state = self.state
        if state.open:
            sweep = self.policy.sweep_s - (time.monotonic() - last_sweep)
        wakeups = state.wakeups
        while wakeups and wakeups[0][1] not in state.open:  # its run ended: never due
            heapq.heappop(wakeups)
        soonest = min(
            sweep,
            wakeups[0][0] - now if wakeups else math.inf,
            self.leases.next_lapse() - now,
        )
        return max(self.policy.tick_s, soonest)


_RUN_ENDS = (ev.RunCompleted, ev.RunFailed, ev.RunHalted)
