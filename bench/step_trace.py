"""Where the wall time of a step goes at one run in flight: each phase of the critical path.

    .venv/bin/python bench/step_trace.py                 # 30 runs, 200 ms agents
    .venv/bin/python bench/step_trace.py --runs 5 --show 1   # and the marks of the last run

Runs ``bench/agent_latency_bench.py``'s 3-step plan one at a time on the embedded
runtime (SQLite, synchronous=FULL, uvloop as the bench) with a few methods wrapped to
note the moment they are reached. A run's critical path is four segments: from the
run's submission, and from the end of each agent's wait, to the next agent's start (or
the run's result). The three that begin at an agent's end are cut into phases, printed
as p50 and mean in ms (the submission's is written by ``creation``, another path: see it
with ``--show``):

* ``reply``: the agent's wait ended -> its ResultCard handed to the bus (the worker);
* ``decide``: -> the decision's ``append_many`` (the loop's step, the Decider);
* ``handoff``: -> the SQLite writer thread begins the batch;
* ``write``: the writer's transaction (check, seal, insert, COMMIT with its fsync);
* ``back``: -> ``append_many`` returns on the event loop;
* ``fold``: -> ``_append_streams`` returns (the appended events folded, unless cards go
  out: then they are folded after the send, once the agents sent to began: ``sending``);
* ``send``: -> the next agent's wait begins (or the run's waiter answered).

``no write`` is each segment less its ``write`` (the fsync'd commit, which varies most with
the machine's load: compare this between versions), and ``submit`` the submission's
segment less its write.

What the bench calls "added per step" is the four segments (and the agents' sleep
overshoot) over three steps. LangGraph (``durability="async"``, its default) writes its
checkpoints while the next node runs, so no fsync is on its critical path; cardbus
writes a dispatch before it sends the card (invariant 2), so ``write`` is.
The wrappers cost a few microseconds each: compare phases, not the total with the bench.
"""

from __future__ import annotations

import argparse
import itertools
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))

import agent_latency_bench as latency

from cardbus.bus.orchestrator import commit as commit_module
from cardbus.bus.runtime.embedded import EmbeddedRuntime
from cardbus.bus.runtime.loop import run
from cardbus.bus.transport import inprocess
from cardbus.eventstore import SqliteEventStore
from cardbus.eventstore import sqlite as sqlite_store

MARKS: list[tuple[float, str]] = []
PHASES = ("reply", "decide", "handoff", "write", "back", "fold", "send")


def mark(what: str) -> None:
    MARKS.append((time.perf_counter(), what))


def wrap_async(owner: Any, name: str, before: str, after: str | None = None) -> None:
    original = getattr(owner, name)

    async def wrapped(*args: Any, **kwargs: Any) -> Any:
        mark(before)
        result = await original(*args, **kwargs)
        if after:
            mark(after)
        return result

    setattr(owner, name, wrapped)


def install() -> None:
    wait = latency.Waits.wait

    async def traced_wait(self: latency.Waits, marker: str) -> None:
        mark("agent.start")
        await wait(self, marker)
        mark("agent.end")

    latency.Waits.wait = traced_wait  # type: ignore[method-assign]
    write = sqlite_store._Writer.write

    def traced_write(self: Any, *args: Any) -> Any:
        began = time.perf_counter()
        try:
            return write(self, *args)
        finally:
            MARKS.append((began, "writer.begin"))  # list.append: safe from another thread
            mark("writer.end")

    sqlite_store._Writer.write = traced_write  # type: ignore[method-assign]
    original_reply = inprocess.InProcessBus.reply

    async def traced_reply(self: Any, reply: Any) -> Any:
        if type(reply).__name__ == "ResultCard":
            mark("reply.result")
        return await original_reply(self, reply)

    inprocess.InProcessBus.reply = traced_reply  # type: ignore[method-assign]
    wrap_async(sqlite_store.SqliteEventStore, "append_many", "append", "append.done")
    wrap_async(commit_module.Committing, "_append_streams", "streams", "streams.done")


