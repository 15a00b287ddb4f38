"""The answer's record in the background, and the barrier (``agents.journal_settle``).

The orchestrator here is a requester that answers ``model.answer`` only when the test
opens its gate (the record's commit), so the order of what the handler sees, what the
orchestrator is sent and what is durable is exact, with no timing. The end-to-end
order in a real log is ``tests/bus/orchestrator/test_journal.py``."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any, ClassVar

import msgspec
import pytest

from cardbus.agents import Agent, Capability, TaskCard, TaskContext
from cardbus.agents.llm import MockLLM
from cardbus.agents.requests import REQUESTER, AgentRequest, AgentResponse


class Q(msgspec.Struct):
    q: str


class A(msgspec.Struct):
    answer: str


class Orchestrator:
    """Answers model.request at once; model.answer when ``gate`` opens (or refuses it)."""

    def __init__(self, refuse_answers: bool = False) -> None:
        self.gate = asyncio.Event()
        self.refuse_answers = refuse_answers
        self.log: list[tuple[str, int]] = []

    async def __call__(self, req: AgentRequest) -> AgentResponse:
        self.log.append((req.kind, req.seq))
        if req.kind == "model.answer":
            await self.gate.wait()
            if self.refuse_answers:
                return AgentResponse(
                    request_id=req.request_id, ok=False, error="log down", error_type="unavailable"
                )
            self.log.append(("durable", req.seq))
            return AgentResponse(request_id=req.request_id, ok=True, result={"recorded": True})
        return AgentResponse(request_id=req.request_id, ok=True, result={"call": ""})


class TwoCalls(Agent):
    agent_id = "two-calls"
    capabilities: ClassVar = [Capability("ask", Q, A)]
    seen: ClassVar[list[tuple[str, int]]] = []

    async def handle(self, task: TaskCard, inputs: Q, ctx: TaskContext) -> A:
        orch: Any = REQUESTER.get()
        first = await ctx.llm.chat([{"role": "user", "content": inputs.q}])
        orch.log.append(("handler has answer", 0))
        asyncio.get_running_loop().call_soon(orch.gate.set)  # the commit, later
        second = await ctx.llm.chat([{"role": "user", "content": first.text}])
        return A(answer=second.text)


def _card() -> TaskCard:
    return TaskCard(task_id="t1", root_id="r1", capability="ask", goal="g", inputs={"q": "x"})


@pytest.fixture
def orchestrator(request: pytest.FixtureRequest) -> Iterator[Orchestrator]:
    orch = Orchestrator(refuse_answers=getattr(request, "param", False))
    token = REQUESTER.set(orch)  # type: ignore[arg-type]
    try:
        yield orch
    finally:
        REQUESTER.reset(token)


async def test_the_handler_reads_the_answer_before_its_record_and_the_next_call_waits(
    orchestrator: Orchestrator,
) -> None:
    result = await TwoCalls.run(_card(), MockLLM())
    assert result.status == "completed", result
    assert orchestrator.log == [
        ("model.request", 0),
        ("handler has answer", 0),  # at once: its record is sent in the background
        ("model.answer", 0),
        ("durable", 0),
        ("model.request", 1),  # what depends on the answer leaves only after
        ("model.answer", 1),
        ("durable", 1),  # the result, too, waited for the last record
    ]


@pytest.mark.parametrize("orchestrator", [True], indirect=True)
async def test_a_record_that_fails_fails_the_task_before_anything_else_leaves(
    orchestrator: Orchestrator,
) -> None:
    result = await TwoCalls.run(_card(), MockLLM())
    assert result.status == "failed"
    assert "log down" in (result.error or ""), result
    # the second call never went out: its request waited for the record, which failed
    assert ("model.request", 1) not in orchestrator.log
