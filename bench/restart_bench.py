"""Benchmark: restarts that do not grow with history (issue 17, item 2).

    .venv/bin/python bench/restart_bench.py                      # 10k, 100k, 1M events
    .venv/bin/python bench/restart_bench.py --sizes 10000,100000 # scaled down

Builds (once, cached in ``--cache``) SQLite logs of N events of finished
history: copies of one real 3-step pipeline run (research -> draft -> review,
18 events, written by the orchestrator on an in-memory log), appended through
``SqliteEventStore`` so both hash chains are real, followed by 20 open runs
that wait for an approval (so a start has in-flight work to resume, and
nothing to decide that would change the log between starts). The baseline is
a log holding only those 20 open runs ("empty": no finished history).

Prints, per size, medians of ``--repeat`` starts in this run:

* start, full fold: ``Orchestrator.start()`` with no snapshot (every event
  from position 1, as before snapshots);
* start, from snapshot: the same with ``<db>.snap`` written by a clean stop;
  its ratio to the baseline's start from a snapshot (target: <= 2x at 1M);
* ``cardbus replay`` of one finished run (in process, through the CLI);
* projection catch-up: all projections current, then one more run appended,
  the time ``ProjectionRunner.catch_up()`` takes to fold it.

Figures go to stdout and, as JSON lines, to ``--json`` (``bench/summary.py``).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import msgspec
from click.testing import CliRunner

sys.path.insert(0, str(Path(__file__).parent))
from pipeline_bench import AGENTS, pipeline_plan
from summary import record

from cardbus.bus.orchestrator import Orchestrator, Policy
from cardbus.bus.orchestrator import snapshot as _snap
from cardbus.bus.orchestrator.plan import Plan
from cardbus.bus.orchestrator.runstate import RunState
from cardbus.bus.runtime.embedded import EmbeddedRuntime
from cardbus.bus.transport.inprocess import InProcessBus
from cardbus.eventstore import (
    Append,
    Envelope,
    MemoryEventStore,
    NewEvent,
    SqliteEventStore,
    new_id,
)
from cardbus.eventstore import events as ev
from cardbus.projections import ProjectionRunner, all_projections
from cardbus.tools.cli import cli

OPEN_RUNS = 20
BENCH = "restart"


async def _template(plan: Plan) -> list[Envelope]:
    """The events of one run of ``plan``, in log order (agents registered first)."""
    store = MemoryEventStore()
    async with EmbeddedRuntime(store, AGENTS, default_planner=False) as rt:
        root = await rt.orchestrator.submit(plan)
        if not plan.tasks[0].requires_approval:
            await rt.orchestrator.wait(root, 30)
        else:
            await asyncio.sleep(0.2)
    return await store.read_all(1, 100_000)


def _run_of(events: list[Envelope]) -> list[Envelope]:
    """The events of the template's run (not the agents' own streams)."""
    root = next(e.stream for e in events if isinstance(e.data, ev.RunStarted))
    return [e for e in events if e.correlation_id == root]


def _copy(events: list[Envelope]) -> list[tuple[str, NewEvent]]:
    """The run's events with a new root id (and so new task ids)."""
    old = events[0].correlation_id
    new = new_id()
    plan_id = next(e.data.plan_id for e in events if isinstance(e.data, ev.RunStarted))
    swaps = [(plan_id, new_id()), (old, new), (old[-12:], new[-12:])]

    def swap(text: str) -> str:
        for a, b in swaps:
            text = text.replace(a, b)
        return text

    out = []
    for e in events:
        data = msgspec.json.decode(swap(msgspec.json.encode(e.data).decode()), type=type(e.data))
        stream, corr = swap(e.stream), swap(e.correlation_id)
        out.append(
            (stream, NewEvent(data=data, correlation_id=corr, actor=e.actor, traceparent=None))
        )
    return out


async def _write_runs(store: SqliteEventStore, run: list[Envelope], copies: int) -> None:
    """``copies`` copies of ``run``, each in its own order, many at once (group commit)."""

    async def one() -> None:
        events = _copy(run)
        appends: list[Append] = []
        versions: dict[str, int] = {}
        for stream, e in events:
            if appends and appends[-1].stream == stream:
                appends[-1] = Append(
                    stream,
                    [*appends[-1].events, e],
                    appends[-1].expected_version,
                    appends[-1].after,
                )
            else:
                after = (len(appends) - 1,) if appends else ()
                appends.append(Append(stream, [e], versions.get(stream, 0), after))
            versions[stream] = versions.get(stream, 0) + 1
        for outcome in await store.append_many(appends):
            if isinstance(outcome, Exception):
                raise outcome

    done = 0
    while done < copies:
        n = min(256, copies - done)
        await asyncio.gather(*(one() for _ in range(n)))
        done += n


