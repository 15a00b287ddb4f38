"""``cardbus schema [NAME] [--out DIR]``: the wire format's JSON Schemas, for agent authors.

Generated from the types the bus encodes (``cardbus.bus.wire``): ``cardbus schema``
lists the names, ``cardbus schema task_card`` prints one, ``cardbus schema contract``
the subjects, headers, acks and permissions, ``--out DIR`` writes them all as files.
"""

from __future__ import annotations

import json

import click

from cardbus.bus.wire import SCHEMA_NAMES, WIRE_VERSION, contract, schema, write_schemas
from cardbus.tools.cli import cli

__all__: list[str] = []


@cli.command("schema")
@click.argument("name", required=False)
@click.option(
    "--out",
    "out_dir",
    default=None,
    type=click.Path(file_okay=False),
    help="Write every schema (and contract.json) into this directory.",
)
def schema_command(name: str | None, out_dir: str | None) -> None:
    """The wire format's JSON Schemas (NAME: one of them, or 'contract')."""
    if out_dir is not None:
        for path in write_schemas(out_dir):
            click.echo(str(path))
        return
    if name is None:
        click.echo(f"cardbus wire version {WIRE_VERSION}; schemas:")
        for known in (*SCHEMA_NAMES, "contract"):
            click.echo(f"  {known}")
        return
    doc = contract() if name == "contract" else schema(name)
    click.echo(json.dumps(doc, indent=2))
