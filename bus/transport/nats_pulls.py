"""How long a pull request lives, and when it is given up as lost (the bus's pull loops).

An idle pull consumer costs a message each way per request: the request and its
``408`` when it expires unanswered. With short requests (2 s) the four consumers of
an idle runtime (three agents' inboxes, the orchestrator's replies) exchanged four
messages a second, and woke client and server for each. A request now lives
``fetch_wait`` (30 s by default) and asks the server for idle heartbeats every
``pull_heartbeat`` (10 s): an idle consumer exchanges about three messages in 30 s.

Nothing is waited for longer: a card or a reply is delivered the moment it is
stored, whatever the request's length. What a long request could delay is noticing
that a request is gone without its ``408`` (a server restarted, a reconnect to
another server of the cluster): a reconnect is told at once (``on_reconnected``:
the loop asks again straight away), and a request lost without one is noticed when
two heartbeats in a row do not come (``2 * pull_heartbeat + 1`` s), as it was
noticed before when its short expiry did not come (``fetch_wait + 1`` s). Statuses
that end a request (``409``: leader change, consumer deleted) end it at once, as
before.

The orchestrator's reply requests are bounded by the agents' leases too
(``LeaseWatch``): renewals come every third of a lease, so while a lease announced on
that consumer runs, silence for three quarters of the shortest one means the request
is gone, and it is asked again. Two missing heartbeats (21 s) were longer than a 10 s
lease: renewals stored meanwhile and not delivered let a live agent's lease lapse (it
was deregistered while it ran, its attempts in flight taken as lost).
"""

from __future__ import annotations

import asyncio
import json
from typing import TypeVar

__all__ = ["LeaseWatch", "PullClock", "next_within"]

T = TypeVar("T")

#: a heartbeat shorter than this is not asked for: the request's expiry tells as soon
HEARTBEAT_MIN_S = 0.5


#: silence on a consumer carrying renewals, in leases, after which its request is gone:
#: past a missed renewal (every third of a lease; the first at most half a lease after
#: the announcement), and a quarter of the lease left to ask again before it lapses
SILENCE_IN_LEASES = 0.75


class LeaseWatch:
    """The leases announced on one reply consumer, as the bus hands them on: while one
    runs, its renewals are due on that consumer's pull (``silence``)."""

    __slots__ = ("_leases",)

    def __init__(self) -> None:
        self._leases: dict[str, tuple[float, float]] = {}  # agent -> (lease, its end)

    def announced(self, agent_id: str, lease_s: float, online: bool, now: float) -> None:
        if online and lease_s > 0:
            self._leases[agent_id] = (lease_s, now + lease_s)
        else:  # going offline, or pinned: no renewals to wait for
            self._leases.pop(agent_id, None)

    def silence(self, now: float) -> float | None:
        """How long the consumer may say nothing while a lease runs (None: none runs)."""
        running = [lease for lease, end in self._leases.values() if end > now]
        if len(running) < len(self._leases):  # lapsed (or the agent gone): none due
            self._leases = {a: le for a, le in self._leases.items() if le[1] > now}
        return SILENCE_IN_LEASES * min(running) if running else None


class PullClock:
    """One pull loop's requests: their expiry and heartbeat, when the last one was
    made and when the server was last heard on it (and ``leases``: the renewals due on
    it)."""

    __slots__ = ("asked", "expires", "heard", "heartbeat", "leases", "lost_after")

    def __init__(
        self, fetch_wait: float, pull_heartbeat: float, leases: LeaseWatch | None = None
    ) -> None:
        self.expires = max(fetch_wait, 0.1)
        # the server refuses a heartbeat over half the expiry
        heartbeat = min(pull_heartbeat, self.expires / 2)
        self.heartbeat = heartbeat if heartbeat >= HEARTBEAT_MIN_S else 0.0
        #: nothing heard for this long while a request is out: it is gone
        self.lost_after = 2 * self.heartbeat + 1.0 if self.heartbeat else self.expires + 1.0
        self.asked = float("-inf")
        self.heard = float("-inf")
        self.leases = leases

    def request(self, batch: int) -> bytes:
        """The body of a pull request for ``batch`` messages."""
        body: dict[str, int] = {"batch": batch, "expires": int(self.expires * 1e9)}
        if self.heartbeat:
            body["idle_heartbeat"] = int(self.heartbeat * 1e9)
        return json.dumps(body).encode()

    def _silence(self, now: float) -> float:
        """How long the requests may say nothing (their heartbeats, or a lease's renewals)."""
        silence = self.leases.silence(now) if self.leases is not None else None
        return self.lost_after if silence is None else min(self.lost_after, silence)

    def gone(self, now: float) -> bool:
        """Whether the requests made are over: expired unseen, silent for longer than
        their heartbeats (or the renewals due) allow, or forgotten (a reconnect)."""
        return now - self.asked > self.expires + 1.0 or now - max(self.asked, self.heard) > (
            self._silence(now)
        )

    def wait(self, now: float) -> float:
        """How long the loop waits for a message before it looks whether the requests
        are gone."""
        return max(max(self.asked, self.heard) + self._silence(now) - now, 0.001)

    def forget(self) -> None:
        """The requests are gone (a reconnect): the loop asks again at once."""
        self.asked = self.heard = float("-inf")


async def next_within(queue: asyncio.Queue[T], timeout: float) -> T:
    """The next item of ``queue``, waiting at most ``timeout`` s (``TimeoutError``).

    An item already queued is taken at once: what one socket read delivered (a round of
    the agents' lease renewals, several replies) goes on in one step of the pull loop,
    and the orchestrator decides on it as one batch, not one loop iteration and one
    decision step a message. ``asyncio.timeout``, not ``wait_for``, which runs
    ``queue.get()`` as a task of its own (two more loop iterations a message)."""
    if not queue.empty():
        return queue.get_nowait()
    async with asyncio.timeout(timeout):
        return await queue.get()
