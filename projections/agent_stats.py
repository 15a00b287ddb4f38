"""Agent statistics per (agent, capability): outcomes, rejections and latency.

Counting rules (one *attempt* = one dispatch of a task to one agent):

* success - the attempt ended in ``TaskCompleted`` naming the agent (a result
  reused from a forked-from run does not count), or in ``RevisionRequested``
  (the agent delivered; how good it was is the quality projection's business);
* failure - the attempt ended in ``TaskTimedOut`` (also counted in
  ``timeouts``), or in ``TaskRetryScheduled`` / ``TaskFailed`` while it was
  still open (a failed result, an output-schema mismatch, ...);
* rejection - ``TaskRejected`` by the agent: not a run;
* host loss - ``TaskTimedOut`` with reason ``host_lost`` (the attempt died with
  the runtime's own process): not the agent's, counted nowhere;
* ``runs = successes + failures``; ``success_rate = successes / runs``;
* latency - dispatch to the agent's first ``TaskResultSubmitted`` of that
  attempt (``recorded_at`` difference); p50/p95 by linear interpolation.

Attempts ending in needs-input, halt or cancellation count nowhere.

Two ways to read it, with the same numbers:

* ``AgentStats().get(conn, agent_id, capability)`` on a runner's read model;
* :class:`AgentStatsFold`, the same fold in plain dicts with no SQLite, for
  the orchestrator's selection: ``fold.apply(env)`` every event, then
  ``fold.get(agent_id, capability) -> AgentStat``.
"""

from __future__ import annotations

import bisect
import collections
import math
import sqlite3
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import msgspec

from cardbus.eventstore import events as ev
from cardbus.eventstore.envelope import Envelope
from cardbus.projections.base import Projection
from cardbus.projections.model import MemoryTable, Model, Row, TableSpec

__all__ = ["AgentStat", "AgentStats", "AgentStatsFold", "percentile"]

STATS = TableSpec(
    "proj_agent_stats",
    (
        ("agent_id", "TEXT"),
        ("capability", "TEXT"),
        ("successes", "INTEGER"),
        ("failures", "INTEGER"),
        ("timeouts", "INTEGER"),
        ("rejections", "INTEGER"),
        ("results", "INTEGER"),
    ),
    key=("agent_id", "capability"),
)
LATENCY = TableSpec(
    "proj_agent_latency",
    (("agent_id", "TEXT"), ("capability", "TEXT"), ("latency_s", "REAL")),
    indexes=(("agent_id", "capability", "latency_s"),),
)
# Per task: its capability and its open attempts {agent_id: [dispatched_at, result_at]}.
CONTEXT = TableSpec(
    "proj_agent_ctx",
    (("task_id", "TEXT"), ("capability", "TEXT"), ("open", "JSON")),
    key=("task_id",),
)


class AgentStat(msgspec.Struct, frozen=True):
    """What selection needs to know about one agent for one capability."""

    runs: int = 0
    success_rate: float = 0.0  # 0.0 while runs == 0
    rejections: int = 0
    p50_s: float | None = None  # None while no latency sample exists
    p95_s: float | None = None
    successes: int = 0
    failures: int = 0
    timeouts: int = 0
    results: int = 0
    agent_id: str = ""
    capability: str = ""


def percentile(sorted_values: Sequence[float], p: float) -> float | None:
    """Linear-interpolated percentile ``p`` in [0, 1] of already sorted values."""
    n = len(sorted_values)
    if n == 0:
        return None
    k = (n - 1) * p
    lo = math.floor(k)
    hi = min(lo + 1, n - 1)
    return sorted_values[lo] + (sorted_values[hi] - sorted_values[lo]) * (k - lo)


