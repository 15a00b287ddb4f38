"""Benchmark: a schedule fires once per due time on two NATS members (issue 32 item 3).

    .venv/bin/python bench/schedules_bench.py             # 60 s, every 2 s, 10 s downtime
    .venv/bin/python bench/schedules_bench.py --seconds 20 --every 1

A real nats-server, two ``cardbus orchestrator`` processes (``--schedule-grace 1``) and
one ``cardbus agent serve`` process. Three checks, each printed with met/MISSED, all from
the log's ``schedule.*`` events:

1. once per due time: a schedule every ``--every`` s (overlap ``allow_all``, catch-up
   ``all``) for ``--seconds``; half-way the member that fired last is killed with
   SIGKILL (and started again 5 s later). Every due time from the first firing to the
   last fired exactly once: no double, no miss.
2. downtime: a schedule every ``--every`` s with catch-up ``one``; both members are
   killed for ``--downtime`` s, then one starts: exactly one missed firing runs (late),
   the other missed due times are skipped (reason ``missed``).
3. overlap ``skip``: a schedule every ``--every`` s of a task that takes 3x as long: a
   due time while its run still runs is skipped with reason ``overlap``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

from cardbus.bus.orchestrator.scheduler import create_schedule
from cardbus.bus.orchestrator.schedules import stream_of
from cardbus.bus.runtime.nats import LocalNatsServer
from cardbus.eventstore import events as ev
from cardbus.eventstore.nats import NatsEventStore

AGENTS = """
import asyncio
import msgspec
from cardbus import Agent, Capability, TaskCard, TaskContext


class Text(msgspec.Struct):
    text: str


class Echo(Agent):
    agent_id = "echo"
    capabilities = [Capability("echo", Text, Text, "answer at once")]

    async def handle(self, task: TaskCard, inputs: Text, ctx: TaskContext) -> Text:
        return inputs


class Slow(Agent):
    agent_id = "slow"
    capabilities = [Capability("slow", Text, Text, "answer after a while")]

    async def handle(self, task: TaskCard, inputs: Text, ctx: TaskContext) -> Text:
        await asyncio.sleep(float(inputs.text))
        return inputs
