"""Loop-detection hashes: per root, how often each ``TaskDispatched.loop_hash`` was dispatched.

The orchestrator stamps every dispatch with a hash of (capability, normalized
inputs); the same hash coming back again and again inside one root is a loop.
A fan-out (one attempt sent to several agents at once) counts once: a
dispatch with the same task and attempt as the hash's previous one is not
counted again. Empty hashes are ignored.

Two ways to read it:

* ``LoopHashes().count(conn, root_id, loop_hash)`` on a runner's read model;
* :class:`LoopCounter`, the same fold in plain dicts, for a process that
  folds the log itself: ``counter.apply(env)``, ``counter.count(root_id, h)``.
"""

from __future__ import annotations

import sqlite3

from eventstore import events as ev
from eventstore.envelope import Envelope

from .base import Projection
from .model import Model, Row, TableSpec

__all__ = ["LoopCounter", "LoopHashes"]

LOOPS = TableSpec(
    "proj_loop_hashes",
    (
        ("root_id", "TEXT"),
        ("loop_hash", "TEXT"),
        ("count", "INTEGER"),
        ("first_seen", "REAL"),
        ("last_seen", "REAL"),
        ("first_position", "INTEGER"),
        ("last_position", "INTEGER"),
        ("last_task_id", "TEXT"),
        ("last_attempt", "INTEGER"),
    ),
    key=("root_id", "loop_hash"),
)


def _fold(model: Model, env: Envelope) -> None:
    data = env.data
    if type(data) is not ev.TaskDispatched or not data.loop_hash:
        return
    table = model["proj_loop_hashes"]
    key = (env.correlation_id, data.loop_hash)
    row = table.get(key)
    if row is None:
        row = {
            "root_id": key[0],
            "loop_hash": key[1],
            "count": 0,
            "first_seen": env.recorded_at,
            "last_seen": env.recorded_at,
            "first_position": env.position,
            "last_position": env.position,
            "last_task_id": None,
            "last_attempt": None,
        }
    elif row["last_task_id"] == env.stream and row["last_attempt"] == data.attempt:
        return  # fan-out of the same attempt
    row["count"] += 1
    row["last_seen"] = env.recorded_at
    row["last_position"] = env.position
    row["last_task_id"] = env.stream
    row["last_attempt"] = data.attempt
    table.put(key, row)


class LoopHashes(Projection):
    """``proj_loop_hashes``: (root_id, loop_hash) -> count, first and last seen."""

    name = "loops"
    version = 1
    tables = (LOOPS,)
    handles = frozenset({ev.TaskDispatched})

    def apply(self, model: Model, env: Envelope) -> None:
        _fold(model, env)

    def count(self, conn: sqlite3.Connection, root_id: str, loop_hash: str) -> int:
        row = conn.execute(
            "SELECT count FROM proj_loop_hashes WHERE root_id = ? AND loop_hash = ?",
            (root_id, loop_hash),
        ).fetchone()
        return int(row[0]) if row else 0

    def list(self, conn: sqlite3.Connection, root_id: str | None = None) -> list[Row]:
        if root_id is None:
            return self.query(
                conn, "SELECT * FROM proj_loop_hashes ORDER BY count DESC, first_position"
            )
        return self.query(
            conn,
            "SELECT * FROM proj_loop_hashes WHERE root_id = ? ORDER BY count DESC, first_position",
            (root_id,),
        )


class LoopCounter:
    """The loop-hash fold in memory: ``apply(env)`` every event, then ``count(root, hash)``."""

    def __init__(self) -> None:
        self.model = Model.in_memory(LoopHashes.tables)

    def apply(self, env: Envelope) -> None:
        _fold(self.model, env)

    def count(self, root_id: str, loop_hash: str) -> int:
        row = self.model["proj_loop_hashes"].get((root_id, loop_hash))
        return int(row["count"]) if row else 0

    def hashes(self, root_id: str) -> dict[str, int]:
        return {
            r["loop_hash"]: r["count"]
            for r in self.model["proj_loop_hashes"].rows()
            if r["root_id"] == root_id
        }
