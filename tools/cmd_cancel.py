"""``cardbus cancel``: cancel a run from the terminal, on any store (SQLite or NATS)."""

from __future__ import annotations

import json

import click

from cardbus.bus.orchestrator.cancel import cancel_run
from cardbus.bus.runtime.loop import run as run_loop
from cardbus.projections import resolve_id
from cardbus.tools.cli import cli
from cardbus.tools.store_option import StoreRef, open_store_option, store_option


@cli.command()
@click.argument("run_id")
@store_option
@click.option("--by", default="cli", show_default=True, help="Who cancels (the events' actor).")
@click.option("--note", default="", help="Why: kept in each task.cancelled's reason.")
@click.option("--json", "as_json", is_flag=True, help="Print the outcome as JSON.")
def cancel(run_id: str, db: StoreRef, by: str, note: str, as_json: bool) -> None:
    """Cancel RUN_ID (a root id, plan id, a task of the run, or a unique prefix).

    Each live task of the run gets a ``task.cancelled`` event whose actor is
    ``--by``; the orchestrator following the log stops them, has the agents cancel
    the handlers still running, and ends the run as ``cancelled``. A run already
    finished is left as it is.
    """

    async def go() -> tuple[str, list[str]]:
        store = await open_store_option(db)
        try:
            found = await resolve_id(store, run_id)
            own = await store.read_stream(found)
            root = own[0].correlation_id if own else found
            reason = "cancelled_by_user" + (f": {note}" if note else "")
            return root, await cancel_run(store, root, by=by, reason=reason)
        finally:
            await store.close()

    root, cancelled = run_loop(go())
    if as_json:
        click.echo(json.dumps({"root_id": root, "cancelled": cancelled, "by": by}))
    elif cancelled:
        click.echo(f"{root}: cancelled {len(cancelled)} task(s) as {by}")
        for task_id in cancelled:
            click.echo(f"  {task_id}")
    else:
        click.echo(f"{root}: nothing to cancel (the run has finished)")
