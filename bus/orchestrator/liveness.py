"""Agent liveness: which registered agents have a live lease, held in memory only.

A worker announces with a lease (``Announce.lease_s``) and announces again
every third of it; those renewals are not events (they change nothing in the
log). The log changes only when liveness does: ``agent.registered`` when an
agent (or its card) is new, ``agent.deregistered`` with reason ``stopped``
when its last replica announced it is going offline, or ``lease_expired``
when no replica renewed in time (written by the orchestrator's clock).

* An agent registered by the operator (``Orchestrator.register``, the
  embedded runtime's own agents) is *pinned*: live while this orchestrator
  runs, with or without renewals.
* An agent found in the log when the orchestrator starts is *unconfirmed*
  for one lease (its ``lease_s``, or ``default_lease_s``): not selected, and a
  task only it could do waits rather than fails; a renewal (or registration)
  confirms it, and at the end of that lease without one it is deregistered.
* Otherwise an agent is live while any replica's lease runs.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

__all__ = ["Leases"]


@dataclass
class Leases:
    default_lease_s: float = 10.0
    replicas: dict[str, dict[str, float]] = field(default_factory=dict)  # agent -> replica -> exp
    pinned: set[str] = field(default_factory=set)
    unconfirmed: dict[str, float] = field(default_factory=dict)  # agent -> end of its grace
    last_seen: dict[str, float] = field(default_factory=dict)  # agent -> latest announce
    #: told of each new lease or grace end (the orchestrator's clock, which may sleep
    #: with nothing due, must wake for it)
    on_lease: Callable[[float], None] | None = None

    def pin(self, agent_id: str, now: float) -> None:
        """Registered by the operator: live while this orchestrator runs."""
        self.pinned.add(agent_id)
        self.unconfirmed.pop(agent_id, None)
        self.last_seen[agent_id] = now

    def unconfirm(self, agent_id: str, lease_s: float, now: float) -> None:
        """Found in the log at start: selectable again once it renews."""
        if agent_id not in self.pinned and agent_id not in self.replicas:
            self.unconfirmed[agent_id] = end = now + (lease_s or self.default_lease_s)
            if self.on_lease is not None:
                self.on_lease(end)

    def renew(self, agent_id: str, replica_id: str, lease_s: float, now: float) -> bool:
        """A replica announced; True if the agent was not live before."""
        was = self.live(agent_id, now)
        self.unconfirmed.pop(agent_id, None)
        lease = lease_s if lease_s > 0 else self.default_lease_s
        self.replicas.setdefault(agent_id, {})[replica_id] = now + lease
        self.last_seen[agent_id] = now
        if self.on_lease is not None and agent_id not in self.pinned:
            # (a pinned agent never lapses: its renewals, which other orchestrators of
            # the log need, need not wake this one's clock each time)
            self.on_lease(now + lease)
        return not was

    def leave(self, agent_id: str, replica_id: str, now: float) -> bool:
        """A replica announced it is going offline; True if that was the agent's last."""
        self.last_seen[agent_id] = now
        replicas = self.replicas.get(agent_id, {})
        replicas.pop(replica_id, None)
        live = [r for r, exp in replicas.items() if exp > now]
        return not live and agent_id not in self.pinned

    def forget(self, agent_id: str) -> None:
        """Deregistered: nothing is known of it any more (a new registration starts over)."""
        self.replicas.pop(agent_id, None)
        self.pinned.discard(agent_id)
        self.unconfirmed.pop(agent_id, None)

    def live(self, agent_id: str, now: float) -> bool:
        """May be selected now."""
        if agent_id in self.pinned:
            return True
        return any(exp > now for exp in self.replicas.get(agent_id, {}).values())

    def waiting(self, agent_id: str, now: float) -> bool:
        """Unconfirmed, within its grace: a task only it can do waits for it."""
        return self.unconfirmed.get(agent_id, 0.0) > now

    def lost(self, agent_id: str, now: float) -> bool:
        """Neither live nor waiting: an attempt on it will never be answered."""
        return not self.live(agent_id, now) and not self.waiting(agent_id, now)

    def lapsed(self, agents: list[str], now: float) -> list[str]:
        """Registered agents whose lease (or grace) ran out: to deregister."""
        return [a for a in agents if self.lost(a, now) and self._known(a)]

    def next_lapse(self) -> float:
        """The soonest moment an agent not pinned may lapse (inf: none can): when the
        last lease of one of its replicas, or its grace, ends."""
        ends = [max(r.values()) for a, r in self.replicas.items() if r and a not in self.pinned]
        ends += [t for a, t in self.unconfirmed.items() if a not in self.pinned]
        return min(ends, default=math.inf)

    def _known(self, agent_id: str) -> bool:
        return agent_id in self.replicas or agent_id in self.unconfirmed
