"""Inspection commands: ``tasks``, ``tail``, ``stats``, ``rebuild`` (``verify``: cmd_audit).

Shared options live here too (``--json``, ``--as-of``; ``--store`` is
``tools.store_option``) and are used by the other commands. Commands are
thin: the read models, time travel and chain checks are in ``projections``
and ``eventstore``.

The projections' read model is kept in ``<db>.proj`` for a SQLite log and
in memory for a NATS log (``StoreRef.projection_path``); each command
brings it up to date before reading. With ``--as-of`` a throw-away
in-memory model is folded up to that point.
"""

from __future__ import annotations

import asyncio
import io
import os
import shutil
import sqlite3
import sys
import textwrap
import time
from collections import deque
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from datetime import UTC, datetime
from typing import Any, TypeVar

import click
import msgspec

from cardbus.eventstore import Envelope, EventStore, TaskState
from cardbus.eventstore.errors import StreamNotFound
from cardbus.projections import (
    AgentStats,
    AsOf,
    Cost,
    LoopHashes,
    Projection,
    ProjectionRunner,
    Quality,
    TaskTable,
    all_projections,
    build_as_of,
    event_reason,
    resolve_id,
)
from cardbus.projections.pricing import PriceTable
from cardbus.projections.spend import Spend, priced
from cardbus.tools.cli import cli
from cardbus.tools.costs import money_rows, prices_option
from cardbus.tools.store_option import StoreRef, open_store_option, parse_store, store_option

__all__ = [
    "as_of_option",
    "db_option",
    "echo_json",
    "fmt_duration",
    "fmt_time",
    "json_option",
    "new_table",
    "open_store",
    "print_rich",
    "read_model",
    "run",
]

F = TypeVar("F", bound=Callable[..., Any])

db_option = store_option  # the old name: --store (alias --db) and the NATS options
json_option = click.option("--json", "as_json", is_flag=True, help="Machine-readable JSON output.")
as_of_option = click.option(
    "--as-of",
    "as_of",
    default=None,
    metavar="POSITION|ISO-TIME",
    help="Show the state as it was at a global position or a moment (ISO 8601, UTC if naive).",
)

_encoder = msgspec.json.Encoder()


def run(coro: Any) -> Any:
    return asyncio.run(coro)


async def open_store(db: str | StoreRef) -> EventStore:
    """The log ``db`` names; a missing file is ``StoreUnavailable`` (one line, exit 1)."""
    return await open_store_option(db if isinstance(db, StoreRef) else parse_store(db))


@asynccontextmanager
async def read_model(
    db: str | StoreRef, as_of: AsOf | None, projections: Sequence[Projection] | None = None
) -> AsyncIterator[tuple[EventStore, ProjectionRunner]]:
    """The store and an up-to-date (or ``as_of``) runner of ``projections`` (default: all).

    Each projection has its own checkpoint in the shared read-model file, so a
    command brings up to date only the projections it reads (on NATS the
    model is folded in memory).
    """
    ref = db if isinstance(db, StoreRef) else parse_store(db)
    store = await open_store_option(ref)
    runner: ProjectionRunner | None = None
    chosen = list(projections) if projections else all_projections()
    try:
        if as_of is not None:
            runner = await build_as_of(store, as_of, chosen)
        else:
            try:
                runner = ProjectionRunner.open(store, ref.projection_path(), chosen)
                await runner.catch_up()
                for notice in runner.notices:  # a stale model is rebuilt, never served silently
                    click.echo(f"warning: {notice}", err=True)
            except sqlite3.Error:  # read-only directory, damaged model: fold into memory
                if runner is not None:
                    runner.close()
                runner = ProjectionRunner.open(store, ":memory:", chosen)
                await runner.catch_up()
        yield store, runner
    finally:
        if runner is not None:
            runner.close()
        await store.close()


async def resolve_filter(store: EventStore, text: str) -> str:
    """A filter's id (``--root``, ``--task``): resolved, or as given if nothing matches yet."""
    try:
        return await resolve_id(store, text)
    except StreamNotFound:
        return text  # an empty result, or (tail --follow) events still to come


def parse_as_of(value: str | None) -> AsOf | None:
    return AsOf.parse(value) if value else None


def echo_json(obj: Any) -> None:
    click.echo(_encoder.encode(obj).decode())


