"""Benchmark: more orchestrator processes on NATS (issue 17, item 3).

    .venv/bin/python bench/nats_scale_bench.py                      # 1 and 2 orchestrators
    .venv/bin/python bench/nats_scale_bench.py --agents 1,2,3 --repeats 3 --seconds 12

Runs of the 3-step plan (research -> draft -> review) whose agents each wait
200 ms +- 25% (``asyncio.sleep``, as in ``agent_latency_bench``: a model call
that holds no CPU), ``--inflight`` runs in flight (a closed loop: a run starts as
one ends), on a fresh local nats-server per measurement, with

* 1 orchestrator process (today's default: it decides every run), or 2 or 4
  (``NatsRuntime(partitions=...)``: each decides the runs of the partitions it
  holds a lease on; each submits and waits for its share of the runs in flight,
  placed in its own partitions: ``local_runs``);
* 1..k agent processes, each serving the three agents as one replica (the
  agents' work-queue consumers share the cards).

Every process is a separate OS process (the point is the second core). After
``--warmup`` seconds the runs finished in the next ``--seconds`` are counted:
runs/s, per-run wall p50, and each process's CPU over that window (from
/proc, % of one core: orchestrators, agents, nats-server). Each configuration
``--repeats`` times (a fresh server each), the median printed with the range.
The figure of issue 17: the best 2-orchestrator median over the best
1-orchestrator median (target >= 1.5x). Figures go to ``--json`` as JSON lines
(``bench/summary.py``).

On a 2-core machine the second orchestrator shares the cores with nats-server
and the agent processes, so what it can add is bounded by the CPU they leave:
the CPU column says where the time goes.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import os
import random
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, NamedTuple

sys.path.insert(0, str(Path(__file__).parent))
from agent_latency_bench import (  # the same workload, in processes
    STEPS,
    model_like_agent,
    plan_for,
)
from nats_bench import MonitoredServer, messages_why, monitor_counts
from subject_tap import TAP_NAME, SubjectTap
from summary import record

from cardbus.bus.runtime.loop import run
from cardbus.bus.runtime.nats import NatsRuntime, serve_agents
from cardbus.eventstore.nats.connection import NatsOptions

BENCH = "nats scale"
PARTITIONS = 32
_TICKS = os.sysconf("SC_CLK_TCK")
_RNG = random.Random()
_AGENT_S, _JITTER = 0.2, 0.25


async def _model_call(text: str) -> None:
    await asyncio.sleep(_AGENT_S * (1 + _RNG.uniform(-_JITTER, _JITTER)))


AGENTS = [model_like_agent(n, _model_call) for n in STEPS]


# -- the processes ---------------------------------------------------------------


def _say(**line: Any) -> None:
    sys.stdout.write(json.dumps(line) + "\n")
    sys.stdout.flush()


async def _go_line() -> dict[str, Any]:
    """The parent's start signal: one JSON line on stdin."""
    line = await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)
    data: dict[str, Any] = json.loads(line)
    return data


async def agents_role(url: str, inflight: int, started_after_s: float | None) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGTERM, stop.set)
    ready = asyncio.Event()
    serving = asyncio.create_task(
        serve_agents(
            NatsOptions(url=url),
            AGENTS,
            stop,
            concurrency=inflight,
            ready=ready,
            **({} if started_after_s is None else {"started_after_s": started_after_s}),
        )
    )
    await ready.wait()
    _say(ready=True)
    await serving


async def orchestrator_role(
    url: str, index: int, of: int, inflight: int, follow: str | None
) -> None:
    rt = NatsRuntime(
        NatsOptions(url=url),
        store_options={"follow": follow} if follow else None,
        name=f"bench-orchestrator-{index}",
        partitions=PARTITIONS if of > 1 else None,
        member=f"o{index}" if of > 1 else None,
    )
    async with rt:
        await rt.wait_for_capabilities(STEPS, 60)
        if rt.partitions is not None:  # every member has its share before the clock starts
            share = PARTITIONS // of
            while not (rt.partitions.members == of and len(rt.partitions.held) == share):
                await asyncio.sleep(0.05)
        _say(ready=True)
        go = await _go_line()
        warm_end, end = go["warm_end"], go["end"]
        walls: list[float] = []
        orch = rt.orchestrator
        slots = inflight // of + (inflight % of if index == 0 else 0)

        async def slot(s: int) -> None:
            i = 0
            while time.time() < end:
                t = time.time()
                root = await orch.submit(plan_for(f"o{index}s{s}r{i}"))
                result = await orch.wait(root, timeout=300)
                assert result.status == "completed", result
                if warm_end <= time.time() <= end:  # ended in the window
                    walls.append(time.time() - t)
                i += 1

        loops = [asyncio.create_task(slot(s)) for s in range(slots)]
        folded = 0

        def count_folded(env: Any) -> None:  # every event this member folds, in the window
            nonlocal folded
            folded += warm_end <= time.time() <= end

        orch.observers.append(count_folded)
        await asyncio.sleep(max(0.0, warm_end - time.time()))
        first = await rt.store.last_position()
        await asyncio.sleep(max(0.0, end - time.time()))
        last = await rt.store.last_position()
        # events its fold could not use (out of a task's order, unknown task): must be none
        _say(
            completed=len(walls),
            walls=walls,
            anomalies=len(orch.state.anomalies),
            folded=folded,
            logged=last - first,
        )
        logging.disable(logging.WARNING)  # the runs cut off by the stop are no news
        for t in loops:
            t.cancel()
        await asyncio.gather(*loops, return_exceptions=True)


