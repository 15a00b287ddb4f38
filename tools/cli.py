"""``cardbus``: the command-line entry point.

Each command lives in a small sibling module (``tools/cmd_*.py``) that
registers itself on ``cli`` with ``@cli.command()``; this module only builds
the group. Commands are thin: the logic they call is in the library. Any
``CardbusError`` becomes one clear line on stderr and exit code 1.
"""

from __future__ import annotations

import importlib
from typing import Any

import click

from eventstore.errors import CardbusError

__all__ = ["cli", "main"]

# Command modules; each defines its commands with @cli.command().
COMMAND_MODULES = [
    "tools.cmd_demo",
    "tools.cmd_export",
    "tools.cmd_inspect",
    "tools.cmd_memory",
    "tools.cmd_nats",
    "tools.cmd_replay",
    "tools.cmd_fork",
    "tools.cmd_run",
]


class _Group(click.Group):
    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except CardbusError as e:
            raise click.ClickException(str(e)) from e


@click.group(cls=_Group)
@click.version_option(package_name="cardbus")
def cli() -> None:
    """cardbus: an event-sourced message bus for multi-agent work."""
    from .telemetry_setup import configure_tracing

    configure_tracing()  # an OpenTelemetry SDK, only if OTEL_* env vars ask for one


def main() -> None:
    cli()


for _name in COMMAND_MODULES:
    importlib.import_module(_name)
