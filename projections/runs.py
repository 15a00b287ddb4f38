"""Runs: one row per run (root task), folded from the log.

``proj_runs`` is keyed by ``root_id``. ``run.started`` gives the goal, plan id
and start; ``run.completed`` / ``run.failed`` / ``run.halted`` the end, status
and reason; ``plan.submitted`` the plan id (it may come first); each task event
of the run (its ``correlation_id``) counts tasks created, completed and failed
or halted, the tokens of its results, and which tasks wait for approval now.

A run that completed without some optional tasks' outputs (``run.completed``
with ``degraded``) is ``completed`` with the reason ``degraded``, and
``degraded`` lists those tasks (plan task ids); ``[]`` for every other run.

A child run (``run.started`` with ``parent_root``) names the run and the task that
started it (``parent_root``, ``parent_task``); None for a run of its own.

A cancelled run (``run.failed`` with ``cancelled``) is ``cancelled``, its reason who
cancelled it and why (``by ops: cancelled_by_user: wrong``: the event's detail).

Stored ``status`` is ``running``, ``completed``, ``failed``, ``halted`` or ``cancelled``;
:meth:`Runs.list` reports a running run with a task waiting for approval as
``awaiting_approval``. The fold is pure: a running run has no ``ended_at``, and
its age is the caller's clock minus ``started_at``.
"""

from __future__ import annotations

import builtins
import re
import sqlite3
import time
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

import msgspec

from cardbus.eventstore import events as ev
from cardbus.eventstore.batch import tokens_in_range
from cardbus.eventstore.envelope import Envelope
from cardbus.eventstore.errors import ConfigError
from cardbus.projections.base import Projection
from cardbus.projections.model import Model, Row, TableSpec

__all__ = ["RUN_STATUSES", "Runs", "parse_since", "run_duration"]

RUN_STATUSES = ("running", "awaiting_approval", "completed", "failed", "halted", "cancelled")

RUNS = TableSpec(
    "proj_runs",
    (
        ("root_id", "TEXT"),
        ("plan_id", "TEXT"),
        ("goal", "TEXT"),
        ("status", "TEXT"),
        ("reason", "TEXT"),
        ("started_at", "REAL"),
        ("ended_at", "REAL"),
        ("updated_at", "REAL"),
        ("tasks_total", "INTEGER"),
        ("tasks_done", "INTEGER"),
        ("tasks_failed", "INTEGER"),
        ("input_tokens", "INTEGER"),
        ("output_tokens", "INTEGER"),
        ("waiting", "JSON"),  # ids of the tasks waiting for approval now
        ("forked_from", "TEXT"),
        ("degraded", "JSON"),  # a degraded completion: the optional tasks it did without
        ("parent_root", "TEXT"),  # a child run: the run and task that started it
        ("parent_task", "TEXT"),
        ("last_position", "INTEGER"),
    ),
    key=("root_id",),
    indexes=(("started_at",),),
)

_ENDS: dict[type, str] = {
    ev.RunCompleted: "completed",
    ev.RunFailed: "failed",
    ev.RunHalted: "halted",
}
# a waiting task that reaches one of these no longer waits
_SETTLES = (
    ev.ApprovalGranted,
    ev.ApprovalDenied,
    ev.TaskCompleted,
    ev.TaskFailed,
    ev.TaskCancelled,
    ev.TaskHalted,
)


def _new_row(root_id: str, env: Envelope) -> Row:
    return {
        "root_id": root_id,
        "plan_id": None,
        "goal": None,
        "status": "running",
        "reason": None,
        "started_at": env.recorded_at,
        "ended_at": None,
        "updated_at": env.recorded_at,
        "tasks_total": 0,
        "tasks_done": 0,
        "tasks_failed": 0,
        "input_tokens": 0,
        "output_tokens": 0,
        "waiting": [],
        "forked_from": None,
        "degraded": [],
        "parent_root": None,
        "parent_task": None,
        "last_position": env.position,
    }


