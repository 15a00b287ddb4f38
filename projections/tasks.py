"""The task table: one row per task, folded with the state machine.

``status`` comes from :func:`eventstore.states.transition`. An event the state
machine refuses (only possible in a tampered or buggy log) leaves the status
where it was and is recorded in ``reason`` as ``illegal transition: ...``;
the fold never raises on it.

``reason`` holds the latest explanation of where the task is: a rejection,
retry, time-out, failure, halt, cancellation, revision request or missing
input; it is cleared when the task completes, unless its review never passed
(then ``quality_met`` is 0 and ``open_issues`` holds what was left open). While a
model call of the task waits for its provider's limit (``model.queued`` until
``model.slot_granted``), ``reason`` says so (:data:`QUEUED_FOR_LIMIT`): queued, not
running; the status does not change (the agent has the card).
"""

from __future__ import annotations

import builtins
import sqlite3
from collections.abc import Callable, Sequence
from typing import Any

import msgspec

from cardbus.eventstore import events as ev
from cardbus.eventstore.envelope import Envelope
from cardbus.eventstore.errors import IllegalTransition
from cardbus.eventstore.states import TRANSITIONS, TaskState, transition
from cardbus.projections.base import Projection
from cardbus.projections.model import Model, Row, TableSpec

__all__ = ["QUEUED_FOR_LIMIT", "TaskTable", "event_reason"]

#: the reason of a task whose model call waits for its provider's limit
QUEUED_FOR_LIMIT = "queued for the model's limit"

_STATE = {s.value: s for s in TaskState}
_json = msgspec.json.Encoder().encode

TASKS = TableSpec(
    "proj_tasks",
    (
        ("task_id", "TEXT"),
        ("parent_task_id", "TEXT"),
        ("root_id", "TEXT"),
        ("agent_id", "TEXT"),
        ("capability", "TEXT"),
        ("status", "TEXT"),
        ("attempts", "INTEGER"),
        ("input", "TEXT"),
        ("output", "TEXT"),
        ("reason", "TEXT"),
        ("created_at", "REAL"),
        ("updated_at", "REAL"),
        ("goal", "TEXT"),
        ("version", "INTEGER"),
        ("quality_met", "INTEGER"),  # a completion: 0 if its review never passed
        ("open_issues", "TEXT"),  # and the issues still open then (JSON)
    ),
    key=("task_id",),
    indexes=(("root_id",),),
)


def _issues(issues: list[ev.ReviewIssue]) -> str:
    return "; ".join(f"[{i.severity}] {i.section}: {i.suggestion}" for i in issues)


def event_reason(data: Any) -> str | None:
    """The human reason an event carries, if it is one that explains a state change."""
    match data:
        case ev.TaskRejected():
            r = f"rejected by {data.agent_id}: {data.reason}"
            return f"{r} ({data.detail})" if data.detail else r
        case ev.TaskRetryScheduled():
            return f"retry as attempt {data.attempt} in {data.delay_s:g}s: {data.reason}"
        case ev.TaskTimedOut() if data.reason == "agent_lost":
            return f"attempt {data.attempt} lost: {data.agent_id} went before it answered"
        case ev.TaskTimedOut() if data.reason == "host_lost":
            return (
                f"attempt {data.attempt} lost with its host: the process running"
                f" {data.agent_id} ended (not the agent's fault)"
            )
        case ev.TaskTimedOut():
            return f"attempt {data.attempt} by {data.agent_id} timed out"
        case ev.TaskCompleted() if not data.quality_met:
            r = "completed, quality not met"
            return f"{r}: {_issues(data.open_issues)}" if data.open_issues else r
        case ev.TaskFailed():
            return f"failed: {data.reason}" + (f" ({data.error})" if data.error else "")
        case ev.TaskHalted():
            return f"halted: {data.reason}" + (f" ({data.detail})" if data.detail else "")
        case ev.TaskCancelled():
            return f"cancelled: {data.reason}"
        case ev.RevisionRequested():
            r = f"revision requested (round {data.round})"
            return f"{r}: {_issues(data.issues)}" if data.issues else r
        case ev.TaskNeedsInput():
            return f"needs input: {data.missing}"
        case ev.ApprovalRequested() if data.reason == "question":  # AskPerson: an answer
            return f"question to a person: {data.detail}"
        case ev.ApprovalRequested():
            r = f"awaiting approval: {data.reason}"
            return f"{r} ({data.detail})" if data.detail else r
        case ev.ApprovalDenied():
            return f"approval denied by {data.by}" + (f": {data.note}" if data.note else "")
        case ev.TaskResultIgnored():
            return f"result of attempt {data.attempt} by {data.agent_id} ignored: {data.reason}"
        case ev.TaskResultSubmitted() if data.error:
            return f"result {data.status}: {data.error}"
        case ev.RunFailed() | ev.RunHalted():
            return data.reason
        case ev.BudgetRefused():
            return f"{data.action} refused ({data.decision}): {data.reason}"
    return None


