"""Shared provider limits, learned from the headers: 200 runs of 5 model calls each
against the loopback stub enforcing 600 requests and 60,000 tokens a minute (429 beyond,
with OpenAI's rate-limit headers); nothing is configured in cardbus.

Two cases, one after the other: all the runs in one process (one ``Pacer``), then split
over two NATS members (two processes, each its own ``Pacer``, sharing the limit through
``PaceShare`` on a local nats-server's key-value bucket).

Time is scaled down: a stub "minute" is ``--minute`` seconds (default 12), and the pacers
are told the same (``Pacer(minute_s=...)``), so the ratios hold: 600 requests per stub
minute. Each run is an asyncio task making its calls one after another through
``OpenAIChatLLM`` (the run's id in ``CALL_PACING``, as the task journal sets it). A call
answered 429 is counted and made again (as the attempt's retry would). Prints, per case,
with met/MISSED: the share of calls answered 429 (<= 1%), the achieved rate against the
limit (>= 90%: the calls the stub let through a minute, from its first to its last), and
the longest run's wait for the limit against the mean (<= 3x).

Run: .venv/bin/python -P bench/limits_bench.py [--minute 12] [--runs 200] [--calls 5]
     [--case one|two|both] [--no-share: the two members pace alone, the baseline]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent.parent / "tests" / "agents"))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from openai_stub import OpenAIStub
from summary import record  # the figures for bench/summary.py ($CARDBUS_BENCH_JSON)

from cardbus.agents.llm import OpenAIChatLLM
from cardbus.agents.pacing import CALL_PACING, CALL_QUEUED_S, Pacer
from cardbus.eventstore.errors import LLMRateLimited

LIMIT_RPM, LIMIT_TPM = 600, 60_000


async def member_runs(
    pacer: Pacer, url: str, runs: range, calls: int, start_at: float
) -> tuple[list[float], int]:
    """Make ``runs`` (``calls`` each, one after another) from ``start_at`` (wall time):
    each run's seconds waited for the limit, and how many calls were answered 429."""
    waits = {i: 0.0 for i in runs}
    limited = 0
    llm = OpenAIChatLLM(url, "stub-model", max_retries=0, pacer=pacer)

    async def one_run(i: int) -> None:
        nonlocal limited
        CALL_PACING.set((f"run-{i}", 0))
        done = 0
        while done < calls:
            CALL_QUEUED_S.set(0.0)
            try:
                await llm.complete(f"run {i} call {done}")
            except LLMRateLimited:
                limited += 1  # the attempt would retry it: so does the bench
                continue
            finally:
                waits[i] += CALL_QUEUED_S.get()
            done += 1

    await asyncio.sleep(max(0.0, start_at - time.time()))
    try:
        await asyncio.gather(*(one_run(i) for i in runs))
    finally:
        await llm.aclose()
    return [waits[i] for i in runs], limited


def provider_rate(stub: OpenAIStub, minute: float) -> float:
    """Calls the stub let through a stub minute, from its first to its last: the rate the
    provider saw (the processes' start-up and the last answer's way back left out)."""
    times = [t for t, _ in stub.served]
    return (len(times) - 1) / (times[-1] - times[0]) * minute if len(times) > 1 else 0.0


def report(
    case: str, waits: list[float], limited: int, elapsed: float, minute: float, rate: float
) -> bool:
    total = len(waits)
    calls = ARGS.calls * total
    share_429 = limited / (calls + limited)
    mean, worst = statistics.mean(waits), max(waits)
    checks = [
        (
            f"calls answered 429: {limited} of {calls + limited} ({share_429:.2%})",
            share_429 <= 0.01,
        ),
        (
            f"achieved rate: {rate:.0f} a minute of {LIMIT_RPM} ({rate / LIMIT_RPM:.0%})",
            rate >= 0.9 * LIMIT_RPM,
        ),
        (
            f"longest run's wait {worst:.2f}s vs mean {mean:.2f}s ({worst / mean:.2f}x)",
            worst <= 3 * mean,
        ),
    ]
    print(
        f"{case}: {total} runs x {ARGS.calls} calls, stub minute {minute:g}s,"
        f" elapsed {elapsed:.1f}s"
    )
    for text, ok in checks:
        print(f"  {'met   ' if ok else 'MISSED'} {text}")
    (_, ok429), (_, okrate), (_, okfair) = checks
    bench = "limits"
    why = (
        f"{share_429:.2%} of calls answered 429, {rate / LIMIT_RPM:.0%} of the limit reached,"
        f" the longest run waited {worst / mean:.2f}x the mean"
    )
    record(
        None,
        bench,
        f"{case}: calls answered 429",
        share_429 * 100,
        "%",
        target="<= 1",
        met=ok429,
        why=why,
    )
    record(
        None,
        bench,
        f"{case}: achieved rate of the limit",
        rate / LIMIT_RPM * 100,
        "%",
        target=">= 90",
        met=okrate,
        why=why,
    )
    record(
        None,
        bench,
        f"{case}: longest run's wait / mean",
        worst / mean,
        "x",
        target="<= 3",
        met=okfair,
        why=why,
    )
    return all(ok for _, ok in checks)


