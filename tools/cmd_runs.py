"""``cardbus runs``: the runs of the log at a glance (the ``runs`` projection)."""

from __future__ import annotations

import time
from typing import Any

import click

from cardbus.eventstore.errors import ConfigError
from cardbus.projections import RUN_STATUSES, Runs, parse_since, run_duration
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
def runs(
    db: StoreRef,
    as_json: bool,
    as_of: str | None,
    status: str | None,
    since: float | None,
    limit: int | None,
) -> None:
    """Every run, newest first: status, goal, plan id, start, duration, tasks, tokens."""
    point = parse_as_of(as_of)

    async def go() -> list[dict[str, Any]]:
        async with read_model(db, point, [Runs()]) as (_, runner):
            return Runs().list(runner.conn, status=status, since=since, limit=limit)

    rows = run(go())
    now = time.time()
    for r in rows:
        r["duration_s"] = run_duration(r, now)
        r["tokens"] = r["input_tokens"] + r["output_tokens"]
    if as_json:
        echo_json(rows)
        return
    title = f"{len(rows)} run{'s' if len(rows) != 1 else ''}"
    if point is not None:
        title += f" as of {point.describe()}"
    table = new_table(title)
    for col in ("root", "status", "goal", "plan", "started", "duration", "tasks", "tokens"):
        right = col in ("duration", "tasks", "tokens")
        table.add_column(col, justify="right" if right else "left")
    for r in rows:
        tasks = f"{r['tasks_done']}/{r['tasks_total']}"
        if r["tasks_failed"]:
            tasks += f" ({r['tasks_failed']} failed)"
        status_text = styled_status(r["status"])
        if r["reason"]:
            status_text += f": {r['reason']}"
        table.add_row(
            r["root_id"],
            status_text,
            r["goal"] or "",
            r["plan_id"] or "",
            fmt_time(r["started_at"])[:19],
            fmt_duration(r["duration_s"]) + ("" if r["ended_at"] is not None else " so far"),
            tasks,
            f"{r['tokens']:,}",
        )
    print_rich(table)
    waiting = [(r["root_id"], t) for r in rows for t in r["waiting"]]
    for _, task in waiting:
        answer = f"cardbus approve {task}{db.flag()} / cardbus deny {task}{db.flag()}"
        click.echo(f"waiting for approval: {task}  ({answer})")
