"""``serve``: an embedded runtime (store, bus, agents, orchestrator) behind the A2A gateway."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Sequence

from cardbus.agents.agent import Agent
from cardbus.agents.mcp_config import MCPServer
from cardbus.bus.a2a.server import A2AGateway, GoalPlanning, Planner, build_app
from cardbus.bus.runtime.embedded import EmbeddedRuntime
from cardbus.eventstore import EventStore

__all__ = ["serve"]

log = logging.getLogger(__name__)


async def serve(
    store: EventStore,
    agents: Sequence[type[Agent]],
    host: str = "127.0.0.1",
    port: int = 9999,
    planner: Planner | None = None,
    served: Sequence[str] = (),
    on_ready: Callable[[str], None] | None = None,
    mcp_servers: Sequence[MCPServer] = (),
) -> None:
    """Serve until SIGINT/SIGTERM (uvicorn's handlers), then stop the runtime.

    A goal sent as text is planned by the orchestrator (``GoalPlanning``) with
    the planner agents among ``agents``, or the runtime's ``RulePlanner``;
    ``planner`` replaces that. ``mcp_servers`` are mounted as tools for the runtime's life.
    """
    import uvicorn

    url = f"http://{host}:{port}/"
    async with EmbeddedRuntime(store, agents, mcp_servers=mcp_servers) as rt:
        names = {*served, *(a.agent_id for a in agents)}
        gateway = A2AGateway(
            store,
            rt.orchestrator,
            rt.bus,
            planner=planner if planner is not None else GoalPlanning(),
            served=sorted(names),
        )
        await gateway.start()
        app = build_app(gateway, url)
        config = uvicorn.Config(app, host=host, port=port, log_level="warning", lifespan="off")
        server = uvicorn.Server(config)
        task = asyncio.create_task(server.serve())
        while not server.started and not task.done():
            await asyncio.sleep(0.02)
        if server.started and on_ready is not None:
            on_ready(url)
        try:
            await task
        finally:
            if not task.done():
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
