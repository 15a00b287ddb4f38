"""``cardbus ui``: the local web console (runs, live timelines, approvals) on uvicorn."""

from __future__ import annotations

from typing import Any

import click

from cardbus.bus.listen import listen_socket
from cardbus.eventstore.errors import MissingExtra
from cardbus.projections.pricing import PriceTable
from cardbus.tools.cli import cli
from cardbus.tools.costs import prices_option
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
@prices_option
def ui(db: StoreRef, host: str, port: int, token: str | None, prices: PriceTable) -> None:
    """Serve the web console: the runs, each run's timeline and task table updating live,
    each task's inputs, outputs and reasons, approve/deny buttons, each run's cost in USD
    (--prices, else genai-prices; "unknown price" where a model has none) and the diff of
    two runs.

    Bound to loopback by default. On any other interface it refuses to start
    without --token, and then every request must carry the token.
    """
    try:
        import uvicorn

        from cardbus.bus.http_guard import host_names
        from cardbus.tools.ui import create_app, is_loopback
    except ImportError as e:
        raise MissingExtra("ui", "the web console") from e
    loopback = is_loopback(host)
    if not loopback and not token:
        raise click.UsageError(
            f"--host {host} is not loopback: anyone who can reach it could approve tasks;"
            " give --token (or CARDBUS_UI_TOKEN) to require it on every request"
        )
    # the Host header must name the interface served (DNS rebinding); "*" when all of them
    hosts = host_names(host)
    # opened in uvicorn's loop at start-up; a SQLite file is created if missing
    app = create_app(
        opener=lambda: open_store_option(db, create=True), token=token, hosts=hosts, prices=prices
    )
    sock = listen_socket(host, port)  # a port in use: PortInUse, one line, before the banner
    port = sock.getsockname()[1]
    shown = "127.0.0.1" if host in ("0.0.0.0", "::") else host
    suffix = f"?token={token}" if token else ""
    click.echo(f"cardbus console on http://{shown}:{port}/{suffix}  (log {db}; Ctrl-C stops)")
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
