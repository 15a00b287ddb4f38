"""Shared provider limits, learned from the headers: 200 runs of 5 model calls each
against the loopback stub enforcing 600 requests and 60,000 tokens a minute (429 beyond,
with OpenAI's rate-limit headers); nothing is configured in cardbus.

Time is scaled down: a stub "minute" is ``--minute`` seconds (default 12), and the pacer
is told the same (``Pacer(minute_s=...)``), so the ratios hold: 600 requests per stub
minute. Each run is an asyncio task making its calls one after another through
``OpenAIChatLLM`` (the run's id in ``CALL_PACING``, as the task journal sets it), all
sharing one process pacer. Prints, with met/MISSED: the share of calls answered 429
(<= 1%), the achieved rate against the limit (>= 90%), and the longest run's wait for
the limit against the mean (<= 3x).

Run: .venv/bin/python -P bench/limits_bench.py [--minute 12] [--runs 200] [--calls 5]

Only the one-process case is measured here; the two NATS members' shared window is not
built yet (see docs/how-to/limits.md).
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent.parent / "tests" / "agents"))
from openai_stub import OpenAIStub

from cardbus.agents.llm import OpenAIChatLLM
from cardbus.agents.pacing import CALL_PACING, Pacer
from cardbus.eventstore.errors import LLMRateLimited


async def bench(minute: float, runs: int, calls: int) -> bool:
    pacer = Pacer(minute_s=minute)
    waits = [0.0] * runs
    limited = 0
    with OpenAIStub() as stub:
        stub.limit_requests, stub.limit_tokens, stub.limit_window_s = 600, 60_000, minute
        llm = OpenAIChatLLM(stub.url, "stub-model", max_retries=0, pacer=pacer)

        async def one_run(i: int) -> None:
            nonlocal limited
            CALL_PACING.set((f"run-{i}", 0))
            done = 0
            while done < calls:
                try:
                    await llm.complete(f"run {i} call {done}")
                except LLMRateLimited:
                    limited += 1  # the attempt would retry it: so does the bench
                    continue
                waits[i] += llm_waits.pop(i, 0.0)
                done += 1

        llm_waits: dict[int, float] = {}
        real_acquire = pacer.acquire

        async def acquire(key, tokens=1.0, *, run="", priority=0):  # type: ignore[no-untyped-def]
            waited = await real_acquire(key, tokens, run=run, priority=priority)
            index = int(str(run).removeprefix("run-"))
            llm_waits[index] = llm_waits.get(index, 0.0) + waited
            return waited

        pacer.acquire = acquire  # type: ignore[method-assign]
        start = time.monotonic()
        await asyncio.gather(*(one_run(i) for i in range(runs)))
        elapsed = time.monotonic() - start
        await llm.aclose()
        served = len(stub.served)
    total = runs * calls
    share_429 = limited / (total + limited)
    # the first burst aside, the rate the stub let through against its limit
    rate = served / elapsed * minute
    mean, worst = statistics.mean(waits), max(waits)
    checks = [
        (
            f"calls answered 429: {limited} of {total + limited} ({share_429:.2%})",
            share_429 <= 0.01,
        ),
        (f"achieved rate: {rate:.0f} a minute of 600 ({rate / 600:.0%})", rate >= 540),
        (
            f"longest run's wait {worst:.2f}s vs mean {mean:.2f}s ({worst / mean:.2f}x)",
            worst <= 3 * mean,
        ),
    ]
    print(f"{runs} runs x {calls} calls, stub minute {minute:g}s, elapsed {elapsed:.1f}s")
    for text, ok in checks:
        print(f"  {'met   ' if ok else 'MISSED'} {text}")
    return all(ok for _, ok in checks)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minute", type=float, default=12.0)
    parser.add_argument("--runs", type=int, default=200)
    parser.add_argument("--calls", type=int, default=5)
    args = parser.parse_args()
    ok = asyncio.run(bench(args.minute, args.runs, args.calls))
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
