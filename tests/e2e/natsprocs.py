"""Helpers for the NATS end-to-end tests: test agents, cardbus processes, log checks."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import msgspec

from cardbus.agents import Agent, Capability
from cardbus.bus.orchestrator.plan import Plan, decode_plan
from cardbus.eventstore import Envelope
from cardbus.eventstore import events as ev
from cardbus.eventstore.nats import NatsEventStore

# Bus settings that make redelivery and reply acks quick enough for tests.
FAST_BUS = {"ack_wait": 1.0, "fetch_wait": 0.5, "reply_ack_wait": 2.0}


class N(msgspec.Struct):
    n: int


class Quick(Agent):
    """The in-process test agent (the AGENTS source below is for subprocesses)."""

    agent_id = "quick"
    description = "adds one"
    capabilities = [Capability("quick", N, N, "add one")]

    async def handle(self, task, inputs, ctx):  # type: ignore[no-untyped-def]
        return N(n=inputs.n + 1)


def slow_agent(seconds: float) -> type[Agent]:
    """The in-process "slow" agent: adds ten after ``seconds``."""

    async def handle(self: Agent, task: Any, inputs: N, ctx: Any) -> N:
        await asyncio.sleep(seconds)
        return N(n=inputs.n + 10)

    return type(
        "Slow",
        (Agent,),
        {
            "agent_id": "slow",
            "description": "adds ten, slowly",
            "capabilities": [Capability("slow", N, N, "add ten")],
            "handle": handle,
        },
    )


AGENTS = """
import asyncio, os, msgspec
from cardbus.agents import Agent, Capability


class N(msgspec.Struct):
    n: int


class Big(msgspec.Struct):
    blob: str


class Quick(Agent):
    agent_id = "quick"
    description = "adds one"
    capabilities = [Capability("quick", N, N, "add one")]

    async def handle(self, task, inputs, ctx):
        return N(n=inputs.n + 1)


class Slow(Agent):
    agent_id = "slow"
    description = "adds ten, slowly"
    capabilities = [Capability("slow", N, N, "add ten slowly")]

    async def handle(self, task, inputs, ctx):
        marks = os.environ.get("CARDBUS_TEST_MARKS")
        if marks:
            name = f"{task.task_id}.{task.attempt}.{os.getpid()}"
            open(os.path.join(marks, name), "w").close()
        ends = os.environ.get("CARDBUS_TEST_ENDS")  # how each handler run ended
        end = os.path.join(ends, f"{task.task_id}.{task.attempt}") if ends else ""
        try:
            await asyncio.sleep(float(os.environ.get("CARDBUS_TEST_SLOW_S", "1.5")))
        except asyncio.CancelledError:
            if end:
                open(end + ".cancelled", "w").close()
            raise
        if end:
            open(end + ".completed", "w").close()
        return N(n=inputs.n + 10)


class Huge(Agent):
    agent_id = "huge"
    description = "answers with two megabytes"
    capabilities = [Capability("huge", N, Big, "too much output")]

    async def handle(self, task, inputs, ctx):
        return Big(blob="x" * (2 * 1024 * 1024))
