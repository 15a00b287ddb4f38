"""Snapshots of the orchestrator's state, so a start does not grow with history.

A snapshot is derivable state, nothing more: ``RunState`` as folded up to a
log position, with the open runs only (finished runs are answered from the
log, as for runs past ``Policy.retain_finished_runs``), the agents, the
selection statistics and the failure records. It is a file beside the log
(``<db>.snap`` for SQLite), never an event: the log stays the truth, and a
snapshot can be deleted at any time (the next start folds the log again).

It names what it covers: the position, the event there (id and hash) and,
when the store keeps one (SQLite), the log hash at that position. ``load``
checks all three against the log, and a fingerprint of the fold's code; a
snapshot that does not match (another log, a log cut short or rewritten, a
newer cardbus) is ignored, and the start folds the log from position 1.
"""

from __future__ import annotations

import collections
import contextlib
import hashlib
import heapq
import logging
import os
import time
from pathlib import Path
from typing import Any

import msgspec

from cardbus.agents.cards import AgentCard
from cardbus.bus.orchestrator import budget as _budget
from cardbus.bus.orchestrator import loop_pause as _loop_pause
from cardbus.bus.orchestrator import runstate as _runstate
from cardbus.bus.orchestrator import waits as _waits
from cardbus.bus.orchestrator.runstate import RunState, RunView, TaskView
from cardbus.eventstore import EventStore
from cardbus.eventstore import states as _states
from cardbus.projections import agent_stats as _agent_stats

__all__ = [
    "StateData",
    "capture",
    "decode_state",
    "encode_state",
    "load",
    "restore",
    "save",
    "snapshot_path_for",
]

log = logging.getLogger(__name__)

FORMAT = 1


class StatsData(msgspec.Struct, kw_only=True):
    """``AgentStatsFold``'s tables: counts per (agent, capability), open attempts, latencies."""

    stats: list[tuple[str, str, dict[str, Any]]]
    context: list[tuple[str, dict[str, Any]]]
    latency: list[tuple[str, str, list[float]]]


class StateData(msgspec.Struct, kw_only=True):
    """The part of ``RunState`` a snapshot keeps: everything but finished runs."""

    runs: list[RunView]  # open runs, in start order
    tasks: list[TaskView]
    agents: dict[str, AgentCard]
    plans: dict[str, str]
    plan_digests: dict[str, str]
    plan_streams: dict[str, str]
    versions: dict[str, int]
    position: int
    wakeups: list[tuple[float, str]]
    anomalies: list[str]
    failures: list[tuple[str, str, list[tuple[str, float, str]]]]
    stats: StatsData
    # RunState's dicts of plain values about agents, by attribute name (e.g. agent_leases)
    extras: dict[str, dict[str, Any]] = {}


#: RunState attributes a snapshot carries (or, for ``_wake_limit`` and the ``on_wake`` and
#: ``on_open`` hooks, need not): a test fails when RunState gains one that is not here
HANDLED = frozenset(
    {
        "retain_finished",
        "_finished",
        "folded_floor",  # the orchestrator's: set anew as it starts
        "retire_at",
        "_plan_streams",
        "runs",
        "open",
        "tasks",
        "agents",
        "plans",
        "plan_digests",
        "versions",
        "position",
        "wakeups",
        "_wake_limit",
        "runs_changed",  # a change counter (admission): any value will do after a restore
        "on_wake",
        "on_open",
        "_stats",
        "anomalies",
        "failures",
        "_failure_keys",
    }
)
EXTRAS = ("agent_leases",)


class Snapshot(msgspec.Struct, kw_only=True):
    format: int
    fingerprint: str  # of the fold's code: another cardbus version folds anew
    position: int  # every event up to here is in the state, none after it
    event_id: str  # the event at ``position``
    event_hash: str
    log_hash: str | None  # the log hash at ``position`` (None: the store keeps none)
    written_at: float
    traceparents: dict[str, str | None]  # open run -> its run.started's traceparent
    state: msgspec.Raw  # a StateData, encoded when captured (the state moves on meanwhile)


def _fingerprint() -> str:
    h = hashlib.sha256(str(FORMAT).encode())
    for module in (_runstate, _budget, _agent_stats, _states, _waits, _loop_pause):
        h.update(Path(str(module.__file__)).read_bytes())
    return h.hexdigest()


FINGERPRINT = _fingerprint()


def snapshot_path_for(store: EventStore) -> Path | None:
    """Where a store's snapshot lives: ``<db>.snap`` beside a SQLite file, else None."""
    path = getattr(store, "path", None)
    if not isinstance(path, (str, Path)) or str(path) in ("", ":memory:"):
        return None
    return Path(f"{path}.snap")


def _finished_roots(state: RunState) -> set[str]:
    return {r for r, run in state.runs.items() if run.finished is not None}


