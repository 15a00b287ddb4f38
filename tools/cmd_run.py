"""``cardbus run`` (a plan file on the embedded default), ``approve`` and ``deny``."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import click

from cardbus.bus.orchestrator.core import answer_approval
from cardbus.bus.orchestrator.plan import decode_plan
from cardbus.bus.runtime.embedded import EmbeddedRuntime
from cardbus.eventstore import SqliteEventStore
from cardbus.tools.cli import cli
from cardbus.tools.llm_options import close_llm, llm_options, open_llm
from cardbus.tools.loading import load_agent


@cli.command()
@click.argument("plan_file", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option("--db", default="cardbus.db", show_default=True, envvar="CARDBUS_DB")
@click.option("--agent", "agent_paths", multiple=True, help="module:Class, added to the plan's.")
@click.option("--timeout", default=600.0, show_default=True, help="Seconds to wait for the run.")
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
@llm_options
def run(
    plan_file: Path,
    db: str,
    agent_paths: tuple[str, ...],
    timeout: float,
    as_json: bool,
    llm_base_url: str | None = None,
    model: str | None = None,
) -> None:
    """Run PLAN_FILE (JSON) with the agents it names, on the SQLite log DB.

    Running a plan with a plan_id that is already in the log resumes that
    run instead of starting another: after a crash, run the same command.
    """
    plan = decode_plan(plan_file.read_bytes())
    agents = [load_agent(p) for p in [*plan.agents, *agent_paths]]

    async def go() -> None:
        llm = open_llm(llm_base_url, model)
        store = await SqliteEventStore.open(db)
        try:
            async with EmbeddedRuntime(store, agents, llm=llm) as rt:
                result = await rt.run(plan, timeout)
        finally:
            await store.close()
            await close_llm(llm)
        if as_json:
            click.echo(
                json.dumps(
                    {
                        "root_id": result.root_id,
                        "status": result.status,
                        "reason": result.reason,
                        "outputs": result.outputs,
                    }
                )
            )
        else:
            click.echo(f"run {result.root_id}: {result.status} {result.reason}".rstrip())
        if result.status != "completed":
            raise SystemExit(2)

    asyncio.run(go())


def _answer(task_id: str, granted: bool, db: str, by: str, note: str) -> None:
    async def go() -> None:
        store = await SqliteEventStore.open(db, create=False)
        try:
            await answer_approval(store, task_id, granted, by, note)
        finally:
            await store.close()

    asyncio.run(go())
    click.echo(f"{task_id}: {'approved' if granted else 'denied'} by {by}")


_by = click.option("--by", default="cli", show_default=True, help="Who answers.")
_note = click.option("--note", default="", help="A note kept in the event.")
_db = click.option("--db", default="cardbus.db", show_default=True, envvar="CARDBUS_DB")


@cli.command()
@click.argument("task_id")
@_db
@_by
@_note
def approve(task_id: str, db: str, by: str, note: str) -> None:
    """Approve TASK_ID, which is waiting for approval."""
    _answer(task_id, True, db, by, note)


@cli.command()
@click.argument("task_id")
@_db
@_by
@_note
def deny(task_id: str, db: str, by: str, note: str) -> None:
    """Deny TASK_ID, which is waiting for approval (it is cancelled)."""
    _answer(task_id, False, db, by, note)
