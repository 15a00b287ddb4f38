"""``cardbus mcp serve``: cardbus as an MCP server (stdio, or streamable HTTP)."""

from __future__ import annotations

import click

from cardbus.bus.listen import listen_socket
from cardbus.bus.runtime.loop import run as run_loop
from cardbus.eventstore.errors import MissingExtra
from cardbus.projections.pricing import PriceTable
from cardbus.tools.cli import cli
from cardbus.tools.cmd_plan import DEMO_AGENT_PATHS
from cardbus.tools.cmd_replay import render_tree
from cardbus.tools.costs import prices_option
from cardbus.tools.llm_options import llm_options, open_llm
from cardbus.tools.loading import load_agent
from cardbus.tools.store_option import StoreRef, open_store_option, store_option


@cli.group()
def mcp() -> None:
    """cardbus as an MCP server, for assistants, IDEs and chat clients."""


@mcp.command()
@store_option(help="The log: a SQLite file (created if missing) or nats://HOST:PORT[,...].")
@click.option(
    "--transport",
    type=click.Choice(["stdio", "http"]),
    default="stdio",
    show_default=True,
    help="stdio: the client starts this command; http: streamable HTTP at /mcp.",
)
@click.option("--host", default="127.0.0.1", show_default=True, help="Interface to bind (http).")
@click.option("--port", default=8766, show_default=True, type=click.IntRange(0, 65535))
@click.option(
    "--token",
    default=None,
    envvar="CARDBUS_MCP_TOKEN",
    show_envvar=True,
    help="Required on every HTTP request (Authorization: Bearer); needed beyond loopback.",
)
@click.option(
    "--token-name",
    default="token",
    show_default=True,
    envvar="CARDBUS_MCP_TOKEN_NAME",
    show_envvar=True,
    help="Who the token stands for: the actor of every action taken with it.",
)
@click.option(
    "--token-file",
    default=None,
    envvar="CARDBUS_MCP_TOKEN_FILE",
    show_envvar=True,
    type=click.Path(dir_okay=False),
    help="A file of `name token` lines: each token accepted, its actions signed with its name.",
)
@click.option(
    "--agent",
    "agent_paths",
    multiple=True,
    help="module:Class (repeat): the agents runs started here run on, in this process"
    " (default: the demo's agents). Not on a NATS log, whose agents run elsewhere.",
)
@prices_option
@llm_options
def serve(
    db: StoreRef,
    transport: str,
    host: str,
    port: int,
    token: str | None,
    token_name: str,
    token_file: str | None,
    agent_paths: tuple[str, ...],
    prices: PriceTable,
    llm_base_url: str | None = None,
    model: str | None = None,
) -> None:
    """Serve cardbus's runs to an MCP client: start a run from a goal or a plan, list
    runs, a run's status, result and cost, a task's replay, what waits for a person
    (approve, deny), cancel, fork and re-run; resources cardbus://runs/{id} and
    cardbus://tasks/{id}.

    Over stdio (the default) the client starts this command and every action is
    signed local:<user>. Over --transport http it is served at
    http://HOST:PORT/mcp behind the console's lock (Host allow-list, same-origin
    JSON, the --token): each action is signed with --token-name. Beyond loopback
    it refuses to start without --token.
    """
    try:
        from cardbus.bus.http_guard import host_names, is_loopback, load_tokens
        from cardbus.tools.mcp_server import RunService, serve_http, serve_stdio
    except ImportError as e:
        raise MissingExtra("mcp", "the MCP server") from e
    tokens = load_tokens(token, token_file, token_name)  # a bad file: one line, at once
    if transport == "http" and not is_loopback(host) and not tokens:
        raise click.UsageError(
            f"--host {host} is not loopback: anyone who can reach it could start and approve"
            " runs; give --token (or CARDBUS_MCP_TOKEN) to require it on every request"
        )
    if agent_paths and db.is_nats:
        raise click.UsageError(
            "--agent hosts agents on a SQLite log; on NATS run them with `cardbus agent serve`"
            " and the orchestrator with `cardbus orchestrator`"
        )
    agents = [] if db.is_nats else [load_agent(p) for p in agent_paths or DEMO_AGENT_PATHS]
    service = RunService(
        opener=lambda: open_store_option(db, create=True),
        agents=agents,
        llm=lambda: open_llm(llm_base_url, model),
        prices=prices,
        submit_to_log=db.is_nats,
        render=render_tree,  # replay text as `cardbus replay` prints it
    )
    if transport == "stdio":
        run_loop(serve_stdio(service))
        return
    sock = listen_socket(host, port)  # a port in use: one line, before the banner
    port = sock.getsockname()[1]
    shown = "127.0.0.1" if host in ("0.0.0.0", "::") else host
    # stderr: stdout is the protocol's when a client runs this command over stdio
    click.echo(
        f"cardbus MCP server on http://{shown}:{port}/mcp  (log {db}; Ctrl-C stops)", err=True
    )
    run_loop(serve_http(service, sock, hosts=host_names(host), tokens=tokens))