# (status, event type) -> status: the state machine's plain table, flattened for speed.
_NEXT: dict[tuple[str | None, type], str] = {
    (frm.value if frm is not None else None, etype): to.value
    for etype, moves in TRANSITIONS.items()
    for frm, to in moves.items()
}


def _on_attempt(row: Row, data: Any) -> None:
    row["agent_id"] = data.agent_id
    if data.attempt > row["attempts"]:
        row["attempts"] = data.attempt


def _on_child(row: Row, data: Any) -> None:
    """A child-run task's attempt: counted as one, no agent (its child run's agents)."""
    row["attempts"] = max(row["attempts"], data.attempt)


def _on_result(row: Row, data: Any) -> None:
    if data.output is not None:
        row["output"] = _json(data.output).decode()
    if data.error:
        row["reason"] = event_reason(data)


def _on_completed(row: Row, data: Any) -> None:
    row["agent_id"] = data.agent_id
    row["output"] = _json(data.output).decode()
    row["reason"] = event_reason(data)  # None, or the quality not met and its open issues
    row["quality_met"] = int(data.quality_met)
    row["open_issues"] = _json(data.open_issues).decode() if data.open_issues else None


def _clear_reason(row: Row, data: Any) -> None:
    row["reason"] = None


def _set_reason(row: Row, data: Any) -> None:
    reason = event_reason(data)
    if reason is not None:
        row["reason"] = reason


_UPDATES: dict[type, Callable[[Row, Any], None]] = {
    t: _set_reason for t in ev.TASK_EVENT_TYPES if t is not ev.TaskCreated
}
_UPDATES.update(
    {
        ev.TaskDispatched: _on_attempt,
        ev.TaskStarted: _on_attempt,
        ev.ChildRunStarted: _on_child,
        ev.TaskResultSubmitted: _on_result,
        ev.TaskCompleted: _on_completed,
        ev.InputProvided: _clear_reason,
        ev.ApprovalGranted: _clear_reason,
    }
)


def _new_row(env: Envelope) -> Row:
    row: Row = {
        "task_id": env.stream,
        "parent_task_id": None,
        "root_id": env.correlation_id,
        "agent_id": None,
        "capability": None,
        "status": None,
        "attempts": 0,
        "input": None,
        "output": None,
        "reason": None,
        "created_at": env.recorded_at,
        "updated_at": env.recorded_at,
        "goal": None,
        "version": 0,
        "quality_met": None,
        "open_issues": None,
    }
    data = env.data
    if isinstance(data, ev.TaskCreated):
        row["parent_task_id"] = data.parent_id
        row["root_id"] = data.root_id
        row["capability"] = data.capability
        row["goal"] = data.goal
        row["input"] = _json(data.inputs).decode()
    return row


# event type -> ({status: status} of the plain table, row update); one lookup per event
_BY_TYPE: dict[type, tuple[dict[str | None, str], Callable[[Row, Any], None] | None]] = {
    t: ({frm: to for (frm, et), to in _NEXT.items() if et is t}, _UPDATES.get(t))
    for t in ev.TASK_EVENT_TYPES
}


_LIMIT_WAITS = frozenset({ev.ModelQueued, ev.ModelSlotGranted})


def _limit_wait(row: Row, data: Any) -> None:
    reason = row["reason"] or ""
    if isinstance(data, ev.ModelQueued):
        row["reason"] = f"{QUEUED_FOR_LIMIT} ({data.limit or data.model})"
    elif reason.startswith(QUEUED_FOR_LIMIT):
        row["reason"] = None