def limited_stub() -> OpenAIStub:
    stub = OpenAIStub()
    stub.limit_requests, stub.limit_tokens = LIMIT_RPM, LIMIT_TPM
    stub.limit_window_s = ARGS.minute
    return stub


async def one_process() -> bool:
    with limited_stub() as stub:
        start = time.time()
        waits, limited = await member_runs(
            Pacer(minute_s=ARGS.minute), stub.url, range(ARGS.runs), ARGS.calls, start
        )
        elapsed = time.time() - start
        rate = provider_rate(stub, ARGS.minute)
    return report("one process", waits, limited, elapsed, ARGS.minute, rate)


def two_members() -> bool:
    from cardbus.bus.runtime.nats import LocalNatsServer

    half = ARGS.runs // 2
    with LocalNatsServer() as server, limited_stub() as stub:
        start_at = time.time() + 4.0  # both members connected and waiting by then
        procs = [
            subprocess.Popen(
                [
                    sys.executable,
                    "-P",
                    __file__,
                    "--member",
                    f"{first}:{last}",
                    "--nats",
                    server.url,
                    "--stub",
                    stub.url,
                    "--start-at",
                    repr(start_at),
                    "--minute",
                    repr(ARGS.minute),
                    "--calls",
                    str(ARGS.calls),
                    *(["--no-share"] if ARGS.no_share else []),
                ],
                stdout=subprocess.PIPE,
                text=True,
            )
            for first, last in ((0, half), (half, ARGS.runs))
        ]
        try:
            outs = [json.loads(p.communicate(timeout=30 * ARGS.minute)[0]) for p in procs]
        finally:
            for p in procs:  # reaped whatever happened
                if p.poll() is None:
                    p.kill()
                p.wait()
        rate = provider_rate(stub, ARGS.minute)
    waits = [w for out in outs for w in out["waits"]]
    limited = sum(out["limited"] for out in outs)
    elapsed = max(out["finished"] for out in outs) - start_at
    case = "two NATS members" + (" (each pacing alone: no share)" if ARGS.no_share else "")
    return report(case, waits, limited, elapsed, ARGS.minute, rate)


async def member(spec: str, nats_url: str, stub_url: str, start_at: float) -> None:
    """One member of the two: its own pacer, sharing the limit through the bucket."""
    import nats

    from cardbus.bus.runtime.pace_share import PaceShare

    first, last = (int(n) for n in spec.split(":"))
    pacer = Pacer(minute_s=ARGS.minute)
    nc = await nats.connect(nats_url)
    try:
        share = PaceShare(nc, pacer)
        if not ARGS.no_share:
            await share.start()
        try:
            waits, limited = await member_runs(
                pacer, stub_url, range(first, last), ARGS.calls, start_at
            )
            finished = time.time()
        finally:
            await share.stop()
    finally:
        await nc.close()
    print(json.dumps({"waits": waits, "limited": limited, "finished": finished}))


def main() -> None:
    global ARGS
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--minute", type=float, default=12.0)
    parser.add_argument("--runs", type=int, default=200)
    parser.add_argument("--calls", type=int, default=5)
    parser.add_argument("--case", choices=["one", "two", "both"], default="both")
    parser.add_argument(
        "--no-share", action="store_true", help="the baseline: two members pacing alone"
    )
    parser.add_argument("--member", help=argparse.SUPPRESS)
    parser.add_argument("--nats", help=argparse.SUPPRESS)
    parser.add_argument("--stub", help=argparse.SUPPRESS)
    parser.add_argument("--start-at", type=float, help=argparse.SUPPRESS)
    ARGS = parser.parse_args()
    if ARGS.member:
        asyncio.run(member(ARGS.member, ARGS.nats, ARGS.stub, ARGS.start_at))
        return
    ok = True
    if ARGS.case in ("one", "both"):
        ok = asyncio.run(one_process()) and ok
    if ARGS.case in ("two", "both"):
        ok = two_members() and ok
    sys.exit(0 if ok else 1)


ARGS = argparse.Namespace()

if __name__ == "__main__":
    main()