def _fold(row: Row, env: Envelope) -> None:
    data: Any = env.data  # one of ``Runs.handles``: dispatched on its exact type
    t = type(data)
    if t is ev.TaskResultSubmitted:
        row["input_tokens"] += tokens_in_range(data.usage.input_tokens)
        row["output_tokens"] += tokens_in_range(data.usage.output_tokens)
    elif t is ev.TaskCreated:
        row["tasks_total"] += 1
    elif t is ev.RunStarted:
        row["goal"] = data.goal
        row["plan_id"] = data.plan_id
        row["forked_from"] = data.forked_from
        row["parent_root"] = data.parent_root
        row["parent_task"] = data.parent_task
        row["started_at"] = min(row["started_at"], env.recorded_at)
    elif t is ev.PlanSubmitted:
        row["plan_id"] = row["plan_id"] or data.plan_id
    elif t in _ENDS:
        row["status"] = _ENDS[t]
        row["ended_at"] = env.recorded_at
        row["reason"] = getattr(data, "reason", None)
        if t is ev.RunCompleted and data.degraded:
            row["reason"] = "degraded"
            row["degraded"] = list(data.degraded)
        elif t is ev.RunFailed and data.cancelled:  # who cancelled it and why
            row["status"] = "cancelled"
            row["reason"] = data.detail or data.reason
    elif t is ev.ApprovalRequested and env.stream not in row["waiting"]:
        row["waiting"] = [*row["waiting"], env.stream]
    if t is ev.TaskCompleted:
        row["tasks_done"] += 1
    elif t is ev.TaskFailed or t is ev.TaskHalted:
        row["tasks_failed"] += 1
    if t in _SETTLES and env.stream in row["waiting"]:
        row["waiting"] = [s for s in row["waiting"] if s != env.stream]
    row["updated_at"] = max(row["updated_at"], env.recorded_at)
    row["last_position"] = env.position