def new_table(title: str) -> Any:
    """A rich Table (rich is imported only when a table is printed: faster --json)."""
    from rich.table import Table

    return Table(title=title, title_justify="left", header_style="bold")


def out_width(default: int | None = 100) -> int | None:
    """The width output fits: the terminal's, else ``default``."""
    if sys.stdout.isatty():
        return shutil.get_terminal_size((100, 40)).columns
    return default


def table_width() -> int | None:
    """The width a one-line-per-row table fits: ``COLUMNS`` if set (piped too), else the
    terminal's; None (no limit: whole rows, one per line) when piped without ``COLUMNS``."""
    columns = os.environ.get("COLUMNS", "")
    if columns.isdigit() and int(columns) > 0:
        return int(columns)
    return out_width(None)


def short_ids(ids: Sequence[str], others: Sequence[str] = (), keep: int = 32) -> dict[str, str]:
    """A short form of each id that ``resolve_id`` (replay, cancel, ...) takes back.

    An id of at most ``keep`` characters stays whole; a longer one becomes its end
    (``resolve_id`` matches the end of an id when nothing begins with the text):
    the last 12 characters (a UUIDv7's random part), else 18 or 24, if no other id of
    ``ids`` or ``others`` ends with that too and none begins with it; else whole.
    """
    every = sorted({*ids, *others})
    out: dict[str, str] = {}
    for n in (12, 18, 24):
        ends: dict[str, int] = {}
        starts: set[str] = set()
        for i in every:
            ends[i[-n:]] = ends.get(i[-n:], 0) + 1
            starts.add(i[:n])
        for i in ids:
            if i in out or len(i) <= keep or (n == 12 and len(i) > 36):
                continue
            tail = i[-n:]
            if ends[tail] == 1 and tail not in starts:
                out[i] = tail
    return {i: out.get(i, i) for i in ids}


def print_rich(*renderables: Any, width: int | None = None) -> None:
    """Render to stdout (colours on a terminal). A table fits ``width`` (the terminal's,
    else 100) without cutting a token: one whose rows do not fit on one line each is
    stacked (:func:`stacked`), one block per row, its first cell (an id) in full on its
    own line. Other renderables get the terminal's width (200 off a terminal).
    """
    from rich.console import Console
    from rich.table import Table

    tty = sys.stdout.isatty()
    buf = io.StringIO()

    def console(w: int) -> Console:
        return Console(file=buf, force_terminal=tty, width=w, highlight=False, soft_wrap=False)

    narrow = console(width or out_width(100) or 100)
    wide = console(width or out_width(200) or 200)
    for r in renderables:
        if isinstance(r, Table):
            narrow.print(r if fits(narrow, r, narrow.width) else stacked(r))
        else:
            wide.print(r)
    click.echo("".join(line.rstrip() + "\n" for line in buf.getvalue().splitlines()), nl=False)


def fits(console: Any, table: Any, width: int) -> bool:
    """True if ``table`` fits ``width`` columns with no cell wrapped (so no word broken)."""
    from rich.measure import Measurement

    wide = console.options.update(max_width=100_000)  # measured unclamped
    return Measurement.get(console, wide, table).maximum <= width


def stacked(table: Any) -> Any:
    """``table`` as one block per row: the first cell alone (in bold), then each other
    column's header and value, indented; values wrap between words."""
    from rich.console import Group
    from rich.table import Table
    from rich.text import Text

    columns = table.columns
    cells = [list(c.cells) for c in columns]
    blocks: list[Any] = []
    if table.title:
        blocks.append(Text(str(table.title), style="italic"))
    for i in range(table.row_count):
        first = cells[0][i]
        blocks.append(Text.from_markup(first, style="bold") if isinstance(first, str) else first)
        grid = Table.grid(padding=(0, 2))
        grid.add_column(style="dim", no_wrap=True)
        grid.add_column(overflow="fold")
        for column, values in zip(columns[1:], cells[1:], strict=True):
            value = values[i]
            if value not in ("", None):
                grid.add_row("  " + str(column.header), value)
        blocks.append(grid)
    return Group(*blocks)


def fmt_time(t: float | None) -> str:
    if t is None:
        return ""
    return datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%d %H:%M:%S.%f")[:-3]


def fmt_duration(s: float | None) -> str:
    if s is None:
        return ""
    if s < 1:
        return f"{s * 1000:.0f}ms"
    if s < 120:
        return f"{s:.2f}s"
    return f"{s / 60:.1f}min"


