"""``cardbus memory list/search/show/forget``: long-term memory, read from the log.

Thin: the fold is ``projections.memory``, the API ``bus.memory.LongTermMemory``.
``forget`` appends a ``memory.forgotten`` event; the forgotten record no
longer appears in ``list``, ``show`` or ``search``.

Every command sees every scope unless told otherwise (the operator's view):
``--scope S`` (repeatable) keeps only those scopes; ``--user``/``--tenant``
show what a run of that context would see (its scope chain, a key present in
several scopes as the most specific one's). A malformed scope, user or tenant
is a one-line error.
"""

from __future__ import annotations

from typing import Any

import click
import msgspec
from rich.table import Table

from cardbus.bus.orchestrator.memory import LongTermMemory
from cardbus.eventstore.errors import InvalidScope
from cardbus.projections.memory import MemoryRecord, Scopes
from cardbus.projections.scope import normalize_scope, scope_chain
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


def scope_options(fn: Any) -> Any:
    """``--scope`` (repeatable), ``--user`` and ``--tenant``: which scopes to look in."""
    fn = click.option(
        "--tenant", default="", help="What a run of this tenant sees (with --user: its user)."
    )(fn)
    fn = click.option("--user", default="", help="What a run of this user sees.")(fn)
    return click.option(
        "--scope",
        "scopes",
        multiple=True,
        help="Only this scope: global, tenant:<id>, user:<id>, tenant:<id>/user:<id> (repeatable).",
    )(fn)


def _scopes(scopes: tuple[str, ...], user: str, tenant: str) -> Scopes:
    """The scopes the options name (None: all), or a one-line error."""
    try:
        if scopes and (user or tenant):
            raise click.UsageError("give --scope, or --user/--tenant, not both")
        if scopes:
            return [normalize_scope(s) for s in scopes]
        if user or tenant:
            return list(scope_chain(user, tenant))
    except InvalidScope as e:
        raise click.BadParameter(str(e)) from None
    return None


def _table(records: list[tuple[MemoryRecord, float | None]], scored: bool = False) -> Table:
    table = Table(show_edge=False, pad_edge=False)
    cols = ("scope", "key", "kind", "value", "tags", "written", "run")
    for col in (*cols, *(["score"] if scored else [])):
        table.add_column(col)
    for rec, score in records:
        row = [
            rec.scope,
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
@click.option("--kind", default=None, help="record, preference, failure or result.")
@click.option("--prefix", default="", help="Only keys starting with this.")
@click.option("--limit", type=int, default=None)
@scope_options
def list_(
    db: StoreRef,
    as_json: bool,
    tags: tuple[str, ...],
    kind: str | None,
    prefix: str,
    limit: int | None,
    scopes: tuple[str, ...],
    user: str,
    tenant: str,
) -> None:
    """Every live record, oldest first, filterable by scope, tag, kind and key prefix."""
    where = _scopes(scopes, user, tenant)

    async def go() -> list[MemoryRecord]:
        store = await open_store(db)
        try:
            return await LongTermMemory(store).list(
                scopes=where, tags=tags, kind=kind, prefix=prefix, limit=limit
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
@click.option("--kind", default=None, help="record, preference, failure or result.")
@scope_options
def search(
    text: str,
    db: StoreRef,
    as_json: bool,
    k: int,
    tags: tuple[str, ...],
    kind: str | None,
    scopes: tuple[str, ...],
    user: str,
    tenant: str,
) -> None:
    """Records whose text is closest in meaning to TEXT (default embedder: hashing, offline)."""
    where = _scopes(scopes, user, tenant)

    async def go() -> list[Any]:
        store = await open_store(db)
        try:
            return await LongTermMemory(store).search(text, k=k, scopes=where, tags=tags, kind=kind)
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
@scope_options
def show(
    key: str, db: StoreRef, as_json: bool, scopes: tuple[str, ...], user: str, tenant: str
) -> None:
    """One record by exact key, as JSON (exit 1 if there is none): of the first scope
    given that has it (none given: global's, else the latest of any scope)."""
    where = _scopes(scopes, user, tenant)

    async def go() -> MemoryRecord | None:
        store = await open_store(db)
        try:
            return await LongTermMemory(store).get(key, where)
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
@click.option(
    "--scope", default=None, help="The record's scope (needed when several scopes hold KEY)."
)
@json_option
def forget(key: str, db: StoreRef, reason: str, scope: str | None, as_json: bool) -> None:
    """Forget KEY: a memory.forgotten event; it disappears from list, show and search."""

    async def go() -> bool:
        store = await open_store(db)
        try:
            return await LongTermMemory(store).forget(key, reason=reason, actor="cli", scope=scope)
        finally:
            await store.close()

    try:
        forgotten = run(go())
    except InvalidScope as e:
        raise click.ClickException(str(e)) from None
    if not forgotten:
        raise click.ClickException(f"no memory record {key!r}")
    if as_json:
        echo_json({"key": key, "scope": scope, "forgotten": True, "reason": reason})
    else:
        click.echo(f"forgot {key}")