"""


STARTED: list[Proc] = []  # every process started: each is stopped at the end, whatever fails


class Proc:
    def __init__(self, args: list[str], cwd: Path, name: str) -> None:
        STARTED.append(self)
        self.log = open(cwd / f"{name}.log", "ab")  # noqa: SIM115 - closed in stop
        env = {**os.environ, "PYTHONPATH": str(cwd), "PYTHONUNBUFFERED": "1"}
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "cardbus.tools", *args],
            cwd=cwd,
            env=env,
            stdout=self.log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
        )

    def kill9(self) -> None:
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGKILL)
        self.proc.wait(10)
        self.log.close()

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()


async def until(condition: Callable[[], Awaitable[bool]], seconds: float, what: str) -> None:
    """Wait for ``condition`` (a look at the log); ``TimeoutError`` naming ``what``."""
    deadline = time.monotonic() + seconds
    while not await condition():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what}: not within {seconds:g} s")
        await asyncio.sleep(0.2)


async def runs_ended(store: NatsEventStore, fired: list[ev.ScheduleFired]) -> dict[str, int]:
    """How the runs of ``fired`` ended: {last event type: count}, and how many plans
    were submitted more than once (``double``) or never (``not started``)."""
    out: dict[str, int] = {}
    for f in fired:
        claims = [
            e for e in await store.read_stream(f"plan-{f.plan_id}")
            if isinstance(e.data, ev.PlanSubmitted)
        ]  # fmt: skip
        if len(claims) != 1:
            key = "not started" if not claims else "double"
        else:
            assert isinstance(claims[0].data, ev.PlanSubmitted)
            root = claims[0].data.root_id
            last = await store.read_stream(root, max(1, await store.stream_version(root)))
            key = last[-1].type if last else "no run"
        out[key] = out.get(key, 0) + 1
    return out


def orchestrator(url: str, cwd: Path, name: str) -> Proc:
    return Proc(["orchestrator", "--nats", url, "--schedule-grace", "1"], cwd, name)


async def schedule_events(store: NatsEventStore, sid: str) -> list[ev.Event]:
    return [e.data for e in await store.read_stream(stream_of(sid))]


async def fired_of(store: NatsEventStore, sid: str) -> list[ev.ScheduleFired]:
    return [e for e in await schedule_events(store, sid) if isinstance(e, ev.ScheduleFired)]


async def pid_of_member(store: NatsEventStore, member: str) -> int:
    """The pid of the orchestrator whose id is ``member`` (its ``orchestrator.started``)."""
    for env in await store.read_stream(f"orchestrator-{member}"):
        if isinstance(env.data, ev.OrchestratorStarted):
            return env.data.pid
    return 0


def verdict(ok: bool) -> str:
    return "met" if ok else "MISSED"


async def once_per_due(store: NatsEventStore, url: str, cwd: Path, a: argparse.Namespace) -> bool:
    procs = [orchestrator(url, cwd, "o1"), orchestrator(url, cwd, "o2")]
    await asyncio.sleep(3)  # both members up (their schedulers read the log at start)
    plan = {"goal": "echo", "tasks": [{"id": "e", "capability": "echo", "inputs": {"text": "x"}}]}
    sid = await create_schedule(
        store, plan, interval_seconds=a.every, overlap="allow_all", catchup="all"
    )
    began = time.monotonic()
    killed = False
    while time.monotonic() - began < a.seconds:
        await asyncio.sleep(0.5)
        if not killed and time.monotonic() - began > a.seconds / 2:
            fired = await fired_of(store, sid)
            pid = await pid_of_member(store, fired[-1].member)
            victim = next(p for p in procs if p.proc.pid == pid)
            victim.kill9()
            killed = True
            print(f"  killed -9 the member that fired last (pid {pid}) after {len(fired)} firings")
            await asyncio.sleep(5)
            procs[procs.index(victim)] = orchestrator(url, cwd, "o-restarted")
    fired = await fired_of(store, sid)

    async def all_ended() -> bool:  # the last firing's run may still be running
        ends = await runs_ended(store, fired)
        return set(ends) <= {"run.completed.v1", "double"}

    with contextlib.suppress(TimeoutError):
        await until(all_ended, 30, "every firing's run completed")
    ends = await runs_ended(store, fired)
    for p in procs:
        p.stop()
    dues = [f.due for f in fired]
    steps = [round((d - dues[0]) / a.every, 6) for d in dues]
    doubles = len(dues) - len(set(dues))
    misses = [k for k in range(int(steps[-1]) + 1) if k not in steps] if steps else []
    members = len({f.member for f in fired})
    completed = ends.get("run.completed.v1", 0)
    ok = killed and not doubles and not misses and len(dues) >= a.seconds / a.every - 3
    ok = ok and completed == len(dues)
    print(
        f"once per due time: {len(dues)} firings over {a.seconds:g} s by {members} members,"
        f" {doubles} double, {len(misses)} missed; their runs: {ends}: {verdict(ok)}"
    )
    return ok


async def downtime(store: NatsEventStore, url: str, cwd: Path, a: argparse.Namespace) -> bool:
    procs = [orchestrator(url, cwd, "d1"), orchestrator(url, cwd, "d2")]
    await asyncio.sleep(3)
    plan = {"goal": "echo", "tasks": [{"id": "e", "capability": "echo", "inputs": {"text": "x"}}]}
    sid = await create_schedule(
        store, plan, interval_seconds=a.every, overlap="allow_all", catchup="one"
    )

    async def fired_twice() -> bool:
        return len(await fired_of(store, sid)) >= 2

    await until(fired_twice, 30 + 4 * a.every, "two firings")
    for p in procs:
        p.kill9()
    down_at = time.time()
    await asyncio.sleep(a.downtime)
    back = orchestrator(url, cwd, "d-back")
    up_at = time.time()

    async def fires_again() -> bool:
        return any(f.due > up_at + a.every for f in await fired_of(store, sid))

    await until(fires_again, 30 + 4 * a.every, "a firing after the restart")
    back.stop()
    events = await schedule_events(store, sid)
    late = [e for e in events if isinstance(e, ev.ScheduleFired) and e.late]
    missed = [e for e in events if isinstance(e, ev.ScheduleSkipped) and e.reason == "missed"]
    dues = [e.due for e in events if isinstance(e, ev.ScheduleFired)]
    ok = len(late) == 1 and late[0].due > down_at and bool(missed) and len(dues) == len(set(dues))
    print(
        f"downtime {a.downtime:g} s, catch-up one: {len(late)} missed firing run,"
        f" skipped: {[m.detail for m in missed]}: {verdict(ok)}"
    )
    return ok


async def overlap_skip(store: NatsEventStore, url: str, cwd: Path, a: argparse.Namespace) -> bool:
    procs = [orchestrator(url, cwd, "s1"), orchestrator(url, cwd, "s2")]
    await asyncio.sleep(3)
    slow = str(3 * a.every)
    plan = {"goal": "slow", "tasks": [{"id": "s", "capability": "slow", "inputs": {"text": slow}}]}
    sid = await create_schedule(store, plan, interval_seconds=a.every, overlap="skip")

    async def skipped() -> list[ev.ScheduleSkipped]:
        return [e for e in await schedule_events(store, sid) if isinstance(e, ev.ScheduleSkipped)]

    deadline = time.monotonic() + 10 * a.every
    while not await skipped() and time.monotonic() < deadline:
        await asyncio.sleep(0.2)
    for p in procs:
        p.stop()
    found = await skipped()
    ok = bool(found) and found[0].reason == "overlap"
    said = f"{found[0].reason}: {found[0].detail}" if found else "none"
    print(f"overlap skip: {len(found)} skipped ({said}): {verdict(ok)}")
    return ok


async def main(a: argparse.Namespace) -> int:
    with tempfile.TemporaryDirectory() as tmp:
        cwd = Path(tmp)
        (cwd / "bench_agents.py").write_text(AGENTS)
        (cwd / "js").mkdir()
        server = LocalNatsServer(str(cwd / "js")).start()
        try:
            Proc(
                ["agent", "serve", "bench_agents:Echo", "bench_agents:Slow", "--nats", server.url],
                cwd,
                "agents",
            )
            store = await NatsEventStore.connect(server.url)
            try:
                results = [
                    await once_per_due(store, server.url, cwd, a),
                    await downtime(store, server.url, cwd, a),
                    await overlap_skip(store, server.url, cwd, a),
                ]
            finally:
                await store.close()
        finally:
            for proc in STARTED:  # the agents, and any orchestrator a failed check left
                proc.stop()
            server.stop()
    return 0 if all(results) else 1


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--seconds", type=float, default=60.0)
    p.add_argument("--every", type=float, default=2.0)
    p.add_argument("--downtime", type=float, default=10.0)
    raise SystemExit(asyncio.run(main(p.parse_args())))