class Runs(Projection):
    """``proj_runs``: status, goal, plan id, times, task counts and tokens of every run."""

    name = "runs"
    version = 3  # 2: the degraded column; 3: a child run's parent_root and parent_task
    tables = (RUNS,)
    handles = frozenset({*ev.TASK_EVENT_TYPES, ev.RunStarted, *_ENDS, ev.PlanSubmitted})

    def apply(self, model: Model, env: Envelope) -> None:
        for _, e in self.apply_many(model, [env]):
            raise e

    def apply_many(
        self, model: Model, events: Sequence[Envelope]
    ) -> list[tuple[Envelope, Exception]]:
        table = model.tables["proj_runs"]
        handles = self.handles
        errors: list[tuple[Envelope, Exception]] = []
        root: str | None = None
        row: Row = {}
        for env in events:
            data: Any = env.data
            if type(data) not in handles:
                continue
            try:
                r = data.root_id if type(data) is ev.PlanSubmitted else env.correlation_id
                if r != root:  # a run's events mostly come in a row: one lookup
                    root = r
                    found: Row | None = table.get((r,))
                    row = found if found is not None else _new_row(r, env)
                    table.put((r,), row)  # the cached row is the one changed below
                _fold(row, env)
            except Exception as e:
                errors.append((env, e))
        return errors

    # -- queries -------------------------------------------------------------

    _COLUMNS = ", ".join(
        "CASE WHEN status = 'running' AND waiting <> '[]'"
        " THEN 'awaiting_approval' ELSE status END AS status"
        if c == "status"
        else c
        for c in RUNS.column_names
    )

    def list(
        self,
        conn: sqlite3.Connection,
        *,
        status: str | None = None,
        since: float | None = None,
        limit: int | None = None,
        until: float | None = None,
        text: str | None = None,
        plan: str | None = None,
        agent: str | None = None,
        offset: int = 0,
    ) -> list[Row]:
        """Runs, newest first; ``status`` one of :data:`RUN_STATUSES`, ``since`` and
        ``until`` unix times (of the start), ``text`` a piece of the goal (any case),
        ``plan`` a piece of the plan id, ``agent`` an agent that handled one of the run's
        tasks (needs :class:`~cardbus.projections.TaskTable` in the same database);
        ``offset`` rows skipped (paging with ``limit``)."""
        where, args = self._where(status, since, until, text, plan, agent)
        sql = f"SELECT * FROM (SELECT {self._COLUMNS} FROM proj_runs)" + where
        sql += " ORDER BY started_at DESC, root_id DESC"
        if limit is not None:
            sql += f" LIMIT {int(limit)}"
            if offset:
                sql += f" OFFSET {int(offset)}"
        elif offset:
            sql += f" LIMIT -1 OFFSET {int(offset)}"
        return [_decode(r) for r in self.query(conn, sql, tuple(args))]

    def count(
        self,
        conn: sqlite3.Connection,
        *,
        status: str | None = None,
        since: float | None = None,
        until: float | None = None,
        text: str | None = None,
        plan: str | None = None,
        agent: str | None = None,
    ) -> int:
        """How many runs :meth:`list` would give with no limit."""
        where, args = self._where(status, since, until, text, plan, agent)
        sql = f"SELECT COUNT(*) AS n FROM (SELECT {self._COLUMNS} FROM proj_runs)" + where
        return int(self.query(conn, sql, tuple(args))[0]["n"])

    def _where(
        self,
        status: str | None,
        since: float | None,
        until: float | None,
        text: str | None,
        plan: str | None,
        agent: str | None,
    ) -> tuple[str, builtins.list[Any]]:
        if status is not None and status not in RUN_STATUSES:
            raise ConfigError(f"unknown run status {status!r} (known: {', '.join(RUN_STATUSES)})")
        where: list[str] = []
        args: list[Any] = []
        if status is not None:
            where.append("status = ?")
            args.append(status)
        if since is not None:
            where.append("started_at >= ?")
            args.append(since)
        if until is not None:
            where.append("started_at <= ?")
            args.append(until)
        for col, value in (("goal", text), ("plan_id", plan)):
            if value:
                escaped = value.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
                where.append(f"{col} LIKE ? ESCAPE '\\'")
                args.append(f"%{escaped}%")
        if agent:
            where.append("root_id IN (SELECT root_id FROM proj_tasks WHERE agent_id = ?)")
            args.append(agent)
        return (" WHERE " + " AND ".join(where)) if where else "", args

    def children(self, conn: sqlite3.Connection, root_id: str) -> builtins.list[Row]:
        """The child runs the tasks of run ``root_id`` started, oldest first."""
        sql = f"SELECT {self._COLUMNS} FROM proj_runs WHERE parent_root = ? ORDER BY started_at"
        return [_decode(r) for r in self.query(conn, sql, (root_id,))]

    def get(self, conn: sqlite3.Connection, root_id: str) -> Row | None:
        sql = f"SELECT {self._COLUMNS} FROM proj_runs WHERE root_id = ?"
        rows = self.query(conn, sql, (root_id,))
        return _decode(rows[0]) if rows else None


def _decode(row: Row) -> Row:
    for col in ("waiting", "degraded"):
        if isinstance(row.get(col), str):
            row[col] = msgspec.json.decode(row[col])
    if row.get("degraded", ()) is None:
        row["degraded"] = []
    return row


def run_duration(row: Row, now: float | None = None) -> float:
    """Seconds from start to end, or to ``now`` (default: the clock) while still running."""
    end = row["ended_at"]
    if end is None:
        end = time.time() if now is None else now
    return max(0.0, float(end) - float(row["started_at"]))


_RELATIVE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(s|m|h|d|w)\s*$")
_UNIT = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}


def parse_since(text: str, now: float | None = None) -> float:
    """A unix time from an age (``30m``, ``2h``, ``1d``, ``1w`` ago) or an ISO 8601 time.

    A time without a zone is UTC; a bad value is a ``ConfigError``.
    """
    m = _RELATIVE.match(text)
    if m:
        return (time.time() if now is None else now) - float(m.group(1)) * _UNIT[m.group(2)]
    try:
        moment = datetime.fromisoformat(text.strip().replace("Z", "+00:00"))
    except ValueError as e:
        raise ConfigError(
            f"--since {text!r}: give an age (30m, 2h, 1d, 1w) or an ISO 8601 time"
        ) from e
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return moment.timestamp()
