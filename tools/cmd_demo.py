"""``cardbus demo``: the report pipeline on the embedded default, with its timeline."""

from __future__ import annotations

import io
import textwrap
import time
from collections.abc import Sequence
from typing import Any

import click
import msgspec

from cardbus.agents.demo import DEMO_AGENTS, parallel_plan, report_plan
from cardbus.agents.mcp_config import MCPServer
from cardbus.bus.runtime.embedded import EmbeddedRuntime
from cardbus.bus.runtime.loop import run as run_loop
from cardbus.eventstore import new_id
from cardbus.projections.replay import TaskNode, Timeline, replay, worded_inputs
from cardbus.tools.cli import cli
from cardbus.tools.cmd_plan import planner_option, with_planner_path
from cardbus.tools.errors import EXIT_FAILED
from cardbus.tools.llm_options import close_llm, llm_options, open_llm, watch_model_calls
from cardbus.tools.loading import load_agent
from cardbus.tools.mcp_options import mcp_options, mcp_servers
from cardbus.tools.outcome import failure_json, run_events, run_line, see_through
from cardbus.tools.progress import RunProgress
from cardbus.tools.store_option import StoreRef, open_store_option, store_option

WIDTH = 100  # the demo's output fits a screen 100 columns wide, about 40 lines


def report_text(draft: Any, width: int = WIDTH) -> str:
    """The writer's draft as readable text, its paragraphs wrapped at ``width`` columns."""
    if not isinstance(draft, dict):
        return str(draft)
    lines = [f"# {draft.get('title', '')}"]
    for section in draft.get("sections", []):
        lines += ["", f"## {section.get('heading', '')}"]
        lines += textwrap.wrap(str(section.get("text", "")), width) or [""]
    return "\n".join(lines).rstrip()


def _clip(line: str, width: int) -> str:
    return line if len(line) <= width else line[: width - 1] + "…"


def _calls(node: TaskNode) -> str:
    kinds = [type(c).__name__ for span in node.spans for c in span.calls]
    models, tools = kinds.count("ModelCall"), kinds.count("ToolCall")
    parts = [f"{models} model call{'s' if models != 1 else ''}"] if models else []
    parts += [f"{tools} tool call{'s' if tools != 1 else ''}"] if tools else []
    return ", ".join(parts) or "no model call"


def story_lines(timeline: Timeline, width: int = WIDTH) -> list[str]:
    """The run in a few lines, from its replay: the plan, then each task with who did it
    and the turns it took (input asked for, revisions after review); ``cardbus replay``
    draws every event."""
    lines = [
        f"The run, read back from the log ({timeline.events} events, {timeline.duration_s:.2f} s):"
    ]
    for r in timeline.planning:
        how = f"refused: {'; '.join(r.errors)}" if r.errors else r.outcome
        tasks = " -> ".join(t.split(" (")[0] for t in r.tasks)
        said = f"  planned by {r.agent_id}: {tasks} (round {r.round}, {how})"
        lines.append(_clip(said + worded_inputs(r.from_goal), width))
    rows = [(depth, n) for depth, n in timeline.walk() if n.role != "plan"]
    name_w = max((len(n.task_id) + 2 * depth for depth, n in rows), default=0)
    agent_w = max((len(n.agent_id or "") for _, n in rows), default=0)
    for depth, n in rows:
        turns = [s.reason for s in n.steps if s.kind == "needs_input" and s.reason]
        turns += [
            (s.reason or "").replace("revision requested", "revised after review")
            for s in n.steps
            if s.kind == "revision_requested"
        ]
        what = "; ".join(turns) or _calls(n)
        name = "  " * depth + n.task_id
        row = f"  {name:<{name_w}}  {n.agent_id or '':<{agent_w}}  {n.status}: {what}"
        lines.append(_clip(row, width))
    return lines


def next_lines(root_id: str, flag: str) -> list[str]:
    """Where to go from here: the replay, the console, the docs."""
    return [
        "Where next:",
        f"  cardbus replay {root_id}{flag}   every event, model call and tool call",
        f"  cardbus ui{flag}   the web console: runs, Gantt, graph, cost (http://127.0.0.1:8765)",
        "  docs/tutorials/first-agent.md   write your own agent (make docs-serve: the whole site)",
    ]


def timeline_text(timeline: Timeline) -> str:
    """The run's tree exactly as ``cardbus replay`` draws it, as plain text."""
    from rich.console import Console

    from cardbus.tools.cmd_replay import render_tree

    buf = io.StringIO()
    Console(file=buf, width=200, highlight=False, soft_wrap=False).print(render_tree(timeline))
    return buf.getvalue().rstrip()


def result_json(result: Any, events: list[Any] | None = None) -> dict[str, Any]:
    """A run's result as ``--json`` prints it (demo, orchestrator --plan); ``events``, the
    run's, name the task that failed it (``failure``, None when it completed)."""
    return {
        "root_id": result.root_id,
        "status": result.status,
        "reason": result.reason,
        "failure": failure_json(events or []),
        "outputs": result.outputs,
    }


def goal_plan(topic: str, goal: str | None = None) -> dict[str, Any]:
    """The demo as a goal alone: the report plan's goal and session, for a planner to split.

    The planner sees the session's ``user`` (the writer looks its preferred
    format up in long-term memory), nothing else of it.
    """
    base = report_plan(topic)
    return {
        "goal": goal or base["goal"],
        "session": base["session"],
        "session_fields": ["user"],
    }


