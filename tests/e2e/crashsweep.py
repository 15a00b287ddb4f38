"""Crash sweep: kill the process running an LLM-and-tools run at every write boundary.

For each store (a SQLite file; a JetStream log on a real ``nats-server``) and
each kill point ``k``, a child process runs a plan of three chained tasks,
each making five model calls (``OpenAIChatLLM`` against the OpenAI-compatible
stub on loopback, served by this process) and three tool calls (one of them,
``charge``, with an effect: every application is appended to a file with its
idempotency key). The child dies (``os._exit``, as a kill would) right after
its ``k``-th write to the log is durable; a second child on the same log
resumes the run to the end. Then the sweep checks, from the log, the stub and
the effects file:

* the run completed with the output of a run that was never killed;
* no model call was sent again once its answer was durable: no task has two
  live ``model.answered`` for the same request (the stub saw each request at
  most once more than it was answered: a call killed in flight is re-sent);
* no effect was applied twice: each task's charges, counted per task, under one
  idempotency key (the same key twice is one charge at the payment end: the call
  repeated after a kill between its effect and its ``tool.called``, which a write
  boundary can be when another append shares the commit; counted and printed apart).

A kill right after the ``tool.requested`` of ``note`` (a tool not declared idempotent)
leaves its effect unknown: the task waits for an operator, and the resumed child acts as
one (it approves; the count is printed), since a kill at a write boundary comes before
the call's effect.

``python -m tests.e2e.crashsweep`` runs the whole sweep (every kill point of
both stores, over 100 in all) and prints the count and the three figures;
``tests/e2e/test_crash_sweep.py`` runs a sample of it in ``make test``.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import hashlib
import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import msgspec

from cardbus.agents import Agent, Capability, TaskCard, TaskContext
from cardbus.agents.cards import AgentConstraints
from cardbus.agents.tools import Tool, ToolRegistry, current_idempotency_key
from cardbus.eventstore import events as ev

ROOT = Path(__file__).resolve().parents[2]
PLAN_ID = "crash-sweep"
MODEL_CALLS = 5
TOOL_CALLS = 3
EXIT_KILLED = 77


class Topic(msgspec.Struct):
    topic: str


class Finding(msgspec.Struct):
    text: str


class Worker(Agent):
    """Five model calls and three tool calls, interleaved; the answer depends on all."""

    agent_id = "sweeper"
    capabilities: ClassVar = [Capability("sweep", Topic, Finding)]
    constraints = AgentConstraints(tools=["lookup", "charge", "note"])

    async def handle(self, task: TaskCard, inputs: Topic, ctx: TaskContext) -> Finding:
        text = inputs.topic
        tools = [("lookup", {"q": text}), ("charge", {"amount": 3}), ("note", {"n": 1})]
        for i in range(MODEL_CALLS):
            answer = await ctx.llm.chat([{"role": "user", "content": f"step {i}: {text}"}])
            text = answer.text
            if i < TOOL_CALLS:
                name, args = tools[i]
                result = await ctx.tool(name, **args)
                text = f"{text} {json.dumps(result, sort_keys=True)}"
        return Finding(text=text)


def plan() -> dict[str, Any]:
    return {
        "plan_id": PLAN_ID,
        "goal": "sweep",
        "tasks": [
            {"id": "a", "capability": "sweep", "inputs": {"topic": "tides"}, "timeout_s": 5},
            {
                "id": "b",
                "capability": "sweep",
                "deps": ["a"],
                "inputs": {"topic": {"$dep": "a", "path": "text"}},
                "timeout_s": 5,
            },
            {
                "id": "c",
                "capability": "sweep",
                "deps": ["b"],
                "inputs": {"topic": {"$dep": "b", "path": "text"}},
                "timeout_s": 5,
            },
        ],
    }


def tools(effects: Path) -> ToolRegistry:
    def charge(args: dict[str, Any]) -> dict[str, Any]:
        # the effect: applied every time the tool runs, recorded with the call's key
        with open(effects, "a", encoding="utf-8") as f:
            f.write(current_idempotency_key() + "\n")
            f.flush()
            os.fsync(f.fileno())
        return {"charged": args["amount"]}

    return ToolRegistry(
        [
            Tool.define("lookup", lambda a: {"found": len(a["q"])}, idempotent=True),
            # keyed: a repeat with the same key is one charge at the payment end
            Tool.define("charge", charge, idempotent=True),
            Tool.define("note", lambda a: {"noted": a["n"]}),
        ]
    )


def answer_for(body: dict[str, Any]) -> str:
    """The stub's answer: a function of the request alone (every trial the same)."""
    digest = hashlib.sha256(json.dumps(body["messages"], sort_keys=True).encode()).hexdigest()
    return f"ans-{digest[:10]}"


