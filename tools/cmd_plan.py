"""``cardbus plan "GOAL"``: plan a goal with the planner agents and print the checked plan."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import click
import msgspec

from cardbus.tools.cli import cli
from cardbus.tools.errors import TimedOut
from cardbus.tools.llm_options import close_llm, llm_options, open_llm

#: the agents a goal is planned over when no --agent is given
DEMO_AGENT_PATHS = [
    "cardbus.agents.demo:Researcher",
    "cardbus.agents.demo:Planner",
    "cardbus.agents.demo:Writer",
    "cardbus.agents.demo:Reviewer",
    "cardbus.agents.demo:Merger",
]


#: ``--planner``: the planner agent added for a goal
PLANNER_PATHS = {
    "rule": "cardbus.agents.planning:RulePlanner",
    "llm": "cardbus.agents.planning:LLMPlanner",
}


def planner_option(f: Any) -> Any:
    """``--planner rule|llm`` (keyword ``planner``), shared by ``plan``, ``run`` and ``demo``."""
    return click.option(
        "--planner",
        type=click.Choice(sorted(PLANNER_PATHS)),
        default=None,
        help="The planner for a goal: rule (no model) or llm (asks the model of"
        " --llm-base-url/--model). Default: an --agent offering plan, else rule.",
    )(f)


def with_planner_path(paths: list[str], planner: str | None) -> list[str]:
    """``paths`` and the ``--planner``'s agent, if one was chosen."""
    if planner is None or PLANNER_PATHS[planner] in paths:
        return paths
    return [*paths, PLANNER_PATHS[planner]]


def goal_plan(
    goal: str,
    agent_paths: list[str],
    capabilities: tuple[str, ...] = (),
    final_capability: str | None = None,
    final_output: str | None = None,
    max_tasks: int | None = None,
    max_plan_rounds: int | None = None,
    budget_tokens: int | None = None,
    inputs: tuple[str, ...] = (),
) -> dict[str, Any]:
    """A goal alone in the plan format, with the limits given on the command line.

    ``inputs`` (``--input NAME=VALUE``) go into the session, and the planner sees them
    (``session_fields``): an input of that name takes the value (``NAME.FIELD=VALUE``:
    only the task planned to feed the input ``NAME``).
    """
    limits = {
        "capabilities": list(capabilities) or None,
        "final_capability": final_capability,
        "final_output": final_output,
        "max_tasks": max_tasks,
    }
    plan: dict[str, Any] = {"goal": goal, "agents": agent_paths}
    if any(v is not None for v in limits.values()):
        plan["limits"] = {k: v for k, v in limits.items() if v is not None}
    if max_plan_rounds is not None:
        plan["max_plan_rounds"] = max_plan_rounds
    if budget_tokens is not None:
        plan["budget_tokens"] = budget_tokens
    session = parse_inputs(inputs)
    if session:
        plan["session"] = session
        plan["session_fields"] = list(session)
    return plan


def parse_inputs(inputs: tuple[str, ...]) -> dict[str, str]:
    """``("region=East", ...)`` as ``{"region": "East"}``; ``UsageError`` for one without ``=``."""
    out: dict[str, str] = {}
    for item in inputs:
        name, sep, value = item.partition("=")
        if not sep or not name.strip():
            raise click.UsageError(f"--input {item!r}: give NAME=VALUE (e.g. --input region=East)")
        out[name.strip()] = value
    return out


def limit_options(f: Any) -> Any:
    """The planning limits, shared by ``cardbus plan`` and ``cardbus run --goal``."""
    for option in reversed(
        [
            click.option(
                "--capability",
                "capabilities",
                multiple=True,
                help="A capability the plan may use (repeat; default: all).",
            ),
            click.option("--final-capability", default=None, help="The capability to end with."),
            click.option("--final-output", default=None, help="The output type to end with."),
            click.option("--max-tasks", type=int, default=None, help="At most this many tasks."),
            click.option(
                "--input",
                "inputs",
                multiple=True,
                metavar="NAME=VALUE",
                help="A value for the input NAME of the planned tasks (repeat; NAME.FIELD=VALUE:"
                " the input FIELD of the task feeding NAME). Kept in the run's session.",
            ),
            click.option(
                "--max-plan-rounds",
                type=int,
                default=None,
                help="Proposals in all before giving up (default: the policy's, 3).",
            ),
        ]
    ):
        f = option(f)
    return f