def final_draft(outputs: dict[str, Any]) -> Any:
    """The report among a run's outputs: the hand-written plan's ``draft``, or a planned
    plan's last output shaped like a draft (title and sections)."""
    if "draft" in outputs:
        return outputs["draft"]
    drafts = [o for o in outputs.values() if isinstance(o, dict) and "sections" in o]
    return drafts[-1] if drafts else None


async def _demo(
    db: StoreRef,
    parallel: bool,
    topic: str,
    llm_base_url: str | None = None,
    model: str | None = None,
    as_json: bool = False,
    goal: str | None = None,
    planner: str | None = None,
    servers: Sequence[MCPServer] = (),
    timeout: float = 60.0,
) -> int:
    store = await open_store_option(db, create=True)
    llm = open_llm(llm_base_url, model)
    try:
        plan = parallel_plan(topic) if parallel else goal_plan(topic, goal)
        plan["plan_id"] = plan_id = new_id()  # how the progress finds the run in the log
        started = time.perf_counter()
        agents = [load_agent(p) for p in with_planner_path([], planner)]
        async with EmbeddedRuntime(
            store, [*DEMO_AGENTS, *agents], llm=llm, mcp_servers=servers, schedules=False
        ) as rt:
            watch_model_calls(rt.orchestrator, llm)

            async def wait() -> Any:
                if as_json:  # stdout: the result alone
                    return await rt.run(plan, timeout=timeout)
                async with RunProgress(store, plan_id, db.flag(), echo=click.echo, changes=False):
                    return await rt.run(plan, timeout=timeout)

            result = await see_through(
                wait(),
                store,
                timeout,
                "cardbus demo",
                plan_id=plan_id,
                orchestrator=rt.orchestrator,
                store_flag=db.flag(),
            )
        elapsed = time.perf_counter() - started
        events = [] if result.status == "completed" else await run_events(store, result)
        if as_json:
            click.echo(msgspec.json.encode(result_json(result, events)).decode())
            return 0 if result.status == "completed" else EXIT_FAILED
        click.echo(f"run {result.root_id}: {result.status} in {elapsed:.2f} s")
        click.echo("")
        click.echo(report_text(final_draft(result.outputs)))
        click.echo("")
        for line in story_lines(await replay(store, result.root_id)):
            click.echo(line)
        click.echo("")
        for line in next_lines(result.root_id, db.flag()):
            click.echo(line)
        if result.status != "completed":  # last: what failed it, first
            click.echo(run_line(result, events))
        return 0 if result.status == "completed" else EXIT_FAILED
    finally:
        await store.close()
        await close_llm(llm)


@cli.command()
@store_option
@click.option(
    "--json", "as_json", is_flag=True, help="Print the result (root id, outputs) as JSON."
)
@click.option("--parallel", is_flag=True, help="Research three subtopics in parallel, then merge.")
@click.option("--topic", default="ocean tides", show_default=True)
@click.option(
    "--goal",
    default=None,
    help="The goal to plan (default: Write a short report on TOPIC); not with --parallel.",
)
@click.option(
    "--timeout",
    default=60.0,
    show_default=True,
    help="Seconds to wait for the run; then it is cancelled and the exit code is 124.",
)
@click.option("--nats", "nats_url", default=None, help="Run across NATS at this URL instead.")
@click.option("--start-nats", is_flag=True, help="Start a local nats-server for the run.")
@click.option(
    "--external-agents", is_flag=True, help="With --nats: agents come from `agent serve`."
)
@planner_option
@llm_options
@mcp_options
def demo(
    db: StoreRef,
    as_json: bool,
    parallel: bool,
    topic: str,
    goal: str | None = None,
    timeout: float = 60.0,
    nats_url: str | None = None,
    start_nats: bool = False,
    external_agents: bool = False,
    planner: str | None = None,
    llm_base_url: str | None = None,
    model: str | None = None,
    mcp: tuple[str, ...] = (),
    mcp_config: tuple[str, ...] = (),
) -> None:
    """Run the demo report pipeline on the embedded default (SQLite + in-process bus).

    The pipeline is planned from a goal by the rule planner (research ->
    outline -> write, reviewed); the planning rounds are printed with the
    timeline. --parallel runs a hand-written plan: three research tasks, merged.

    With --nats URL (or --start-nats) it runs on NATS JetStream instead: the
    orchestrator in this process, the agents in this process too unless
    --external-agents (then `cardbus agent serve` processes do the work).

    Exit code 0 when the run completed, 1 when it did not (the last line
    names the task that failed it and why), 124 after --timeout (the run is
    cancelled, reason client_timed_out in the log).
    """
    servers = mcp_servers(mcp, mcp_config)
    if nats_url or start_nats:
        from cardbus.tools.cmd_nats import demo_on_nats

        raise SystemExit(
            demo_on_nats(
                nats_url,
                start_nats,
                parallel,
                topic,
                external_agents,
                as_json,
                llm_base_url,
                model,
                mcp_servers=servers,
                timeout=timeout,
            )
        )
    raise SystemExit(
        run_loop(
            _demo(
                db, parallel, topic, llm_base_url, model, as_json, goal, planner, servers, timeout
            )
        )
    )
