"""Benchmark: what an idle scheduler costs (issue 32 item 3, issue 34's idle target).

    .venv/bin/python bench/schedules_idle_bench.py [--seconds 5]

An embedded runtime on a SQLite file, then a NATS member (a real nats-server), each
with nothing to do, in three phases of ``--seconds``: its scheduler running with no
schedule, running with two schedules not due for a while (a daily cron, an hourly
interval), and stopped (the baseline, in the same run). Printed per phase: the
process's CPU per second (all threads; the runtime's own idle cost included) and the
scheduler's own calls to the store per second (counted through a proxy: the figure
that does not depend on the machine's load). The target: the scheduler adds at most
1 ms of CPU per second to an idle runtime (issue 34 wants the whole idle runtime under
1 ms/s); its store calls per second are then near zero.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))
from pipeline_bench import AGENTS
from summary import record

from cardbus.bus.orchestrator.scheduler import Scheduler, create_schedule
from cardbus.bus.runtime.embedded import EmbeddedRuntime
from cardbus.bus.runtime.loop import run
from cardbus.bus.runtime.nats import LocalNatsServer, NatsRuntime
from cardbus.eventstore import EventStore, SqliteEventStore
from cardbus.eventstore.nats.connection import NatsOptions

PLAN = {
    "goal": "a daily report",
    "tasks": [{"id": "r", "capability": "research", "inputs": {"topic": "tides"}}],
}


class Counted:
    """The scheduler's store, counting its calls (reads and appends)."""

    def __init__(self, store: EventStore) -> None:
        self._store, self.calls = store, 0

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._store, name)
        if not callable(attr):
            return attr

        def counted(*args: Any, **kwargs: Any) -> Any:
            self.calls += 1
            return attr(*args, **kwargs)

        return counted


async def phase(scheduler: Scheduler, seconds: float) -> tuple[float, float]:
    """(ms of process CPU per second, the scheduler's store calls per second)."""
    store = scheduler.store
    assert isinstance(store, Counted)
    calls, cpu, wall = store.calls, time.process_time(), time.perf_counter()
    await asyncio.sleep(seconds)
    elapsed = time.perf_counter() - wall
    return 1000 * (time.process_time() - cpu) / elapsed, (store.calls - calls) / elapsed


async def phases(scheduler: Scheduler, store: EventStore, seconds: float) -> dict[str, Any]:
    await asyncio.sleep(1.0)  # the start's aftermath is over
    out = {"no schedule": await phase(scheduler, seconds)}
    await create_schedule(store, PLAN, cron="0 3 * * *")
    await create_schedule(store, PLAN, interval_seconds=3600, start=time.time() + 1800)
    await asyncio.sleep(1.0)  # both seen (each wakes the scheduler once)
    out["2 schedules not due"] = await phase(scheduler, seconds)
    await scheduler.stop()
    await asyncio.sleep(0.5)
    out["scheduler stopped"] = await phase(scheduler, seconds)
    return out


async def embedded(seconds: float) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as d:
        store = await SqliteEventStore.open(Path(d) / "idle.db")
        try:
            rt = EmbeddedRuntime(store, AGENTS)
            rt.scheduler.store = Counted(store)  # type: ignore[assignment]
            async with rt:
                return await phases(rt.scheduler, store, seconds)
        finally:
            await store.close()


async def nats_member(seconds: float) -> dict[str, Any]:
    server = LocalNatsServer().start()
    try:
        rt = NatsRuntime(NatsOptions(url=server.url), AGENTS, name="idle")
        async with rt:
            assert rt.scheduler is not None
            # the running loop reads through the proxy from now on
            rt.scheduler.store = Counted(rt.store)  # type: ignore[assignment]
            return await phases(rt.scheduler, rt.store, seconds)
    finally:
        server.stop()


async def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seconds", type=float, default=5.0)
    args = ap.parse_args()
    for where, measure in (("embedded SQLite", embedded), ("NATS member", nats_member)):
        figures = await measure(args.seconds)
        base = figures["scheduler stopped"][0]
        for name, (cpu, calls) in figures.items():
            print(f"{where:16s} {name:22s} CPU {cpu:5.2f} ms/s", end="")
            print(f"  scheduler store calls {calls:5.2f}/s")
        added = max(figures["no schedule"][0], figures["2 schedules not due"][0]) - base
        verdict = "met" if added <= 1.0 else "MISSED"
        print(f"{where:16s} the scheduler adds {added:+.2f} ms/s (target <= 1): {verdict}")
        record(None, "schedules", f"CPU an idle scheduler adds, {where}", added, "ms/s")


if __name__ == "__main__":
    run(main())