def _rate(x: float | None) -> str:
    return "" if x is None else f"{x * 100:.0f}%"


_STATUS_STYLE = {
    "completed": "green",
    "failed": "red",
    "halted": "magenta",
    "cancelled": "dim",
    "needs_revision": "magenta",
    "needs_input": "blue",
    "pending": "yellow",
    "awaiting_approval": "yellow",
    "running": "cyan",
    "dispatched": "cyan",
}


def styled_status(status: str | None) -> str:
    if not status:
        return "?"
    style = _STATUS_STYLE.get(status)
    return f"[{style}]{status}[/]" if style else status


# --- tasks --------------------------------------------------------------------


@cli.command()
@db_option
@json_option
@as_of_option
@click.option(
    "--status",
    default=None,
    type=click.Choice([state.value for state in TaskState]),
    help="Only tasks in this status.",
)
@click.option("--agent", default=None, help="Only tasks last handled by this agent.")
@click.option("--root", default=None, help="Only tasks of this run (root id, plan id or prefix).")
@click.option("--capability", default=None, help="Only tasks needing this capability.")
@click.option("--limit", default=None, type=click.IntRange(min=1), help="At most this many rows.")
@click.option(
    "--wide", is_flag=True, help="Full ids (a row that does not fit becomes a block of lines)."
)
def tasks(
    db: StoreRef,
    as_json: bool,
    as_of: str | None,
    status: str | None,
    agent: str | None,
    root: str | None,
    capability: str | None,
    limit: int | None,
    wide: bool,
) -> None:
    """The task table (a projection of the log), filterable: one line per task, ids
    shortened to an end that replay and the other commands accept (``--wide``: in full).
    The width is the terminal's, or ``COLUMNS``, or 100 when piped."""
    point = parse_as_of(as_of)

    async def go() -> list[dict[str, Any]]:
        async with read_model(db, point, [TaskTable()]) as (store, runner):
            return TaskTable().list(
                runner.conn,
                status=status,
                agent=agent,
                root=None if root is None else await resolve_filter(store, root),
                capability=capability,
                limit=limit,
            )

    rows = run(go())
    if as_json:
        for r in rows:
            for col in ("input", "output", "open_issues"):
                if r.get(col) is not None:
                    r[col] = msgspec.json.decode(r[col])
            if r.get("quality_met") is not None:
                r["quality_met"] = bool(r["quality_met"])
        echo_json(rows)
        return
    title = f"{len(rows)} task{'s' if len(rows) != 1 else ''}"
    if point is not None:
        title += f" as of {point.describe()}"
    if wide:
        table = new_table(title)
        for col in ("task", "root", "capability", "agent", "status", "att", "updated", "reason"):
            table.add_column(col)
        for r in rows:
            table.add_row(
                r["task_id"],
                r["root_id"] or "",
                r["capability"] or "",
                r["agent_id"] or "",
                styled_status(r["status"]),
                str(r["attempts"]),
                fmt_time(r["updated_at"]),
                r["reason"] or "",
            )
        print_rich(table)
        return
    suffix, columns, cells = _task_rows(rows)
    print_rows(title + suffix, columns, cells, fixed=len(columns) - 3)


def _task_rows(rows: list[dict[str, Any]]) -> tuple[str, list[str], list[list[str]]]:
    """The task table's title suffix, columns and cells: short ids, one line each (the
    root column only when the rows are of several runs)."""
    roots = sorted({r["root_id"] for r in rows if r["root_id"]})
    task_ids = short_ids([r["task_id"] for r in rows], roots)
    # a root's end may end its own tasks' ids too: resolve_id picks the run then
    root_ids = short_ids(roots, keep=12)
    day = {fmt_time(r["updated_at"])[:10] for r in rows}
    one_run = len(roots) <= 1
    cells = [
        [
            task_ids[r["task_id"]],
            *([] if one_run else [root_ids.get(r["root_id"] or "", "")]),
            styled_status(r["status"]),
            str(r["attempts"]),
            fmt_time(r["updated_at"])[11 if len(day) == 1 else 5 : 19],
            r["capability"] or "",
            r["agent_id"] or "",
            " ".join((r["reason"] or "").split()),
        ]
        for r in rows
    ]
    columns = ["task", *([] if one_run else ["root"]), "status", "att", "updated"]
    suffix = f" of run {roots[0]}" if len(roots) == 1 else ""
    return suffix, [*columns, "capability", "agent", "reason"], cells