def _stat(agent_id: str, capability: str, row: Row | None, latencies: list[float]) -> AgentStat:
    """``latencies`` must be sorted."""
    if row is None:
        row = {"successes": 0, "failures": 0, "timeouts": 0, "rejections": 0, "results": 0}
    runs = row["successes"] + row["failures"]
    return AgentStat(
        runs=runs,
        success_rate=row["successes"] / runs if runs else 0.0,
        rejections=row["rejections"],
        p50_s=percentile(latencies, 0.5),
        p95_s=percentile(latencies, 0.95),
        successes=row["successes"],
        failures=row["failures"],
        timeouts=row["timeouts"],
        results=row["results"],
        agent_id=agent_id,
        capability=capability,
    )


def _sum_rows(rows: Iterable[Row]) -> Row | None:
    total: Row | None = None
    for r in rows:
        if total is None:
            total = {k: 0 for k in ("successes", "failures", "timeouts", "rejections", "results")}
        for k in total:
            total[k] += r[k]
    return total


_HANDLES = frozenset(
    {
        ev.TaskCreated,
        ev.TaskDispatched,
        ev.TaskResultSubmitted,
        ev.TaskCompleted,
        ev.RevisionRequested,
        ev.TaskRejected,
        ev.TaskTimedOut,
        ev.TaskRetryScheduled,
        ev.TaskFailed,
        ev.TaskHalted,
        ev.TaskCancelled,
        ev.TaskNeedsInput,
    }
)


def _bump(stats: Any, agent_id: str, capability: str, column: str, also: str = "") -> None:
    if not agent_id:  # no agent's outcome (a child-run task's: its child run's agents count)
        return
    k = (agent_id, capability)
    row = stats.get(k)
    if row is None:
        row = {
            "agent_id": agent_id,
            "capability": capability,
            "successes": 0,
            "failures": 0,
            "timeouts": 0,
            "rejections": 0,
            "results": 0,
        }
    row[column] += 1
    if also:
        row[also] += 1
    stats.put(k, row)


def _fold(model: Model, env: Envelope) -> None:
    data = env.data
    tables = model.tables
    ctx_table = tables["proj_agent_ctx"]
    key = (env.stream,)
    if isinstance(data, ev.TaskCreated):
        ctx_table.put(key, {"task_id": env.stream, "capability": data.capability, "open": {}})
        return
    ctx = ctx_table.get(key)
    if ctx is None:
        return  # no TaskCreated: nothing to attribute to
    capability: str = ctx["capability"]
    open_: dict[str, list[float | None]] = ctx["open"]
    stats = tables["proj_agent_stats"]
    if isinstance(data, ev.TaskDispatched):
        open_[data.agent_id] = [env.recorded_at, None]
    elif isinstance(data, ev.TaskResultSubmitted):
        _bump(stats, data.agent_id, capability, "results")
        attempt = open_.get(data.agent_id)
        if attempt is not None and attempt[1] is None:
            attempt[1] = env.recorded_at
            start = attempt[0] or 0.0
            tables["proj_agent_latency"].add(
                (data.agent_id, capability, max(0.0, env.recorded_at - start))
            )
    elif isinstance(data, ev.TaskCompleted):
        if data.reused_from is None:
            _bump(stats, data.agent_id, capability, "successes")
        open_.clear()
    elif isinstance(data, ev.RevisionRequested):
        for agent_id, (_, result_at) in list(open_.items()):
            if result_at is not None:
                _bump(stats, agent_id, capability, "successes")
        open_.clear()
    elif isinstance(data, ev.TaskRejected):
        _bump(stats, data.agent_id, capability, "rejections")
        open_.pop(data.agent_id, None)
    elif isinstance(data, ev.TaskTimedOut) and data.reason == "host_lost":
        open_.pop(data.agent_id, None)  # died with the runtime's process: no outcome of its
    elif isinstance(data, ev.TaskTimedOut):
        if open_.pop(data.agent_id, None) is not None:
            _bump(stats, data.agent_id, capability, "failures", "timeouts")
    elif isinstance(data, (ev.TaskRetryScheduled, ev.TaskFailed)):
        for agent_id in list(open_):
            _bump(stats, agent_id, capability, "failures")
        open_.clear()
    else:  # halted, cancelled, needs input: the attempt ends without an outcome
        open_.clear()
    ctx_table.put(key, ctx)