def capture(state: RunState) -> StateData:
    """``state`` without its finished runs (and their tasks, plans and versions)."""
    done = _finished_roots(state)
    gone: set[str] = set(done)
    for root in done:
        gone.update(state.runs[root].tasks)
        plan_stream = state._plan_streams.get(root)
        if plan_stream:
            gone.add(plan_stream)
    tasks = [
        t for tid, t in state.tasks.items() if tid not in gone and t.created.root_id not in done
    ]
    gone.update(tid for tid, t in state.tasks.items() if t.created.root_id in done)
    stats = state._stats
    return StateData(
        runs=list(state.open.values()),
        tasks=tasks,
        agents=dict(state.agents),
        plans={p: r for p, r in state.plans.items() if r not in done},
        plan_digests={
            p: d for p, d in state.plan_digests.items() if state.plans.get(p) not in done
        },
        plan_streams={r: s for r, s in state._plan_streams.items() if r not in done},
        versions={s: v for s, v in state.versions.items() if s not in gone},
        position=state.position,
        wakeups=sorted(w for w in state.wakeups if w[1] in state.open),
        anomalies=list(state.anomalies),
        failures=[
            (a, c, [(k, at, reason) for k, (at, reason) in recent.items()])
            for (a, c), recent in state.failures.items()
        ],
        stats=StatsData(
            stats=[(a, c, row) for (a, c), row in stats.model["proj_agent_stats"].data.items()],
            context=[(k[0], row) for k, row in stats._context.data.items()],
            latency=[(a, c, list(xs)) for (a, c), xs in stats._latency.items()],
        ),
        extras={k: dict(getattr(state, k)) for k in EXTRAS if hasattr(state, k)},
    )


def encode_state(state: RunState) -> bytes:
    """``capture(state)``, encoded now: what ``save`` writes."""
    return msgspec.json.encode(capture(state))


def _dec_hook(kind: Any, obj: Any) -> Any:
    if kind is collections.Counter or getattr(kind, "__origin__", None) is collections.Counter:
        return collections.Counter(obj)
    raise NotImplementedError(f"cannot decode {kind!r}")


def decode_state(body: bytes) -> StateData:
    """What ``encode_state`` wrote (``msgspec.ValidationError`` if it is not that)."""
    return msgspec.json.decode(body, type=StateData, dec_hook=_dec_hook)


def restore(data: StateData, state: RunState) -> RunState:
    """Fill an empty ``state`` with what ``data`` holds, ready to fold the events after it."""
    for run in data.runs:
        state.runs[run.root_id] = state.open[run.root_id] = run
    state.tasks = {t.task_id: t for t in data.tasks}
    state.agents = dict(data.agents)
    state.plans = dict(data.plans)
    state.plan_digests = dict(data.plan_digests)
    state._plan_streams = dict(data.plan_streams)
    state.versions = dict(data.versions)
    state.position = data.position
    state.wakeups = list(data.wakeups)
    heapq.heapify(state.wakeups)
    state.anomalies.extend(data.anomalies)
    for a, c, recent in data.failures:
        state.failures[a, c] = collections.OrderedDict((k, (at, r)) for k, at, r in recent)
        for k, _, _ in recent:
            state._failure_keys[k] = (a, c)
    stats = state._stats
    table = stats.model["proj_agent_stats"]
    for a, c, row in data.stats.stats:
        table.data[a, c] = row
    for task_id, row in data.stats.context:
        stats._context.data[(task_id,)] = row
    for a, c, xs in data.stats.latency:
        stats.restore_latencies(a, c, xs)
    for k, values in data.extras.items():
        if hasattr(state, k):
            getattr(state, k).update(values)
    return state


async def save(
    path: Path,
    store: EventStore,
    data: bytes,
    position: int,
    traceparents: dict[str, str | None],
) -> bool:
    """Write a snapshot of ``data`` (an encoded ``StateData`` covering the log up to
    ``position``) to ``path`` atomically (a temporary file renamed over it); False if
    the log has no such event."""
    if position <= 0:
        return False
    page = await store.read_all(position, 1)
    if not page or page[0].position != position:
        return False
    snap = Snapshot(
        format=FORMAT,
        fingerprint=FINGERPRINT,
        position=position,
        event_id=page[0].event_id,
        event_hash=page[0].hash,
        log_hash=await store.log_hash_at(position),
        written_at=time.time(),
        traceparents=traceparents,
        state=msgspec.Raw(data),
    )
    body = msgspec.json.encode(snap)
    tmp = path.with_name(f"{path.name}.{os.getpid()}.{id(snap)}.tmp")
    tmp.write_bytes(body)
    os.replace(tmp, path)
    return True


async def load(path: Path, store: EventStore) -> tuple[Snapshot, StateData] | None:
    """The snapshot at ``path`` and its state if it still describes this log, else None
    (and why, logged)."""
    try:
        body = path.read_bytes()
    except FileNotFoundError:
        return None
    except OSError as e:
        log.warning("snapshot %s unreadable, folding the whole log: %s", path, e)
        return None
    try:
        snap = msgspec.json.decode(body, type=Snapshot)
        if snap.format != FORMAT or snap.fingerprint != FINGERPRINT:
            log.info("snapshot %s is of another cardbus version, folding the whole log", path)
            return None
        data = decode_state(snap.state)
    except (msgspec.DecodeError, msgspec.ValidationError) as e:
        log.warning("snapshot %s unreadable, folding the whole log: %s", path, e)
        return None
    page = await store.read_all(snap.position, 1)
    stale = (
        not page
        or page[0].position != snap.position
        or page[0].event_id != snap.event_id
        or page[0].hash != snap.event_hash
    )
    if not stale and snap.log_hash is not None:
        stale = await store.log_hash_at(snap.position) != snap.log_hash
    if stale:
        log.warning("snapshot %s does not match the log, folding the whole log", path)
        with contextlib.suppress(OSError):
            path.unlink()
        return None
    return snap, data
