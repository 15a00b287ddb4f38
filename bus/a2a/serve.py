"""``serve``: an embedded runtime (store, bus, agents, orchestrator) behind the A2A gateway."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Sequence

from cardbus.agents.agent import Agent
from cardbus.agents.llm import LLM
from cardbus.agents.mcp_config import MCPServer
from cardbus.bus.a2a.server import A2AGateway, GoalPlanning, Planner, build_app
from cardbus.bus.http_guard import (
    DEFAULT_BODY_TIMEOUT_S,
    DEFAULT_MAX_BODY,
    Tokens,
    host_names,
    is_loopback,
)
from cardbus.bus.listen import listen_socket
from cardbus.bus.runtime.embedded import EmbeddedRuntime
from cardbus.eventstore import EventStore
from cardbus.eventstore.errors import ConfigError

__all__ = ["check_exposure", "serve"]

log = logging.getLogger(__name__)


def check_exposure(host: str, tokens: Tokens | Sequence[str]) -> None:
    """``ConfigError`` for a server reachable beyond loopback that no token locks."""
    if not is_loopback(host) and not tokens:
        raise ConfigError(
            f"--host {host} is not loopback and no token is set: anyone who can reach it could"
            " start runs and answer approvals; give --token, CARDBUS_A2A_TOKEN or --token-file"
        )


async def serve(
    store: EventStore,
    agents: Sequence[type[Agent]],
    host: str = "127.0.0.1",
    port: int = 9999,
    planner: Planner | None = None,
    served: Sequence[str] = (),
    on_ready: Callable[[str], None] | None = None,
    *,
    tokens: Tokens | Sequence[str] = (),
    public_url: str | None = None,
    max_body: int = DEFAULT_MAX_BODY,
    body_timeout_s: float | None = DEFAULT_BODY_TIMEOUT_S,
    mcp_servers: Sequence[MCPServer] = (),
    llm: LLM | None = None,
    on_runtime: Callable[[EmbeddedRuntime], None] | None = None,
) -> None:
    """Serve until SIGINT/SIGTERM (uvicorn's handlers), then stop the runtime.

    A goal sent as text is planned by the orchestrator (``GoalPlanning``) with
    the planner agents among ``agents``, or the runtime's ``RulePlanner``;
    ``planner`` replaces that. ``tokens``: one of them on every request but
    the card's (required beyond loopback: ``ConfigError``), token -> the name
    its holder's actions are logged with (a list: each named ``token``);
    ``body_timeout_s``: the time a request's body may take (408 after); ``public_url``:
    the URL the card advertises (and a name the ``Host`` header may carry);
    ``max_body``: the largest request body taken, in bytes; a ``port`` in use is
    ``PortInUse``, raised before anything starts. ``mcp_servers`` are
    mounted as tools for the runtime's life; ``llm`` is the model the agents ask (None:
    the deterministic mock); ``on_runtime`` is called with the runtime once it has started.
    """
    import uvicorn

    check_exposure(host, tokens)
    # bound before the runtime starts: a port in use is PortInUse (one line), not uvicorn's
    # exit; with port 0, the port bound is the one the card advertises
    sock = listen_socket(host, port)
    port = sock.getsockname()[1]
    shown = "127.0.0.1" if host in ("0.0.0.0", "::") else host
    url = public_url or f"http://{shown}:{port}/"
    with sock:  # closed however serving ends (uvicorn closes it too when it ran)
        async with EmbeddedRuntime(store, agents, llm=llm, mcp_servers=mcp_servers) as rt:
            if on_runtime is not None:
                on_runtime(rt)
            names = {*served, *(a.agent_id for a in agents)}
            gateway = A2AGateway(
                store,
                rt.orchestrator,
                rt.bus,
                planner=planner if planner is not None else GoalPlanning(),
                served=sorted(names),
            )
            await gateway.start()
            app = build_app(
                gateway,
                url,
                tokens=tokens,
                hosts=host_names(host, public_url),
                max_body=max_body,
                body_timeout_s=body_timeout_s,
            )
            config = uvicorn.Config(app, host=host, port=port, log_level="warning", lifespan="off")
            server = uvicorn.Server(config)
            task = asyncio.create_task(server.serve(sockets=[sock]))
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
