"""``cardbus``: the command-line entry point.

Each command lives in a small sibling module (``tools/cmd_*.py``) that
registers itself on ``cli`` with ``@cli.command()``; this module only builds
the group. Commands are thin: the logic they call is in the library. What a
command raises is said here, once (``tools/errors.py``): any ``CardbusError``
or missing extra is one line on stderr and exit code 1, a timeout exit code
124; see ``cardbus.tools.errors`` for every exit code.
"""

from __future__ import annotations

import importlib
from typing import Any

import click

__all__ = ["cli", "main"]

# Each command and the module that defines it (with @cli.command()); a module is
# imported only when one of its commands runs (or --help lists them), so a
# command does not pay for the others' imports (NATS, rich, the orchestrator).
COMMANDS = {
    "a2a": "cardbus.tools.cmd_a2a",
    "agent": "cardbus.tools.cmd_nats",
    "agents": "cardbus.tools.cmd_agents",
    "answer": "cardbus.tools.cmd_answer",
    "approve": "cardbus.tools.cmd_run",
    "cancel": "cardbus.tools.cmd_cancel",
    "demo": "cardbus.tools.cmd_demo",
    "diff": "cardbus.tools.cmd_diff",
    "deny": "cardbus.tools.cmd_run",
    "export": "cardbus.tools.cmd_export",
    "fork": "cardbus.tools.cmd_fork",
    "head": "cardbus.tools.cmd_audit",
    "mcp": "cardbus.tools.cmd_mcp",
    "memory": "cardbus.tools.cmd_memory",
    "nats": "cardbus.tools.cmd_nats",
    "orchestrator": "cardbus.tools.cmd_nats",
    "plan": "cardbus.tools.cmd_plan",
    "rebuild": "cardbus.tools.cmd_inspect",
    "replay": "cardbus.tools.cmd_replay",
    "rerun": "cardbus.tools.cmd_rerun",
    "review": "cardbus.tools.cmd_review",
    "run": "cardbus.tools.cmd_run",
    "runs": "cardbus.tools.cmd_runs",
    "schedule": "cardbus.tools.cmd_schedule",
    "schema": "cardbus.tools.cmd_schema",
    "stats": "cardbus.tools.cmd_inspect",
    "tail": "cardbus.tools.cmd_inspect",
    "tasks": "cardbus.tools.cmd_inspect",
    "ui": "cardbus.tools.cmd_ui",
    "verify": "cardbus.tools.cmd_audit",
}
COMMAND_MODULES = sorted(set(COMMANDS.values()))


class _Group(click.Group):
    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(COMMANDS)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name not in self.commands and cmd_name in COMMANDS:
            importlib.import_module(COMMANDS[cmd_name])  # registers it on cli
        return self.commands.get(cmd_name)

    def invoke(self, ctx: click.Context) -> Any:
        from cardbus.tools.errors import one_line

        try:
            return super().invoke(ctx)
        except Exception as e:
            said = one_line(e)
            if said is None:
                raise
            raise said from e


@click.group(cls=_Group)
@click.version_option(package_name="cardbus")
def cli() -> None:
    """cardbus: an event-sourced message bus for multi-agent work."""
    from cardbus.tools.telemetry_setup import configure_metrics, configure_tracing

    configure_tracing()  # an OpenTelemetry SDK, only if OTEL_* env vars ask for one
    configure_metrics()


def main() -> None:
    cli()
