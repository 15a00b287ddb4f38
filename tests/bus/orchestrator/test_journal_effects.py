"""An effect the journal recorded is never repeated silently (invariant 8, issue 30 item 3).

* Parallel tool calls of one model turn keep their own keys across attempts: one cut
  mid-effect and approved runs again with its original key; its sibling that completed
  is replayed, not run again.
* After a first difference (the agent's instructions changed between a kill and the
  resume), a tool call matching a recorded one (name and arguments) reuses its key: an
  idempotent tool deduplicates, a non-idempotent one asks.
* An operator records an unknown effect as done, with its result: the run goes on with
  that result as the tool's answer.

Real parts: an ``EmbeddedRuntime`` on a SQLite file (a "crash" is leaving the runtime
while a tool hangs mid-effect, then opening the file again), the OpenAI-compatible stub
on loopback answering ``OpenAIChatLLM``, a real ``ToolRegistry``. The log is the witness.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import msgspec
import pytest

from cardbus.agents.llm import OpenAIChatLLM
from cardbus.agents.llm_agent import LLMAgent
from cardbus.agents.tools import Tool, ToolRegistry, current_idempotency_key
from cardbus.bus.orchestrator import Policy, RetryPolicy, record_effect_done
from cardbus.bus.runtime.embedded import EmbeddedRuntime
from cardbus.eventstore import events as ev
from cardbus.eventstore.sqlite import SqliteEventStore
from tests.agents.openai_stub import OpenAIStub, Reply


class Question(msgspec.Struct, frozen=True):
    question: str


class Answer(msgspec.Struct, frozen=True):
    answer: str


class Biller(LLMAgent):
    agent_id = "biller"
    description = "Looks a customer up and charges them."
    capability = "bill"
    input_type = Question
    output_type = Answer
    instructions = "Look the customer up and charge them."
    tools = ["lookup", "charge"]


FINAL = json.dumps({"answer": "billed"})


class Effects:
    """What the tools did: each application with the key it was given."""

    def __init__(self) -> None:
        self.applied: list[tuple[str, str]] = []
        self.hang = asyncio.Event()  # never set: a tool waiting on it "dies" mid-effect

    def keys(self, tool: str) -> list[str]:
        return [k for name, k in self.applied if name == tool]

    def registry(
        self, *, dying: bool, charge_idempotent: bool = False, lookup_dies: bool = False
    ) -> ToolRegistry:
        async def lookup(args: dict[str, Any]) -> dict[str, Any]:
            self.applied.append(("lookup", current_idempotency_key()))
            if dying and lookup_dies:
                await self.hang.wait()
            return {"customer": args["who"], "plan": "gold"}

        async def charge(args: dict[str, Any]) -> dict[str, Any]:
            self.applied.append(("charge", current_idempotency_key()))
            if dying:
                await self.hang.wait()
            return {"charged": args["amount"]}

        return ToolRegistry(
            [
                Tool.define("lookup", lookup, idempotent=True),
                Tool.define("charge", charge, idempotent=charge_idempotent, timeout_s=600),
            ]
        )


def _policy() -> Policy:
    return Policy(retry=RetryPolicy(max_attempts=3, initial_interval_s=0.01, jitter=0.0))


def _plan(plan_id: str) -> dict[str, Any]:
    return {
        "plan_id": plan_id,
        "goal": "bill ada",
        "tasks": [{"id": "b", "capability": "bill", "inputs": {"question": "bill ada"}}],
    }


async def _events(store: SqliteEventStore, root: str) -> list[Any]:
    return [e.data for e in await store.read_correlation(root)]


async def _until(store: SqliteEventStore, root: str, done: Any, timeout: float = 60.0) -> list[Any]:
    deadline = asyncio.get_running_loop().time() + timeout
    while True:
        events = await _events(store, root)
        if done(events):
            return events
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"not reached in {timeout}s: {[type(e).__name__ for e in events]}")
        await asyncio.sleep(0.02)


def _asked(events: list[Any]) -> bool:
    return any(isinstance(e, ev.ApprovalRequested) for e in events)


def _settled(lookups: int) -> Any:
    """The task asks about ``charge``, and its attempt's ``lookup`` (sent with it, in the
    same turn) has its result in the log, ``lookups`` in all: nothing more comes from the
    asking attempt, so an operator's answer does not race its last writes."""

    def settled(events: list[Any]) -> bool:
        return _asked(events) and len(_called(events, "lookup")) >= lookups

    return settled


