"""Checking a whole stored log: bodies, the columns read by queries, both chains, a kept head.

``audit`` takes the stored rows in position order and names every problem it
finds, each at the position where it is seen:

* a body that is not a blob, does not decode, or does not match its hash;
* a column used for reads (event id, stream, version, correlation, type)
  that says something else than the body: queries would return a lie;
* each stream's chain (``envelope.verify_chain``): versions and prev_hash;
* positions that are missing (rows deleted) or repeated;
* the log chain (``loghead``): a stored log hash that does not follow from
  the one before it;
* against a head kept outside the log: a log that ends before it (tail
  truncated), or a different log hash at its position (rewritten).

It never raises on a malformed row: every row becomes events or problems.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, NamedTuple

from cardbus.eventstore.envelope import ChainProblem, decode_body, verify_chain
from cardbus.eventstore.errors import DecodeError
from cardbus.eventstore.loghead import LOG_GENESIS, LogHead, link

__all__ = ["LOG_STREAM", "NO_LOG_CHAIN", "LogAudit", "StoredRow", "audit", "audit_stream"]

#: the ``stream`` of a problem that belongs to the log as a whole
LOG_STREAM = "(log)"

#: what an audit of a log without stored log hashes did not check (``cardbus verify``
#: says it beside its OK): an older SQLite log, never opened by a writer since
NO_LOG_CHAIN = (
    "per-stream chains only: this log has no log chain, as it was written before cardbus kept"
    " one; events cut out across streams with the positions renumbered are caught only"
    " against a kept head (--head)"
)


class LogAudit(NamedTuple):
    """An audit's outcome, with whether a stored log chain was there to check."""

    problems: list[ChainProblem]
    head: LogHead  # where the log ends (its log hash computed from the rows)
    log_chain: bool  # False: no stored log hashes (checked: bodies, columns, stream chains)


class StoredRow(NamedTuple):
    position: int
    event_id: Any
    stream: Any
    version: Any
    correlation_id: Any
    type: Any
    body: Any
    hash: Any
    log_hash: Any  # None where the store keeps no log chain (or it was erased)


def _log_problem(position: int, problem: str) -> ChainProblem:
    return ChainProblem(LOG_STREAM, position, "?", 0, problem)


def _body_bytes(stored: Any) -> bytes | None:
    if isinstance(stored, bytes):
        return stored
    if isinstance(stored, str):  # edited by hand into TEXT: hash the bytes it stands for
        return stored.encode("utf-8", "surrogatepass")
    return None


def _column_problems(row: StoredRow, body: bytes) -> tuple[list[ChainProblem], float]:
    """What the row's columns get wrong about its body, and the body's recorded_at."""
    try:
        env = decode_body(body, max_bytes=1 << 62)
    except DecodeError:
        return [], 0.0  # verify_chain names the undecodable body
    where = (str(row.stream), row.position, env.event_id, env.version)
    wanted = {
        "event_id": env.event_id,
        "stream": env.stream,
        "version": env.version,
        "correlation_id": env.correlation_id,
        "type": env.type,
    }
    problems = [
        ChainProblem(*where, f"column {name} is {got!r}, the body says {want!r}")
        for name, want in wanted.items()
        if (got := getattr(row, name)) != want
    ]
    return problems, env.recorded_at


def audit(
    rows: Iterable[StoredRow], head: LogHead | None = None, *, log_chain: bool = True
) -> tuple[list[ChainProblem], LogHead]:
    """Every problem in ``rows`` (in position order), and the head the rows end at.

    ``log_chain=False`` for a store that keeps no stored log hashes (they are
    then only computed, for the head).
    """
    problems: list[ChainProblem] = []
    by_stream: dict[str, list[tuple[int, bytes, str]]] = {}
    last_position = 0
    computed = LOG_GENESIS  # the log hash as it follows from the rows
    at_head: str | None = LOG_GENESIS if head is not None and head.position == 0 else None
    last_id, last_time = "", 0.0
    for row in rows:
        position = row.position
        if not isinstance(position, int):
            problems.append(_log_problem(last_position, f"a row with position {position!r}"))
            continue
        if position > last_position + 1:
            gap = f"{last_position + 1}" + (
                f"..{position - 1}" if position - 1 > last_position + 1 else ""
            )
            problems.append(_log_problem(last_position + 1, f"positions {gap} missing (deleted)"))
        elif position <= last_position:
            problems.append(_log_problem(position, "position repeated or out of order"))
        body = _body_bytes(row.body)
        if body is None:
            problems.append(
                ChainProblem(str(row.stream), position, str(row.event_id), 0, "body is not a blob")
            )
        else:
            wrong, last_time = _column_problems(row, body)
            problems.extend(wrong)
            by_stream.setdefault(str(row.stream), []).append((position, body, str(row.hash)))
        computed = link(computed, str(row.hash))
        if log_chain:
            if row.log_hash is None:
                problems.append(_log_problem(position, "no log hash stored (erased?)"))
            elif row.log_hash != computed:
                problems.append(
                    _log_problem(
                        position,
                        "log hash does not follow from the previous event's"
                        " (an event before it deleted, inserted or moved?)",
                    )
                )
                computed = str(row.log_hash)  # resynchronise: name each break once
        if head is not None and position == head.position:
            at_head = computed
        last_position = max(last_position, position)
        last_id = str(row.event_id)
    for stream, stream_rows in by_stream.items():
        problems.extend(verify_chain(stream_rows, stream))
    if head is not None:
        if head.position > last_position:
            missing = f"{last_position + 1}..{head.position}"
            problems.append(
                _log_problem(
                    last_position + 1,
                    f"the log ends at position {last_position} but the kept head is at"
                    f" {head.position}: events {missing} missing (truncated)",
                )
            )
        elif at_head != head.log_hash:
            problems.append(
                _log_problem(
                    head.position,
                    "the log hash here differs from the kept head:"
                    " an event at or before it was changed, deleted or moved",
                )
            )
    problems.sort(key=lambda p: p.position)
    return problems, LogHead(
        position=last_position, log_hash=computed, event_id=last_id, recorded_at=last_time
    )


def audit_stream(rows: Iterable[StoredRow]) -> list[ChainProblem]:
    """The problems of one stream's rows (in position order): bodies, columns, its chain."""
    problems: list[ChainProblem] = []
    chain: list[tuple[int, bytes, str]] = []
    stream = ""
    for row in rows:
        stream = str(row.stream)
        body = _body_bytes(row.body)
        if body is None:
            problems.append(
                ChainProblem(stream, row.position, str(row.event_id), 0, "body is not a blob")
            )
            continue
        problems.extend(_column_problems(row, body)[0])
        chain.append((row.position, body, str(row.hash)))
    problems.extend(verify_chain(chain, stream))
    return sorted(problems, key=lambda p: p.position)
