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

from cardbus.bus.orchestrator.forks import on_agents, read_fork, write_run
from cardbus.eventstore import events as ev
from cardbus.eventstore.errors import ConfigError
from cardbus.projections.fork import ForkPlan
from cardbus.tools.cli import cli
from cardbus.tools.cmd_inspect import echo_json, json_option, open_store
from cardbus.tools.errors import EXIT_FAILED
from cardbus.tools.llm_options import close_llm, llm_options, open_llm, watch_model_calls
from cardbus.tools.mcp_options import mcp_options, mcp_servers
from cardbus.tools.outcome import failure_json, run_events, run_line, see_through
from cardbus.tools.store_option import StoreRef, store_option


@cli.command()
@click.argument("task_id")
@click.option("--at", "at", required=True, help="Event id (or global position) to fork at.")
@store_option
@json_option
@click.option(
    "--agent", "agent_paths", multiple=True, help="module:Class (default: the plan's agents)."
)
@click.option("--no-run", is_flag=True, help="Only write the forked run; do not run it.")
@click.option(
    "--timeout",
    default=600.0,
    show_default=True,
    help="Seconds to wait for the run; then it is cancelled and the exit code is 124.",
)
@llm_options
@mcp_options
def fork(
    task_id: str,
    at: str,
    db: StoreRef,
    as_json: bool,
    agent_paths: tuple[str, ...],
    no_run: bool,
    timeout: float,
    llm_base_url: str | None = None,
    model: str | None = None,
    mcp: tuple[str, ...] = (),
    mcp_config: tuple[str, ...] = (),
) -> None:
    """Start a new run from the run of TASK_ID (a task or root id) as it was at --at.

    Results completed at or before the fork point are reused; every other task
    of the plan runs again, by default on the plan's agents (the classes the
    old run named, kept in its run.started), else on --agent. The new run's
    run.started event records forked_from = "<old root>@<event id>". Its LLM
    agents ask the model of --llm-base-url / --model, and --mcp / --mcp-config
    mount MCP servers as tools, as for `cardbus run`.

    Exit code 0 when the new run completed, 1 when it did not (the last line
    names the task that failed it and why), 124 after --timeout (the run is
    cancelled, reason client_timed_out in the log).
    """
    from cardbus.bus.runtime.embedded import EmbeddedRuntime, with_planner

    servers = mcp_servers(mcp, mcp_config)

    async def go() -> tuple[ForkPlan, Any, list[Any]]:
        store = await open_store(db)
        try:
            plan = await read_fork(store, task_id, at)
            paths, agents = _agents(plan, agent_paths)
            if not no_run:
                agents = with_planner(agents)
            plan = on_agents(plan, paths, [a.agent_id for a in agents])
            if no_run:
                await write_run(store, plan.streams, plan.root_id, plan.at_event_id, "fork")
                return plan, None, []
            llm = open_llm(llm_base_url, model, agents)
            try:
                # started before the run is written: one that cannot start (a tool nothing
                # serves) leaves no run behind; the orchestrator then folds the new run
                async with EmbeddedRuntime(
                    store, agents, llm=llm, mcp_servers=servers, schedules=False
                ) as rt:
                    watch_model_calls(rt.orchestrator, llm)
                    await write_run(store, plan.streams, plan.root_id, plan.at_event_id, "fork")
                    result = await see_through(
                        rt.orchestrator.wait(plan.root_id, timeout),
                        store,
                        timeout,
                        "cardbus fork",
                        root_id=plan.root_id,
                        orchestrator=rt.orchestrator,
                        store_flag=db.flag(),
                    )
            finally:
                await close_llm(llm)
            ok = result.status == "completed"
            return plan, result, [] if ok else await run_events(store, result)
        finally:
            await store.close()

    plan, result, events = asyncio.run(go())
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
                "failure": failure_json(events),
            }
        )
    else:
        click.echo(
            f"forked {plan.source_root_id} at {plan.at_event_id} (position {plan.at_position})"
            f" into run {plan.root_id}: {len(plan.reused)} result(s) reused,"
            f" {len(plan.rerun)} task(s) to run again"
        )
        click.echo(f"cardbus replay {plan.root_id}{db.flag()}")
        if result is not None:  # last: what failed it, first
            click.echo(run_line(result, events))
    if result is not None and result.status != "completed":
        raise SystemExit(EXIT_FAILED)  # a failed run (2 is a usage error)


def _agents(plan: ForkPlan, given: tuple[str, ...]) -> tuple[list[str], list[Any]]:
    """The import paths and classes the fork runs on: ``given``, else the old run's."""
    from cardbus.agents.demo import DEMO_AGENTS
    from cardbus.tools.loading import load_agent

    started = plan.streams[0][1][0]
    assert isinstance(started, ev.RunStarted)
    paths = list(given) or list(started.agent_paths)
    if paths:
        return paths, [load_agent(p) for p in paths]
    # a run from before the paths were kept: the demo's agents, if they are the ones it named
    demo = {a.agent_id: a for a in DEMO_AGENTS}
    named = [a for a in started.agents if a != "rule-planner"]
    unknown = [a for a in named if a not in demo]
    if unknown:
        raise ConfigError(
            f"run {plan.source_root_id} ran on agents {', '.join(sorted(unknown))}, whose"
            " classes its log does not name: give them with --agent module:Class"
        )
    chosen = [demo[a] for a in named] or list(DEMO_AGENTS)
    return [f"{a.__module__}:{a.__name__}" for a in chosen], chosen