def print_rows(title: str, columns: list[str], rows: list[list[str]], fixed: int) -> None:
    """A table of one line per row that fits the width (:func:`table_width`:
    ``COLUMNS`` honoured, whole rows when piped without it): its first ``fixed``
    columns (ids, status, times) are never cut; the others shrink with an
    ellipsis, the last (a reason) first."""
    from rich.console import Console
    from rich.table import Table
    from rich.text import Text

    width = table_width() or 100_000
    t = Table(title=title, title_justify="left", header_style="bold", box=None, pad_edge=False)
    for i, col in enumerate(columns):
        longest = max([len(col), *(Text.from_markup(r[i]).cell_len for r in rows)])
        t.add_column(
            col,
            no_wrap=True,
            overflow="ellipsis",
            min_width=longest if i < fixed else None,
            ratio=1 if i == len(columns) - 1 else None,
        )
    for r in rows:
        t.add_row(*r)
    buf = io.StringIO()
    tty = sys.stdout.isatty()
    Console(file=buf, force_terminal=tty, width=width, highlight=False, soft_wrap=False).print(t)
    click.echo("".join(line.rstrip() + "\n" for line in buf.getvalue().splitlines()), nl=False)


# --- tail ---------------------------------------------------------------------


def _summary(env: Envelope) -> str:
    data = env.data
    reason = event_reason(data)
    agent = getattr(data, "agent_id", None)
    attempt = getattr(data, "attempt", None)
    parts = []
    if attempt is not None:
        parts.append(f"#{attempt}")
    if agent:
        parts.append(str(agent))
    if reason:
        parts.append(reason)
    return " ".join(parts)


def _matcher(
    type_prefix: Sequence[str], task: str | None, root: str | None, agent: str | None
) -> Callable[[Envelope], bool]:
    def match(env: Envelope) -> bool:
        if type_prefix and not any(env.type.startswith(p) for p in type_prefix):
            return False
        if task is not None and env.stream != task:
            return False
        if root is not None and env.correlation_id != root:
            return False
        return not (
            agent is not None
            and getattr(env.data, "agent_id", None) != agent
            and env.actor != agent
        )

    return match


def _echo_event(env: Envelope, as_json: bool) -> None:
    if as_json:
        echo_json(env)
        return
    line = (
        f"{env.position:>8}  {fmt_time(env.recorded_at)}  {env.stream:<36} v{env.version:<3}"
        f" {env.type:<28} {_summary(env)}".rstrip()
    )
    width = out_width(None)  # on a terminal; piped, one line per event (for grep)
    if width and len(line) > width:  # wrapped between words, never inside an id
        line = textwrap.fill(
            line,
            width,
            subsequent_indent=" " * 10,
            break_long_words=False,
            break_on_hyphens=False,
        )
    click.echo(line)


