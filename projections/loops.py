"""Loop-detection hashes: per root, each ``TaskDispatched.loop_hash`` and how often it came back.

The orchestrator stamps a dispatch with a hash of (capability, normalized
inputs); the same hash on more and more tasks of one root is a loop. The
counting rule is the orchestrator's (``bus/runstate.py``): ``count`` is the
number of *distinct tasks* of the root dispatched with that hash, so retries
and fan-out of one task count once; ``dispatches`` counts every dispatch
event. Empty hashes are ignored.

Two ways to read it:

* ``LoopHashes().count(conn, root_id, loop_hash)`` on a runner's read model;
* :class:`LoopCounter`, the same fold in plain dicts, for a process that
  folds the log itself: ``counter.apply(env)``, ``counter.count(root_id, h)``.
"""

from __future__ import annotations

import sqlite3

from cardbus.eventstore import events as ev
from cardbus.eventstore.envelope import Envelope
from cardbus.projections.base import Projection
from cardbus.projections.model import Model, Row, TableSpec

__all__ = ["LoopCounter", "LoopHashes"]

LOOPS = TableSpec(
    "proj_loop_hashes",
    (
        ("root_id", "TEXT"),
        ("loop_hash", "TEXT"),
        ("count", "INTEGER"),  # distinct tasks
        ("dispatches", "INTEGER"),
        ("first_seen", "REAL"),
        ("last_seen", "REAL"),
        ("first_position", "INTEGER"),
        ("last_position", "INTEGER"),
    ),
    key=("root_id", "loop_hash"),
)
# which tasks of a root were dispatched with a hash (a task counts once)
LOOP_TASKS = TableSpec(
    "proj_loop_tasks",
    (("root_id", "TEXT"), ("loop_hash", "TEXT"), ("task_id", "TEXT"), ("first_seen", "REAL")),
    key=("root_id", "loop_hash", "task_id"),
)


def _fold(model: Model, env: Envelope) -> None:
    data = env.data
    if not isinstance(data, ev.TaskDispatched) or not data.loop_hash:
        return
    tables = model.tables
    hashes, tasks = tables["proj_loop_hashes"], tables["proj_loop_tasks"]
    key = (env.correlation_id, data.loop_hash)
    row = hashes.get(key)
    if row is None:
        row = {
            "root_id": key[0],
            "loop_hash": key[1],
            "count": 0,
            "dispatches": 0,
            "first_seen": env.recorded_at,
            "last_seen": env.recorded_at,
            "first_position": env.position,
            "last_position": env.position,
        }
    task_key = (*key, env.stream)
    if tasks.get(task_key) is None:
        tasks.put(
            task_key,
            {
                "root_id": key[0],
                "loop_hash": key[1],
                "task_id": env.stream,
                "first_seen": env.recorded_at,
            },
        )
        row["count"] += 1
    row["dispatches"] += 1
    row["last_seen"] = env.recorded_at
    row["last_position"] = env.position
    hashes.put(key, row)


class LoopHashes(Projection):
    """``proj_loop_hashes``: (root_id, loop_hash) -> distinct tasks, dispatches, first/last seen."""

    name = "loops"
    version = 2
    tables = (LOOPS, LOOP_TASKS)
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
                conn,
                "SELECT * FROM proj_loop_hashes ORDER BY count DESC, dispatches DESC,"
                " first_position",
            )
        return self.query(
            conn,
            "SELECT * FROM proj_loop_hashes WHERE root_id = ?"
            " ORDER BY count DESC, dispatches DESC, first_position",
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
