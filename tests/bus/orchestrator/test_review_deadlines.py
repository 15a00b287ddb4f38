"""A tool call under review with a deadline (``waits``, kind ``review``): refused or
approved by rule when nobody answers, or escalated so that only the named person may.

Real parts as in ``test_tool_review``: an ``EmbeddedRuntime`` on a SQLite file, the
OpenAI-compatible stub on loopback, a real ``ToolRegistry``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from cardbus.agents.llm import OpenAIChatLLM
from cardbus.agents.tools import ToolRegistry
from cardbus.bus.orchestrator import Policy
from cardbus.bus.orchestrator.reviews import answer_review
from cardbus.bus.orchestrator.waits import BY
from cardbus.bus.runtime.embedded import EmbeddedRuntime
from cardbus.eventstore import events as ev
from cardbus.eventstore.errors import NotAnApprover
from cardbus.eventstore.sqlite import SqliteEventStore
from tests.agents.openai_stub import OpenAIStub, Reply
from tests.bus.orchestrator.test_tool_review import PLAN, RAN, TRANSFER, Payer, _asked, _until


def _plan(*steps: dict[str, Any]) -> dict[str, Any]:
    return PLAN | {"waits": {"review": {"deadline_s": 0.3, "then": list(steps)}}}


@pytest.mark.parametrize("action", ["deny", "approve"])
async def test_a_review_nobody_answers_is_answered_by_its_policy(tmp_path: Path, action: str):
    RAN.clear()
    with OpenAIStub() as stub:
        stub.script(
            Reply(content="Paying 900 now.", tool_calls=[("transfer", {"amount": 900})]),
            json.dumps({"answer": "done"}),
        )
        llm = OpenAIChatLLM(stub.url, "stub-model", max_retries=0)
        step = {"action": action, "note": "nobody reviewed it in time"}
        async with (
            await SqliteEventStore.open(tmp_path / "log.db", poll_interval=0.01) as store,
            EmbeddedRuntime(
                store, [Payer], Policy(), llm=llm, tools=ToolRegistry([TRANSFER])
            ) as rt,
        ):
            done = await rt.run(_plan(step), timeout=60)
            events = [e.data for e in await store.read_correlation(done.root_id)]
        last = stub.bodies()[-1]["messages"][-1]
    assert done.status == "completed", done
    expired = [e for e in events if isinstance(e, ev.WaitExpired)]
    assert [(e.kind, e.step, e.action) for e in expired] == [("review", 1, action)]
    answered = [e for e in events if isinstance(e, ev.ToolReviewAnswered)]
    decision = "approve" if action == "approve" else "refuse"
    assert [(a.decision, a.by, a.proposed) for a in answered] == [(decision, BY, {"amount": 900})]
    assert last["role"] == "tool"
    if action == "approve":
        assert RAN == [900]
        assert json.loads(last["content"]) == {"sent": 900}
    else:
        assert RAN == []  # the model got the refusal as the tool's answer
        assert "nobody reviewed it in time" in last["content"]


async def test_an_escalated_review_is_answered_only_by_its_approver(tmp_path: Path):
    RAN.clear()
    with OpenAIStub() as stub:
        stub.script(
            Reply(content="Paying 900 now.", tool_calls=[("transfer", {"amount": 900})]),
            json.dumps({"answer": "done"}),
        )
        llm = OpenAIChatLLM(stub.url, "stub-model", max_retries=0)
        async with (
            await SqliteEventStore.open(tmp_path / "log.db", poll_interval=0.01) as store,
            EmbeddedRuntime(
                store, [Payer], Policy(), llm=llm, tools=ToolRegistry([TRANSFER])
            ) as rt,
        ):
            root = await rt.orchestrator.submit(_plan({"action": "escalate", "to": ["bea"]}))
            events = await _until(
                store,
                root,
                lambda es: _asked(es) and any(isinstance(e, ev.WaitExpired) for e in es),
            )
            task_id = next(e.task_id for e in events if isinstance(e, ev.ToolReviewRequested))
            with pytest.raises(NotAnApprover, match="bea"):
                await answer_review(store, task_id, "approve", by="ada")
            await answer_review(store, task_id, "edit", by="bea", arguments={"amount": 450})
            done = await rt.orchestrator.wait(root, timeout=60)
    assert done.status == "completed", done
    assert RAN == [450]
