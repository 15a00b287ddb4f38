"""``cardbus rerun ROOT``: run a recorded run again, as a new run.

The events of the new root are ``projections.rerun.plan_rerun``'s; this command
loads the agents (the recorded run's, by import path, with ``--agent`` classes
in place of those of the same id or capabilities), appends the events and runs
them on the embedded runtime.

``--offline``: every task runs again, each model and tool call answered from the
recorded run's log (the journal's strict mode: a call that differs fails its
task with ``replay_diverged`` and the difference); the model is ``OfflineLLM``,
no endpoint, no key. Otherwise ``--task ID`` (with ``--model M`` or ``--agent``)
runs the chosen tasks live (and what depends on them), the rest reused, and
prints the diff against the recorded run.
"""

from __future__ import annotations

import asyncio
from typing import Any

import click
import msgspec

from cardbus.agents.agent import Agent
from cardbus.bus.orchestrator.forks import check_agents, read_rerun, write_run
from cardbus.eventstore import events as ev
from cardbus.eventstore.errors import ValidationError
from cardbus.projections.diff import RunDiff, diff_runs
from cardbus.projections.ids import read_run
from cardbus.projections.rerun import RerunPlan, recorded_model
from cardbus.tools.cli import cli
from cardbus.tools.cmd_diff import diff_text
from cardbus.tools.cmd_inspect import echo_json, json_option, open_store
from cardbus.tools.errors import EXIT_FAILED
from cardbus.tools.llm_options import announce_on_first_call, watch_model_calls
from cardbus.tools.loading import load_agent
from cardbus.tools.mcp_options import mcp_options, mcp_servers
from cardbus.tools.outcome import run_line, see_through
from cardbus.tools.store_option import StoreRef, store_option

__all__ = ["rerun_agents"]


def rerun_agents(recorded: list[str], given: list[type[Agent]]) -> list[type[Agent]]:
    """The recorded agents (import paths), each replaced by a given class of the same id
    or offering all its capabilities; the given classes that replace none are added."""
    out: list[type[Agent]] = []
    used: set[int] = set()
    for path in recorded:
        try:
            agent = load_agent(path)
        except ValidationError as e:
            if given:  # one of the given classes may stand in for it
                continue
            raise ValidationError(f"{e}; give the agents with --agent module:Class") from e
        caps = {c.name for c in agent.capabilities}
        for i, other in enumerate(given):
            offered = {c.name for c in other.capabilities}
            if other.agent_id == agent.agent_id or (caps and caps <= offered):
                agent = other
                used.add(i)
                break
        if agent not in out:
            out.append(agent)
    out += [a for i, a in enumerate(given) if i not in used and a not in out]
    return out


def _failures(events: list[Any]) -> list[dict[str, str]]:
    """The tasks of a run that failed: plan task id, task id, reason and error."""
    keys = {
        e.stream: e.data.plan_id or e.stream for e in events if isinstance(e.data, ev.TaskCreated)
    }
    return [
        {"task": keys.get(e.stream, e.stream), "task_id": e.stream}
        | {"reason": e.data.reason, "error": e.data.error}
        for e in events
        if isinstance(e.data, ev.TaskFailed)
    ]


async def _recorded_model(store: Any, events: list[Any]) -> str:
    """The model the recorded run asked most; for a re-run whose calls were all replayed
    (no request of its own names one), the model of the run it re-ran, and so on back."""
    seen: set[str] = set()
    while True:
        model = recorded_model(events)
        started = next((e.data for e in events if isinstance(e.data, ev.RunStarted)), None)
        origin = started.rerun_of if started is not None else None
        if model or not origin or origin in seen:
            return model
        seen.add(origin)
        events = await read_run(store, origin)