@cli.command()
@db_option
@json_option
@click.option(
    "-n", "--last", default=20, show_default=True, help="Start with the last N matching events."
)
@click.option(
    "--from", "from_position", default=None, type=int, help="Start at this position instead."
)
@click.option("-f", "--follow", is_flag=True, help="Keep printing new events as they are appended.")
@as_of_option
@click.option(
    "--limit", default=None, type=click.IntRange(min=1), help="Stop after printing N events."
)
@click.option(
    "--timeout", default=None, type=float, help="With --follow: stop after this many seconds."
)
@click.option(
    "--type", "type_prefix", multiple=True, help="Only event types starting with this (repeatable)."
)
@click.option("--task", default=None, help="Only events of this task (id or unique prefix).")
@click.option("--root", default=None, help="Only events of this run (root id, plan id or prefix).")
@click.option("--agent", default=None, help="Only events naming this agent (or written by it).")
def tail(
    db: StoreRef,
    as_json: bool,
    last: int,
    from_position: int | None,
    follow: bool,
    as_of: str | None,
    limit: int | None,
    timeout: float | None,
    type_prefix: tuple[str, ...],
    task: str | None,
    root: str | None,
    agent: str | None,
) -> None:
    """Print the newest events of the log (one line each, or JSON lines), optionally live."""
    point = parse_as_of(as_of)
    if point is not None and follow:
        raise click.UsageError("--as-of shows the past: it cannot be combined with --follow")
    filtered = bool(type_prefix or agent or (point is not None and point.timestamp is not None))

    async def go() -> None:
        nonlocal task, root
        store = await open_store(db)
        printed = 0
        try:
            task = None if task is None else await resolve_filter(store, task)
            root = None if root is None else await resolve_filter(store, root)
            plain = _matcher(type_prefix, task, root, agent)
            match = plain if point is None else (lambda e: plain(e) and point.includes(e))
            head = await store.last_position()
            if point is not None and point.position is not None:
                head = min(head, point.position)
            if from_position is not None:
                backlog: list[Envelope] = []
                pos = from_position
                while True:
                    page = await store.read_all(pos, 1000)
                    backlog.extend(e for e in page if match(e))
                    if len(page) < 1000 or page[-1].position >= head:
                        break
                    pos = page[-1].position + 1
                backlog = [e for e in backlog if e.position <= head]
            else:
                if task is not None:
                    candidates = await store.read_stream(task)
                elif root is not None:
                    candidates = await store.read_correlation(root)
                elif not filtered:
                    candidates = await store.read_all(max(1, head - last + 1), last)
                else:
                    window: deque[Envelope] = deque(maxlen=max(last, 0))
                    pos = 1
                    while pos <= head:
                        page = await store.read_all(pos, 5000)
                        if not page:
                            break
                        window.extend(e for e in page if match(e))
                        pos = page[-1].position + 1
                    candidates = list(window)
                backlog = [e for e in candidates if match(e) and e.position <= head]
                backlog = backlog[-last:] if last > 0 else []
            for env in backlog:
                if limit is not None and printed >= limit:
                    return
                _echo_event(env, as_json)
                printed += 1
            if not follow:
                return
            deadline = None if timeout is None else time.monotonic() + timeout
            events = store.subscribe(head + 1)
            try:
                while limit is None or printed < limit:
                    remaining = None if deadline is None else deadline - time.monotonic()
                    if remaining is not None and remaining <= 0:
                        return
                    try:
                        env = await asyncio.wait_for(anext(events), remaining)
                    except TimeoutError:
                        return
                    if match(env):
                        _echo_event(env, as_json)
                        sys.stdout.flush()
                        printed += 1
            finally:
                await events.aclose()  # type: ignore[attr-defined]
        finally:
            await store.close()

    try:
        run(go())
    except KeyboardInterrupt:
        pass


# --- stats --------------------------------------------------------------------


