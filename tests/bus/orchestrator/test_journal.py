"""The journal: model and tool calls recorded in the task's stream, replayed on a retry.

Real parts: an ``EmbeddedRuntime`` on a SQLite file, the OpenAI-compatible stub
on loopback answering ``OpenAIChatLLM``, a real ``ToolRegistry``.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any, ClassVar

import msgspec
import pytest

from cardbus.agents import Agent, Capability, TaskCard, TaskContext
from cardbus.agents.cards import AgentConstraints
from cardbus.agents.llm import OpenAIChatLLM
from cardbus.agents.tools import Tool, ToolRegistry, current_idempotency_key
from cardbus.bus.orchestrator import Policy, RetryPolicy
from cardbus.bus.orchestrator.access import AccessPolicy
from cardbus.bus.runtime.embedded import EmbeddedRuntime
from cardbus.eventstore import events as ev
from cardbus.eventstore.errors import LLMBadOutput
from cardbus.eventstore.sqlite import SqliteEventStore
from tests.agents.openai_stub import OpenAIStub, Reply


class Q(msgspec.Struct):
    q: str


class A(msgspec.Struct):
    answer: str


FAILS_LEFT: dict[str, int] = {}
EFFECTS: list[tuple[str, str]] = []


class Asker(Agent):
    """Three model calls and one tool call; fails after the second model call while
    FAILS_LEFT says so."""

    agent_id = "asker"
    capabilities: ClassVar = [Capability("ask", Q, A)]
    constraints = AgentConstraints(tools=["charge"])

    async def handle(self, task: TaskCard, inputs: Q, ctx: TaskContext) -> A:
        first = await ctx.llm.chat([{"role": "user", "content": f"one: {inputs.q}"}])
        second = await ctx.llm.chat([{"role": "user", "content": f"two: {first.text}"}])
        if FAILS_LEFT.get(inputs.q, 0) > 0:
            FAILS_LEFT[inputs.q] -= 1
            raise RuntimeError("failed after two model calls")
        paid = await ctx.tool("charge", amount=5)
        third = await ctx.llm.chat([{"role": "user", "content": f"three: {paid}"}])
        return A(answer=f"{second.text}|{third.text}")


def _charge(args: dict[str, Any]) -> dict[str, Any]:
    EFFECTS.append(("charge", current_idempotency_key()))
    return {"charged": args["amount"]}


def _tools() -> ToolRegistry:
    return ToolRegistry([Tool.define("charge", _charge)])


def _policy() -> Policy:
    return Policy(retry=RetryPolicy(max_attempts=3, initial_interval_s=0.01, jitter=0.0))


def _plan(plan_id: str, q: str = "tides") -> dict[str, Any]:
    return {
        "plan_id": plan_id,
        "goal": "ask",
        "tasks": [{"id": "t", "capability": "ask", "inputs": {"q": q}}],
    }


async def _events(store: SqliteEventStore, root: str) -> list[Any]:
    return [e.data for e in await store.read_correlation(root)]


async def test_a_retry_sends_only_the_calls_after_the_failure_and_marks_the_rest_replayed(
    tmp_path: Path,
) -> None:
    EFFECTS.clear()
    with OpenAIStub() as stub:
        stub.script(*[Reply(content=f"answer {i}") for i in range(1, 5)])
        llm = OpenAIChatLLM(stub.url, "stub-model")
        async with (
            await SqliteEventStore.open(tmp_path / "log.db", poll_interval=0.01) as store,
            EmbeddedRuntime(store, [Asker], _policy(), llm=llm, tools=_tools()) as rt,
        ):
            FAILS_LEFT["tides"] = 1
            result = await rt.run(_plan("journal-retry"))
            events = await _events(store, result.root_id)
        sent = [b["messages"][0]["content"] for b in stub.bodies()]
    assert result.status == "completed", result
    # attempt 1: two calls; attempt 2: replays both, then the tool and the third call live
    assert sent == ["one: tides", "two: answer 1", "three: {'charged': 5}"]
    answered = [e for e in events if isinstance(e, ev.ModelAnswered)]
    assert [(e.attempt, e.seq, e.replayed_from is not None) for e in answered] == [
        (1, 0, False),
        (1, 1, False),
        (2, 0, True),
        (2, 1, True),
        (2, 3, False),
    ]
    originals = {e.seq: e for e in answered if e.attempt == 1}
    replayed = [e for e in answered if e.replayed_from]
    assert all(e.input_tokens == 0 and e.output_tokens == 0 for e in replayed)
    requested = [e for e in events if isinstance(e, ev.ModelRequested)]
    assert [(e.attempt, e.seq) for e in requested] == [(1, 0), (1, 1), (2, 3)]
    assert requested[0].request["messages"][0]["content"] == "one: tides"
    assert originals[0].answer["text"] == "answer 1"
    assert len(EFFECTS) == 1


async def test_the_answer_is_in_the_log_before_anything_that_depends_on_it_leaves(
    tmp_path: Path,
) -> None:
    """The handler gets a model's answer at once, its record on the way to the log
    (issue 34.3); the next request (a tool call: its effect), the next model call and the
    result wait until it is durable: in the log, the answer comes before each of them,
    and the tool, run by the orchestrator, finds it there."""
    store_: list[SqliteEventStore] = []
    found: list[int] = []

    async def peek(args: dict[str, Any]) -> dict[str, Any]:
        stream = await store_[0].read_stream(args["task"])
        found.append(
            sum(1 for e in stream if isinstance(e.data, ev.ModelAnswered) and not e.data.error)
        )
        return {"peeked": True}

    class Peeker(Agent):
        agent_id = "peeker"
        capabilities: ClassVar = [Capability("ask", Q, A)]
        constraints = AgentConstraints(tools=["peek"])

        async def handle(self, task: TaskCard, inputs: Q, ctx: TaskContext) -> A:
            first = await ctx.llm.chat([{"role": "user", "content": inputs.q}])
            await ctx.tool("peek", task=task.task_id)
            second = await ctx.llm.chat([{"role": "user", "content": first.text}])
            return A(answer=second.text)

    tools = ToolRegistry([Tool.define("peek", peek)])
    async with (
        await SqliteEventStore.open(tmp_path / "log.db", poll_interval=0.01) as store,
        EmbeddedRuntime(store, [Peeker], _policy(), tools=tools) as rt,
    ):
        store_.append(store)
        result = await rt.run(_plan("journal-durable"))
        envs = await store.read_correlation(result.root_id)
    assert result.status == "completed", result
    assert found == [1]
    order = [
        (type(e.data).__name__, getattr(e.data, "seq", None))
        for e in envs
        if isinstance(
            e.data, (ev.ModelRequested, ev.ModelAnswered, ev.ToolRequested, ev.TaskCompleted)
        )
    ]
    assert order == [
        ("ModelRequested", 0),
        ("ModelAnswered", 0),
        ("ToolRequested", 1),
        ("ModelRequested", 2),
        ("ModelAnswered", 2),
        ("TaskCompleted", None),
    ], order


async def test_digest_only_content_keeps_no_prompt_and_redaction_runs_first(
    tmp_path: Path,
) -> None:
    for access, expect in (
        (AccessPolicy(model_content="digest"), None),
        (
            AccessPolicy(redact=lambda kind, v: {"redacted": kind}),
            {"redacted": "model.request"},
        ),
    ):
        async with (
            await SqliteEventStore.open(
                tmp_path / f"log-{expect is None}.db", poll_interval=0.01
            ) as store,
            EmbeddedRuntime(store, [Asker], _policy(), tools=_tools(), access=access) as rt,
        ):
            result = await rt.run(_plan("journal-private"))
            events = await _events(store, result.root_id)
        assert result.status == "completed"
        requested = [e for e in events if isinstance(e, ev.ModelRequested)]
        assert requested and all(e.request == expect for e in requested)
        assert all(e.request_digest and e.request_bytes > 0 for e in requested)


class Payer(Agent):
    agent_id = "payer"
    capabilities: ClassVar = [Capability("ask", Q, A)]
    constraints = AgentConstraints(tools=["charge", "lookup"])

    async def handle(self, task: TaskCard, inputs: Q, ctx: TaskContext) -> A:
        await ctx.tool("lookup", q=inputs.q)
        paid = await ctx.tool("charge", amount=7)
        return A(answer=str(paid))


@pytest.mark.parametrize("idempotent", [True, False])
async def test_an_unknown_effect_is_repeated_only_for_an_idempotent_tool(
    tmp_path: Path, idempotent: bool
) -> None:
    """The process dies during a tool call (``tool.requested``, no ``tool.called``); the
    restarted one repeats an idempotent tool with the same key, and otherwise asks."""
    EFFECTS.clear()
    hang = asyncio.Event()

    async def charge_and_die(args: dict[str, Any]) -> dict[str, Any]:
        EFFECTS.append(("charge", current_idempotency_key()))
        await hang.wait()  # never set: the process "dies" here
        return {}

    lookups: list[str] = []

    def lookup(args: dict[str, Any]) -> dict[str, Any]:
        lookups.append(args["q"])
        return {"found": args["q"]}

    def tools(charge: Any) -> ToolRegistry:
        return ToolRegistry(
            [
                Tool.define("charge", charge, idempotent=idempotent, timeout_s=600),
                Tool.define("lookup", lookup, idempotent=True),
            ]
        )

    path = tmp_path / "log.db"
    async with (
        await SqliteEventStore.open(path, poll_interval=0.01) as store,
        EmbeddedRuntime(store, [Payer], _policy(), tools=tools(charge_and_die)) as rt,
    ):
        root = await rt.orchestrator.submit(_plan(f"journal-unknown-{idempotent}"))
        await _until(
            store,
            root,
            lambda es: any(isinstance(e, ev.ToolRequested) and e.tool == "charge" for e in es),
        )
    assert len(EFFECTS) == 1
    async with (
        await SqliteEventStore.open(path, poll_interval=0.01) as store,
        EmbeddedRuntime(store, [Payer], _policy(), tools=tools(_charge)) as rt,
    ):
        if idempotent:
            done = await rt.orchestrator.wait(root, timeout=60)
        else:
            events = await _until(
                store, root, lambda es: any(isinstance(e, ev.ApprovalRequested) for e in es)
            )
            asked = [e for e in events if isinstance(e, ev.ApprovalRequested)]
            assert asked[-1].reason == "tool_effect_unknown" and "charge" in asked[-1].detail
            assert len(EFFECTS) == 1  # not repeated before an operator says so
            task_id = next(e.task_id for e in events if isinstance(e, ev.ToolRequested))
            await rt.orchestrator.approve(task_id, by="operator")
            done = await rt.orchestrator.wait(root, timeout=60)
        events = await _events(store, root)
    assert done.status == "completed", done
    unknown = [e for e in events if isinstance(e, ev.ToolEffectUnknown)]
    assert [e.decision for e in unknown] == (["repeat"] if idempotent else ["ask", "repeat"])
    keys = [k for name, k in EFFECTS if name == "charge"]
    assert len(keys) == 2 and keys[0] == keys[1] == unknown[0].idempotency_key
    assert lookups == ["tides"]  # answered from the journal on every later attempt
    replayed = [e for e in events if isinstance(e, ev.ToolCalled) and e.tool == "lookup"]
    assert replayed[0].replayed_from is None and all(e.replayed_from for e in replayed[1:])
    assert len(replayed) >= 2


async def _until(store: SqliteEventStore, root: str, done: Any, timeout: float = 60.0) -> list[Any]:
    """The run's events once ``done(events)`` holds (polled: the log is the witness)."""
    deadline = asyncio.get_running_loop().time() + timeout
    while True:
        events = await _events(store, root)
        if done(events):
            return events
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"not reached in {timeout}s: {[type(e).__name__ for e in events]}")
        await asyncio.sleep(0.02)