# -- the parent ------------------------------------------------------------------


def _cpu_s(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / _TICKS  # utime + stime


class _Child:
    def __init__(self, args: list[str], name: str) -> None:
        self.name = name
        self.proc = subprocess.Popen(
            [sys.executable, __file__, *args],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )

    def line(self, timeout: float = 120.0) -> dict[str, Any]:
        assert self.proc.stdout is not None
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            text = self.proc.stdout.readline()
            if text.startswith("{"):
                data: dict[str, Any] = json.loads(text)
                return data
            if not text and self.proc.poll() is not None:
                raise RuntimeError(f"{self.name} exited with {self.proc.returncode}")
        raise RuntimeError(f"{self.name}: nothing after {timeout} s")

    def send(self, data: dict[str, Any]) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps(data) + "\n")
        self.proc.stdin.flush()

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def measure(
    orchestrators: int, agents: int, args: argparse.Namespace, by_subject: bool = False
) -> dict[str, Any]:
    """One measurement on a fresh nats-server: runs/s, wall p50, CPU % per process;
    ``by_subject``: the server's messages counted by subject family too (a tap on ``>``,
    which costs the server a delivery per message: its CPU and runs/s are not comparable)."""
    tmp = tempfile.TemporaryDirectory(prefix="cardbus-scale-")
    server = MonitoredServer(tmp.name).start()
    children: list[_Child] = []
    tap = SubjectTap(server.url).start() if by_subject else None
    try:
        base = ["--url", server.url, "--inflight", str(args.inflight)]
        # each agent process pulls for its share of the cards in flight (a pull loop per
        # card at once: more would only poll)
        share = ["--url", server.url, "--inflight", str(-(-args.inflight // agents))]
        if args.started_after_s is not None:
            share += ["--started-after-s", str(args.started_after_s)]
        agent_procs = [_Child(["--role", "agents", *share], f"agents-{j}") for j in range(agents)]
        children += agent_procs
        for c in agent_procs:
            c.line()
        orch_procs = [
            _Child(
                [
                    *("--role", "orchestrator", *base),
                    *(("--follow", args.follow) if args.follow else ()),
                    *("--index", str(i), "--of", str(orchestrators)),
                ],
                f"orchestrator-{i}",
            )
            for i in range(orchestrators)
        ]
        children += orch_procs
        for c in orch_procs:
            c.line()
        warm_end = time.time() + 0.2 + args.warmup
        end = warm_end + args.seconds
        for c in orch_procs:
            c.send({"warm_end": warm_end, "end": end})
        pids = {c.name: c.proc.pid for c in children}
        assert server.proc is not None
        pids["nats-server"] = server.proc.pid
        time.sleep(max(0.0, warm_end - time.time()))
        before = {n: _cpu_s(p) for n, p in pids.items()}
        msgs_before = monitor_counts(server.monitor)
        if tap is not None:
            tap.counting = True
        time.sleep(max(0.0, end - time.time()))
        cpu = {n: (_cpu_s(p) - before[n]) / args.seconds * 100 for n, p in pids.items()}
        msgs_after = monitor_counts(server.monitor)
        if tap is not None:
            tap.counting = False
        done = [c.line(timeout=60 + args.seconds) for c in orch_procs]
    finally:
        if tap is not None:
            tap.stop()
        for c in children:
            c.stop()
        server.stop()
        tmp.cleanup()
    walls = [w for d in done for w in d["walls"]]
    runs_s = sum(d["completed"] for d in done) / args.seconds
    per_run = {  # CPU ms per run finished, by role: robust to the machine's other load
        role: sum(v for n, v in cpu.items() if n.startswith(role)) * 10 / runs_s
        if runs_s
        else float("nan")
        for role in ("orchestrator", "agents", "nats-server")
    }
    logged = max(d.get("logged", 0) for d in done) or 1
    msgs = sum(msgs_after[k] - msgs_before[k] for k in ("in_msgs", "out_msgs"))
    msgs -= msgs_after.get(f"{TAP_NAME} out", 0.0) - msgs_before.get(f"{TAP_NAME} out", 0.0)
    runs = runs_s * args.seconds
    return {
        "by_subject": {k: v / runs for k, v in tap.counts.items()} if tap and runs else {},
        "runs_s": runs_s,
        # each member's folded events in the window, as a share of the events logged in it
        "fold_share": [d.get("folded", 0) / logged for d in done],
        "msgs_per_run": msgs / (runs_s * args.seconds) if runs_s else float("nan"),
        "anomalies": sum(d.get("anomalies", 0) for d in done),
        "wall_p50_ms": statistics.median(walls) * 1000 if walls else float("nan"),
        "cpu": cpu,
        "per_run": per_run,
    }


MSGS_TARGET = 25.0  # server messages per 3-step run (issue 24)


def _by_subject(o: int, a: int, args: argparse.Namespace) -> None:
    """One more measurement, with the tap: where the messages per run come from."""
    got = measure(o, a, args, by_subject=True)
    fams = got["by_subject"]
    total = got["msgs_per_run"]
    met = total <= MSGS_TARGET
    print(
        f"server messages per run by subject family, {o} orchestrator(s), {a} agent"
        f" process(es), load {os.getloadavg()[0]:.1f}: {total:.1f} in+out per run"
        f" (target <= {MSGS_TARGET:g}: {'met' if met else 'MISSED'}); published per run:"
    )
    for name, n in sorted(fams.items(), key=lambda kv: -kv[1]):
        if n >= 0.05:
            print(f"    {n:6.2f}  {name}")
    record(
        args.json,
        BENCH,
        f"server messages per 3-step run (in+out), {o} orchestrator(s), {a} agent process(es)",
        round(total, 1),
        "msgs",
        target=f"<= {MSGS_TARGET:g}",
        met=met,
        why=messages_why(total, fams.get("log publishes (cardbus.evt)", 0.0)),
    )


def _cpu_text(cpu: dict[str, float]) -> str:
    orch = [v for n, v in cpu.items() if n.startswith("orchestrator")]
    agents = [v for n, v in cpu.items() if n.startswith("agents")]
    return (
        f"orch {'+'.join(f'{v:.0f}' for v in orch)}%,"
        f" agents {'+'.join(f'{v:.0f}' for v in agents)}%, nats-server {cpu['nats-server']:.0f}%"
    )


class _CpuModel(NamedTuple):
    """What the CPU per run says about more cores. Each member folds and decides its own
    partitions' runs, and pays for what every member reads (every reply, the shared
    partition): per run, that much in each process (``each``), plus the rest, shared
    among k (``shared``): 1 process: each + shared = one_ms; 2: 2 each + shared = two_ms."""

    one_ms: float
    two_ms: float
    each: float
    shared: float
    rest: float  # agents + nats-server, CPU ms per run
    cores: int

    @classmethod
    def of(cls, one_ms: float, two_ms: float, rest_ms: list[float]) -> _CpuModel:
        each = max(0.0, two_ms - one_ms)
        rest = statistics.median(rest_ms)
        return cls(one_ms, two_ms, each, max(0.0, one_ms - each), rest, os.cpu_count() or 1)

    def cap(self, orchestrator_ms: float) -> float:
        """Runs/s this machine cannot pass: every core busy."""
        return self.cores * 1000 / (orchestrator_ms + self.rest)

    def per_process(self, k: int) -> float:
        """CPU ms per run in each of k orchestrators, with cores to spare."""
        return self.each + self.shared / k


def _project(m: _CpuModel) -> None:
    print(
        f"# CPU per run: orchestrators {m.one_ms:.1f} ms with 1, {m.two_ms:.1f} ms with 2"
        f" (so about {m.each:.1f} ms paid in each, {m.shared:.1f} ms shared);"
        f" agents + nats-server {m.rest:.1f} ms"
    )
    print(
        f"# this machine ({m.cores} cores) cannot pass about {m.cap(m.one_ms):.0f}"
        f" runs/s with 1 orchestrator, {m.cap(m.two_ms):.0f} with 2 (all CPU used);"
    )
    line = ", ".join(
        f"{k}: {1000 / m.per_process(k):.0f} runs/s ({m.per_process(1) / m.per_process(k):.2f}x)"
        for k in (1, 2, 4, 8)
    )
    print(f"# with cores to spare for agents and nats-server, k orchestrators reach about {line}")


def _cores_why(one_rate: float, m: _CpuModel) -> str:
    """Why a second orchestrator adds what it does: the machine's cores, all used."""
    return (
        f"one orchestrator ran {one_rate:,.0f} runs/s at {m.one_ms:.2f} ms of CPU a run, and"
        f" the agents and nats-server {m.rest:.2f} ms: {one_rate * (m.one_ms + m.rest) / 1000:.2f}"
        f" of the machine's {m.cores} cores; {m.cores} cores cannot pass about"
        f" {m.cap(m.two_ms):,.0f} runs/s with two; with cores to spare two reach about"
        f" {m.per_process(1) / m.per_process(2):.2f}x one; the model: the '#' lines of"
        " `.venv/bin/python bench/nats_scale_bench.py`"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--inflight", type=int, default=500)
    ap.add_argument(
        "--orchestrators", default="1,2,4", help="orchestrator processes, comma-separated"
    )
    ap.add_argument("--agents", default="1,2", help="agent processes, comma-separated")
    ap.add_argument("--seconds", type=float, default=10.0, help="the measured window")
    ap.add_argument("--warmup", type=float, default=3.0)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--json", default=None, help="append the figures as JSON lines here")
    ap.add_argument(
        "--follow",
        choices=("auto", "consumer"),
        default=None,
        help="how each orchestrator's store follows the log (NatsEventStore follow=;"
        " default: NatsRuntime's choice)",
    )
    ap.add_argument(
        "--no-by-subject",
        action="store_true",
        help="skip the extra measurement per orchestrator count that counts the server's"
        " messages by subject family",
    )
    ap.add_argument(
        "--started-after-s",
        type=float,
        default=None,
        help="the agents' Started threshold (default: serve_agents', NATS_STARTED_AFTER_S;"
        " 0.01: a Started for every card, as before it)",
    )
    ap.add_argument("--role", choices=("agents", "orchestrator"), help=argparse.SUPPRESS)
    ap.add_argument("--url", help=argparse.SUPPRESS)
    ap.add_argument("--index", type=int, default=0, help=argparse.SUPPRESS)
    ap.add_argument("--of", type=int, default=1, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.role == "agents":
        run(agents_role(args.url, args.inflight, args.started_after_s))
        return
    if args.role == "orchestrator":
        run(orchestrator_role(args.url, args.index, args.of, args.inflight, args.follow))
        return
    orchestrators = [int(x) for x in args.orchestrators.split(",")]
    agent_counts = [int(x) for x in args.agents.split(",")]
    print(
        f"# nats scale: 3-step runs, agents 200 ms +- 25%, {args.inflight} in flight,"
        f" {args.seconds:.0f} s window after {args.warmup:.0f} s warm-up, median of"
        f" {args.repeats}; {os.cpu_count()} cores, load {os.getloadavg()[0]:.1f}"
    )
    print(f"# ideal (no overhead): {args.inflight / (3 * _AGENT_S):.0f} runs/s")
    print(
        "| orchestrators | agent procs | runs/s (range) | run wall p50 | CPU % of a core"
        " | CPU ms per run: orch (summed) / agents / nats-server | events folded, share of"
        " the log, per member | server msgs per run |"
    )
    print("|---|---|---|---|---|---|---|---|")
    shares: dict[int, list[float]] = {}  # orchestrators -> the largest member's fold share
    medians: dict[tuple[int, int], float] = {}
    orch_ms: dict[int, list[float]] = {}  # orchestrators -> orchestrator CPU ms per run
    rest_ms: list[float] = []  # agents + nats-server CPU ms per run
    anomalies = 0  # over every measurement: events an orchestrator's fold could not use
    for o in orchestrators:
        for a in agent_counts:
            got = [measure(o, a, args) for _ in range(args.repeats)]
            anomalies += sum(g["anomalies"] for g in got)
            rates = sorted(g["runs_s"] for g in got)
            mid = sorted(got, key=lambda g: g["runs_s"])[len(got) // 2]
            medians[(o, a)] = statistics.median(rates)
            pr = mid["per_run"]
            orch_ms.setdefault(o, []).append(pr["orchestrator"])
            rest_ms.append(pr["agents"] + pr["nats-server"])
            print(
                f"| {o} | {a} | {medians[(o, a)]:.0f} ({rates[0]:.0f}-{rates[-1]:.0f})"
                f" | {mid['wall_p50_ms']:.0f} ms | {_cpu_text(mid['cpu'])}"
                f" | {pr['orchestrator']:.1f} / {pr['agents']:.1f} / {pr['nats-server']:.1f}"
                f" | {' '.join(f'{x:.0%}' for x in mid['fold_share'])}"
                f" | {mid['msgs_per_run']:.1f} |",
                flush=True,
            )
            shares.setdefault(o, []).append(max(mid["fold_share"]))
            record(
                args.json,
                BENCH,
                f"events folded by the busiest member, share of the log, {o} orchestrator(s),"
                f" {a} agent process(es)",
                round(max(mid["fold_share"]) * 100, 1),
                "%",
                target="<= 60%" if o == 2 else "",
                met=max(mid["fold_share"]) <= 0.6 if o == 2 else None,
                why=(
                    "each member folds its own partitions and what every member reads (every"
                    f" reply, the shared partition): {mid['msgs_per_run']:.1f} messages a run"
                )
                if o == 2
                else "",
            )
            record(
                args.json,
                BENCH,
                f"server messages per run, {o} orchestrator(s), {a} agent process(es)",
                round(mid["msgs_per_run"], 1),
                "msgs",
            )
            record(
                args.json,
                BENCH,
                f"runs/s, {o} orchestrator process(es), {a} agent process(es), {args.inflight}"
                " in flight",
                round(medians[(o, a)], 1),
                "runs/s",
            )
    if not args.no_by_subject:
        for o in orchestrators:
            _by_subject(o, agent_counts[0], args)
    print(f"log anomalies folded by the orchestrators, every measurement: {anomalies}")
    record(
        args.json,
        BENCH,
        "log anomalies folded by the orchestrators (every measurement)",
        anomalies,
        "events",
        target="0",
        met=anomalies == 0,
        why=f"{anomalies} events an orchestrator's fold could not use (for an unknown task,"
        " unreadable, out of order): each logged as a warning, 'log anomaly: ...'",
    )
    if 1 in orchestrators:
        base_ms = statistics.median(orch_ms[1])
        for k, limit in ((2, 0.60), (4, None)):
            if k in shares:
                worst = max(shares[k])
                verdict = "" if limit is None else f" (target <= {limit:.0%}: "
                verdict += "" if limit is None else ("met)" if worst <= limit else "MISSED)")
                print(f"{k} members: the busiest folded {worst:.0%} of the log{verdict}")
        for k, limit in ((2, 1.15), (4, 1.3)):
            if k not in orch_ms:
                continue
            ms = statistics.median(orch_ms[k])
            ratio = ms / base_ms if base_ms else float("nan")
            met = ratio <= limit
            print(
                f"orchestrator CPU per run, {k} members summed: {ms:.1f} ms, {ratio:.2f}x one"
                f" ({base_ms:.1f} ms; target <= {limit}x: {'met' if met else 'MISSED'})"
            )
            record(
                args.json,
                BENCH,
                f"orchestrator CPU per run, {k} processes summed, vs 1",
                round(ratio, 2),
                "x",
                target=f"<= {limit}x one orchestrator",
                met=met,
                why=(
                    f"{ms:.2f} ms a run summed against {base_ms:.2f} with one: each member"
                    " also reads what every member must (every reply, the shared partition);"
                    " paid in each and shared, from the 1- and 2-member figures: the '#'"
                    " lines of `.venv/bin/python bench/nats_scale_bench.py`"
                ),
                ratio=round(ratio, 2),
                ratio_of="1 orchestrator process",
            )
    if 1 in orchestrators and 2 in orchestrators:
        one = max(v for (o, _), v in medians.items() if o == 1)
        two = max(v for (o, _), v in medians.items() if o == 2)
        ratio = two / one if one else 0.0
        print(f"2 orchestrator processes vs 1 (best of each): {ratio:.2f}x (target >= 1.5x)")
        one_ms, two_ms = statistics.median(orch_ms[1]), statistics.median(orch_ms[2])
        model = _CpuModel.of(one_ms, two_ms, rest_ms)
        _project(model)
        for k, ms in ((1, one_ms), (2, two_ms)):
            record(args.json, BENCH, f"orchestrator CPU per run, {k} process(es) summed", ms, "ms")
        record(
            args.json,
            BENCH,
            f"2 orchestrator processes vs 1, {args.inflight} in flight",
            round(ratio, 2),
            "x",
            target=">= 1.5x one orchestrator",
            met=ratio >= 1.5,
            why=_cores_why(one, model),
            ratio=round(ratio, 2),
            ratio_of="1 orchestrator process",
        )


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        main()
