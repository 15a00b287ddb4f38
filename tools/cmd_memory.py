"""``cardbus memory list/search/show/forget``: long-term memory, read from the log.

Thin: the fold is ``projections.memory``, the API ``bus.memory.LongTermMemory``.
``forget`` appends a ``memory.forgotten`` event; the forgotten record no
longer appears in ``list``, ``show`` or ``search``.
"""

from __future__ import annotations

from typing import Any

import click
import msgspec
from rich.table import Table

from cardbus.bus.orchestrator.memory import LongTermMemory
from cardbus.projections.memory import MemoryRecord
from cardbus.tools.cli import cli
from cardbus.tools.cmd_inspect import (
    echo_json,
    fmt_time,
    json_option,
    open_store,
    print_rich,
    run,
)
from cardbus.tools.store_option import StoreRef, store_option


@cli.group()
def memory() -> None:
    """Long-term memory: records that outlive runs (stream ``memory`` of the log)."""


def _value(value: Any, width: int = 60) -> str:
    text = value if isinstance(value, str) else msgspec.json.encode(value).decode()
    return text if len(text) <= width else text[: width - 1] + "…"


def _table(records: list[tuple[MemoryRecord, float | None]], scored: bool = False) -> Table:
    table = Table(show_edge=False, pad_edge=False)
    for col in ("key", "kind", "value", "tags", "written", "run", *(["score"] if scored else [])):
        table.add_column(col)
    for rec, score in records:
        row = [
            rec.key,
            rec.kind,
            _value(rec.value),
            ",".join(rec.tags),
            fmt_time(rec.recorded_at),
            rec.root_id[-12:],
        ]
        if scored:
            row.append("" if score is None else f"{score:.3f}")
        table.add_row(*row)
    return table


@memory.command("list")
@store_option
@json_option
@click.option("--tag", "tags", multiple=True, help="Only records with this tag (repeatable).")
@click.option("--kind", default=None, help="record, preference or failure.")
@click.option("--prefix", default="", help="Only keys starting with this.")
@click.option("--limit", type=int, default=None)
def list_(
    db: StoreRef,
    as_json: bool,
    tags: tuple[str, ...],
    kind: str | None,
    prefix: str,
    limit: int | None,
) -> None:
    """Every live record, oldest first, filterable by tag, kind and key prefix."""

    async def go() -> list[MemoryRecord]:
        store = await open_store(db)
        try:
            return await LongTermMemory(store).list(
                tags=tags, kind=kind, prefix=prefix, limit=limit
            )
        finally:
            await store.close()

    records = run(go())
    if as_json:
        echo_json(records)
    elif not records:
        click.echo("no memory records")
    else:
        print_rich(_table([(r, None) for r in records]))


@memory.command()
@click.argument("text")
@store_option
@json_option
@click.option("-k", "k", type=int, default=5, show_default=True, help="How many hits.")
@click.option("--tag", "tags", multiple=True, help="Only records with this tag (repeatable).")
@click.option("--kind", default=None, help="record, preference or failure.")
def search(
    text: str, db: StoreRef, as_json: bool, k: int, tags: tuple[str, ...], kind: str | None
) -> None:
    """Records whose text is closest in meaning to TEXT (default embedder: hashing, offline)."""

    async def go() -> list[Any]:
        store = await open_store(db)
        try:
            return await LongTermMemory(store).search(text, k=k, tags=tags, kind=kind)
        finally:
            await store.close()

    hits = run(go())
    if as_json:
        echo_json(hits)
    elif not hits:
        click.echo("no match")
    else:
        print_rich(_table([(h.record, h.score) for h in hits], scored=True))


@memory.command()
@click.argument("key")
@store_option
@click.option("--json", "as_json", is_flag=True, help="JSON (the output is JSON either way).")
def show(key: str, db: StoreRef, as_json: bool) -> None:
    """One record by exact key, as JSON (exit 1 if there is none)."""

    async def go() -> MemoryRecord | None:
        store = await open_store(db)
        try:
            return await LongTermMemory(store).get(key)
        finally:
            await store.close()

    record = run(go())
    if record is None:
        raise click.ClickException(f"no memory record {key!r}")
    echo_json(record)


@memory.command()
@click.argument("key")
@store_option
@click.option("--reason", default="", help="Why it is forgotten (kept in the event).")
@json_option
def forget(key: str, db: StoreRef, reason: str, as_json: bool) -> None:
    """Forget KEY: a memory.forgotten event; it disappears from list, show and search."""

    async def go() -> bool:
        store = await open_store(db)
        try:
            return await LongTermMemory(store).forget(key, reason=reason, actor="cli")
        finally:
            await store.close()

    if not run(go()):
        raise click.ClickException(f"no memory record {key!r}")
    if as_json:
        echo_json({"key": key, "forgotten": True, "reason": reason})
    else:
        click.echo(f"forgot {key}")