@cli.command()
@db_option
@json_option
@as_of_option
@click.option("--agent", default=None, help="Only this agent.")
@click.option("--capability", default=None, help="Only this capability.")
@prices_option
def stats(
    db: StoreRef,
    as_json: bool,
    as_of: str | None,
    agent: str | None,
    capability: str | None,
    prices: PriceTable,
) -> None:
    """Agent statistics, cost (tokens, and USD per model, agent, capability and run) and
    quality tables (projections of the log)."""
    point = parse_as_of(as_of)
    spent: list[dict[str, Any]] = []

    def keep(a: str, c: str) -> bool:
        return (agent is None or a == agent) and (capability is None or c == capability)

    async def go() -> tuple[list[Any], list[dict[str, Any]], list[dict[str, Any]], list[Any]]:
        stat_projections = [AgentStats(), Cost(), Quality(), LoopHashes(), Spend()]
        async with read_model(db, point, stat_projections) as (_, runner):
            spent.extend(
                r for r in Spend().rows(runner.conn) if keep(r["agent_id"], r["capability"])
            )
            agents = [s for s in AgentStats().all(runner.conn) if keep(s.agent_id, s.capability)]
            cost = [
                r
                for r in Cost().list(runner.conn)
                if (agent is None or r["scope"] != "agent" or r["key"] == agent)
                and (capability is None or r["scope"] != "capability" or r["key"] == capability)
            ]
            quality = [
                q for q in Quality().list(runner.conn) if keep(q["agent_id"], q["capability"])
            ]
            loops = [
                r for r in LoopHashes().list(runner.conn) if r["count"] > 1 or r["dispatches"] > 1
            ]
            return agents, cost, quality, loops

    agents, cost, quality, loops = run(go())
    money = {
        scope: priced(spent, prices, column)
        for scope, column in (
            ("model", "model"),
            ("agent", "agent_id"),
            ("capability", "capability"),
            ("run", "root_id"),
        )
    }
    if as_json:
        echo_json(
            {
                "agents": agents,
                "cost": cost,
                "quality": quality,
                "loops": loops,
                "money": {scope: money_rows(rows) for scope, rows in money.items()},
                "prices": prices.describe(),
            }
        )
        return
    suffix = f" as of {point.describe()}" if point else ""
    t1 = new_table("Agents" + suffix)
    for col in ("agent", "capability", "runs", "success", "ok", "fail", "timeouts", "rejected"):
        t1.add_column(col, justify="left" if col in ("agent", "capability") else "right")
    t1.add_column("p50", justify="right")
    t1.add_column("p95", justify="right")
    for s in agents:
        t1.add_row(
            s.agent_id,
            s.capability,
            str(s.runs),
            _rate(s.success_rate) if s.runs else "",
            str(s.successes),
            str(s.failures),
            str(s.timeouts),
            str(s.rejections),
            fmt_duration(s.p50_s),
            fmt_duration(s.p95_s),
        )
    t2 = new_table("Cost (tokens)" + suffix)
    for col in ("scope", "key", "input", "output", "total", "results"):
        t2.add_column(col, justify="left" if col in ("scope", "key") else "right")
    for r in cost:
        t2.add_row(
            r["scope"],
            r["key"],
            f"{r['input_tokens']:,}",
            f"{r['output_tokens']:,}",
            f"{r['input_tokens'] + r['output_tokens']:,}",
            str(r["results"]),
        )
    t_usd = new_table(f"Cost (USD; prices: {prices.describe()})" + suffix)
    for col in ("scope", "key", "calls", "input", "output", "cost"):
        t_usd.add_column(col, justify="left" if col in ("scope", "key") else "right")
    column = {"model": "model", "agent": "agent_id", "capability": "capability", "run": "root_id"}
    for scope, rows in money.items():
        for r in rows:
            t_usd.add_row(
                scope,
                r[column[scope]] or "(not named)",
                str(r["calls"]),
                f"{r['input_tokens']:,}",
                f"{r['output_tokens']:,}",
                r["money"].text(),
            )
    t3 = new_table("Quality" + suffix)
    for col in ("agent", "capability", "results", "completed", "first pass", "revisions"):
        t3.add_column(col, justify="left" if col in ("agent", "capability") else "right")
    t3.add_column("schema ok", justify="right")
    for q in quality:
        t3.add_row(
            q["agent_id"],
            q["capability"],
            str(q["results"]),
            str(q["completions"]),
            _rate(q["first_pass_rate"]),
            _rate(q["revision_rate"]),
            _rate(q["schema_compliance"]),
        )
    renderables: list[Any] = [t1, t2, t_usd, t3]
    if loops:
        t4 = new_table("Repeated loop hashes" + suffix)
        for col in ("root", "loop hash", "tasks", "dispatches", "first seen", "last seen"):
            t4.add_column(col)
        for r in loops:
            t4.add_row(
                r["root_id"],
                r["loop_hash"][:16],
                str(r["count"]),
                str(r["dispatches"]),
                fmt_time(r["first_seen"]),
                fmt_time(r["last_seen"]),
            )
        renderables.append(t4)
    print_rich(*renderables)


# --- rebuild ------------------------------------------------------------------

_NAMES = [p.name for p in all_projections()]


@cli.command()
@click.argument("names", nargs=-1, type=click.Choice(_NAMES))
@db_option
@json_option
def rebuild(names: tuple[str, ...], db: StoreRef, as_json: bool) -> None:
    """Drop projections' read models (all by default) and fold the whole log again."""

    async def go() -> tuple[int, float]:
        store = await open_store(db)
        try:
            with ProjectionRunner.open(store, db.projection_path()) as runner:
                t0 = time.perf_counter()
                position = await runner.rebuild(list(names) or None)
                return position, time.perf_counter() - t0
        finally:
            await store.close()

    position, elapsed = run(go())
    chosen = list(names) or _NAMES
    rate = position / elapsed if elapsed > 0 else 0.0
    if as_json:
        echo_json(
            {
                "projections": chosen,
                "position": position,
                "seconds": elapsed,
                "events_per_s": rate,
                "path": db.projection_path(),
            }
        )
        return
    click.echo(
        f"rebuilt {', '.join(chosen)} from {position} events in {elapsed:.2f}s"
        f" ({rate:,.0f} events/s) into {db.projection_path()}"
    )
