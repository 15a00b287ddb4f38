"""``cardbus ui``: the local web console (runs, live timelines, approvals) on uvicorn."""

from __future__ import annotations

from typing import Any

import click

from cardbus.bus.http_guard import DEFAULT_BODY_TIMEOUT_S, DEFAULT_TOKEN_NAME, load_tokens
from cardbus.bus.listen import listen_socket
from cardbus.eventstore.errors import ConfigError, MissingExtra
from cardbus.projections.pricing import PriceTable
from cardbus.tools.cli import cli
from cardbus.tools.costs import prices_option
from cardbus.tools.llm_options import llm_options, open_llm
from cardbus.tools.loading import load_agent
from cardbus.tools.mcp_options import mcp_options, mcp_servers
from cardbus.tools.store_option import StoreRef, open_store_option, store_option


@cli.command()
@store_option(
    help="The log: a SQLite file (created if missing: the console waits for runs)"
    " or nats://HOST:PORT[,...]."
)
@click.option("--host", default="127.0.0.1", show_default=True, help="Interface to bind.")
@click.option("--port", default=8765, show_default=True, type=click.IntRange(0, 65535))
@click.option(
    "--token",
    default=None,
    envvar="CARDBUS_UI_TOKEN",
    show_envvar=True,
    help="Required on every request (?token=...); needed to bind beyond loopback.",
)
@click.option(
    "--token-name",
    default=DEFAULT_TOKEN_NAME,
    show_default=True,
    envvar="CARDBUS_UI_TOKEN_NAME",
    show_envvar=True,
    help="The name --token's holder is logged as: the actor of every action taken with it.",
)
@click.option(
    "--token-file",
    default=None,
    type=click.Path(dir_okay=False),
    envvar="CARDBUS_UI_TOKEN_FILE",
    show_envvar=True,
    help="Named tokens, one `name token` a line (# comments): each action's actor is the"
    " name of the token it came with.",
)
@click.option(
    "--request-body-timeout",
    default=DEFAULT_BODY_TIMEOUT_S,
    show_default=True,
    type=click.FloatRange(min=0, min_open=True),
    help="Seconds a request's body may take to arrive, whole (408 after).",
)
@prices_option
@click.option(
    "--agent",
    "agent_paths",
    multiple=True,
    help="module:Class (repeat): agents the console runs, in its own process on the SQLite"
    " log, so its page can start, fork and re-run runs (as `cardbus run --agent`).",
)
@llm_options
@mcp_options
def ui(
    db: StoreRef,
    host: str,
    port: int,
    token: str | None,
    token_name: str,
    token_file: str | None,
    request_body_timeout: float,
    prices: PriceTable,
    agent_paths: tuple[str, ...],
    llm_base_url: str | None = None,
    model: str | None = None,
    mcp: tuple[str, ...] = (),
    mcp_config: tuple[str, ...] = (),
) -> None:
    """Serve the web console: the runs, each run's timeline and task table updating live,
    each task's inputs, outputs and reasons, approve/deny and cancel buttons, each run's
    cost in USD (--prices, else genai-prices; "unknown price" where a model has none),
    the diff of two runs, the HTML replay and trace spans to download.

    With --agent, the console also runs work: it hosts those agents (and the rule
    planner) on an embedded orchestrator, and its page starts a run from a goal or a
    plan, forks a run from a task with overrides, and re-runs a failed task. Without
    --agent those buttons are disabled and say how to enable them. The hosted
    agents ask the model of --llm-base-url / --model (as `cardbus run`), and
    --mcp / --mcp-config mount MCP servers as their tools. On a NATS log the
    agents and orchestrators run elsewhere (`cardbus agent serve`, `cardbus orchestrator`):
    the page's actions write the new runs to the log and the running orchestrators
    decide them.

    Bound to loopback by default. On any other interface it refuses to start
    without --token or --token-file, and then every request must carry a token.
    Each action is logged with the name of the token it came with (--token is
    named --token-name; a token file names each); on loopback without a token,
    with local:<user>, the account the console runs as. A name the page gives is
    kept as a note.
    """
    try:
        import uvicorn

        from cardbus.bus.http_guard import host_names
        from cardbus.tools.ui import create_app, is_loopback
    except ImportError as e:
        raise MissingExtra("ui", "the web console") from e
    try:
        tokens = load_tokens(token, token_file, token_name)
    except ConfigError as e:
        raise click.UsageError(str(e)) from e
    loopback = is_loopback(host)
    if not loopback and not tokens:
        raise click.UsageError(
            f"--host {host} is not loopback: anyone who can reach it could approve tasks;"
            " give --token (or CARDBUS_UI_TOKEN) or --token-file to require one on every"
            " request"
        )
    if agent_paths and db.is_nats:
        raise click.UsageError(
            "--agent hosts agents on a SQLite log; on NATS run them with `cardbus agent serve`"
            " and the orchestrator with `cardbus orchestrator`"
        )
    agents = [load_agent(p) for p in agent_paths]  # as cardbus run loads them
    servers = mcp_servers(mcp, mcp_config)
    if servers and not agents:
        raise click.UsageError("--mcp mounts tools for the agents of --agent: give some")
    if agents:  # refused now, in one line, rather than when the server starts them
        from cardbus.bus.runtime.embedded import EmbeddedRuntime

        EmbeddedRuntime.check_tools(agents, mcp_servers=servers)
    # the Host header must name the interface served (DNS rebinding); "*" when all of them
    hosts = host_names(host)
    # opened in uvicorn's loop at start-up; a SQLite file is created if missing
    app = create_app(
        opener=lambda: open_store_option(db, create=True),
        tokens=tokens,
        body_timeout_s=request_body_timeout,
        hosts=hosts,
        prices=prices,
        agents=agents,
        llm=lambda: open_llm(llm_base_url, model),
        submit_to_log=db.is_nats,  # NATS: the running orchestrators decide new runs
        mcp_servers=servers,
    )
    sock = listen_socket(host, port)  # a port in use: PortInUse, one line, before the banner
    port = sock.getsockname()[1]
    shown = "127.0.0.1" if host in ("0.0.0.0", "::") else host
    suffix = f"?token={token}" if token else ""
    click.echo(f"cardbus console on http://{shown}:{port}/{suffix}  (log {db}; Ctrl-C stops)")
    if agents:
        click.echo(f"running agents {', '.join(a.agent_id for a in agents)} for its actions")
    config = uvicorn.Config(
        app,
        host=host,
        port=port,
        log_level="warning",
        timeout_graceful_shutdown=1,
        lifespan="on",
    )

    class Server(uvicorn.Server):
        def handle_exit(self, sig: int, frame: Any) -> None:
            # open event streams end first: shutdown does not wait on them, nor cancel
            # them with a traceback
            stop = getattr(app.state, "stop_streams", None)
            if stop is not None:
                stop()
            super().handle_exit(sig, frame)

    Server(config).run(sockets=[sock])
