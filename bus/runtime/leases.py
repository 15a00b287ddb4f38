"""Who is live, asked of the orchestrators that hold the leases (``cardbus agents`` on NATS).

Lease renewals are not events (``bus.orchestrator.liveness``): from the log alone an
idle agent that keeps renewing looks lapsed once its last card is a lease old. The
orchestrators running on the log hold the renewals, so a reader asks them: each answers
``cardbus.orch.leases`` (core request/reply, no queue group: every member answers; the
subject is the orchestrator role's, ``orchestrator_permissions``, so no agent can answer
for them) with the registered agents it holds a live lease for and those whose lease
(and grace) ran out. An agent one of them holds live is live; an agent nobody has a
word on (an orchestrator just restarted, still waiting for its first renewal), or no
orchestrator answering at all, leaves the log's own inference.
"""

from __future__ import annotations

import contextlib
import json
import time
from typing import TYPE_CHECKING, Any

from cardbus.eventstore.nats.connection import TRANSPORT_ERRORS

if TYPE_CHECKING:
    from cardbus.bus.orchestrator.core import Orchestrator

__all__ = ["LEASES_SUBJECT", "ask_leases", "lease_report", "serve_leases"]

LEASES_SUBJECT = "cardbus.orch.leases"
_MORE_S = 0.2  # after the first answer, how long other members may take to answer too


def lease_report(orchestrator: Orchestrator, now: float | None = None) -> dict[str, list[str]]:
    """The registered agents ``orchestrator`` holds a live lease for, and those it holds
    none and no grace for (it deregisters them on its next clock tick)."""
    now = time.time() if now is None else now
    leases, live, lapsed = orchestrator.leases, [], []
    for agent_id in orchestrator.state.agents:
        if leases.live(agent_id, now):
            live.append(agent_id)
        elif not leases.waiting(agent_id, now):
            lapsed.append(agent_id)
    return {"live": sorted(live), "lapsed": sorted(lapsed)}


async def serve_leases(nc: Any, orchestrator: Orchestrator) -> Any:
    """Answer ``cardbus.orch.leases`` with ``orchestrator``'s lease report; returns the
    subscription (it ends with the connection)."""

    async def answer(msg: Any) -> None:
        if msg.reply:
            with contextlib.suppress(*TRANSPORT_ERRORS):
                await msg.respond(json.dumps(lease_report(orchestrator)).encode())

    return await nc.subscribe(LEASES_SUBJECT, cb=answer)


async def ask_leases(nc: Any, wait_s: float = 1.0) -> dict[str, bool] | None:
    """Ask every orchestrator on ``nc``'s server: agent -> live (True) or lapsed (False),
    for the agents any of them had a word on (live if any holds it live); None if none
    answered within ``wait_s``."""
    inbox = nc.new_inbox()
    sub = await nc.subscribe(inbox)
    said: dict[str, bool] = {}
    answered = False
    try:
        await nc.publish(LEASES_SUBJECT, b"", reply=inbox)
        await nc.flush()
        deadline = time.monotonic() + wait_s
        while (left := deadline - time.monotonic()) > 0:
            try:
                msg = await sub.next_msg(timeout=left)
            except TimeoutError:
                break
            try:
                report = json.loads(msg.data)
                live, lapsed = list(report["live"]), list(report["lapsed"])
            except (ValueError, KeyError, TypeError):
                continue  # not an answer of ours
            answered = True
            for agent_id in map(str, lapsed):
                said.setdefault(agent_id, False)
            for agent_id in map(str, live):
                said[agent_id] = True
            deadline = min(deadline, time.monotonic() + _MORE_S)  # the others, if any
    finally:
        with contextlib.suppress(*TRANSPORT_ERRORS):
            await sub.unsubscribe()
    return said if answered else None
