"""What wakes an idle NATS runtime: each wake-up of its event loop, what ran, its CPU.

    .venv/bin/python bench/idle_trace.py                # 10 s after a run, as idle_bench
    .venv/bin/python bench/idle_trace.py --seconds 3 --all   # every loop iteration too
    .venv/bin/python bench/idle_trace.py --partitions 4      # one partitioned member

Runs ``bench/idle_bench.py``'s NATS case (a 3-step pipeline, then nothing) on asyncio's
own loop (not uvloop: its loop cannot be watched) with the selector and ``Handle._run``
wrapped, and prints, for the idle window, each burst of loop iterations (those less than
4 ms apart): when, the main thread's CPU it took, how many iterations, and the names of
what ran (the log follower's ``Folding``, the agents' lease renewals ``RenewalRound``,
the pull loops' ``NatsBus._serve``, nats-py's ``_read_loop`` and ``_flusher``...). A
burst of ``_read_loop`` and ``_flusher`` alone about 2 s after the runtime connected is
nats-server's first PING to each connection (it measures the round trip once). The
wrappers cost CPU of their own: compare bursts with each other, not the total with
``idle_bench.py``.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))
from pipeline_bench import AGENTS, pipeline_plan

_NAMES = (
    "Folding",
    "read_again_after_failure",
    "RenewalRound",
    "_pump_replies",
    "NatsBus._serve",
    "ReplyAcks",
    "_check_live",
    "Clock.run",
    "_sweep",
    "_read_loop",
    "_flusher",
)


def _what(handle: asyncio.Handle) -> str:
    """The task's coroutine (innermost awaited frame) or the callback a handle runs."""
    cb = getattr(handle, "_callback", None)
    owner = getattr(cb, "__self__", None)
    if isinstance(owner, asyncio.Task):
        coro: Any = owner.get_coro()
        name = getattr(coro, "__qualname__", "?")
        while True:
            inner = getattr(coro, "cr_await", None) or getattr(coro, "ag_await", None)
            if inner is None or not hasattr(inner, "cr_frame"):
                break
            coro = inner
        frame = getattr(coro, "cr_frame", None)
        where = f"{Path(frame.f_code.co_filename).name}:{frame.f_lineno}" if frame else "?"
        return f"task {name} @ {where}"
    return repr(cb)[:80]


async def trace(seconds: float, show_all: bool, partitions: int | None = None) -> None:
    from cardbus.bus.runtime.nats import LocalNatsServer, NatsRuntime
    from cardbus.eventstore.nats.connection import NatsOptions

    iterations: list[tuple[float, float, list[str]]] = []  # (when, CPU s, what ran)
    current: list[Any] = []
    on = False
    t0 = 0.0
    server = LocalNatsServer().start()
    try:
        async with NatsRuntime(NatsOptions(url=server.url), AGENTS, partitions=partitions) as rt:
            result = await rt.run(pipeline_plan(), timeout=60)
            assert result.status == "completed", result
            loop = asyncio.get_running_loop()
            selector = loop._selector  # type: ignore[attr-defined]
            select = selector.select
            run = asyncio.Handle._run

            def watched_select(timeout: float | None = None) -> Any:
                if on and current and current[2]:
                    iterations.append((current[0], time.thread_time() - current[1], current[2]))
                events = select(timeout)
                current[:] = [time.perf_counter() - t0, time.thread_time(), []]
                return events

            def watched_run(self: asyncio.Handle) -> None:
                if on and current:
                    current[2].append(_what(self))
                run(self)

            selector.select = watched_select
            asyncio.Handle._run = watched_run  # type: ignore[method-assign]
            try:
                await asyncio.sleep(0.5)  # as idle_bench: the run's aftermath is over
                t0, on = time.perf_counter(), True
                cpu = time.process_time()
                await asyncio.sleep(seconds)
                on = False
                cpu = time.process_time() - cpu
            finally:
                selector.select = select
                asyncio.Handle._run = run  # type: ignore[method-assign]
    finally:
        server.stop()
    bursts: list[list[Any]] = []  # [first, last, CPU s, iterations, what ran]
    for when, used, ran in iterations:
        if show_all:
            print(f"  {when:7.3f} {1e6 * used:6.0f} us  {ran[0]}  (+{len(ran) - 1})")
        if bursts and when - bursts[-1][1] < 0.004:
            b = bursts[-1]
            b[1], b[2], b[3] = when, b[2] + used, b[3] + 1
            b[4].extend(ran)
        else:
            bursts.append([when, when, used, 1, list(ran)])
    print(f"idle {seconds:g} s after a run, load {os.getloadavg()[0]:.2f}: process CPU")
    print(f"{1000 * cpu / seconds:.2f} ms/s with the wrappers; the bursts of loop iterations:")
    for first, _, used, n, ran in bursts:
        names = [k for k in _NAMES if any(k in r for r in ran)]
        print(f"  {first:7.3f} s {1e6 * used:6.0f} us {n:3d} iterations  {', '.join(names)}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--all", action="store_true", help="print every loop iteration too")
    ap.add_argument(
        "--partitions",
        type=int,
        default=None,
        help="one member of a partitioned orchestrator holding this many (idle_bench's"
        " nats-partitioned: 4)",
    )
    args = ap.parse_args()
    # asyncio's loop: uvloop's is not watchable
    asyncio.run(trace(args.seconds, args.all, args.partitions))


if __name__ == "__main__":
    main()