def _charging(event: Any) -> bool:
    return isinstance(event, ev.ToolRequested) and event.tool == "charge"


LOCAL_RUNS: list[str] = []


class LocalToolUser(Agent):
    """Runs a tool of its own (as a framework's function tool) through the journal."""

    agent_id = "local"
    capabilities: ClassVar = [Capability("ask", Q, A)]

    async def handle(self, task: TaskCard, inputs: Q, ctx: TaskContext) -> A:
        async def run(key: str) -> dict[str, Any]:
            LOCAL_RUNS.append(key)
            return {"looked_up": inputs.q}

        found = await ctx.journal.tool_call("lookup", {"q": inputs.q}, run)
        if FAILS_LEFT.get(inputs.q, 0) > 0:
            FAILS_LEFT[inputs.q] -= 1
            raise RuntimeError("failed after its own tool")
        return A(answer=str(found))


async def test_an_agents_own_tool_is_journaled_and_replayed(tmp_path: Path) -> None:
    LOCAL_RUNS.clear()
    FAILS_LEFT["own tool"] = 1
    async with (
        await SqliteEventStore.open(tmp_path / "log.db", poll_interval=0.01) as store,
        EmbeddedRuntime(store, [LocalToolUser], _policy()) as rt,
    ):
        result = await rt.run(_plan("journal-local", "own tool"))
        events = await _events(store, result.root_id)
    assert result.status == "completed", result
    assert result.outputs["t"] == {"answer": "{'looked_up': 'own tool'}"}
    assert len(LOCAL_RUNS) == 1 and LOCAL_RUNS[0]  # ran once, with its key
    requested = [e for e in events if isinstance(e, ev.ToolRequested)]
    called = [e for e in events if isinstance(e, ev.ToolCalled)]
    assert [e.local for e in requested] == [True]
    assert requested[0].idempotency_key == "" and called[0].idempotency_key == LOCAL_RUNS[0]
    assert [e.replayed_from is None for e in called] == [True, False]
    assert called[0].result == {"looked_up": "own tool"}