"""


def write_agents(directory: Path) -> None:
    (directory / "nats_agents.py").write_text(AGENTS)


def chain(plan_id: str, slow_timeout: float = 20.0) -> Plan:
    """``chain_plan`` as a Plan."""
    return decode_plan(json.dumps(chain_plan(plan_id, slow_timeout)).encode())


def chain_plan(plan_id: str, slow_timeout: float = 20.0) -> dict[str, Any]:
    """a (quick) -> b (slow) -> c (quick): 1 -> 2 -> 12 -> 13."""
    return {
        "plan_id": plan_id,
        "goal": "survive a fault",
        "tasks": [
            {"id": "a", "capability": "quick", "inputs": {"n": 1}},
            {
                "id": "b",
                "capability": "slow",
                "deps": ["a"],
                "timeout_s": slow_timeout,
                "max_attempts": 5,
                "inputs": {"n": {"$dep": "a", "path": "n"}},
            },
            {
                "id": "c",
                "capability": "quick",
                "deps": ["b"],
                "inputs": {"n": {"$dep": "b", "path": "n"}},
            },
        ],
    }


class Proc:
    """A ``python -m cardbus.tools ...`` subprocess with its output in a file."""

    def __init__(self, args: Sequence[str], cwd: Path, env: dict[str, str], name: str) -> None:
        self.log = cwd / f"{name}.log"
        self._out = open(self.log, "wb")  # noqa: SIM115 - closed in wait/kill
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "cardbus.tools", *args],
            cwd=cwd,
            env=env,
            stdout=self._out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
        )

    @property
    def pid(self) -> int:
        return self.proc.pid

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def wait_for(self, text: str, timeout: float = 20.0) -> None:
        deadline = time.monotonic() + timeout
        while text not in self.output():
            if self.proc.poll() is not None:
                raise AssertionError(f"process exited ({self.proc.returncode}):\n{self.output()}")
            if time.monotonic() > deadline:
                raise AssertionError(f"no {text!r} after {timeout}s:\n{self.output()}")
            time.sleep(0.02)

    def kill(self) -> None:
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGKILL)
        self.proc.wait(10)
        self._out.close()

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._out.close()

    def wait(self, timeout: float) -> int:
        code = self.proc.wait(timeout)
        self._out.close()
        return code


def env_for(directory: Path, **extra: str) -> dict[str, str]:
    return {
        **os.environ,
        "PYTHONPATH": str(directory),  # the agents module a test writes; cardbus is installed
        "PYTHONUNBUFFERED": "1",
        **extra,
    }


def agent_proc(
    directory: Path, url: str, agents: Sequence[str], name: str, *args: str, **env: str
) -> Proc:
    paths = [f"nats_agents:{a}" for a in agents]
    return Proc(
        ["agent", "serve", *paths, "--nats", url, "--ack-wait", "1", *args],
        directory,
        env_for(directory, **env),
        name,
    )


async def until(cond: Callable[[], Any], timeout: float = 20.0, what: str = "") -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = cond()
        if asyncio.iscoroutine(value):
            value = await value
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what or cond}")
        await asyncio.sleep(0.02)


async def read_log(url: str, **options: Any) -> list[Envelope]:
    store = await NatsEventStore.connect(url, create_stream=False, **options)
    try:
        out: list[Envelope] = []
        while True:
            page = await store.read_all(out[-1].position + 1 if out else 0, 5000)
            out += page
            if len(page) < 5000:
                return out
    finally:
        await store.close()


async def verify(url: str, **options: Any) -> list[Any]:
    """Every problem of the whole log: chains, and (``audit``) gap-free positions, subjects."""
    store = await NatsEventStore.connect(url, create_stream=False, **options)
    try:
        return [*await store.verify(), *(await store.audit())[0]]
    finally:
        await store.close()


def check_log(events: Sequence[Envelope]) -> None:
    """Every stream's versions are 1..n, no duplicate event id, positions increase."""
    versions: dict[str, list[int]] = {}
    for e in events:
        versions.setdefault(e.stream, []).append(e.version)
    for stream, vs in versions.items():
        assert vs == list(range(1, len(vs) + 1)), (stream, vs)
    ids = Counter(e.event_id for e in events)
    assert not [i for i, n in ids.items() if n > 1]
    positions = [e.position for e in events]
    assert positions == sorted(positions) and len(set(positions)) == len(positions)


def per_task(events: Sequence[Envelope], root: str) -> dict[str, list[ev.Event]]:
    """Events of run ``root`` by plan task id (the stream name before the first '-')."""
    out: dict[str, list[ev.Event]] = {}
    for e in events:
        if e.correlation_id == root and e.stream != root and not e.stream.startswith("plan-"):
            out.setdefault(e.stream.split("-")[0], []).append(e.data)
    return out


def count(events: list[ev.Event], kind: type) -> int:
    return sum(isinstance(d, kind) for d in events)


def result_json(proc: Proc) -> dict[str, Any]:
    for line in reversed(proc.output().splitlines()):
        if line.startswith("{"):
            data: dict[str, Any] = json.loads(line)
            return data
    raise AssertionError(f"no JSON result in:\n{proc.output()}")
