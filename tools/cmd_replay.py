"""``cardbus replay``: the timeline of a task or a run, from the log alone."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from cardbus.projections import (
    AsOf,
    Step,
    TaskNode,
    Timeline,
    render_html,
    replay,
    resolve_id,
)
from cardbus.projections.replay import (
    AttemptSpan,
    Call,
    EffectUnknown,
    ModelCall,
    ToolCall,
    answer_excerpt,
    one_line,
    prompt_excerpt,
)
from cardbus.tools.cli import cli
from cardbus.tools.cmd_inspect import (
    as_of_option,
    echo_json,
    fmt_duration,
    fmt_time,
    json_option,
    open_store,
    print_rich,
    run,
    styled_status,
)
from cardbus.tools.store_option import StoreRef, store_option


def _step_line(step: Step, start: float, changed: bool = True) -> Any:
    """One step; its task's status after it only where the step changed it (``changed``):
    a result awaiting its check leaves the task as it was, and "-> dispatched" after
    it read as if the task had gone back."""
    from rich.text import Text

    line = Text()
    line.append(fmt_time(step.time)[11:], style="dim")
    line.append(f" +{fmt_duration(step.time - start):<9}", style="dim")
    line.append(f"{fmt_duration(step.duration_s):>8}  ", style="dim")
    line.append(f"{step.kind:<18}", style="bold")
    if step.attempt is not None:
        line.append(f" #{step.attempt}")
    if step.agent_id:
        line.append(f" {step.agent_id}", style="cyan")
    if step.status and changed:
        line.append(f" -> {step.status}")
    if step.reason:
        line.append(f"  {step.reason}", style="red")
    elif step.detail:
        line.append(f"  {step.detail}", style="dim")
    return line


def _task_label(n: TaskNode) -> str:
    from rich.markup import escape

    label = f"[bold]{n.capability or '?'}[/] {n.task_id}  {styled_status(n.status)}"
    if n.agent_id:
        label += f"  agent [cyan]{n.agent_id}[/]"
    label += f"  attempts {n.attempts}  {fmt_duration(n.duration_s)}"
    if not n.quality_met:
        issues = "; ".join(f"[{i.severity}] {i.section}: {i.suggestion}" for i in n.open_issues)
        label += "  [yellow]quality not met[/]" + (f" ({escape(issues)})" if issues else "")
    return label


def _how(replayed_from: str | None) -> tuple[str, str]:
    if replayed_from:
        return f"replayed from {replayed_from}", "yellow"
    return "live", "green"


def call_line(call: Call) -> Any:
    """One journaled call on one line: a model call with its prompt and answer in short,
    a tool call with its arguments and result, an unknown effect with its decision."""
    from rich.text import Text

    line = Text()
    match call:
        case ModelCall():
            line.append(f"model #{call.seq:<3}", style="bold")
            line.append(f" {call.response_model or call.model or '?'}", style="cyan")
            line.append(f"  {call.input_tokens}+{call.output_tokens} tokens")
            line.append(f"  {fmt_duration(call.latency_s)}", style="dim")
            how, style = _how(call.replayed_from)
            if call.status == "open":
                how, style = "no answer recorded", "red"
            line.append(f"  {how}", style=style)
            line.append(f'  "{prompt_excerpt(call)}"', style="dim")
            line.append(" -> ")
            line.append(f'"{answer_excerpt(call)}"', style="red" if call.error else "")
        case ToolCall():
            line.append(f"tool  #{call.seq:<3}", style="bold")
            line.append(f" {call.tool}", style="cyan")
            line.append(f"({one_line(call.arguments, 40) if call.arguments is not None else ''})")
            if call.error is not None:
                line.append(f" -> error {call.error_type or ''}: {one_line(call.error, 50)}", "red")
            elif call.status in ("open", "unknown"):
                line.append(" -> no result recorded", style="red")
            else:
                line.append(f" -> {one_line(call.result, 50)}")
            how, style = _how(call.replayed_from)
            if call.status in ("open", "unknown"):
                how = "effect unknown" if call.status == "unknown" else "still running or lost"
            line.append(f"  {how}", style=style)
            if call.idempotency_key:
                line.append(f"  key {call.idempotency_key}", style="dim")
        case EffectUnknown():
            line.append(f"effect unknown #{call.seq}", style="bold red")
            line.append(f" {call.tool}", style="cyan")
            line.append(f"  call {call.requested_event_id}  key {call.idempotency_key}", "dim")
            line.append(f"  decision {call.decision}", style="bold")
    return line


def _attempt_label(a: AttemptSpan) -> str:
    models = [c for c in a.calls if isinstance(c, ModelCall)]
    tools = [c for c in a.calls if isinstance(c, ToolCall)]
    replayed = sum(1 for c in models if c.replayed_from) + sum(1 for c in tools if c.replayed_from)
    label = f"[bold]attempt #{a.attempt}[/] [cyan]{a.agent_id}[/] ({a.outcome}):"
    label += f" {len(models)} model call(s), {len(tools)} tool call(s)"
    return label + (f", {replayed} replayed" if replayed else "")


def render_tree(t: Timeline) -> Any:
    from rich.tree import Tree

    kind = "run" if t.id == t.root_id else "task"
    head = (
        f"[bold]replay of {kind} {t.id}[/]  root {t.root_id}  {t.events} events"
        f"  {fmt_time(t.start)} .. {fmt_time(t.end)[11:]} ({fmt_duration(t.duration_s)})"
    )
    if t.as_of:
        head += f"  [yellow]as of {t.as_of}[/]"
    tree = Tree(head)
    for s in t.run:
        tree.add(_step_line(s, t.start))

    def add(parent: Any, n: TaskNode) -> None:
        branch = parent.add(_task_label(n))
        before = None  # the task's status as the steps so far left it
        for s in n.steps:
            branch.add(_step_line(s, t.start, s.status != before))
            before = s.status or before  # a tool or memory step carries none
        for a in n.spans:  # what each attempt asked models and tools (the journal)
            if a.calls:
                calls = branch.add(_attempt_label(a))
                for call in a.calls:
                    calls.add(call_line(call))
        if n.calls:
            calls = branch.add("[bold]calls outside the attempts shown[/]")
            for call in n.calls:
                calls.add(call_line(call))
        for c in n.children:
            add(branch, c)

    for n in t.tasks:
        add(tree, n)
    return tree


@cli.command("replay")
@click.argument("task_id")
@store_option
@json_option
@as_of_option
@click.option(
    "--html",
    "html_path",
    default=None,
    type=click.Path(dir_okay=False, writable=True, path_type=Path),
    help="Also write a self-contained HTML page with a Gantt timeline to this file.",
)
def replay_cmd(
    task_id: str, db: StoreRef, as_json: bool, as_of: str | None, html_path: Path | None
) -> None:
    """Timeline of a task (or a run, by root id) and all its subtasks, from the log.

    TASK_ID is a task or root id, a plan id, or a unique prefix of one. The
    log is a SQLite file or a JetStream log (--store nats://...).
    """
    show_replay(task_id, db, as_json, as_of, html_path)


def show_replay(
    task_id: str, db: StoreRef, as_json: bool, as_of: str | None, html_path: Path | None
) -> None:
    """``cardbus replay`` (also behind the deprecated ``cardbus nats replay``)."""
    point = AsOf.parse(as_of) if as_of else None

    async def go() -> Timeline:
        store = await open_store(db)
        try:
            return await replay(store, await resolve_id(store, task_id), point)
        finally:
            await store.close()

    timeline = run(go())
    if html_path is not None:
        html_path.write_text(render_html(timeline), encoding="utf-8")
    if as_json:
        echo_json(timeline)
    else:
        print_rich(render_tree(timeline))
        if html_path is not None:
            click.echo(f"wrote {html_path}")