def describe(plan: Any, from_goal: dict[str, list[str]] | None = None) -> str:
    """A checked plan as lines: each task, its capability, deps, inputs and reviewer.

    ``from_goal``: the inputs given the goal's own words (task id -> names), each
    marked "(taken from the goal)" so that it is never read as a value someone gave.
    """
    lines = []
    width = max(len(t.id) for t in plan.tasks)
    worded = from_goal or {}
    for t in plan.tasks:
        inputs = ", ".join(
            f"{k}={_short(v)}" + (" (taken from the goal)" if k in worded.get(t.id, []) else "")
            for k, v in sorted(t.inputs.items(), key=lambda kv: kv[0])
        )
        line = f"  {t.id:<{width}}  {t.capability}"
        if t.deps:
            line += f"  after {', '.join(t.deps)}"
        if t.review_by:
            line += f"  reviewed by {t.review_by}"
        if t.optional:  # the run can do without it
            line += "  (optional)"
        lines.append(line)
        if inputs:
            lines.append(f"  {'':<{width}}    inputs: {inputs}")
    return "\n".join(lines)


def _compact(value: Any) -> Any:
    """A plan as JSON of the plan format, fields at their default left out."""
    if isinstance(value, msgspec.Struct):
        out = {}
        for f in msgspec.structs.fields(value):
            v = getattr(value, f.name)
            default = f.default
            if default is msgspec.NODEFAULT and f.default_factory is not msgspec.NODEFAULT:
                default = f.default_factory()
            if default is msgspec.NODEFAULT or v != default:
                out[f.encode_name] = _compact(v)
        return out
    if isinstance(value, dict):
        return {k: _compact(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_compact(v) for v in value]
    return msgspec.to_builtins(value)


def _short(value: Any) -> str:
    if isinstance(value, dict) and "$dep" in value:
        return f"<{value['$dep']}.{value.get('path', '')}>".replace(".>", ">")
    text = json.dumps(value)
    return text if len(text) <= 40 else text[:37] + "..."


@cli.command("plan")
@click.argument("goal")
@click.option(
    "--agent",
    "agent_paths",
    multiple=True,
    help="module:Class of an agent to plan over (repeat; default: the demo's agents).",
)
@limit_options
@click.option("--json", "as_json", is_flag=True, help="Print the plan file (JSON) instead.")
@click.option(
    "-o",
    "--out",
    type=click.Path(dir_okay=False, writable=True, path_type=Path),
    default=None,
    help="Also write the plan file here (for cardbus run PLAN.json).",
)
@click.option(
    "--timeout",
    default=120.0,
    show_default=True,
    help="Seconds to wait for a plan; then the exit code is 124.",
)
@planner_option
@llm_options
def plan_cmd(
    goal: str,
    agent_paths: tuple[str, ...],
    capabilities: tuple[str, ...],
    final_capability: str | None,
    final_output: str | None,
    max_tasks: int | None,
    inputs: tuple[str, ...],
    max_plan_rounds: int | None,
    as_json: bool,
    out: Path | None,
    timeout: float,
    planner: str | None = None,
    llm_base_url: str | None = None,
    model: str | None = None,
) -> None:
    """Plan GOAL over the agents' cards and print the checked plan; nothing runs.

    The planner is an agent offering the capability plan among --agent (the
    rule planner when none does); its proposals are checked exactly as a
    plan file would be, on a throw-away log in memory. Exit code 1 when no
    proposal passed, 124 when --timeout passed first.
    """
    from cardbus.bus.runtime.embedded import plan_goal
    from cardbus.tools.loading import load_agent

    paths = with_planner_path(list(agent_paths) or DEMO_AGENT_PATHS, planner)
    agents = [load_agent(p) for p in paths]
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

    async def go() -> Any:
        llm = open_llm(llm_base_url, model)
        try:
            return await plan_goal(spec, agents, llm=llm, timeout=timeout)
        except TimeoutError:
            raise TimedOut(
                f"timed out after {timeout:g} s waiting for a plan for {goal!r}; nothing was"
                " written (planning runs on a log in memory)"
            ) from None
        finally:
            await close_llm(llm)

    planned = asyncio.run(go())
    for r in planned.rounds:
        if r.outcome == "refused":
            click.echo(f"round {r.round} by {r.agent_id}: refused: {'; '.join(r.errors)}", err=True)
    if planned.plan is None:
        raise click.ClickException(
            f"no plan for {goal!r}: {planned.reason}"
            + (f" ({planned.detail})" if planned.detail else "")
        )
    text = json.dumps(_compact(planned.plan), indent=2)
    if out is not None:
        out.write_text(text + "\n", encoding="utf-8")
    if as_json:
        click.echo(text)
        return
    last = planned.rounds[-1]
    click.echo(
        f"Plan for {goal!r}: {len(planned.plan.tasks)} tasks, checked"
        f" (by {last.agent_id}, round {last.round} of {len(planned.rounds)};"
        f" {planned.events} events, {planned.duration_s * 1000:.0f} ms)"
    )
    click.echo(describe(planned.plan, planned.plan.from_goal))
    if out is not None:
        click.echo(f"Written to {out}: cardbus run {out}")
