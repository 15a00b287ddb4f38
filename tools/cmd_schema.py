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
@click.option("--json", "as_json", is_flag=True, help="The list (or the files written) as JSON.")
def schema_command(name: str | None, out_dir: str | None, as_json: bool) -> None:
    """The wire format's JSON Schemas (NAME: one of them, or 'contract')."""
    if out_dir is not None:
        paths = [str(p) for p in write_schemas(out_dir)]
        click.echo(json.dumps(paths) if as_json else "\n".join(paths))
        return
    if name is None and as_json:
        names = [*SCHEMA_NAMES, "contract"]
        click.echo(json.dumps({"wire_version": WIRE_VERSION, "schemas": names}))
    elif name is None:
        click.echo(f"cardbus wire version {WIRE_VERSION}; schemas:")
        for known in (*SCHEMA_NAMES, "contract"):
            click.echo(f"  {known}")
    else:  # (a schema is JSON already)
        doc = contract() if name == "contract" else schema(name)
        click.echo(json.dumps(doc, indent=2))
