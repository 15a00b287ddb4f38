"""An LLM agent's typed failures reach the retry policy; the model is recorded per attempt."""

from __future__ import annotations

import msgspec

from cardbus.agents import LLMAgent
from cardbus.agents.agent import Agent, Capability, TaskContext
from cardbus.agents.cards import TaskCard
from cardbus.agents.llm import MockLLM
from cardbus.bus.orchestrator import Policy, RetryPolicy
from cardbus.bus.runtime.embedded import EmbeddedRuntime
from cardbus.eventstore import MemoryEventStore
from cardbus.eventstore import events as ev
from cardbus.eventstore.errors import LLMTimeout


class Topic(msgspec.Struct):
    topic: str


class Facts(msgspec.Struct):
    facts: list[str]


class Flaky(Agent):
    """Times out on its model once, then answers."""

    agent_id = "flaky"
    capabilities = [Capability("research", Topic, Facts)]

    async def handle(self, task: TaskCard, inputs: Topic, ctx: TaskContext) -> Facts:
        if task.attempt == 1:
            raise LLMTimeout("no answer within 1s")
        await ctx.llm.complete(f"facts about {inputs.topic}")
        return Facts(facts=["a"])


class Garbler(LLMAgent):
    """Its model never answers JSON: llm_bad_output after the repairs."""

    agent_id = "garbler"
    capability = "research"
    input_type = Topic
    output_type = Facts
    max_repairs = 1


def _plan() -> dict[str, object]:
    return {"goal": "g", "tasks": [{"id": "r", "capability": "research", "inputs": {"topic": "t"}}]}


async def _events(store: MemoryEventStore, task_id: str) -> list[object]:
    return [e.data for e in await store.read_stream(task_id)]


async def test_a_typed_llm_failure_is_retried_under_its_own_reason() -> None:
    store = MemoryEventStore()
    policy = Policy(retry=RetryPolicy(initial_interval_s=0.0, jitter=0.0))
    async with EmbeddedRuntime(store, [Flaky], policy=policy, llm=MockLLM(model="m-7")) as rt:
        result = await rt.run(_plan(), timeout=30)
    assert result.status == "completed", result
    task_id = rt.orchestrator.state.runs[result.root_id].names["r"]
    data = await _events(store, task_id)
    (retry,) = [d for d in data if isinstance(d, ev.TaskRetryScheduled)]
    assert retry.reason.startswith("llm_timeout: ")  # not agent_error
    submitted = [d for d in data if isinstance(d, ev.TaskResultSubmitted)]
    assert [s.usage.model for s in submitted] == ["", "m-7"]  # the model, per attempt
    assert submitted[1].usage.input_tokens > 0


async def test_bad_output_fails_the_task_at_once_by_default() -> None:
    store = MemoryEventStore()
    mock = MockLLM(respond=lambda prompt: "I cannot answer in JSON, sorry.")
    async with EmbeddedRuntime(store, [Garbler], llm=mock) as rt:
        result = await rt.run(_plan(), timeout=30)
    assert result.status == "failed"
    task_id = rt.orchestrator.state.runs[result.root_id].names["r"]
    data = await _events(store, task_id)
    (failed,) = [d for d in data if isinstance(d, ev.TaskFailed)]
    assert failed.reason == "llm_bad_output" and failed.attempts == 1
    assert not [d for d in data if isinstance(d, ev.TaskRetryScheduled)]
    assert len(mock.calls) == 2  # the ask and its one repair: no second attempt
