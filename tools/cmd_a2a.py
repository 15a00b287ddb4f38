"""``cardbus a2a serve``: the orchestrator as an A2A agent (needs the ``a2a`` extra)."""

from __future__ import annotations

import click

from cardbus.bus.http_guard import (
    DEFAULT_BODY_TIMEOUT_S,
    DEFAULT_MAX_BODY,
    DEFAULT_TOKEN_NAME,
    load_tokens,
)
from cardbus.bus.runtime.loop import run as run_loop
from cardbus.eventstore.errors import ConfigError
from cardbus.tools.cli import cli
from cardbus.tools.llm_options import close_llm, llm_options, open_llm, watch_model_calls
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
@click.option(
    "--token",
    default=None,
    envvar="CARDBUS_A2A_TOKEN",
    show_envvar=True,
    help="Required on every request (Authorization: Bearer or X-API-Key); needed beyond loopback.",
)
@click.option(
    "--token-name",
    default=DEFAULT_TOKEN_NAME,
    show_default=True,
    envvar="CARDBUS_A2A_TOKEN_NAME",
    show_envvar=True,
    help="The name --token's holder is logged as: the actor of what they do (approve, answer,"
    " start, cancel).",
)
@click.option(
    "--token-file",
    default=None,
    type=click.Path(dir_okay=False),
    envvar="CARDBUS_A2A_TOKEN_FILE",
    show_envvar=True,
    help="Named tokens, one `name token` a line (# comments), any of which is accepted; the"
    " actor of what a request does is its token's name (a token alone: --token-name).",
)
@click.option(
    "--public-url",
    default=None,
    help="The URL the card advertises (behind a proxy); its host may be in the Host header.",
)
@click.option(
    "--max-request-bytes",
    default=DEFAULT_MAX_BODY,
    show_default=True,
    type=click.IntRange(1024),
    help="Larger request bodies are refused unread.",
)
@click.option(
    "--request-body-timeout",
    default=DEFAULT_BODY_TIMEOUT_S,
    show_default=True,
    type=click.FloatRange(min=0, min_open=True),
    help="Seconds a request's body may take to arrive, whole (408 after).",
)
@llm_options
@mcp_options
def serve(
    host: str,
    port: int,
    db: StoreRef,
    agent_paths: tuple[str, ...],
    token: str | None,
    token_name: str,
    token_file: str | None,
    public_url: str | None,
    max_request_bytes: int,
    request_body_timeout: float,
    llm_base_url: str | None = None,
    model: str | None = None,
    mcp: tuple[str, ...] = (),
    mcp_config: tuple[str, ...] = (),
) -> None:
    """Serve the orchestrator as an A2A agent: a message with a plan starts a run.

    The card is at http://HOST:PORT/.well-known/agent-card.json, JSON-RPC
    (A2A 1.0 and 0.3, streaming over SSE) at http://HOST:PORT/. Bound to
    loopback by default; on any other interface it refuses to start without
    a token, and then every request but the card's must carry one.

    Its LLM agents ask --llm-base-url (OPENAI_BASE_URL) for --model
    (CARDBUS_MODEL), as `cardbus run` does; without an endpoint, the
    deterministic mock. The first model call says which, in one line on stderr.
    """
    from cardbus.bus.a2a.serve import check_exposure
    from cardbus.bus.a2a.serve import serve as run_server
    from cardbus.tools.loading import load_agent

    try:
        tokens = load_tokens(token, token_file, token_name)
        check_exposure(host, tokens)
    except ConfigError as e:
        raise click.ClickException(str(e)) from e  # one line on stderr, exit 1
    paths = list(agent_paths) or _DEMO
    agents = [load_agent(p) for p in paths]
    servers = mcp_servers(mcp, mcp_config)

    async def go() -> None:
        llm = open_llm(llm_base_url, model, agents)
        store = await open_store_option(db, create=True)
        try:
            await run_server(
                store,
                agents,
                host=host,
                port=port,
                served=paths,
                tokens=tokens,
                public_url=public_url,
                max_body=max_request_bytes,
                body_timeout_s=request_body_timeout,
                mcp_servers=servers,
                llm=llm,
                on_runtime=lambda rt: watch_model_calls(rt.orchestrator, llm),
                on_ready=lambda url: click.echo(f"cardbus a2a: serving {url} (log {db})"),
            )
        finally:
            await store.close()
            await close_llm(llm)

    run_loop(go())
