"""The agent directory's status: the log's inference, or the lease holders' word."""

from __future__ import annotations

from cardbus.eventstore import Envelope, MemoryEventStore, NewEvent
from cardbus.eventstore import events as ev
from cardbus.projections.agents import agent_directory

T0 = 1_000_000.0


async def _log() -> list[Envelope]:
    store = MemoryEventStore()
    for agent_id in ("idle", "gone", "left", "new"):
        card = {"agent_id": agent_id, "capabilities": [{"name": "echo"}]}
        registered = ev.AgentRegistered(agent_id=agent_id, card=card, lease_s=1.0)
        # "new" registered a moment ago; the others long before
        at = T0 + 99.5 if agent_id == "new" else T0
        stream = f"agent-{agent_id}"
        await store.append(
            stream, [NewEvent(data=registered, correlation_id=stream, recorded_at=at)], 0
        )
    left = ev.AgentDeregistered(agent_id="left", reason="stopped")
    await store.append("agent-left", [NewEvent(data=left, correlation_id="agent-left")], 1)
    return await store.read_all(0, 100)


async def test_the_log_alone_calls_an_idle_agent_lapsed() -> None:
    rows = {r.agent_id: r for r in agent_directory(await _log(), T0 + 100)}
    assert {a: (r.status, r.status_from) for a, r in rows.items()} == {
        "gone": ("lapsed", "log"),
        "idle": ("lapsed", "log"),
        "left": ("deregistered", "log"),
        "new": ("live", "log"),
    }


async def test_the_lease_holders_word_decides_for_the_agents_it_names() -> None:
    # an orchestrator holds idle's renewals and none for gone; it has no word on new
    leases = {"idle": True, "gone": False, "left": True}
    rows = {r.agent_id: r for r in agent_directory(await _log(), T0 + 100, leases=leases)}
    assert {a: (r.status, r.status_from) for a, r in rows.items()} == {
        "gone": ("lapsed", "orchestrator"),
        "idle": ("live", "orchestrator"),
        "left": ("deregistered", "log"),  # its deregistration is the log's last word
        "new": ("live", "log"),
    }