# -- the child: run (or resume) the plan, die after the k-th write ----------------------


def _answers_in(result: Any) -> int:
    """The live ``model.answered`` events among what an append returned."""
    envs = result if isinstance(result, list) else []
    flat = [e for x in envs for e in (x if isinstance(x, list) else [x])]
    return sum(
        1
        for e in flat
        if isinstance(getattr(e, "data", None), ev.ModelAnswered) and not e.data.replayed_from
    )


def _instrument(writes: list[int], crash_at: int) -> None:
    """Count every store's successful writes into ``writes[0]``; with ``crash_at`` > 0,
    die (as a kill would: no cleanup) right after the ``crash_at``-th is durable."""
    from cardbus.eventstore.nats import NatsEventStore
    from cardbus.eventstore.sqlite import SqliteEventStore

    # the control's kill point: after the write that makes this many answers durable
    after_answers = int(os.environ.get("CARDBUS_SWEEP_KILL_AFTER_ANSWERS", "0"))
    answers = [0]

    def wrap(cls: Any, name: str) -> None:
        original = getattr(cls, name)

        async def write(self: Any, *args: Any, **kwargs: Any) -> Any:
            depth = getattr(self, "_sweep_depth", 0)
            self._sweep_depth = depth + 1  # an append_many that appends counts once
            try:
                result = await original(self, *args, **kwargs)
            finally:
                self._sweep_depth = depth
            if depth == 0:
                writes[0] += 1
                answers[0] += _answers_in(result)
                if 0 < crash_at <= writes[0] or 0 < after_answers <= answers[0]:
                    os._exit(EXIT_KILLED)
            return result

        setattr(cls, name, write)

    for cls in (SqliteEventStore, NatsEventStore):
        wrap(cls, "append")
        wrap(cls, "append_many")


async def _child(store_url: str, stub_url: str, effects: Path, crash_at: int) -> dict[str, Any]:
    from cardbus.agents.llm import OpenAIChatLLM
    from cardbus.bus.orchestrator import Policy, RetryPolicy

    approved: list[str] = []
    llm = OpenAIChatLLM(stub_url, "stub-model", max_retries=0, timeout_s=10)
    policy = Policy(retry=RetryPolicy(max_attempts=5, initial_interval_s=0.05, jitter=0.0))
    registry = tools(effects)
    if store_url.startswith("nats://"):
        from cardbus.bus.runtime.nats import NatsRuntime
        from cardbus.eventstore.nats.connection import NatsOptions

        async with NatsRuntime(
            NatsOptions(url=store_url),
            [Worker],
            policy=policy,
            llm=llm,
            tools=registry,
            bus_options={"ack_wait": 2.0},
        ) as rt:
            root = await rt.submit(plan())
            result = await _finish(rt.orchestrator, root, approved)
    else:
        from cardbus.bus.orchestrator.access import AccessPolicy
        from cardbus.bus.runtime.embedded import EmbeddedRuntime
        from cardbus.eventstore.sqlite import SqliteEventStore

        # the sweep's control: with replay off, its figures must see calls sent again
        access = AccessPolicy(replay=os.environ.get("CARDBUS_SWEEP_NO_REPLAY") != "1")
        async with (
            await SqliteEventStore.open(store_url) as store,
            EmbeddedRuntime(store, [Worker], policy, llm=llm, tools=registry, access=access) as rt,
        ):
            root = await rt.orchestrator.submit(plan())
            result = await _finish(rt.orchestrator, root, approved)
    return {
        "root": root,
        "status": result.status,
        "outputs": result.outputs,
        "approved": approved,
    }


async def _finish(orchestrator: Any, root: str, approved: list[str]) -> Any:
    """Wait for the run; meanwhile act as the operator: a task waiting because a call of
    ``note`` (not idempotent) was cut off is approved. That is right here, since the kill
    came at a write boundary, right after ``tool.requested``: before the call's effect."""
    from cardbus.eventstore import TaskState

    waiting = asyncio.ensure_future(orchestrator.wait(root, timeout=120))
    while not waiting.done():
        run = orchestrator.state.runs.get(root)
        for task_id in list(run.tasks if run is not None else ()):
            task = orchestrator.state.tasks[task_id]
            if task.state is TaskState.AWAITING_APPROVAL and task_id not in approved:
                approved.append(task_id)
                await orchestrator.approve(task_id, by="sweep-operator")
        await asyncio.wait({waiting}, timeout=0.05)
    return waiting.result()


