"""``cardbus replay``: the timeline of a task or a run, from the log alone."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click
import msgspec

from cardbus.projections import (
    AsOf,
    Step,
    TaskNode,
    Timeline,
    render_html,
    replay,
    resolve_id,
)
from cardbus.projections.pricing import PriceTable, format_usd
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
from cardbus.tools.costs import (
    attempt_money,
    call_cost,
    prices_option,
    say_unpriced,
    task_money,
    timeline_money,
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


def _task_label(n: TaskNode, prices: PriceTable | None = None) -> str:
    from rich.markup import escape

    label = f"[bold]{n.capability or '?'}[/] {n.task_id}  {styled_status(n.status)}"
    if n.agent_id:
        label += f"  agent [cyan]{n.agent_id}[/]"
    label += f"  attempts {n.attempts}  {fmt_duration(n.duration_s)}"
    money = task_money(n, prices or PriceTable())
    if money.priced or money.unknown:
        label += f"  cost {money.text()}"
    if not n.quality_met:
        issues = "; ".join(f"[{i.severity}] {i.section}: {i.suggestion}" for i in n.open_issues)
        label += "  [yellow]quality not met[/]" + (f" ({escape(issues)})" if issues else "")
    return label


def _how(replayed_from: str | None) -> tuple[str, str]:
    if replayed_from:
        return f"replayed from {replayed_from}", "yellow"
    return "live", "green"


def call_line(call: Call, prices: PriceTable | None = None) -> Any:
    """One journaled call on one line: a model call with its prompt and answer in short
    (and its cost), a tool call with its arguments and result, an unknown effect with its
    decision."""
    from rich.text import Text

    line = Text()
    match call:
        case ModelCall():
            line.append(f"model #{call.seq:<3}", style="bold")
            line.append(f" {call.response_model or call.model or '?'}", style="cyan")
            line.append(f"  {call.input_tokens}+{call.output_tokens} tokens")
            if call.status != "open":
                cost = call_cost(call, prices or PriceTable())
                line.append(f"  {'unknown price' if cost is None else format_usd(cost)}")
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


def _attempt_label(a: AttemptSpan, prices: PriceTable | None = None) -> str:
    models = [c for c in a.calls if isinstance(c, ModelCall)]
    tools = [c for c in a.calls if isinstance(c, ToolCall)]
    replayed = sum(1 for c in models if c.replayed_from) + sum(1 for c in tools if c.replayed_from)
    label = f"[bold]attempt #{a.attempt}[/] [cyan]{a.agent_id}[/] ({a.outcome}):"
    label += f" {len(models)} model call(s), {len(tools)} tool call(s)"
    label += f", {replayed} replayed" if replayed else ""
    if models:
        label += f"; cost {attempt_money(a, prices or PriceTable()).text()}"
    return label


def _walk_json(body: dict[str, Any]) -> list[dict[str, Any]]:
    """The task nodes of a timeline's JSON, in ``Timeline.walk`` order."""
    out: list[dict[str, Any]] = []

    def visit(n: dict[str, Any]) -> None:
        out.append(n)
        for c in n.get("children", []):
            visit(c)

    for t in body.get("tasks", []):
        visit(t)
    return out


def render_tree(t: Timeline, prices: PriceTable | None = None) -> Any:
    from rich.tree import Tree

    prices = prices or PriceTable()
    kind = "run" if t.id == t.root_id else "task"
    head = (
        f"[bold]replay of {kind} {t.id}[/]  root {t.root_id}  {t.events} events"
        f"  {fmt_time(t.start)} .. {fmt_time(t.end)[11:]} ({fmt_duration(t.duration_s)})"
    )
    money = timeline_money(t, prices)
    if money.priced or money.unknown:
        head += f"  cost {money.text()}"
    if t.as_of:
        head += f"  [yellow]as of {t.as_of}[/]"
    tree = Tree(head)
    for s in t.run:
        tree.add(_step_line(s, t.start))

    def add(parent: Any, n: TaskNode) -> None:
        branch = parent.add(_task_label(n, prices))
        before = None  # the task's status as the steps so far left it
        for s in n.steps:
            branch.add(_step_line(s, t.start, s.status != before))
            before = s.status or before  # a tool or memory step carries none
        for a in n.spans:  # what each attempt asked models and tools (the journal)
            if a.calls:
                calls = branch.add(_attempt_label(a, prices))
                for call in a.calls:
                    calls.add(call_line(call, prices))
        if n.calls:
            calls = branch.add("[bold]calls outside the attempts shown[/]")
            for call in n.calls:
                calls.add(call_line(call, prices))
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
@prices_option
def replay_cmd(
    task_id: str,
    db: StoreRef,
    as_json: bool,
    as_of: str | None,
    html_path: Path | None,
    prices: PriceTable,
) -> None:
    """Timeline of a task (or a run, by root id) and all its subtasks, from the log.

    TASK_ID is a task or root id, a plan id, or a unique prefix of one. The
    log is a SQLite file or a JetStream log (--store nats://...). Each model call,
    attempt, task and the run show their cost in USD (--prices, else genai-prices).
    """
    show_replay(task_id, db, as_json, as_of, html_path, prices)


def show_replay(
    task_id: str,
    db: StoreRef,
    as_json: bool,
    as_of: str | None,
    html_path: Path | None,
    prices: PriceTable | None = None,
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
    table = prices or PriceTable()
    if as_json:
        body: Any = msgspec.to_builtins(timeline)
        body["cost"] = timeline_money(timeline, table).json()
        body["prices"] = table.describe()
        for node, (_, n) in zip(_walk_json(body), timeline.walk(), strict=True):
            node["cost"] = task_money(n, table).json()
            for span_json, span in zip(node.get("spans", []), n.spans, strict=True):
                for call_json, call in zip(span_json.get("calls", []), span.calls, strict=True):
                    if isinstance(call, ModelCall):
                        call_json["cost"] = call_cost(call, table)
        echo_json(body)
    else:
        print_rich(render_tree(timeline, table))
        say_unpriced(
            call.response_model or call.model
            for _, node in timeline.walk()
            for call in [*node.calls, *(c for a in node.spans for c in a.calls)]
            if isinstance(call, ModelCall)
            and call.status != "open"
            and call.replayed_from is None
            and call_cost(call, table) is None
        )
        if html_path is not None:
            click.echo(f"wrote {html_path}")
