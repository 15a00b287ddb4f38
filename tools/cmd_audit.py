"""Tamper evidence: ``cardbus head`` (keep the log's end elsewhere) and ``cardbus verify``.

``--store`` (or ``--db``, ``tools.store_option``) names the log: a SQLite
file (a path or ``sqlite:///path``) or a JetStream log (``nats://HOST:PORT``,
``tls://...``; the ``--nats-*`` options or the ``CARDBUS_NATS_*`` variables).
Both commands only read: on SQLite ``verify`` audits the file read-only (``SqliteEventStore.
verify_file``), so it never writes a schema into a file that is not a log,
and a missing, empty or foreign file is one line and exit 1; on NATS the
stream is never created or changed (``NatsEventStore.audit``). The checks
are in ``eventstore.audit`` (and ``eventstore.nats.audits``); the head and
its signature in ``eventstore.loghead``.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import click

from cardbus.eventstore import EventStore, SqliteEventStore
from cardbus.eventstore.audit import NO_LOG_CHAIN
from cardbus.eventstore.envelope import ChainProblem
from cardbus.eventstore.errors import ConfigError, StreamNotFound
from cardbus.eventstore.loghead import LogHead, decode_head, encode_head, sign, signature_ok
from cardbus.projections import resolve_id
from cardbus.tools.cli import cli
from cardbus.tools.cmd_inspect import echo_json, json_option, run
from cardbus.tools.store_option import StoreRef, open_store_option, store_option

__all__ = ["head", "verify"]


async def _open(db: StoreRef) -> EventStore:
    """The log ``db`` names, opened to read: never a file or stream created."""
    return await open_store_option(db)


key_option = click.option(
    "--key-file",
    type=click.Path(exists=True, dir_okay=False),
    envvar="CARDBUS_HEAD_KEY_FILE",
    show_envvar=True,
    help="A secret kept outside the log: the head is signed (head) or its signature checked"
    " (verify) with HMAC-SHA256 under it.",
)


def _key(path: str | None) -> bytes | None:
    if path is None:
        return None
    key = Path(path).read_bytes().strip()
    if not key:
        raise ConfigError(f"key file {path!r} is empty")
    return key


@cli.command()
@store_option
@key_option
def head(db: StoreRef, key_file: str | None) -> None:
    """Print the log's end (position and log hash) as JSON: keep it outside the log.

    ``cardbus verify --head FILE`` later names what was cut off or changed
    up to that point. With --key-file the head is signed. SQLite or NATS.
    """

    async def go() -> LogHead:
        store = await _open(db)
        try:
            return await store.head()
        finally:
            await store.close()

    kept = run(go())
    key = _key(key_file)
    click.echo(encode_head(sign(kept, key) if key else kept).decode(), nl=False)


@cli.command()
@click.argument("task_id", required=False)
@store_option
@click.option(
    "--head",
    "head_file",
    type=click.Path(exists=True, dir_okay=False),
    help="A head printed earlier by `cardbus head`: the log must still reach it, unchanged.",
)
@key_option
@json_option
def verify(
    task_id: str | None, db: StoreRef, head_file: str | None, key_file: str | None, as_json: bool
) -> None:
    """Check the log: one task (or run), or the whole log.

    TASK_ID is a task or root id, a plan id, or a unique prefix of one.

    The whole log: every body against its hash, the columns queries read
    against the body, each task's hash chain, gap-free positions and the log
    chain over them, and with --head that nothing kept in the head was cut
    off or changed. On NATS also: the positions (stream sequences) against
    the stream's state, and each subject's tokens against the body. Exits 1
    naming every problem; the log is only read.
    """
    kept = decode_head(Path(head_file).read_bytes()) if head_file else None
    key = _key(key_file)
    signature = _signature(kept, head_file, key)
    log_chain: bool | None = None  # not a question for one task's streams
    if task_id is None:
        problems, end, log_chain = run(_audit(db, kept))
        scope, streams, count = "the whole log", None, end.position
    else:
        if kept is not None:
            raise click.UsageError("--head checks the whole log: leave out TASK_ID")
        streams, problems, count = run(_verify_task(db, task_id))
        scope = f"{len(streams)} stream(s) of {task_id}"
    _report(problems, scope, task_id, streams, count, kept, as_json, signature, log_chain)


def _signature(kept: LogHead | None, head_file: str | None, key: bytes | None) -> str:
    """Whether the kept head's signature was checked: "checked", "unsigned" or "" (no head).

    A signed head is checked with --key-file or refused (its signature would go
    unchecked: a forged head of a cut or rewritten log would pass); an unsigned
    head is accepted with a warning on stderr.
    """
    if kept is None:
        return ""
    if kept.signature and key is None:
        raise ConfigError(
            f"the head in {head_file!r} is signed, but its signature was not checked:"
            " give the key with --key-file"
        )
    if key is not None and not signature_ok(kept, key):
        raise ConfigError(f"the head in {head_file!r} is not signed with that key (or was edited)")
    if key is None:
        click.echo(
            f"warning: the head in {head_file!r} is unsigned: it was not checked, and proves"
            " the log only if the file itself was kept safe (sign it: cardbus head --key-file)",
            err=True,
        )
        return "unsigned"
    return "checked"


async def _audit(
    db: StoreRef, kept: LogHead | None
) -> tuple[list[ChainProblem], LogHead, bool | None]:
    """The problems, where the log ends, and whether it stores a log chain (None: the
    store never does, it computes the log hash over positions it never reuses, as
    JetStream's sequences: eventstore.nats.audits)."""
    if db.path is not None:  # an older SQLite log may keep no log chain: said beside the OK
        found = await SqliteEventStore.audit_file(db.path, kept)
        return found.problems, found.head, found.log_chain
    store = await _open(db)
    try:
        problems, end = await store.audit(kept)
        return problems, end, None
    finally:
        await store.close()


async def _verify_task(db: StoreRef, task_id: str) -> tuple[list[str], list[Any], int]:
    store = await _open(db)
    try:
        task_id = await resolve_id(store, task_id)  # a full id, a plan id or a unique prefix
        own = await store.read_stream(task_id)
        related = await store.read_correlation(task_id)  # a root id: the whole run
        if related:
            streams = sorted({e.stream for e in related} | ({task_id} if own else set()))
            count = len({e.position for e in [*own, *related]})
        elif own:
            streams, count = [task_id], len(own)
        else:
            raise StreamNotFound(task_id)
        problems = []
        for s in streams:
            problems.extend(await store.verify(s))
        return streams, sorted(problems, key=lambda p: p.position), count
    finally:
        await store.close()


def _report(
    problems: list[Any],
    scope: str,
    task_id: str | None,
    streams: list[str] | None,
    count: int,
    kept: LogHead | None,
    as_json: bool,
    signature: str = "",
    log_chain: bool | None = None,
) -> None:
    note = NO_LOG_CHAIN if log_chain is False else ""
    if as_json:
        echo_json(
            {
                "ok": not problems,
                "scope": "log" if task_id is None else task_id,
                "streams": streams,
                "events": count,
                "head": kept,
                "signature": signature or None,  # "checked" | "unsigned" (with --head)
                # False: an older SQLite log, its stream chains only; None: one task, or a
                # store that computes the log hash (NATS)
                "log_chain": log_chain,
                "note": note or None,
                "problems": problems,
            }
        )
    elif not problems:
        against = ""
        if kept:
            how = "its signature checked" if signature == "checked" else "unsigned, not checked"
            against = f", up to the kept head at position {kept.position}, {how}"
        click.echo(f"OK: hash chains intact in {scope} ({count} events{against})")
        if note:
            click.echo(f"  ({note})")
    else:
        for p in problems:
            click.echo(
                f"BAD event {p.event_id} at position {p.position}"
                f" (stream {p.stream}, version {p.version}): {p.problem}"
            )
    if problems:
        if note and not as_json:
            click.echo(f"({note})")
        click.echo(f"verify failed: {len(problems)} problem(s) in {scope}", err=True)
        sys.exit(1)
