"""Where a step's CPU goes, embedded: the 3-step plan under cProfile, per thread.

    .venv/bin/python bench/step_profile.py                       # 1,000 in flight, 200 ms agents
    .venv/bin/python bench/step_profile.py --inflight 32 --agent-ms 0   # the instant pipeline
    .venv/bin/python bench/step_profile.py --no-profile          # the figures alone

Runs ``--runs`` runs of ``bench/agent_latency_bench.py``'s plan and agents
(``--inflight`` at a time, each agent waiting ``--agent-ms``) on the embedded
runtime (SQLite, synchronous=FULL) and prints the process's CPU per step, the
SQLite writer's busy time per step, and the cyclic garbage collector's CPU by
generation (with the number of objects it tracks at the end). With the profile
(default) it also prints two profiles, each timed by its own thread's CPU clock
(``time.thread_time``), not the wall clock: the event loop's thread (orchestrator,
workers, agents) and the SQLite writer thread (checking, sealing, hashing,
inserting); a wall-clock profile would charge each thread for the time it waits
for the GIL. Each opens with the function calls a step and the largest share of
the time one function takes by itself (where none stands out, a flat profile, the
CPU a step follows the number of calls), then lists its top entries. The profiler
slows Python code down several times; compare the shares, and take the CPU
figures from ``--no-profile``.

``--max-concurrency`` overrides the agents' limit (the latency bench sets
20,000 so that it never binds: the in-process bus then keeps 20,000 idle
consumer tasks per agent, which the collector walks).
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import gc
import os
import pstats
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))

import agent_latency_bench as latency

from cardbus.agents.cards import AgentConstraints
from cardbus.bus.runtime.embedded import EmbeddedRuntime
from cardbus.eventstore import SqliteEventStore
from cardbus.eventstore import sqlite as sqlite_store


class GcClock:
    """CPU the cyclic collector takes, per generation, from ``gc.callbacks``."""

    def __init__(self) -> None:
        self.by_generation = {0: [0, 0.0], 1: [0, 0.0], 2: [0, 0.0]}
        self._began = 0.0

    def __call__(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self._began = time.thread_time()
        else:
            g = self.by_generation[info["generation"]]
            g[0] += 1
            g[1] += time.thread_time() - self._began

    def reset(self) -> None:
        for g in self.by_generation.values():
            g[:] = [0, 0.0]


def profile_writer(profiler: cProfile.Profile) -> None:
    """Profile every batch the SQLite writer thread writes (its own CPU clock)."""
    write = sqlite_store._Writer.write

    def profiled(self: Any, *args: Any) -> Any:
        profiler.enable()
        try:
            return write(self, *args)
        finally:
            profiler.disable()

    sqlite_store._Writer.write = profiled  # type: ignore[method-assign]


async def main(args: argparse.Namespace) -> None:
    latency.WAITS.agent_s = args.agent_ms / 1000
    if args.max_concurrency:
        for agent in latency.AGENTS:
            agent.constraints = AgentConstraints(max_concurrency=args.max_concurrency)
    loop_profile = cProfile.Profile(time.thread_time)
    writer_profile = cProfile.Profile(time.thread_time)
    if args.profile:
        profile_writer(writer_profile)
    collector = GcClock()
    gc.callbacks.append(collector)
    with tempfile.TemporaryDirectory() as tmp:
        store = await SqliteEventStore.open(Path(tmp) / "profile.db")
        policy = latency.policy_for(args.inflight)
        async with EmbeddedRuntime(store, latency.AGENTS, policy=policy) as rt:

            async def run_one(marker: str) -> None:
                r = await rt.run(latency.plan_for(marker), timeout=600)
                assert r.status == "completed", r

            await latency.closed_loop(run_one, 3, 1, "warm-")
            collector.reset()
            writer_profile.clear()
            counts = getattr(rt.orchestrator, "reply_counts", None)  # none before it existed
            before = dict(vars(counts)) if counts is not None else {}
            cpu, busy = time.process_time(), store.writer_busy_s
            if args.profile:
                loop_profile.enable()
            wall, _, _ = await latency.closed_loop(run_one, args.runs, args.inflight, "p-")
            loop_profile.disable()
            cpu = time.process_time() - cpu
            busy = store.writer_busy_s - busy
            tracked = len(gc.get_objects())
            looked = {k: v - before[k] for k, v in vars(counts).items()} if counts else {}
        await store.close()
    gc.callbacks.remove(collector)
    steps = args.runs * len(latency.STEPS)
    print(
        f"{args.inflight} in flight, {args.runs} runs, agents {args.agent_ms:g} ms:"
        f" CPU {1e3 * cpu / steps:.3f} ms/step, SQLite writer busy {1e3 * busy / steps:.3f}"
        f" ms/step, {args.runs / wall:.1f} runs/s, load {os.getloadavg()[0]:.1f}"
        + (" (profiled: slower)" if args.profile else "")
    )
    if looked:  # each result should be decided on once: a step per result, not two
        print(
            f"results per step: decided {looked['results_decided'] / steps:.2f}"
            f" (of which deferred {looked['results_deferred'] / steps:.2f}),"
            f" held for a busy stream {looked['results_held'] / steps:.2f}"
        )
    gcs = collector.by_generation
    print(
        "garbage collector: "
        + ", ".join(f"gen{g} {n} x {1e3 * s / max(n, 1):.1f} ms" for g, (n, s) in gcs.items())
        + f" = {1e3 * sum(s for _, s in gcs.values()) / steps:.3f} ms/step;"
        f" {tracked} objects tracked at the end"
    )
    if args.profile:
        for name, profiler in (
            ("event loop thread", loop_profile),
            ("writer thread", writer_profile),
        ):
            stats = pstats.Stats(profiler)
            print(f"\n===== {name} (thread CPU)")
            print(calls_a_step(stats, steps))
            stats.sort_stats(args.sort).print_stats(args.top)


def calls_a_step(stats: pstats.Stats, steps: int) -> str:
    """How many function calls a step makes, and the largest share of the profile's time
    any one function takes by itself. With no function standing out (a flat profile) the
    CPU a step follows the number of calls: that count is the figure to bring down."""
    rows = stats.stats.values()
    calls = sum(nc for _, nc, _, _, _ in rows)
    builtin = sum(nc for (file, _, _), (_, nc, _, _, _) in stats.stats.items() if file == "~")
    total = sum(tt for _, _, tt, _, _ in rows) or 1.0
    top = max((tt for _, _, tt, _, _ in rows), default=0.0)
    return (
        f"{calls / steps:,.0f} function calls a step ({builtin / steps:,.0f} of them to"
        f" built-ins such as isinstance and dict.get); the largest share of this thread's"
        f" profiled time one function takes by itself: {100 * top / total:.1f}%"
    )


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--inflight", type=int, default=1000)
    ap.add_argument("--runs", type=int, default=2000)
    ap.add_argument("--agent-ms", type=float, default=200.0)
    ap.add_argument("--max-concurrency", type=int, default=0, help="override the agents' limit")
    ap.add_argument("--no-profile", dest="profile", action="store_false")
    ap.add_argument("--top", type=int, default=30, help="entries per profile")
    ap.add_argument("--sort", default="tottime", help="pstats sort key (tottime, cumulative)")
    asyncio.run(main(ap.parse_args()))
