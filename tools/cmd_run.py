"""``cardbus run`` (a plan file on the embedded default), ``approve`` and ``deny``."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import click
import msgspec

from cardbus.agents.mcp_config import MCPServer, split_plan_servers
from cardbus.bus.orchestrator.core import RunResult
from cardbus.bus.orchestrator.effects import NO_RESULT, UnknownEffect, record_effect_done
from cardbus.bus.orchestrator.loop_pause import answer_word
from cardbus.bus.orchestrator.plan import as_plan, decode_plan
from cardbus.bus.orchestrator.policy import Policy
from cardbus.bus.runtime.embedded import EmbeddedRuntime
from cardbus.bus.runtime.loop import run as run_loop
from cardbus.eventstore import new_id
from cardbus.eventstore.errors import ConfigError
from cardbus.projections import resolve_id
from cardbus.tools.cli import cli
from cardbus.tools.cmd_plan import (
    DEMO_AGENT_PATHS,
    goal_plan,
    limit_options,
    planner_option,
    with_planner_path,
)
from cardbus.tools.errors import EXIT_FAILED
from cardbus.tools.follow import Follow
from cardbus.tools.llm_options import close_llm, llm_options, open_llm, watch_model_calls
from cardbus.tools.loading import load_agent
from cardbus.tools.mcp_options import mcp_options, mcp_servers
from cardbus.tools.memory_options import memory_options, with_context
from cardbus.tools.outcome import failure_json, run_events, run_line, see_through
from cardbus.tools.progress import RunProgress
from cardbus.tools.store_option import StoreRef, open_store_option, store_option


@cli.command()
@click.argument(
    "plan_file", required=False, type=click.Path(exists=True, dir_okay=False, path_type=Path)
)
@click.option("--goal", default=None, help="Plan this goal and run it (instead of PLAN_FILE).")
@limit_options
@store_option
@click.option("--agent", "agent_paths", multiple=True, help="module:Class, added to the plan's.")
@click.option(
    "--timeout",
    default=600.0,
    show_default=True,
    help="Seconds to wait for the run; then it is cancelled and the exit code is 124.",
)
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
@click.option(
    "--follow",
    is_flag=True,
    help="Print every step (model and tool calls too) and the models' text as it is written.",
)
@click.option(
    "--priority",
    type=int,
    default=None,
    help="Serve this run before lower priorities (admission, model limits); default: the plan's.",
)
@click.option(
    "--on-loop",
    type=click.Choice(["halt", "pause"]),
    default="halt",
    show_default=True,
    help="A loop detected halts the run, or pauses it for a person (cardbus approve/deny RUN).",
)
@click.option(
    "--notify-url",
    default="",
    metavar="URL",
    help="POST a notice (signed with $CARDBUS_NOTIFY_SECRET) when a person's word is awaited.",
)
@planner_option
@llm_options
@mcp_options
@memory_options
def run(
    plan_file: Path | None,
    goal: str | None,
    capabilities: tuple[str, ...],
    final_capability: str | None,
    final_output: str | None,
    max_tasks: int | None,
    inputs: tuple[str, ...],
    max_plan_rounds: int | None,
    db: StoreRef,
    agent_paths: tuple[str, ...],
    timeout: float,
    as_json: bool,
    follow: bool = False,
    priority: int | None = None,
    on_loop: str = "halt",
    notify_url: str = "",
    planner: str | None = None,
    llm_base_url: str | None = None,
    model: str | None = None,
    mcp: tuple[str, ...] = (),
    mcp_config: tuple[str, ...] = (),
    user: str | None = None,
    tenant: str | None = None,
    reuse: bool = False,
    reuse_max_age: float = 24 * 3600.0,
) -> None:
    """Run PLAN_FILE (JSON) with the agents it names, on the log --store (in this process).

    With --goal GOAL instead, a planner agent (the rule planner unless an
    --agent offers the capability plan) splits the goal into tasks over the
    agents' cards (the demo's agents unless --agent names others), and the
    checked plan runs; the planning rounds are in the log (cardbus replay).

    It prints the root id first, then each task's progress (a live display
    on a terminal; one line per change otherwise, and the `cardbus approve`
    command for a task that waits for approval), then the result (--json:
    the result alone, with the outputs). --follow: every step, model and tool calls
    included, and the text of the models' answers as it is written.

    --user/--tenant name whose long-term memory the run reads and writes
    (its scope chain); --reuse keeps completed tasks' results and answers
    identical later tasks from them (task.completed says reused, and from where).

    MCP servers (--mcp, --mcp-config, and the plan file's "mcp_servers") are
    started for the run; their tools are NAME__<tool> (the plan's agents must
    allow them, e.g. "NAME__*").

    Running a plan with a plan_id that is already in the log resumes that
    run instead of starting another: after a crash, run the same command.

    The last line names the task that failed the run first and why. Exit
    code 0 when the run completed, 1 when it failed (or halted), 124 when
    --timeout passed: the run is then cancelled (reason client_timed_out in
    the log), since its agents stop with this command.
    """
    if (plan_file is None) == (goal is None):
        raise click.UsageError("give PLAN_FILE or --goal GOAL (one of them)")
    if inputs and goal is None:
        raise click.UsageError("--input is for --goal (a plan file gives its tasks' inputs)")
    plan_servers: list[MCPServer] = []
    if goal is not None:
        paths = with_planner_path(list(agent_paths) or DEMO_AGENT_PATHS, planner)
        spec = goal_plan(
            goal,
            paths,
            capabilities,
            final_capability,
            final_output,
            max_tasks,
            max_plan_rounds,
            inputs=inputs,
        )
        plan = as_plan(spec)
        agents = [load_agent(p) for p in paths]
    else:
        assert plan_file is not None
        data, plan_servers = split_plan_servers(plan_file.read_bytes())
        plan = decode_plan(data)
        paths = with_planner_path([*plan.agents, *agent_paths], planner)
        agents = [load_agent(p) for p in paths]

    servers = mcp_servers(mcp, mcp_config, plan_servers)
    # the run is found in the log by its plan id (a plan without one gets it here)
    plan = msgspec.structs.replace(plan, plan_id=plan.plan_id or new_id())
    if priority is not None:
        plan = msgspec.structs.replace(plan, priority=priority)
    plan, reuse_policy = with_context(plan, user, tenant, reuse, reuse_max_age)
    try:
        policy = Policy(on_loop=on_loop, notify_url=notify_url)  # type: ignore[arg-type]
    except ConfigError as e:
        raise click.BadParameter(str(e), param_hint="--notify-url") from e

    async def go() -> None:
        store = await open_store_option(db, create=True)
        llm = open_llm(llm_base_url, model, agents)
        try:
            async with EmbeddedRuntime(
                store,
                agents,
                llm=llm,
                mcp_servers=servers,
                reuse=reuse_policy,
                policy=policy,
                schedules=False,  # it runs its plan and exits: the schedules are not its
            ) as rt:
                watch_model_calls(rt.orchestrator, llm)

                async def wait() -> RunResult:
                    if as_json:  # stdout: the result alone
                        return await rt.run(plan, timeout)
                    assert plan.plan_id is not None
                    following = Follow(rt.bus)  # writes and flushes: a piece shows as it comes
                    if follow:
                        await following.start()
                    try:
                        async with RunProgress(
                            store,
                            plan.plan_id,
                            db.flag(),
                            echo=click.echo,
                            follow=following if follow else None,
                        ):
                            return await rt.run(plan, timeout)
                    finally:
                        await following.stop()

                result = await see_through(
                    wait(),
                    store,
                    timeout,
                    "cardbus run",
                    plan_id=plan.plan_id,
                    orchestrator=rt.orchestrator,
                    store_flag=db.flag(),
                )
            events = [] if result.status == "completed" else await run_events(store, result)
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
                        "detail": result.detail,
                        "failure": failure_json(events),
                        "outputs": result.outputs,
                        "quality_met": result.quality_met,
                        "open_issues": msgspec.to_builtins(result.open_issues),
                        "degraded": result.degraded,
                    }
                )
            )
        else:
            click.echo(run_line(result, events))
            if not result.quality_met:  # completed, but a review never passed
                click.echo("quality not met:")
                for name, issues in result.open_issues.items():
                    shown = "; ".join(f"[{i.severity}] {i.section}: {i.suggestion}" for i in issues)
                    click.echo(f"  {name}: {shown or 'the review did not pass'}")
        if result.status != "completed":
            raise SystemExit(EXIT_FAILED)  # a failed run; 2 is click's usage error

    run_loop(go())


def _answer(
    text: str,
    granted: bool,
    db: StoreRef,
    by: str,
    note: str,
    as_json: bool,
    inputs: dict[str, Any] | None = None,
) -> None:
    async def go() -> tuple[str, str]:
        store = await open_store_option(db)
        try:
            the_id = await resolve_id(store, text)  # a full id or a unique prefix
            return the_id, await answer_word(store, the_id, granted, by, note, inputs)
        finally:
            await store.close()

    the_id, answer = run_loop(go())
    if as_json:
        out = {"task_id": the_id, "answer": answer, "by": by, "note": note}
        click.echo(json.dumps(out | ({"inputs": inputs} if inputs is not None else {})))
    else:
        click.echo(f"{the_id}: {answer} by {by}")


_by = click.option("--by", default="cli", show_default=True, help="Who answers.")
_note = click.option("--note", default="", help="A note kept in the event.")
_json = click.option("--json", "as_json", is_flag=True, help="Print the answer as JSON.")


@cli.command()
@click.argument("task_id")
@store_option
@_by
@_note
@_json
@click.option(
    "--done",
    is_flag=True,
    help="A tool call whose effect is unknown happened: record it as done (with --result)"
    " instead of calling it again; the run goes on with that result.",
)
@click.option(
    "--result",
    "result_json",
    default=None,
    metavar="JSON",
    help="With --done: the call's result, as JSON (default: confirm the result the log has).",
)
@click.option(
    "--call",
    default="",
    help="With --done: which call (its tool.requested id or key, or a prefix), when several wait.",
)
@click.option(
    "--inputs",
    "inputs_json",
    default=None,
    metavar="JSON",
    help="A paused run: the paused task goes on with these inputs (merged over its own).",
)
def approve(
    task_id: str,
    db: StoreRef,
    by: str,
    note: str,
    as_json: bool,
    done: bool,
    result_json: str | None,
    call: str,
    inputs_json: str | None,
) -> None:
    """Approve TASK_ID, which is waiting for approval, or resume a paused run.

    A task waiting on a tool call whose effect is unknown (tool_effect_unknown) calls it
    again with its idempotency key; with --done, the call is recorded as done instead,
    with the result given (--result) or the one the log has, and the run goes on.

    Given a run paused on a loop (Policy on_loop "pause", cardbus run --on-loop pause),
    the paused task goes on past the loop, with --inputs JSON merged over its inputs.
    An approval escalated by its deadline is answered only by the approvers it names.
    """
    inputs: dict[str, Any] | None = None
    if inputs_json is not None:
        try:
            inputs = json.loads(inputs_json)
        except ValueError as e:
            raise click.BadParameter(f"not JSON: {e}", param_hint="--inputs") from e
        if not isinstance(inputs, dict) or done:
            raise click.BadParameter("a JSON object, without --done", param_hint="--inputs")
    if not done:
        if result_json is not None or call:
            raise click.UsageError("--result and --call go with --done")
        _answer(task_id, True, db, by, note, as_json, inputs)
        return
    result: Any = NO_RESULT
    if result_json is not None:
        try:
            result = json.loads(result_json)
        except ValueError as e:
            raise click.BadParameter(f"not JSON: {e}", param_hint="--result") from e
    _record_done(task_id, db, by, note, as_json, result, call)


def _record_done(
    text: str, db: StoreRef, by: str, note: str, as_json: bool, result: Any, call: str
) -> None:
    async def go() -> tuple[str, UnknownEffect]:
        store = await open_store_option(db)
        try:
            task_id = await resolve_id(store, text)  # a full id or a unique prefix
            effect = await record_effect_done(
                store, task_id, by=by, result=result, call=call, note=note
            )
            return task_id, effect
        finally:
            await store.close()

    task_id, effect = run_loop(go())
    if as_json:
        out = {"task_id": task_id, "answer": "done", "by": by, "note": note}
        click.echo(json.dumps(out | {"call": effect.call, "tool": effect.tool, "key": effect.key}))
    else:
        click.echo(
            f"{task_id}: {effect.tool} (call {effect.call}, key {effect.key}) recorded as done"
            f" by {by}"
        )


@cli.command()
@click.argument("task_id")
@store_option
@_by
@_note
@_json
def deny(task_id: str, db: StoreRef, by: str, note: str, as_json: bool) -> None:
    """Deny TASK_ID, which is waiting for approval (it is cancelled), or stop a paused run
    (it halts, loop_detected)."""
    _answer(task_id, False, db, by, note, as_json)