def _requested(events: list[Any], tool: str) -> list[Any]:
    return [e for e in events if isinstance(e, ev.ToolRequested) and e.tool == tool]


def _called(events: list[Any], tool: str) -> list[Any]:
    return [e for e in events if isinstance(e, ev.ToolCalled) and e.tool == tool]


CALLS = {"lookup": ("lookup", {"who": "ada"}), "charge": ("charge", {"amount": 7})}


@pytest.mark.parametrize("first", ["lookup", "charge"])
@pytest.mark.parametrize("sibling", ["completed", "cut"])
async def test_parallel_calls_keep_their_keys_and_the_approved_one_runs_with_its_own(
    tmp_path: Path, first: str, sibling: str
) -> None:
    """One turn asks for ``lookup`` (idempotent) and ``charge`` (not) in parallel; the
    process dies during ``charge`` (``lookup`` done, or cut too). The resumed run asks
    the operator about ``charge`` only; approved, it runs with its first key, and
    ``lookup`` is replayed, never run again (cut, it was repeated once with its key)."""
    effects = Effects()
    path = tmp_path / "log.db"
    order = [CALLS[first], *(c for name, c in CALLS.items() if name != first)]
    cut = sibling == "cut"

    def mid_charge(events: list[Any]) -> bool:
        if cut:
            return len(_requested(events, "lookup")) == len(_requested(events, "charge")) == 1
        return bool(_requested(events, "charge")) and bool(_called(events, "lookup"))

    with OpenAIStub() as stub:
        stub.script(Reply(tool_calls=order), FINAL)
        llm = OpenAIChatLLM(stub.url, "stub-model", max_retries=0)
        dying = effects.registry(dying=True, lookup_dies=cut)
        async with (
            await SqliteEventStore.open(path, poll_interval=0.01) as store,
            EmbeddedRuntime(store, [Biller], _policy(), llm=llm, tools=dying) as rt,
        ):
            root = await rt.orchestrator.submit(_plan(f"parallel-{first}-{sibling}"))
            await _until(store, root, mid_charge)
        assert len(effects.keys("lookup")) == len(effects.keys("charge")) == 1
        async with (
            await SqliteEventStore.open(path, poll_interval=0.01) as store,
            EmbeddedRuntime(
                store, [Biller], _policy(), llm=llm, tools=effects.registry(dying=False)
            ) as rt,
        ):
            events = await _until(store, root, _settled(1 if cut else 2))
            assert len(effects.keys("charge")) == 1  # not repeated before the operator
            task_id = _requested(events, "charge")[0].task_id
            await rt.orchestrator.approve(task_id, by="operator")
            done = await rt.orchestrator.wait(root, timeout=60)
            events = await _events(store, root)
        sent = len(stub.bodies())
    assert done.status == "completed", done
    assert done.outputs["b"] == {"answer": "billed"}
    keys = {t: _requested(events, t)[0].idempotency_key or "" for t in CALLS}
    # the approved call ran again with its first key (its first tool.requested's id)
    charges = effects.keys("charge")
    assert len(charges) == 2 and charges[0] == charges[1]
    unknown = [e for e in events if isinstance(e, ev.ToolEffectUnknown)]
    assert [e.decision for e in unknown if e.tool == "charge"] == ["ask", "repeat"]
    assert {e.idempotency_key for e in unknown if e.tool == "charge"} == {charges[0]}
    assert all(e.idempotency_key == charges[0] for e in _requested(events, "charge")[1:])
    assert keys["charge"] == ""  # a first call's key is its event id, handed to the tool
    # the sibling ran once (cut: repeated once, with its key), then was replayed
    lookups = effects.keys("lookup")
    assert len(lookups) == (2 if cut else 1) and len(set(lookups)) == 1
    live = [e for e in _called(events, "lookup") if e.replayed_from is None]
    replayed = [e for e in _called(events, "lookup") if e.replayed_from is not None]
    assert len(live) == 1 and replayed and all(e.attempt > live[0].attempt for e in replayed)
    # the model was asked twice in all: the tool-calling turn once, the final answer once
    assert sent == 2


