"""``cardbus demo``: a small demo of the log (the agent pipeline replaces it)."""

from __future__ import annotations

import asyncio

import click

from eventstore import NewEvent, SqliteEventStore, new_id
from eventstore import events as ev

from .cli import cli


async def _demo(db: str) -> None:
    store = await SqliteEventStore.open(db)
    try:
        root = new_id()
        for capability in ("research", "write"):
            task = new_id()
            lifecycle: list[ev.Event] = [
                ev.TaskCreated(root_id=root, capability=capability, goal=f"{capability} demo"),
                ev.TaskDispatched(attempt=1, agent_id=f"{capability}-agent"),
                ev.TaskStarted(attempt=1, agent_id=f"{capability}-agent"),
                ev.TaskCompleted(attempt=1, agent_id=f"{capability}-agent", output="ok"),
            ]
            await store.append(
                task, [NewEvent(data=d, correlation_id=root, actor="demo") for d in lifecycle], 0
            )
        for env in await store.read_correlation(root):
            click.echo(f"{env.position:>6}  {env.stream[:8]}  v{env.version}  {env.type}")
    finally:
        await store.close()


@cli.command()
@click.option("--db", default="cardbus.db", show_default=True, help="SQLite event store file.")
def demo(db: str) -> None:
    """Run the demo pipeline on the embedded default (SQLite + in-process bus)."""
    asyncio.run(_demo(db))