# -- the parent: trials and figures --------------------------------------------------


@dataclass
class Figures:
    trials: int = 0
    completed_same: int = 0
    resent_after_durable: int = 0
    effects_twice: int = 0
    failures: list[str] = field(default_factory=list)
    killed: int = 0
    approved: int = 0  # unknown effects of a non-idempotent tool, approved by the operator
    repeated_same_key: int = 0  # the idempotent tool's calls repeated with their key

    def line(self) -> str:
        return (
            f"{self.trials} kill points ({self.killed} killed mid-run):"
            f" {self.completed_same} completed with the same output;"
            f" {self.resent_after_durable} model calls sent again after their answer was"
            f" durable; {self.effects_twice} effects applied twice"
            f" ({self.approved} unknown effects approved by the operator;"
            f" {self.repeated_same_key} idempotent calls repeated under their key)"
        )


def _spawn(
    store_url: str, stub_url: str, effects: Path, crash_at: int, after_answers: int = 0
) -> tuple[int, str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env["CARDBUS_SWEEP_KILL_AFTER_ANSWERS"] = str(after_answers)
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "tests.e2e.crashsweep",
            "child",
            store_url,
            stub_url,
            str(effects),
            str(crash_at),
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    return proc.returncode, proc.stdout.strip().splitlines()[-1] if proc.stdout.strip() else (
        proc.stderr[-2000:]
    )


async def _log_of(store_url: str) -> list[Any]:
    if store_url.startswith("nats://"):
        from cardbus.eventstore.nats import NatsEventStore

        store: Any = await NatsEventStore.connect(store_url)
    else:
        from cardbus.eventstore.sqlite import SqliteEventStore

        store = await SqliteEventStore.open(store_url)
    try:
        out: list[Any] = []
        position = 0
        while True:
            page = await store.read_all(position + 1, 1000)
            out.extend(page)
            if len(page) < 1000:
                return out
            position = page[-1].position
    finally:
        await store.close()


def judge(log: list[Any], effects: Path) -> tuple[int, int, int]:
    """(model calls sent again after a durable answer, effects applied twice, calls of
    the idempotent tool repeated under the same key)."""
    live: collections.Counter[tuple[str, str]] = collections.Counter()
    for env in log:
        data = env.data
        if isinstance(data, ev.ModelAnswered) and not data.replayed_from and data.error is None:
            live[(data.task_id, data.request_digest)] += 1
    resent = sum(n - 1 for n in live.values() if n > 1)
    keys = (
        collections.Counter(
            line for line in effects.read_text(encoding="utf-8").splitlines() if line
        )
        if effects.exists()
        else collections.Counter()
    )
    # each application names its call's key, and the key names its call's task (the
    # charge's first tool.requested): applications are counted per task, one charge each.
    # (Counted against the run's completed tasks as a whole, a task charged twice under two
    # keys could hide behind one that was never charged, and a charge counted under no
    # task read as applied twice.) A key that names no charge in the log is stray.
    task_of = {
        env.event_id: env.stream
        for env in log
        if isinstance(env.data, ev.ToolRequested) and env.data.tool == "charge"
    }
    # A charge is applied twice when its task paid under two keys. The same key twice is
    # one charge at the payment end (the tool is idempotent, keyed): that is the call
    # repeated after a kill that came between its effect and its tool.called, which a kill
    # at a write boundary can be when another append shares the commit (group commit) and
    # its caller runs on before the killing one; counted apart (``repeated``).
    per_task: collections.Counter[str] = collections.Counter()
    stray = repeated = 0
    for key, n in keys.items():
        if key in task_of:
            per_task[task_of[key]] += 1
            repeated += n - 1
        else:
            stray += n
    twice = sum(n - 1 for n in per_task.values() if n > 1) + stray
    return resent, twice, repeated


class Sweep:
    """One store's trials, each on a fresh log (a new SQLite file, or a new nats-server),
    sharing the stub."""

    def __init__(self, kind: str, workdir: Path, stub: Any) -> None:
        self.kind = kind
        self.workdir = workdir
        self.stub = stub
        self.figures = Figures()
        self._n = 0
        self._server: Any = None

    def fresh_log(self) -> str:
        from cardbus.bus.runtime.nats import LocalNatsServer

        self._n += 1
        if self.kind != "nats":
            return str(self.workdir / f"sweep-{self._n}.db")
        self.close()
        path = self.workdir / f"nats-{self._n}"
        path.mkdir(parents=True, exist_ok=True)
        self._server = LocalNatsServer(str(path)).start()
        return str(self._server.url)

    def close(self) -> None:
        if self._server is not None:
            self._server.stop()
            self._server = None

    def trial(self, crash_at: int, expected: Any, after_answers: int = 0) -> None:
        """Kill at ``crash_at`` (or once ``after_answers`` answers are durable), resume,
        judge."""
        store_url = self.fresh_log()
        effects = self.workdir / f"effects-{self.kind}-{self._n}.txt"
        code, out = _spawn(store_url, self.stub.url, effects, crash_at, after_answers)
        killed = code == EXIT_KILLED
        if not killed and code != 0:
            self.figures.failures.append(f"{self.kind} k={crash_at}: child failed: {out}")
            return
        if killed:
            self.figures.killed += 1
            code, out = _spawn(store_url, self.stub.url, effects, 0)
            if code != 0:
                self.figures.failures.append(f"{self.kind} k={crash_at}: resume failed: {out}")
                return
        result = json.loads(out)
        self.figures.approved += len(result.get("approved", []))
        resent, twice, repeated = judge(asyncio.run(_log_of(store_url)), effects)
        self.figures.trials += 1
        self.figures.resent_after_durable += resent
        self.figures.effects_twice += twice
        self.figures.repeated_same_key += repeated
        if result["status"] == "completed" and result["outputs"] == expected:
            self.figures.completed_same += 1
        else:
            self.figures.failures.append(
                f"{self.kind} k={crash_at}: {result['status']} {result['outputs']!r:.300}"
            )


def run_sweep(
    kinds: list[str],
    points: list[int] | None,
    workdir: Path,
    verbose: bool = True,
    after_answers: int = 0,
) -> dict[str, Figures]:
    """Every kill point (``points`` None) or the ones given, for each store kind; with
    ``after_answers``, one trial killed once that many model answers are durable."""
    from tests.agents.openai_stub import OpenAIStub

    out: dict[str, Figures] = {}
    with OpenAIStub() as stub:
        stub.responder = answer_for
        for kind in kinds:
            sweep = Sweep(kind, workdir, stub)
            try:
                base = _baseline(sweep.fresh_log(), stub.url, workdir / f"effects-{kind}-0.txt")
                writes = int(base["writes"])
                if after_answers:
                    points = [0]
                for k in points if points is not None else range(1, writes + 1):
                    if k > writes:
                        continue
                    start = time.monotonic()
                    sweep.trial(k, base["outputs"], after_answers)
                    if verbose:
                        took = time.monotonic() - start
                        print(f"  {kind} k={k}/{writes} {took:.1f}s: {sweep.figures.line()}")
            finally:
                sweep.close()
            out[kind] = sweep.figures
    return out


def _baseline(store_url: str, stub_url: str, effects: Path) -> dict[str, Any]:
    """A run that is never killed: its outputs, and its writes (the kill points are 1..that)."""
    code, out = _spawn(store_url, stub_url, effects, 0)
    if code != 0:
        raise RuntimeError(f"the baseline run failed: {out}")
    result: dict[str, Any] = json.loads(out)
    if result["status"] != "completed":
        raise RuntimeError(f"the baseline run did not complete: {result}")
    return result


def _child_main(argv: list[str]) -> None:
    store_url, stub_url, effects, crash_at = argv[0], argv[1], Path(argv[2]), int(argv[3])
    writes = [0]
    _instrument(writes, crash_at)
    result = asyncio.run(_child(store_url, stub_url, effects, crash_at))
    result["writes"] = writes[0]
    print(json.dumps(result, default=str))


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "child":
        _child_main(sys.argv[2:])
        return
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--stores", default="sqlite,nats")
    parser.add_argument("--points", default="", help="kill points (default: every one)")
    args = parser.parse_args()
    points = [int(p) for p in args.points.split(",") if p] or None
    with tempfile.TemporaryDirectory(prefix="cardbus-sweep-") as tmp:
        figures = run_sweep(args.stores.split(","), points, Path(tmp))
    total = Figures()
    for kind, f in figures.items():
        print(f"{kind}: {f.line()}")
        for failure in f.failures:
            print(f"  FAILED {failure}")
        total.trials += f.trials
        total.killed += f.killed
        total.completed_same += f.completed_same
        total.resent_after_durable += f.resent_after_durable
        total.effects_twice += f.effects_twice
        total.approved += f.approved
        total.repeated_same_key += f.repeated_same_key
        total.failures += f.failures
    print(f"all: {total.line()}")
    ok = (
        not total.failures
        and total.completed_same == total.trials
        and total.resent_after_durable == 0
        and total.effects_twice == 0
    )
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
