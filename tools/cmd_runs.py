"""``cardbus runs``: the runs of the log at a glance (the ``runs`` projection)."""

from __future__ import annotations

import time
from typing import Any

import click

from cardbus.eventstore.errors import ConfigError
from cardbus.projections import RUN_STATUSES, Runs, Spend, parse_since, priced, run_duration
from cardbus.projections.lineage import tree_order
from cardbus.projections.pricing import Money, PriceTable
from cardbus.projections.spend import row_cost
from cardbus.tools.cli import cli
from cardbus.tools.cmd_inspect import (
    as_of_option,
    echo_json,
    fmt_duration,
    fmt_time,
    json_option,
    new_table,
    parse_as_of,
    print_rich,
    read_model,
    run,
    styled_status,
)
from cardbus.tools.costs import prices_option, say_unpriced
from cardbus.tools.store_option import StoreRef, store_option


def _since(ctx: click.Context, param: click.Parameter, value: str | None) -> float | None:
    if value is None:
        return None
    try:
        return parse_since(value)
    except ConfigError as e:
        raise click.BadParameter(str(e)) from e


@cli.command()
@store_option
@json_option
@as_of_option
@click.option("--status", type=click.Choice(RUN_STATUSES), default=None, help="Only these runs.")
@click.option(
    "--since",
    default=None,
    callback=_since,
    metavar="AGE|ISO-TIME",
    help="Only runs started since then: an age (30m, 2h, 1d, 1w) or an ISO 8601 time.",
)
@click.option("--limit", default=None, type=click.IntRange(min=1), help="At most this many runs.")
@prices_option
def runs(
    db: StoreRef,
    as_json: bool,
    as_of: str | None,
    status: str | None,
    since: float | None,
    limit: int | None,
    prices: PriceTable,
) -> None:
    """Every run, newest first: status, goal, plan id, start, duration, tasks, tokens, cost.

    A child run is listed beneath the run whose task started it (└); a parent's tokens
    and cost are shown with its child runs' (--json: tree_tokens, tree_cost).

    Cost is in USD, from each model call's tokens at its model's price (--prices,
    else genai-prices); "unknown price" for a model with none, "at least" when
    only part of a run's calls have one.
    """
    point = parse_as_of(as_of)

    async def go() -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        async with read_model(db, point, [Runs(), Spend()]) as (_, runner):
            found = Runs().list(runner.conn, status=status, since=since, limit=limit)
            spent = Spend().rows(runner.conn, roots=[r["root_id"] for r in found])
            return found, spent

    rows, spent = run(go())
    money = {r["root_id"]: r for r in priced(spent, prices, "root_id")}
    now = time.time()
    tree = tree_order(rows)  # a child run right after the run whose task started it
    for r in rows:
        r["duration_s"] = run_duration(r, now)
        r["tokens"] = r["input_tokens"] + r["output_tokens"]
        cost = money.get(r["root_id"])
        r["cost"] = (cost["money"] if cost else Money()).json()
    # a parent's tokens and cost with its child runs' (those listed): what the tree spent
    tree_money: dict[str, Money] = {}
    for _, r in reversed(tree):  # children before their parents
        kids = [k for _, k in tree if k.get("parent_root") == r["root_id"]]
        own = money.get(r["root_id"])
        total = Money()
        total += own["money"] if own else Money()
        for k in kids:
            total += tree_money[k["root_id"]]
        tree_money[r["root_id"]] = total
        if kids:
            r["tree_tokens"] = r["tokens"] + sum(k["tree_tokens"] for k in kids)
            r["tree_cost"] = total.json()
        else:
            r["tree_tokens"], r["tree_cost"] = r["tokens"], r["cost"]
    if as_json:
        echo_json(rows)
        return
    title = f"{len(rows)} run{'s' if len(rows) != 1 else ''}"
    if point is not None:
        title += f" as of {point.describe()}"
    table = new_table(title)
    columns = ("root", "status", "goal", "plan", "started", "duration", "tasks", "tokens", "cost")
    for col in columns:
        right = col in ("duration", "tasks", "tokens", "cost")
        table.add_column(col, justify="right" if right else "left")
    for depth, r in tree:
        tasks = f"{r['tasks_done']}/{r['tasks_total']}"
        if r["tasks_failed"]:
            tasks += f" ({r['tasks_failed']} failed)"
        status_text = styled_status(r["status"])
        if r["reason"]:
            status_text += f": {r['reason']}"
        if r.get("degraded"):  # completed without these optional tasks' outputs
            status_text += f" ({', '.join(r['degraded'])})"
        tokens_text, cost_text = f"{r['tokens']:,}", r["cost"]["text"]
        if r["tree_tokens"] != r["tokens"] or r["tree_cost"] != r["cost"]:  # with its children
            tokens_text = f"{r['tree_tokens']:,} with child runs ({tokens_text} own)"
            cost_text = f"{r['tree_cost']['text']} with child runs"
        table.add_row(
            "  " * (depth - 1) + "└ " + r["root_id"] if depth else r["root_id"],
            status_text,
            r["goal"] or "",
            r["plan_id"] or "",
            fmt_time(r["started_at"])[:19],
            fmt_duration(r["duration_s"]) + ("" if r["ended_at"] is not None else " so far"),
            tasks,
            tokens_text,
            cost_text,
        )
    print_rich(table)
    say_unpriced(r["model"] for r in spent if r["model"] and row_cost(r, prices) is None)
    waiting = [(r["root_id"], t) for r in rows for t in r["waiting"]]
    for _, task in waiting:
        answer = f"cardbus approve {task}{db.flag()} / cardbus deny {task}{db.flag()}"
        click.echo(f"waiting for approval: {task}  ({answer})")