# a task's last word: nothing after it changes an agent's numbers
_FINAL = (ev.TaskCompleted, ev.TaskFailed, ev.TaskCancelled, ev.TaskHalted)


class AgentStats(Projection):
    """``proj_agent_stats`` + ``proj_agent_latency``; see the module docstring."""

    name = "agent_stats"
    version = 1
    tables = (STATS, LATENCY, CONTEXT)
    handles = _HANDLES

    def apply(self, model: Model, env: Envelope) -> None:
        _fold(model, env)

    def get(
        self, conn: sqlite3.Connection, agent_id: str, capability: str | None = None
    ) -> AgentStat:
        """One agent's statistics for one capability (or all its capabilities)."""
        if capability is None:
            rows = self.query(
                conn, "SELECT * FROM proj_agent_stats WHERE agent_id = ?", (agent_id,)
            )
            lat = conn.execute(
                "SELECT latency_s FROM proj_agent_latency WHERE agent_id = ? ORDER BY latency_s",
                (agent_id,),
            ).fetchall()
            return _stat(agent_id, "", _sum_rows(rows), [x for (x,) in lat])
        rows = self.query(
            conn,
            "SELECT * FROM proj_agent_stats WHERE agent_id = ? AND capability = ?",
            (agent_id, capability),
        )
        lat = conn.execute(
            "SELECT latency_s FROM proj_agent_latency WHERE agent_id = ? AND capability = ?"
            " ORDER BY latency_s",
            (agent_id, capability),
        ).fetchall()
        return _stat(agent_id, capability, rows[0] if rows else None, [x for (x,) in lat])

    def all(self, conn: sqlite3.Connection) -> list[AgentStat]:
        latencies: dict[tuple[str, str], list[float]] = {}
        for a, c, x in conn.execute(
            "SELECT agent_id, capability, latency_s FROM proj_agent_latency ORDER BY latency_s"
        ):
            latencies.setdefault((a, c), []).append(x)
        return [
            _stat(
                r["agent_id"],
                r["capability"],
                r,
                latencies.get((r["agent_id"], r["capability"]), []),
            )
            for r in self.query(
                conn, "SELECT * FROM proj_agent_stats ORDER BY agent_id, capability"
            )
        ]


