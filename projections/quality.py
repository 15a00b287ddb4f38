"""Quality per (agent, capability): first-pass, revision and output-schema compliance rates.

* ``results`` - results the agent submitted for the capability;
* ``completions`` - tasks the agent completed (reused results excluded);
* ``first_pass`` - completions with nothing before them on the task: no
  rejection, time-out, retry or revision request;
* ``revisions`` - ``RevisionRequested`` on a result of the agent;
* ``schema_violations`` - ``TaskRetryScheduled`` / ``TaskFailed`` with reason
  ``output_schema_mismatch`` after a result of the agent.

Rates (computed when read): ``first_pass_rate = first_pass / completions``,
``revision_rate = revisions / results``,
``schema_compliance = 1 - schema_violations / results`` (``None`` when the
denominator is 0).
"""

from __future__ import annotations

import sqlite3
from typing import Any

from cardbus.eventstore import events as ev
from cardbus.eventstore.envelope import Envelope
from cardbus.projections.base import Projection
from cardbus.projections.model import Model, Row, TableSpec

__all__ = ["Quality", "SCHEMA_MISMATCH"]

SCHEMA_MISMATCH = "output_schema_mismatch"

QUALITY = TableSpec(
    "proj_quality",
    (
        ("agent_id", "TEXT"),
        ("capability", "TEXT"),
        ("results", "INTEGER"),
        ("completions", "INTEGER"),
        ("first_pass", "INTEGER"),
        ("revisions", "INTEGER"),
        ("schema_violations", "INTEGER"),
    ),
    key=("agent_id", "capability"),
)
CONTEXT = TableSpec(
    "proj_quality_ctx",
    (("task_id", "TEXT"), ("capability", "TEXT"), ("troubled", "INTEGER"), ("last_agent", "TEXT")),
    key=("task_id",),
)


def _bump(table: Any, agent_id: str | None, capability: str, column: str) -> None:
    if agent_id is None:
        return
    k = (agent_id, capability)
    row = table.get(k)
    if row is None:
        row = {
            "agent_id": agent_id,
            "capability": capability,
            "results": 0,
            "completions": 0,
            "first_pass": 0,
            "revisions": 0,
            "schema_violations": 0,
        }
    row[column] += 1
    table.put(k, row)


def _rate(num: int, den: int) -> float | None:
    return num / den if den else None


class Quality(Projection):
    name = "quality"
    version = 1
    tables = (QUALITY, CONTEXT)
    handles = frozenset(
        {
            ev.TaskCreated,
            ev.TaskResultSubmitted,
            ev.TaskCompleted,
            ev.RevisionRequested,
            ev.TaskRejected,
            ev.TaskTimedOut,
            ev.TaskRetryScheduled,
            ev.TaskFailed,
        }
    )

    def apply(self, model: Model, env: Envelope) -> None:
        data = env.data
        tables = model.tables
        ctxs = tables["proj_quality_ctx"]
        key = (env.stream,)
        if isinstance(data, ev.TaskCreated):
            ctxs.put(
                key,
                {
                    "task_id": env.stream,
                    "capability": data.capability,
                    "troubled": 0,
                    "last_agent": None,
                },
            )
            return
        ctx = ctxs.get(key)
        if ctx is None:
            return
        table = tables["proj_quality"]
        capability = ctx["capability"]
        if isinstance(data, ev.TaskResultSubmitted):
            _bump(table, data.agent_id, capability, "results")
            ctx["last_agent"] = data.agent_id
        elif isinstance(data, ev.TaskCompleted):
            if data.reused_from is None:
                _bump(table, data.agent_id, capability, "completions")
                if not ctx["troubled"]:
                    _bump(table, data.agent_id, capability, "first_pass")
        elif isinstance(data, ev.RevisionRequested):
            _bump(table, ctx["last_agent"], capability, "revisions")
            ctx["troubled"] = 1
        elif isinstance(data, (ev.TaskRetryScheduled, ev.TaskFailed)):
            if data.reason == SCHEMA_MISMATCH:
                _bump(table, ctx["last_agent"], capability, "schema_violations")
            ctx["troubled"] = 1
        else:  # rejected, timed out
            ctx["troubled"] = 1
        ctxs.put(key, ctx)

    @staticmethod
    def with_rates(row: Row) -> dict[str, Any]:
        out = dict(row)
        out["first_pass_rate"] = _rate(row["first_pass"], row["completions"])
        out["revision_rate"] = _rate(row["revisions"], row["results"])
        v = _rate(row["schema_violations"], row["results"])
        out["schema_compliance"] = None if v is None else 1.0 - v
        return out

    def list(self, conn: sqlite3.Connection) -> list[dict[str, Any]]:
        rows = self.query(conn, "SELECT * FROM proj_quality ORDER BY agent_id, capability")
        return [self.with_rates(r) for r in rows]

    def get(
        self, conn: sqlite3.Connection, agent_id: str, capability: str
    ) -> dict[str, Any] | None:
        rows = self.query(
            conn,
            "SELECT * FROM proj_quality WHERE agent_id = ? AND capability = ?",
            (agent_id, capability),
        )
        return self.with_rates(rows[0]) if rows else None