class NewBiller(Biller):
    """The same agent, its instructions changed between the kill and the resume."""

    instructions = "Bill the customer: look them up first, then charge them."


def _asking_final(events: list[Any]) -> bool:
    """Both tools answered, and the final model call (seq 3) has gone out."""
    asked = any(isinstance(e, ev.ModelRequested) and e.seq == 3 for e in events)
    return asked and bool(_called(events, "charge")) and bool(_called(events, "lookup"))


@pytest.mark.parametrize(
    ("idempotent", "answer"), [(True, ""), (False, "done"), (False, "approve")]
)
async def test_after_a_first_difference_a_recorded_call_keeps_its_key(
    tmp_path: Path, idempotent: bool, answer: str
) -> None:
    """Killed while the model writes its final answer, resumed with changed instructions:
    the first model call differs, so the run goes live; the model asks for the same two
    calls, which reuse their recorded keys. The idempotent ones run again with them (the
    tool deduplicates); a non-idempotent ``charge`` asks. The operator records it done
    with the result the log has (it never ran twice, and the model got that result), or
    approves it (it runs again with its first key)."""
    effects = Effects()
    path = tmp_path / "log.db"
    calls = [CALLS["lookup"], CALLS["charge"]]
    with OpenAIStub() as stub:
        # the final answer of the first process never comes: it is killed meanwhile
        stub.script(Reply(tool_calls=calls), Reply(content=FINAL, delay_s=30))
        llm = OpenAIChatLLM(stub.url, "stub-model", max_retries=0)
        tools = effects.registry(dying=False, charge_idempotent=idempotent)
        async with (
            await SqliteEventStore.open(path, poll_interval=0.01) as store,
            EmbeddedRuntime(store, [Biller], _policy(), llm=llm, tools=tools) as rt,
        ):
            root = await rt.orchestrator.submit(_plan(f"difference-{answer}"))
            await _until(store, root, _asking_final)
        first = dict(effects.applied)  # tool -> the key it ran with
        assert len(effects.applied) == 2
        stub.script(Reply(tool_calls=calls), FINAL)
        async with (
            await SqliteEventStore.open(path, poll_interval=0.01) as store,
            EmbeddedRuntime(store, [NewBiller], _policy(), llm=llm, tools=tools) as rt,
        ):
            if not idempotent:
                events = await _until(store, root, _settled(2))
                assert len(effects.keys("charge")) == 1  # asked, not run
                task_id = _requested(events, "charge")[0].task_id
                if answer == "done":
                    await record_effect_done(store, task_id, by="ops", note="it went through")
                else:
                    await rt.orchestrator.approve(task_id, by="ops")
            done = await rt.orchestrator.wait(root, timeout=60)
            envs = await store.read_correlation(root)
        bodies = stub.bodies()
    events = [e.data for e in envs]
    assert done.status == "completed", done
    # the resumed run went live from its first model call (the instructions differ)
    answered = [e for e in events if isinstance(e, ev.ModelAnswered) and e.error is None]
    assert [e.seq for e in answered if not e.replayed_from].count(0) == 2
    unknown = [e for e in events if isinstance(e, ev.ToolEffectUnknown)]
    assert {e.reason for e in unknown} == {"after_difference"}
    decisions = {t: [e.decision for e in unknown if e.tool == t] for t in CALLS}
    assert decisions == {
        "lookup": ["repeat"],
        "charge": {"": ["repeat"], "done": ["ask"], "approve": ["ask", "repeat"]}[answer],
    }
    assert all(e.idempotency_key == first[e.tool] for e in unknown)
    # nothing ran under a new key: each tool's every application has its first key
    assert {k for _, k in effects.applied} == {first["lookup"], first["charge"]}
    assert len(effects.keys("lookup")) == 2
    assert len(effects.keys("charge")) == (1 if answer == "done" else 2)
    if answer == "done":
        (recorded,) = [e for e in envs if getattr(e.data, "recorded_by", "")]
        assert recorded.actor == "ops" and recorded.data.recorded_by == "ops"
        assert recorded.data.result == {"charged": 7}
        assert recorded.data.idempotency_key == first["charge"]
        # the model was given the recorded result as the tool's answer
        last = bodies[-1]["messages"]
        answers = [json.loads(m["content"]) for m in last if m["role"] == "tool"]
        assert {"charged": 7} in answers
