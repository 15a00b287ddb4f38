"""``cardbus fork``: a new run whose history up to an event is taken from an old one.

The events of the new root are computed by ``projections.fork.plan_fork``
(results completed before the fork point are reused, not recomputed); this
command appends them and runs the orchestrator on the embedded runtime with
the agents given (the demo agents by default) until the new run finishes.
"""

from __future__ import annotations

import asyncio
from typing import Any

import click

from cardbus.eventstore import NewEvent, new_id
from cardbus.eventstore.errors import StreamNotFound
from cardbus.projections import resolve_id
from cardbus.projections.fork import ForkPlan, plan_fork
from cardbus.tools.cli import cli
from cardbus.tools.cmd_inspect import echo_json, json_option, open_store
from cardbus.tools.store_option import StoreRef, store_option


@cli.command()
@click.argument("task_id")
@click.option("--at", "at", required=True, help="Event id (or global position) to fork at.")
@store_option
@json_option
@click.option("--agent", "agent_paths", multiple=True, help="module:Class (default: the demo's).")
@click.option("--no-run", is_flag=True, help="Only write the forked run; do not run it.")
@click.option("--timeout", default=600.0, show_default=True, help="Seconds to wait for the run.")
def fork(
    task_id: str,
    at: str,
    db: StoreRef,
    as_json: bool,
    agent_paths: tuple[str, ...],
    no_run: bool,
    timeout: float,
) -> None:
    """Start a new run from the run of TASK_ID (a task or root id) as it was at --at.

    Results completed at or before the fork point are reused; every other task
    of the plan runs again on the current agents. The new run's run.started
    event records forked_from = "<old root>@<event id>".
    """
    from cardbus.bus.runtime.embedded import EmbeddedRuntime
    from cardbus.tools.loading import load_agent

    if agent_paths:
        agents = [load_agent(p) for p in agent_paths]
    else:
        from cardbus.agents.demo import DEMO_AGENTS

        agents = list(DEMO_AGENTS)

    async def go() -> tuple[ForkPlan, Any]:
        store = await open_store(db)
        try:
            own = await store.read_stream(await resolve_id(store, task_id))
            root = own[0].correlation_id if own else task_id
            events = await store.read_correlation(root)
            if not events:
                raise StreamNotFound(task_id)
            plan = plan_fork(events, at, new_id())
            for stream, datas in plan.streams:
                await store.append(
                    stream,
                    [
                        NewEvent(
                            data=d,
                            correlation_id=plan.root_id,
                            causation_id=plan.at_event_id,
                            actor="fork",
                        )
                        for d in datas
                    ],
                    0,
                )
            if no_run:
                return plan, None
            async with EmbeddedRuntime(store, agents) as rt:
                result = await rt.orchestrator.wait(plan.root_id, timeout)
            return plan, result
        finally:
            await store.close()

    plan, result = asyncio.run(go())
    if as_json:
        echo_json(
            {
                "root_id": plan.root_id,
                "forked_from": plan.forked_from,
                "at_position": plan.at_position,
                "reused": plan.reused,
                "rerun": plan.rerun,
                "status": getattr(result, "status", None),
                "reason": getattr(result, "reason", None),
            }
        )
    else:
        click.echo(
            f"forked {plan.source_root_id} at {plan.at_event_id} (position {plan.at_position})"
            f" into run {plan.root_id}: {len(plan.reused)} result(s) reused,"
            f" {len(plan.rerun)} task(s) to run again"
        )
        if result is not None:
            click.echo(f"run {plan.root_id}: {result.status} {result.reason}".rstrip())
        click.echo(f"cardbus replay {plan.root_id}{db.flag()}")
    if result is not None and result.status != "completed":
        raise SystemExit(1)  # a failed run (2 is a usage error)
