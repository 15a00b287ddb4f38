"""The agent directory: every agent the log knows, its status, capabilities and record.

A pure fold over the log (``agent.*`` events and the attempts agents ran).
Lease renewals are never logged, so from the log alone an agent is:

* ``deregistered``: its latest word is ``agent.deregistered`` (with the reason,
  ``stopped`` or ``lease_expired``);
* ``live``: registered, and seen (registered, started or answered a card)
  within its lease (``lease_s``, or ``default_lease_s`` for one registered by the
  operator);
* ``lapsed``: registered but not seen within its lease. An idle agent that
  keeps renewing shows as lapsed here; the orchestrator, which holds the
  renewals, deregisters one whose lease really ran out.

So the log alone cannot tell an idle live agent from a lapsed one. ``leases``
is the word of the orchestrators that hold the renewals (on NATS, ``cardbus
agents`` asks the running ones: ``bus.runtime.leases``): agent -> whether one of
them holds a live lease for it. It decides the status of every registered agent
it names; the others keep the log's inference.

``overlaps`` names the other registered agents that offer more than
``threshold`` (seed 003: 70%) of this agent's capabilities: candidates for
merging, or a sign that one replaced another under a new id.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import msgspec

from cardbus.eventstore import events as ev
from cardbus.eventstore.envelope import Envelope
from cardbus.projections.agent_stats import AgentStatsFold

__all__ = ["OVERLAP_THRESHOLD", "AgentRow", "agent_directory", "capability_overlaps"]

OVERLAP_THRESHOLD = 0.7


class AgentRow(msgspec.Struct, kw_only=True):
    agent_id: str
    name: str = ""
    status: str = "live"  # "live" | "lapsed" | "deregistered"
    reason: str = ""  # the deregistration's reason
    # who said live or lapsed: "log" (seen within its lease) or "orchestrator" (``leases``)
    status_from: str = "log"
    capabilities: list[str] = []
    lease_s: float = 0.0
    registered_at: float = 0.0
    last_seen: float = 0.0
    runs: int = 0  # attempts with an outcome (see the agent statistics)
    success_rate: float | None = None  # None while runs == 0
    overlaps: list[str] = []  # "<agent> (85%)": registered agents offering most of its caps


def capability_overlaps(
    capabilities: Mapping[str, Iterable[str]], threshold: float = OVERLAP_THRESHOLD
) -> dict[str, list[tuple[str, float]]]:
    """For each agent, the others offering more than ``threshold`` of its capabilities
    (the share of its own capabilities the other offers too), highest first."""
    caps = {a: set(c) for a, c in capabilities.items()}
    out: dict[str, list[tuple[str, float]]] = {}
    for a, mine in caps.items():
        if not mine:
            continue
        found = [
            (b, len(mine & theirs) / len(mine))
            for b, theirs in caps.items()
            if b != a and len(mine & theirs) / len(mine) > threshold
        ]
        if found:
            out[a] = sorted(found, key=lambda x: (-x[1], x[0]))
    return out


def agent_directory(
    events: Iterable[Envelope],
    now: float,
    default_lease_s: float = 10.0,
    threshold: float = OVERLAP_THRESHOLD,
    leases: Mapping[str, bool] | None = None,
) -> list[AgentRow]:
    """Every agent of the log, by id (see the module docstring for the status, and for
    ``leases``: the running orchestrators' word on who is live)."""
    rows: dict[str, AgentRow] = {}
    stats = AgentStatsFold()
    for env in events:
        stats.apply(env)
        data = env.data
        if isinstance(data, ev.AgentRegistered):
            card = data.card if isinstance(data.card, dict) else {}
            caps = card.get("capabilities") or []
            rows[data.agent_id] = AgentRow(
                agent_id=data.agent_id,
                name=str(card.get("name") or ""),
                capabilities=[str(c.get("name")) for c in caps if isinstance(c, dict)],
                lease_s=data.lease_s,
                registered_at=env.recorded_at,
                last_seen=env.recorded_at,
            )
        elif isinstance(data, ev.AgentDeregistered):
            row = rows.setdefault(data.agent_id, AgentRow(agent_id=data.agent_id))
            row.status, row.reason = "deregistered", data.reason
            row.last_seen = max(row.last_seen, env.recorded_at)
        elif isinstance(data, (ev.TaskStarted, ev.TaskRedelivered, ev.TaskResultSubmitted)):
            seen = rows.get(data.agent_id)
            if seen is not None:
                seen.last_seen = max(seen.last_seen, env.recorded_at)
    for row in rows.values():
        if row.status != "deregistered" and leases is not None and row.agent_id in leases:
            row.status = "live" if leases[row.agent_id] else "lapsed"
            row.status_from = "orchestrator"
        elif row.status != "deregistered":
            lease = row.lease_s or default_lease_s
            row.status = "live" if row.last_seen + lease > now else "lapsed"
        s = stats.get(row.agent_id)
        row.runs = s.runs
        row.success_rate = s.success_rate if s.runs else None
    registered = {a: r.capabilities for a, r in rows.items() if r.status != "deregistered"}
    for a, found in capability_overlaps(registered, threshold).items():
        rows[a].overlaps = [f"{b} ({share:.0%})" for b, share in found]
    return [rows[a] for a in sorted(rows)]
