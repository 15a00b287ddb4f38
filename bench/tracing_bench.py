"""What tracing costs: the 3-step pipeline of ``pipeline_bench`` with and without tracing.

Modes, each in its own process (an OpenTelemetry provider is set once per process):

* ``none``   -- the tracing hooks replaced by plain calls: cardbus without tracing code;
* ``api``    -- the default: the hooks run, no SDK is configured (the API's no-op);
* ``sdk``    -- an SDK provider recording every span into a batch processor whose
  exporter discards them (the cost of making spans, not of shipping them).

Modes are interleaved ``--rounds`` times and the best round of each is kept.

    .venv/bin/python bench/tracing_bench.py [--runs 300] [--concurrency 32] [--store memory]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

MODES = ("none", "api", "sdk")


def _strip_tracing() -> None:
    from cardbus.bus import telemetry

    class NoTracing:
        def __init__(self, *a: Any, **k: Any) -> None:
            return None

        def start_run(self, *a: Any, **k: Any) -> None:
            return None

        def traceparent(self, root_id: str) -> None:
            return None

        def on_event(self, env: Any) -> None:
            return None

        def send_task(self, bus: Any, agent_id: str, card: Any) -> Any:
            return bus.send_task(agent_id, card)

        def close(self) -> None:
            return None

    telemetry.RunTracing = NoTracing  # type: ignore[assignment,misc]
    telemetry.traced_handler = lambda handler, bus, agent_id: handler  # type: ignore[assignment]
    telemetry.invoke_agent = lambda agent, card, llm: agent.run(card, llm)  # type: ignore[assignment]


def _install_sdk() -> None:
    from opentelemetry import trace
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import (
        BatchSpanProcessor,
        SpanExporter,
        SpanExportResult,
    )

    class Discard(SpanExporter):
        def export(self, spans: Sequence[Any]) -> SpanExportResult:
            return SpanExportResult.SUCCESS

    provider = TracerProvider()
    provider.add_span_processor(BatchSpanProcessor(Discard(), max_queue_size=1 << 16))
    trace.set_tracer_provider(provider)


async def _child(mode: str, runs: int, concurrency: int, store_kind: str) -> dict[str, float]:
    if mode == "none":
        _strip_tracing()
    elif mode == "sdk":
        _install_sdk()
    from pipeline_bench import AGENTS, measure, pct, pipeline_plan

    from cardbus.bus.runtime.embedded import EmbeddedRuntime
    from cardbus.eventstore import EventStore, MemoryEventStore, SqliteEventStore

    out: dict[str, float] = {}
    with tempfile.TemporaryDirectory(dir=".") as d:
        for conc in (1, concurrency):
            store: EventStore
            if store_kind == "sqlite":
                store = await SqliteEventStore.open(Path(d) / f"t-{conc}.db")
            else:
                store = MemoryEventStore()
            async with EmbeddedRuntime(store, AGENTS) as rt:

                async def run_one() -> None:
                    result = await rt.run(pipeline_plan(), timeout=60)
                    assert result.status == "completed", result

                await measure(run_one, 20, 1)
                cpu = time.process_time()
                rate, lat = await measure(run_one, runs, conc)
                cpu = time.process_time() - cpu
            await store.close()
            out[f"rate_{conc}"] = rate
            out[f"p50_{conc}"] = pct(lat, 50)
            out[f"cpu_{conc}"] = cpu / runs * 1e6
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--runs", type=int, default=300)
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--store", choices=("memory", "sqlite"), default="memory")
    parser.add_argument("--child", choices=MODES, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(asyncio.run(_child(args.child, args.runs, args.concurrency, args.store))))
        return
    best: dict[str, dict[str, float]] = {}
    for _ in range(args.rounds):
        for mode in MODES:
            cmd = [sys.executable, __file__, "--child", mode, "--runs", str(args.runs)]
            cmd += ["--concurrency", str(args.concurrency), "--store", args.store]
            res = json.loads(subprocess.run(cmd, check=True, capture_output=True).stdout)
            prev = best.get(mode)
            best[mode] = (
                res
                if prev is None
                else {k: (max if k.startswith("rate") else min)(prev[k], v) for k, v in res.items()}
            )
    c = args.concurrency
    print(f"3-step pipeline, {args.runs} runs per cell, {args.store} store, best of {args.rounds}")
    print(
        f"{'mode':<5} | {'runs/s 1':>9} | {'p50 ms 1':>8} | {'CPU us/run 1':>12} |"
        f" {f'runs/s {c}':>9} | {f'CPU us/run {c}':>13} | CPU vs none (1 / {c})"
    )
    base = best["none"]
    for mode in MODES:
        r = best[mode]
        d1 = (r["cpu_1"] / base["cpu_1"] - 1) * 100
        dc = (r[f"cpu_{c}"] / base[f"cpu_{c}"] - 1) * 100
        print(
            f"{mode:<5} | {r['rate_1']:>9.1f} | {r['p50_1']:>8.3f} | {r['cpu_1']:>12.0f} |"
            f" {r[f'rate_{c}']:>9.1f} | {r[f'cpu_{c}']:>13.0f} | {d1:+.1f}% / {dc:+.1f}%"
        )
    from summary import record  # the figures for bench/summary.py ($CARDBUS_BENCH_JSON)

    for mode in MODES:
        r = best[mode]
        for conc in (1, c):
            name = f"tracing {mode}, {conc} in flight, {args.store} store"
            record(None, "tracing", f"3-step pipeline, {name}", r[f"rate_{conc}"], "runs/s")
            record(
                None,
                "tracing",
                f"CPU per run, {name}",
                r[f"cpu_{conc}"],
                "us",
                **(
                    {"ratio": r[f"cpu_{conc}"] / base[f"cpu_{conc}"], "ratio_of": "no tracing"}
                    if mode != "none"
                    else {}
                ),
            )


if __name__ == "__main__":
    main()
