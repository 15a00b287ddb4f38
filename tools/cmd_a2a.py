"""``cardbus a2a serve``: the orchestrator as an A2A agent (needs the ``a2a`` extra)."""

from __future__ import annotations

import click

from cardbus.bus.runtime.loop import run as run_loop
from cardbus.tools.cli import cli
from cardbus.tools.mcp_options import mcp_options, mcp_servers
from cardbus.tools.store_option import StoreRef, open_store_option, store_option

_DEMO = [
    "cardbus.agents.demo:Researcher",
    "cardbus.agents.demo:Planner",
    "cardbus.agents.demo:Writer",
    "cardbus.agents.demo:Reviewer",
]


@cli.group()
def a2a() -> None:
    """A2A: serve cardbus runs to A2A clients."""


@a2a.command()
@click.option("--host", default="127.0.0.1", show_default=True)
@click.option("--port", default=9999, show_default=True, type=int)
@store_option(help="The log the A2A tasks are read from: a SQLite file or nats://HOST:PORT.")
@click.option(
    "--agent",
    "agent_paths",
    multiple=True,
    help="module:Class or a2a+http://host:port, served in this process (default: the demo's).",
)
@mcp_options
def serve(
    host: str,
    port: int,
    db: StoreRef,
    agent_paths: tuple[str, ...],
    mcp: tuple[str, ...] = (),
    mcp_config: tuple[str, ...] = (),
) -> None:
    """Serve the orchestrator as an A2A agent: a message with a plan starts a run.

    The card is at http://HOST:PORT/.well-known/agent-card.json, JSON-RPC
    (A2A 1.0 and 0.3, streaming over SSE) at http://HOST:PORT/.
    """
    from cardbus.bus.a2a.serve import serve as run_server
    from cardbus.tools.loading import load_agent

    paths = list(agent_paths) or _DEMO
    agents = [load_agent(p) for p in paths]
    servers = mcp_servers(mcp, mcp_config)

    async def go() -> None:
        store = await open_store_option(db, create=True)
        try:
            await run_server(
                store,
                agents,
                host=host,
                port=port,
                served=paths,
                mcp_servers=servers,
                on_ready=lambda url: click.echo(f"cardbus a2a: serving {url} (log {db})"),
            )
        finally:
            await store.close()

    run_loop(go())