class TaskTable(Projection):
    """``proj_tasks``: the columns of the source designs, plus ``goal`` and stream ``version``."""

    name = "tasks"
    version = 3  # 2: quality_met, open_issues; 3: queued for the model's limit
    tables = (TASKS,)
    handles = frozenset(ev.TASK_EVENT_TYPES) | _LIMIT_WAITS

    def apply(self, model: Model, env: Envelope) -> None:
        for _, e in self.apply_many(model, [env]):
            raise e

    def apply_many(
        self, model: Model, events: Sequence[Envelope]
    ) -> list[tuple[Envelope, Exception]]:
        # One loop with everything in locals: this fold is what a rebuild spends its time on.
        tasks = model.tables["proj_tasks"]
        get, put = tasks.get, tasks.put
        by_type = _BY_TYPE
        errors: list[tuple[Envelope, Exception]] = []
        stream: str | None = None
        row: Row = {}
        for env in events:
            data = env.data
            t = type(data)
            spec = by_type.get(t)
            if spec is None:
                if t in _LIMIT_WAITS:  # no state change: the reason says it is queued
                    waiting = get((env.stream,))
                    if waiting is not None:
                        _limit_wait(waiting, data)
                        waiting["updated_at"] = env.recorded_at
                        put((env.stream,), waiting)
                continue
            moves, update = spec
            try:
                if env.stream != stream:  # a task's events mostly come in a row: one lookup
                    stream = env.stream
                    key = (stream,)
                    found: Row | None = get(key)
                    row = found if found is not None else _new_row(env)
                    put(key, row)  # the cached row is the one changed below
                status = row["status"]
                new_status = moves.get(status)
                if new_status is None:  # not in the plain table: approval, or refused
                    try:
                        new_status = transition(_STATE[status] if status else None, data).value
                    except IllegalTransition as e:
                        row["reason"] = f"illegal transition: {e} (event {env.event_id})"
                if new_status is not None:
                    row["status"] = new_status
                    if update is not None:
                        update(row, data)
                row["updated_at"] = env.recorded_at
                row["version"] = env.version
            except Exception as e:
                errors.append((env, e))
        return errors

    # -- queries -------------------------------------------------------------

    def list(
        self,
        conn: sqlite3.Connection,
        *,
        status: str | None = None,
        agent: str | None = None,
        root: str | None = None,
        capability: str | None = None,
        limit: int | None = None,
        statuses: Sequence[str] | None = None,
        offset: int = 0,
    ) -> list[Row]:
        """Tasks in creation order; ``statuses``: any of these; ``offset`` rows skipped."""
        where, args = self._where(status, agent, root, capability, statuses)
        sql = "SELECT * FROM proj_tasks" + where + " ORDER BY created_at, task_id"
        if limit is not None:
            sql += f" LIMIT {int(limit)}"
        elif offset:
            sql += " LIMIT -1"
        if offset:
            sql += f" OFFSET {int(offset)}"
        return self.query(conn, sql, tuple(args))

    def count(
        self,
        conn: sqlite3.Connection,
        *,
        root: str | None = None,
        statuses: Sequence[str] | None = None,
    ) -> dict[str, int]:
        """Tasks by status (of run ``root``; of ``statuses`` only, if given)."""
        where, args = self._where(None, None, root, None, statuses)
        sql = "SELECT status, COUNT(*) AS n FROM proj_tasks" + where + " GROUP BY status"
        return {r["status"]: int(r["n"]) for r in self.query(conn, sql, tuple(args))}

    @staticmethod
    def _where(
        status: str | None,
        agent: str | None,
        root: str | None,
        capability: str | None,
        statuses: Sequence[str] | None,
    ) -> tuple[str, builtins.list[Any]]:
        where: list[str] = []
        args: list[Any] = []
        for col, value in (
            ("status", status),
            ("agent_id", agent),
            ("root_id", root),
            ("capability", capability),
        ):
            if value is not None:
                where.append(f"{col} = ?")
                args.append(value)
        if statuses is not None:
            where.append(f"status IN ({', '.join('?' * len(statuses)) or 'NULL'})")
            args.extend(statuses)
        return (" WHERE " + " AND ".join(where)) if where else "", args

    def get(self, conn: sqlite3.Connection, task_id: str) -> Row | None:
        rows = self.query(conn, "SELECT * FROM proj_tasks WHERE task_id = ?", (task_id,))
        return rows[0] if rows else None