@cli.command()
@click.argument("root")
@click.option("--offline", is_flag=True, help="Answer every call from the log; no endpoint.")
@click.option(
    "--task",
    "tasks",
    multiple=True,
    help="A task (plan task id) to run again live; what depends on it runs again too.",
)
@click.option("--model", default=None, help="The model the chosen --task(s) ask (offered).")
@click.option(
    "--agent", "agent_paths", multiple=True, help="module:Class, in place of a recorded agent."
)
@click.option(
    "--llm-base-url",
    default=None,
    envvar="OPENAI_BASE_URL",
    show_envvar=True,
    help="The endpoint of a live re-run (env OPENAI_BASE_URL); never used --offline.",
)
@store_option
@json_option
@click.option(
    "--timeout",
    default=600.0,
    show_default=True,
    help="Seconds to wait for the run; then it is cancelled and the exit code is 124.",
)
@mcp_options
def rerun(
    root: str,
    offline: bool,
    tasks: tuple[str, ...],
    model: str | None,
    agent_paths: tuple[str, ...],
    llm_base_url: str | None,
    db: StoreRef,
    as_json: bool,
    timeout: float,
    mcp: tuple[str, ...] = (),
    mcp_config: tuple[str, ...] = (),
) -> None:
    """Run the recorded run ROOT again as a new run (its run.started names ROOT in rerun_of).

    --offline: every task again, with the recorded agents (or --agent's), every model
    and tool call answered from ROOT's log with no endpoint; a task that asks something
    else fails with replay_diverged, naming the call and showing the difference.

    --task ID (repeat) with --model M (the agent must offer M) or --agent module:Class:
    those tasks run live, the rest of ROOT's results are reused; then the diff
    against ROOT is printed (cardbus diff). A task to run that no agent here can
    take (a model none offers) is refused before anything is written. Their MCP tools: --mcp /
    --mcp-config, as for `cardbus run`.

    Exit code 0 when the new run completed, 1 otherwise (the last line names
    the task that failed it first and why), 124 after --timeout (the new run
    is cancelled, reason client_timed_out in the log).
    """
    if offline == bool(tasks):
        raise click.UsageError("give --offline, or --task ID (one of them)")
    if offline and model:
        raise click.UsageError("--model is for --task: offline, every call is the recorded one")
    from cardbus.agents.journal import OfflineLLM
    from cardbus.agents.llm import configured_llm, describe_llm
    from cardbus.bus.runtime.embedded import EmbeddedRuntime

    given = [load_agent(p) for p in agent_paths]
    # the live tasks' MCP tools (offline, every call is answered from the log: none needed)
    servers = [] if offline else mcp_servers(mcp, mcp_config)

    async def go() -> tuple[RerunPlan, Any, list[Any], RunDiff | None]:
        store = await open_store(db)
        llm: Any = None
        try:
            events = await read_run(store, root)
            started = next((e.data for e in events if isinstance(e.data, ev.RunStarted)), None)
            recorded = list(started.agent_paths) if started is not None else []
            if not recorded and not given:
                raise ValidationError(
                    "the run recorded no agent import paths: give them with --agent module:Class"
                )
            agents = rerun_agents(recorded, given)
            ids = [a.agent_id for a in agents]
            plan, events = await read_rerun(
                store, root, None if offline else tasks, model=model, agents=ids
            )
            # a task no agent here can take (its capability, or a --model none offers) is
            # refused before anything is written, not left to fail no_capable_agent
            check_agents(plan.streams, [a.card() for a in agents])
            default_model = await _recorded_model(store, events)
            if offline:
                llm = OfflineLLM(default_model)
            else:
                llm = configured_llm(llm_base_url, default_model or None)
            # said once, at the first model call that goes out (none, offline: OfflineLLM
            # refuses it, and the task fails with replay_diverged)
            line = (
                "LLM: none, offline (a model call the recorded run did not make is refused)"
                if offline
                else describe_llm(llm)
            )
            llm = announce_on_first_call(llm, line)
            # started before the run is written: one that cannot start (a tool nothing
            # serves) leaves no run behind; the orchestrator then folds the new run
            async with EmbeddedRuntime(
                store,
                agents,
                llm=llm,
                default_planner=False,
                mcp_servers=servers,
                require_tools=not offline,
                schedules=False,
            ) as rt:
                watch_model_calls(rt.orchestrator, llm)
                await write_run(store, plan.streams, plan.root_id, plan.source_root_id, "rerun")
                result = await see_through(
                    rt.orchestrator.wait(plan.root_id, timeout),
                    store,
                    timeout,
                    "cardbus rerun",
                    root_id=plan.root_id,
                    orchestrator=rt.orchestrator,
                    store_flag=db.flag(),
                )
            new = await store.read_correlation(plan.root_id)
            compared = None if offline else diff_runs(events, new)
            return plan, result, new, compared
        finally:
            await store.close()
            close = getattr(llm, "aclose", None)
            if close is not None:
                await close()

    plan, result, events, compared = asyncio.run(go())
    failures = _failures(events)
    if as_json:
        echo_json(
            {
                "root_id": plan.root_id,
                "rerun_of": plan.source_root_id,
                "offline": plan.offline,
                "rerun": plan.rerun,
                "reused": plan.reused,
                "status": result.status,
                "reason": result.reason,
                "detail": result.detail,
                "outputs": result.outputs,
                "failures": failures,
                "diff": None if compared is None else msgspec.to_builtins(compared),
            }
        )
    else:
        how = "offline" if plan.offline else "live"
        click.echo(
            f"re-ran {plan.source_root_id} as run {plan.root_id} ({how}):"
            f" {len(plan.rerun)} task(s) run again, {len(plan.reused)} result(s) reused"
        )
        for f in failures:
            click.echo(f"task {f['task']} ({f['task_id']}) failed: {f['reason']}")
            click.echo("  " + f["error"].replace("\n", "\n  "))
        if compared is not None:
            for text in diff_text(compared):
                click.echo(text)
        click.echo(f"cardbus diff {plan.source_root_id} {plan.root_id}{db.flag()}")
        click.echo(run_line(result, events))  # last: what failed it, first
    if result.status != "completed":
        raise SystemExit(EXIT_FAILED)