class Judged(Agent):
    """Two model calls; the second answer must say "good" (else the model's answer
    failed the attempt: llm_bad_output)."""

    agent_id = "judged"
    capabilities: ClassVar = [Capability("ask", Q, A)]

    async def handle(self, task: TaskCard, inputs: Q, ctx: TaskContext) -> A:
        first = await ctx.llm.chat([{"role": "user", "content": f"first: {inputs.q}"}])
        second = await ctx.llm.chat([{"role": "user", "content": f"second: {first.text}"}])
        if second.text != "good":
            raise LLMBadOutput(f"not good: {second.text}")
        return A(answer=second.text)


async def test_a_retry_after_a_bad_answer_asks_the_model_again_from_that_call(
    tmp_path: Path,
) -> None:
    with OpenAIStub() as stub:
        stub.script("first answer", "bad", "good")
        llm = OpenAIChatLLM(stub.url, "stub-model")
        policy = Policy(
            retry=RetryPolicy(
                max_attempts=2, initial_interval_s=0.01, jitter=0.0, non_retryable_reasons=[]
            )
        )
        async with (
            await SqliteEventStore.open(tmp_path / "log.db", poll_interval=0.01) as store,
            EmbeddedRuntime(store, [Judged], policy, llm=llm) as rt,
        ):
            result = await rt.run(_plan("journal-bad-answer", "tides"))
            events = await _events(store, result.root_id)
        sent = [b["messages"][0]["content"] for b in stub.bodies()]
    assert result.status == "completed", result
    # the first call is replayed; the one whose answer failed the attempt is asked again
    assert sent == ["first: tides", "second: first answer", "second: first answer"]
    answered = [
        (e.attempt, e.seq, e.replayed_from is not None)
        for e in events
        if isinstance(e, ev.ModelAnswered)
    ]
    assert answered == [(1, 0, False), (1, 1, False), (2, 0, True), (2, 1, False)]
