"""Helpers for the orchestrator tests: a runtime harness, helper agents, log queries.

Imported by ``conftest.py`` (fixtures) and by the test modules (this folder is
on ``sys.path`` under pytest's default import mode). Every behaviour is
driven through the public API (``Orchestrator``, ``InProcessBus``,
``AgentWorker``, ``Agent``) and checked on the events in the log.
"""

from __future__ import annotations

import asyncio
import inspect
import math
import time
from collections.abc import Callable, Sequence
from typing import Any

import msgspec

from cardbus.agents.agent import Agent, Capability, TaskContext
from cardbus.agents.cards import AgentConstraints, TaskCard
from cardbus.agents.llm import LLM
from cardbus.bus import InProcessBus, Orchestrator, Plan, PlanTask, Policy, RunResult
from cardbus.bus.orchestrator import RetryPolicy
from cardbus.bus.runtime.worker import AgentWorker
from cardbus.eventstore import Envelope, EventStore
from cardbus.eventstore import events as ev

FAST = Policy(retry=RetryPolicy(initial_interval_s=0.01), tick_s=0.01)

#: every TaskCard each helper agent received, by agent id (cleared per test)
CARDS: dict[str, list[TaskCard]] = {}


class TextIn(msgspec.Struct, frozen=True):
    text: str


class TextOut(msgspec.Struct, frozen=True):
    text: str


Handler = Callable[[TaskCard, Any, TaskContext], Any]


def make_agent(
    agent_id: str,
    capability: str = "echo",
    handler: Handler | None = None,
    *,
    input_type: type = TextIn,
    output_type: type = TextOut,
    description: str = "",
    cap_description: str = "",
    constraints: AgentConstraints | None = None,
) -> type[Agent]:
    """An Agent subclass, written as a user would; it records every card it gets."""

    async def handle(self: Agent, task: TaskCard, inputs: Any, ctx: TaskContext) -> Any:
        CARDS.setdefault(agent_id, []).append(task)
        if handler is None:
            return TextOut(text=inputs.text)
        out = handler(task, inputs, ctx)
        if inspect.isawaitable(out):
            out = await out
        return out

    attrs = {
        "agent_id": agent_id,
        "description": description or f"{agent_id} agent",
        "capabilities": [Capability(capability, input_type, output_type, cap_description)],
        "constraints": constraints or AgentConstraints(),
        "handle": handle,
    }
    return type(f"Agent_{agent_id}", (Agent,), attrs)


class TableEmbedder:
    """A test Embedder: similarity to the goal is set per agent by a marker word.

    The first text is the goal ([1, 0]); a capability text containing a key of
    ``sims`` gets a vector whose cosine with the goal is that value.
    """

    def __init__(self, sims: dict[str, float]) -> None:
        self.sims = sims

    def embed(self, texts: Sequence[str]) -> list[list[float]]:
        out = [[1.0, 0.0]]
        for text in texts[1:]:
            s = next((v for k, v in self.sims.items() if k in text), 0.0)
            out.append([s, math.sqrt(max(0.0, 1 - s * s))])
        return out


class Runtime:
    """Orchestrator + in-process bus + one AgentWorker per agent class, on ``store``."""

    def __init__(
        self,
        store: EventStore,
        agents: Sequence[type[Agent]],
        policy: Policy = FAST,
        embedder: Any = None,
        rng: Any = None,
        concurrency: int = 1,
        llm: LLM | None = None,
        started_after_s: float = 0.01,
    ) -> None:
        self.store = store
        self.bus = InProcessBus()
        self.orch = Orchestrator(store, self.bus, policy, embedder, rng)
        self.workers = [AgentWorker(self.bus, a, llm, concurrency, started_after_s) for a in agents]
        self.stopped = False

    async def start(self) -> Runtime:
        await self.orch.start()
        for w in self.workers:
            await self.orch.register(w.agent.card())
            await w.start()
        return self

    async def stop(self) -> None:
        if self.stopped:
            return
        self.stopped = True
        await self.orch.stop()
        await self.bus.close()

    async def run(self, plan: Plan, timeout: float = 10) -> RunResult:
        return await self.orch.run(plan, timeout)


def task(id: str, capability: str = "echo", text: str | None = None, **kw: Any) -> PlanTask:
    """A plan task; ``text`` becomes ``inputs={"text": text}`` (default: the id)."""
    kw.setdefault("timeout_s", 5.0)
    if "inputs" not in kw:
        kw["inputs"] = {"text": id if text is None else text}
    return PlanTask(id=id, capability=capability, **kw)


def plan(*tasks: PlanTask, **kw: Any) -> Plan:
    kw.setdefault("goal", "test goal")
    return Plan(tasks=list(tasks), **kw)


def tid(root_id: str, name: str) -> str:
    """The task id the orchestrator gives plan task ``name`` in run ``root_id``."""
    return f"{name}-{root_id[-12:]}"


class Log:
    """The events of one run, with small queries."""

    def __init__(self, envs: list[Envelope]) -> None:
        self.envs = envs

    def e(self, cls: type | tuple[type, ...] = object, stream: str | None = None) -> list[Envelope]:
        return [
            x
            for x in self.envs
            if isinstance(x.data, cls) and (stream is None or x.stream == stream)
        ]

    def of(self, cls: type | tuple[type, ...], stream: str | None = None) -> list[Any]:
        return [x.data for x in self.e(cls, stream)]

    def tags(self, stream: str) -> list[str]:
        return [x.type.removeprefix("task.").removesuffix(".v1") for x in self.e(stream=stream)]

    def first(self, cls: type, stream: str | None = None) -> Envelope:
        found = self.e(cls, stream)
        assert found, f"no {cls.__name__} in {stream or 'the run'}: {self.summary()}"
        return found[0]

    def summary(self) -> str:
        return "; ".join(f"{x.stream[:16]}:{x.type}" for x in self.envs)


async def run_log(store: EventStore, root_id: str) -> Log:
    return Log(await store.read_correlation(root_id))


async def wait_for(
    store: EventStore, pred: Callable[[Envelope], bool], timeout: float = 5.0
) -> Envelope:
    """Poll the log until an event matches ``pred``."""
    deadline = time.monotonic() + timeout
    while True:
        for env in await store.read_all(0, 100_000):
            if pred(env):
                return env
        if time.monotonic() > deadline:
            raise AssertionError("no matching event in the log in time")
        await asyncio.sleep(0.01)


def is_(cls: type, stream: str | None = None) -> Callable[[Envelope], bool]:
    return lambda env: isinstance(env.data, cls) and (stream is None or env.stream == stream)


__all__ = [
    "CARDS",
    "FAST",
    "Log",
    "Runtime",
    "TableEmbedder",
    "TextIn",
    "TextOut",
    "ev",
    "is_",
    "make_agent",
    "plan",
    "run_log",
    "task",
    "tid",
    "wait_for",
]