async def build(path: Path, history: int, finished: list[Envelope], waiting: list[Envelope]) -> int:
    """The log at ``path`` (reused if it is there): ``history`` events of finished runs,
    then the open runs. Returns its number of events."""
    if path.exists():
        store = await SqliteEventStore.open(path, create=False)
        n = await store.last_position()
        await store.close()
        return n
    tmp = path.with_name(path.name + ".building")
    for f in tmp.parent.glob(tmp.name + "*"):
        f.unlink()
    store = await SqliteEventStore.open(tmp, synchronous="OFF")
    agents = [e for e in finished if isinstance(e.data, ev.AgentRegistered) and e.version == 1]
    for e in agents:  # the agents' cards, once
        await store.append(
            e.stream, [NewEvent(data=e.data, correlation_id=e.correlation_id, actor=e.actor)], 0
        )
    run = _run_of(finished)
    await _write_runs(store, run, history // len(run))
    open_run = _run_of(waiting)
    await _write_runs(store, open_run, OPEN_RUNS)
    n = await store.last_position()
    await store.close()
    os.replace(tmp, path)
    for suffix in ("-wal", "-shm"):
        Path(f"{tmp}{suffix}").unlink(missing_ok=True)
    return n


async def start_time(path: Path, snapshot: bool) -> tuple[float, int]:
    """Seconds ``Orchestrator.start()`` takes on the log at ``path``, and where it started."""
    store = await SqliteEventStore.open(path, create=False)
    orch = Orchestrator(store, InProcessBus(), snapshot="auto" if snapshot else None)
    t = time.perf_counter()
    await orch.start()
    took = time.perf_counter() - t
    assert len(orch.state.open) == OPEN_RUNS, len(orch.state.open)
    from_position = orch.snapshot_position
    await orch.stop()  # (writes the snapshot again, when on)
    await store.close()
    return took, from_position


async def rebuild_time(path: Path, snapshot: bool) -> float:
    """Seconds to rebuild the orchestrator's state alone, as ``start`` does (the snapshot,
    then the log after it; or the whole log), without the start's own writes."""
    store = await SqliteEventStore.open(path, create=False)
    t = time.perf_counter()
    state = RunState(retain_finished=Policy().retain_finished_runs)
    loaded = await _snap.load(Path(f"{path}.snap"), store) if snapshot else None
    if loaded is not None:
        _snap.restore(loaded[1], state)
        state.position = loaded[0].position
    assert snapshot == (loaded is not None)
    while page := await store.read_all(state.position + 1, 5000):
        for env in page:
            state.apply(env)
    took = time.perf_counter() - t
    assert len(state.open) == OPEN_RUNS, len(state.open)
    await store.close()
    return took


def replay_time(path: Path, root: str) -> float:
    t = time.perf_counter()
    r = CliRunner().invoke(cli, ["replay", root, "--db", str(path)], catch_exceptions=False)
    took = time.perf_counter() - t
    assert r.exit_code == 0, r.output
    return took


async def catch_up_time(path: Path, finished: list[Envelope], repeat: int) -> tuple[float, float]:
    """(first catch-up from nothing, median catch-up of one more run) on a copy of the log."""
    copy = path.with_name(path.name + ".proj-bench.db")
    for f in copy.parent.glob(copy.name + "*"):
        f.unlink()
    copy.write_bytes(path.read_bytes())
    store = await SqliteEventStore.open(copy)
    runner = ProjectionRunner.open(store, f"{copy}.proj", all_projections())
    t = time.perf_counter()
    await runner.catch_up()
    rebuild = time.perf_counter() - t
    run = _run_of(finished)
    times = []
    for _ in range(repeat):
        await _write_runs(store, run, 1)
        t = time.perf_counter()
        await runner.catch_up()
        times.append(time.perf_counter() - t)
    runner.close()
    await store.close()
    for f in copy.parent.glob(copy.name + "*"):
        f.unlink()
    return rebuild, statistics.median(times)


def _waiting_plan() -> Plan:
    plan = pipeline_plan()
    first = msgspec.structs.replace(plan.tasks[0], requires_approval=True)
    return msgspec.structs.replace(plan, tasks=[first, *plan.tasks[1:]])


def _ms(s: float) -> str:
    return f"{s * 1000:.1f} ms"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", default="10000,100000,1000000", help="events of history")
    ap.add_argument("--repeat", type=int, default=5, help="starts per figure (median)")
    ap.add_argument("--cache", default="/tmp/cardbus-restart-bench", help="where logs are kept")
    ap.add_argument("--json", default=None, help="append the figures as JSON lines here")
    args = ap.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    cache = Path(args.cache)
    cache.mkdir(parents=True, exist_ok=True)
    finished = asyncio.run(_template(pipeline_plan()))
    waiting = asyncio.run(_template(_waiting_plan()))
    print(f"template run: {len(finished)} events (agents included); {OPEN_RUNS} open runs")
    print(
        f"load: {os.getloadavg()[0]:.2f} {os.getloadavg()[1]:.2f} (1/5 min), cpus {os.cpu_count()}"
    )

    def measure(path: Path) -> dict[str, Any]:
        full = [asyncio.run(start_time(path, False))[0] for _ in range(args.repeat)]
        Path(f"{path}.snap").unlink(missing_ok=True)
        asyncio.run(start_time(path, True))  # folds all, writes the snapshot on stop
        snaps = [asyncio.run(start_time(path, True)) for _ in range(args.repeat)]
        assert all(p > 0 for _, p in snaps), "the start did not use the snapshot"
        rebuilt = [asyncio.run(rebuild_time(path, True)) for _ in range(args.repeat)]
        return {
            "rebuild": statistics.median(rebuilt),
            "full": statistics.median(full),
            "snap": statistics.median(t for t, _ in snaps),
            "snap_bytes": Path(f"{path}.snap").stat().st_size,
        }

    t = time.perf_counter()
    base_path = cache / "history-0.db"
    base_events = asyncio.run(build(base_path, 0, finished, waiting))
    base = measure(base_path)
    print(
        f"baseline ({base_events} events, open runs only): start {_ms(base['full'])} full fold,"
        f" {_ms(base['snap'])} from snapshot ({base['snap_bytes'] // 1024} KiB; state rebuilt in"
        f" {_ms(base['rebuild'])} of it)"
    )
    rows = []
    for size in sizes:
        path = cache / f"history-{size}.db"
        t = time.perf_counter()
        n = asyncio.run(build(path, size, finished, waiting))
        built = time.perf_counter() - t
        m = measure(path)
        root = asyncio.run(_first_root(path))
        replay = statistics.median(replay_time(path, root) for _ in range(3))
        rebuild, catch = asyncio.run(catch_up_time(path, finished, args.repeat))
        rows.append((size, n, m, replay, rebuild, catch, built))
        ratio = m["snap"] / base["snap"]
        print(
            f"{size:>9} history ({n} events, built in {built:.0f} s): start full fold"
            f" {_ms(m['full'])}, from snapshot {_ms(m['snap'])} = {ratio:.2f}x empty"
            f" (state rebuilt in {_ms(m['rebuild'])} of it, {m['rebuild'] / base['rebuild']:.2f}x);"
            f" replay {_ms(replay)}; projection catch-up of 1 run {_ms(catch)}"
            f" (first catch-up {rebuild:.1f} s)"
        )
    print()
    print(
        "| history events | start, full fold | start, from snapshot | vs empty | target"
        " | state rebuild from snapshot | cardbus replay (1 run) | projection catch-up (1 run) |"
    )
    print("|---|---|---|---|---|---|---|---|")
    print(
        f"| 0 (open runs only) | {_ms(base['full'])} | {_ms(base['snap'])} | 1.00x | |"
        f" {_ms(base['rebuild'])} | | |"
    )
    largest = max(sizes)
    for size, _n, m, replay, _rebuild, catch, _ in rows:
        ratio = m["snap"] / base["snap"]
        target = ""
        if size == largest:
            target = f"<= 2x: {'met' if ratio <= 2 else 'MISSED'}"
        print(
            f"| {size:,} | {_ms(m['full'])} | {_ms(m['snap'])} | {ratio:.2f}x | {target}"
            f" | {_ms(m['rebuild'])} | {_ms(replay)} | {_ms(catch)} |"
        )
        if args.json:
            label = f"{size:,} events of history"
            record(
                args.json,
                BENCH,
                f"start from snapshot, {label}",
                m["snap"] * 1000,
                "ms",
                target="<= 2x empty" if size == largest else "",
                met=(ratio <= 2) if size == largest else None,
                why=(
                    f"{_ms(m['snap'])} from the snapshot, of which the state's rebuild"
                    f" {_ms(m['rebuild'])}, against {_ms(base['snap'])} with no history"
                )
                if size == largest
                else "",
                ratio=ratio,
                ratio_of="empty log",
            )
            record(args.json, BENCH, f"start, full fold, {label}", m["full"] * 1000, "ms")
            record(
                args.json,
                BENCH,
                f"state rebuild from snapshot, {label}",
                m["rebuild"] * 1000,
                "ms",
                ratio=m["rebuild"] / base["rebuild"],
                ratio_of="empty log",
            )
            record(args.json, BENCH, f"cardbus replay of 1 run, {label}", replay * 1000, "ms")
            record(args.json, BENCH, f"projection catch-up of 1 run, {label}", catch * 1000, "ms")


async def _first_root(path: Path) -> str:
    store = await SqliteEventStore.open(path, create=False)
    try:
        page = await store.read_all(1, 100)
        return next(e.stream for e in page if isinstance(e.data, ev.RunStarted))
    finally:
        await store.close()


if __name__ == "__main__":
    main()