class AgentStatsFold:
    """Agent statistics folded in memory, no SQLite: for the orchestrator's selection.

    ``apply(env)`` each event of the log in position order (it ignores the
    ones it does not need), then ``get(agent_id, capability)``.
    """

    handles = _HANDLES

    def __init__(
        self,
        latency_window: int | None = None,
        forget_finished: bool = False,
        capability_of: Callable[[str], str | None] | None = None,
    ) -> None:
        """By default the same numbers as the projection, from every event ever.

        A long-lived reader (the orchestrator) bounds its memory instead:
        ``latency_window`` keeps only the latest N latency samples per (agent,
        capability), so p50/p95 are of recent attempts; ``forget_finished``
        drops a task's bookkeeping once it completes or fails for good.

        ``capability_of`` (with ``forget_finished``): the reader's own view of its
        tasks, ``task id -> capability`` while the task is known and not finished
        (None otherwise). The fold then keeps no row per task from its creation: a
        task's row is made at its first event after it, from that view. Most tasks
        of a waiting run are not dispatched yet, and a row (its dict, its key, its
        open attempts) was ~300 bytes each of them. The numbers are the same: a row
        made at creation would hold that capability and no open attempt.
        """
        self.model = Model.in_memory(AgentStats.tables)
        self.latency_window = latency_window
        self.forget_finished = forget_finished
        self._latency: dict[tuple[str, str], collections.deque[float]] = {}
        # each window's samples also kept sorted, one insertion (and one removal) per
        # sample: selection reads the p50 on every dispatch, and sorting the whole window
        # again after each new sample cost more than the rest of the lookup
        self._sorted_latency: dict[tuple[str, str], list[float]] = {}
        latency: MemoryTable = self.model["proj_agent_latency"]
        self._samples = latency.samples
        self._context: MemoryTable = self.model["proj_agent_ctx"]
        self._stats_table: MemoryTable = self.model["proj_agent_stats"]
        self._capability_of = capability_of if forget_finished else None

    def apply(self, env: Envelope) -> None:
        if type(env.data) in _HANDLES:
            if self._capability_of is not None and not self._row_for(env):
                return
            _fold(self.model, env)
            if self._samples:  # move new latency samples into per-key windows
                for a, c, x in self._samples:
                    self._add_sample((a, c), x)
                self._samples.clear()
            if self.forget_finished and isinstance(env.data, _FINAL):
                self._context.data.pop((env.stream,), None)

    def _row_for(self, env: Envelope) -> bool:
        """With ``capability_of``: whether ``env`` has a row to fold into (made now, as
        its ``task.created`` would have, when the task is known and not finished)."""
        key = (env.stream,)
        rows = self._context.data
        if type(env.data) is ev.TaskCreated:
            rows.pop(key, None)  # a fresh row, as task.created's: made at the next event
            return False
        if key in rows:
            return True
        assert self._capability_of is not None
        capability = self._capability_of(env.stream)
        if capability is None:  # unknown, or finished (its row was dropped then)
            return False
        rows[key] = {"task_id": env.stream, "capability": capability, "open": {}}
        return True

    def _add_sample(self, key: tuple[str, str], x: float) -> None:
        window = self._latency.get(key)
        if window is None:
            window = self._latency[key] = collections.deque(maxlen=self.latency_window)
            self._sorted_latency[key] = []
        ordered = self._sorted_latency[key]
        if window.maxlen is not None and len(window) == window.maxlen:
            oldest = window[0]  # the sample the append below pushes out
            i = bisect.bisect_left(ordered, oldest)
            if i < len(ordered) and ordered[i] == oldest:
                del ordered[i]
            else:  # not found (a NaN from a broken log compares unequal): sort afresh
                ordered[:] = sorted(list(window)[1:])
        window.append(x)
        bisect.insort(ordered, x)

    def restore_latencies(self, agent_id: str, capability: str, samples: Iterable[float]) -> None:
        """Set one window's samples, oldest first (a snapshot being loaded)."""
        window = collections.deque(samples, maxlen=self.latency_window)
        self._latency[agent_id, capability] = window
        self._sorted_latency[agent_id, capability] = sorted(window)

    def _sorted(self, key: tuple[str, str]) -> list[float]:
        return self._sorted_latency.get(key, [])

    def get(self, agent_id: str, capability: str | None = None) -> AgentStat:
        """Statistics of one agent for one capability (or over all its capabilities)."""
        stats: MemoryTable = self.model["proj_agent_stats"]
        if capability is None:
            rows = [r for (a, _), r in stats.data.items() if a == agent_id]
            lat = sorted(x for (a, c), xs in self._latency.items() if a == agent_id for x in xs)
            return _stat(agent_id, "", _sum_rows(rows), lat)
        key = (agent_id, capability)
        return _stat(agent_id, capability, stats.get(key), self._sorted(key))

    def all(self) -> list[AgentStat]:
        stats: MemoryTable = self.model["proj_agent_stats"]
        return [_stat(a, c, r, self._sorted((a, c))) for (a, c), r in sorted(stats.data.items())]

    def for_selection(self, agent_id: str, capability: str) -> tuple[int, float, float | None]:
        """``runs``, ``success_rate`` and ``p50_s`` of :meth:`get` (the same numbers), alone:
        what agent selection reads on every dispatch, without the p95 and the counts."""
        key = (agent_id, capability)
        p50 = percentile(self._sorted(key), 0.5)
        row = self._stats_table.data.get(key)
        if row is None:
            return 0, 0.0, p50
        runs = row["successes"] + row["failures"]
        return runs, row["successes"] / runs if runs else 0.0, p50
