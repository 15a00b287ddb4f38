"""Cost: input and output tokens (``TaskResultSubmitted.usage``) per root, agent and capability.

One table, ``proj_cost``, keyed by ``(scope, key)`` where scope is ``root``,
``agent`` or ``capability``; ``results`` counts the results that carried the
tokens.
"""

from __future__ import annotations

import sqlite3

from cardbus.eventstore import events as ev
from cardbus.eventstore.batch import tokens_in_range
from cardbus.eventstore.envelope import Envelope
from cardbus.projections.base import Projection
from cardbus.projections.model import Model, Row, TableSpec

__all__ = ["Cost", "SCOPES"]

SCOPES = ("root", "agent", "capability")

COST = TableSpec(
    "proj_cost",
    (
        ("scope", "TEXT"),
        ("key", "TEXT"),
        ("input_tokens", "INTEGER"),
        ("output_tokens", "INTEGER"),
        ("results", "INTEGER"),
    ),
    key=("scope", "key"),
)
CONTEXT = TableSpec(
    "proj_cost_ctx", (("task_id", "TEXT"), ("capability", "TEXT")), key=("task_id",)
)


class Cost(Projection):
    name = "cost"
    version = 1
    tables = (COST, CONTEXT)
    handles = frozenset({ev.TaskCreated, ev.TaskResultSubmitted})

    def apply(self, model: Model, env: Envelope) -> None:
        data = env.data
        if type(data) is ev.TaskCreated:
            model["proj_cost_ctx"].put(
                (env.stream,), {"task_id": env.stream, "capability": data.capability}
            )
            return
        if type(data) is not ev.TaskResultSubmitted:
            return
        ctx = model["proj_cost_ctx"].get((env.stream,))
        capability = ctx["capability"] if ctx else "?"
        table = model["proj_cost"]
        usage = data.usage
        for key in (
            ("root", env.correlation_id),
            ("agent", data.agent_id),
            ("capability", capability),
        ):
            row = table.get(key)
            if row is None:
                row = {
                    "scope": key[0],
                    "key": key[1],
                    "input_tokens": 0,
                    "output_tokens": 0,
                    "results": 0,
                }
            row["input_tokens"] += tokens_in_range(usage.input_tokens)
            row["output_tokens"] += tokens_in_range(usage.output_tokens)
            row["results"] += 1
            table.put(key, row)

    def list(self, conn: sqlite3.Connection, scope: str | None = None) -> list[Row]:
        if scope is None:
            return self.query(conn, "SELECT * FROM proj_cost ORDER BY scope, key")
        return self.query(conn, "SELECT * FROM proj_cost WHERE scope = ? ORDER BY key", (scope,))

    def get(self, conn: sqlite3.Connection, scope: str, key: str) -> Row | None:
        rows = self.query(conn, "SELECT * FROM proj_cost WHERE scope = ? AND key = ?", (scope, key))
        return rows[0] if rows else None