def segments(marks: list[tuple[float, str]]) -> dict[str, list[float]]:
    """Each critical segment's phases (ms), from the marks in time order."""
    out: dict[str, list[float]] = {p: [] for p in (*PHASES, "total", "no write", "submit")}
    marks = sorted(marks)
    i = 0
    while i < len(marks):
        start, what = marks[i]
        if what not in ("run.begin", "agent.end"):
            i += 1
            continue
        j = i + 1
        while j < len(marks) and marks[j][1] not in ("agent.start", "run.end"):
            j += 1
        if j == len(marks):
            break
        seg = marks[i : j + 1]
        at: dict[str, float] = {}
        for t, w in seg:
            at.setdefault(w, t)  # the first of each: the decision's own append
        needed = ("append", "writer.begin", "writer.end", "append.done", "streams.done")
        if all(k in at for k in needed):
            replied = at.get("reply.result", start)  # a run's submission has no reply
            times = [start, replied, *(at[k] for k in needed), seg[-1][0]]
            for phase, (a, b) in zip(PHASES, itertools.pairwise(times), strict=True):
                out[phase].append((b - a) * 1000)
            out["total"].append((seg[-1][0] - start) * 1000)
            out["no write"].append(out["total"][-1] - out["write"][-1])
        elif what == "run.begin" and "writer.begin" in at and "writer.end" in at:
            # the submission's stretch (its creation and first dispatch written together),
            # without its write: another path (``creation``), no phases
            whole = seg[-1][0] - start
            out["submit"].append((whole - (at["writer.end"] - at["writer.begin"])) * 1000)
        i = j
    return out


async def main(args: argparse.Namespace) -> None:
    latency.WAITS.agent_s = args.agent_ms / 1000
    install()
    with tempfile.TemporaryDirectory() as tmp:
        store = await SqliteEventStore.open(Path(tmp) / "trace.db")
        async with EmbeddedRuntime(store, latency.AGENTS, policy=latency.policy_for(1)) as rt:

            async def run_one(marker: str) -> None:
                mark("run.begin")
                result = await rt.run(latency.plan_for(marker), timeout=600)
                mark("run.end")
                assert result.status == "completed", result

            await latency.closed_loop(run_one, 3, 1, "warm-")
            MARKS.clear()
            cpu = time.process_time()
            _, walls, markers = await latency.closed_loop(run_one, args.runs, 1, "t-")
            cpu = time.process_time() - cpu
        await store.close()
    steps = len(latency.STEPS)
    added = [
        (w - latency.WAITS.by_run[m]) / steps * 1000 for w, m in zip(walls, markers, strict=True)
    ]
    print(
        f"1 in flight, {args.runs} runs, agents {args.agent_ms:g} ms: added per step p50"
        f" {statistics.median(added):.2f} ms, CPU {cpu / (args.runs * steps) * 1000:.2f} ms/step,"
        f" load {os.getloadavg()[0]:.1f}"
    )
    print("critical segment from an agent's end (3 a run), ms:")
    for phase, values in segments(MARKS).items():
        if values:
            print(
                f"  {phase:>8}: p50 {statistics.median(values):6.3f}  mean"
                f" {statistics.fmean(values):6.3f}"
            )
    if args.show:
        tail = sorted(MARKS)
        begins = [k for k, (_, w) in enumerate(tail) if w == "run.begin"]
        shown = tail[begins[-args.show] :] if len(begins) >= args.show else tail
        first = prev = shown[0][0]
        for t, w in shown:
            print(f"{(t - first) * 1000:9.2f} +{(t - prev) * 1000:7.2f}  {w}")
            prev = t


def _args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=30)
    ap.add_argument("--agent-ms", type=float, default=200.0)
    ap.add_argument("--show", type=int, default=0, help="print the marks of the last N runs")
    return ap.parse_args()


if __name__ == "__main__":
    go: Callable[[Any], Any] = run
    go(main(_args()))
