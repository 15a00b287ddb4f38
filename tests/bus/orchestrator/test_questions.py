"""Typed questions to a person: asked durably, answered once, validated naming the field."""

from __future__ import annotations

import pytest
from orchkit import plan, run_log, task, tid, wait_for

from cardbus.agents.demo import Payer
from cardbus.agents.questions import AskPerson, question_spec
from cardbus.bus import answer_approval
from cardbus.bus.orchestrator.questions import (
    PERSON,
    QuestionRefused,
    answer_question,
    open_questions,
)
from cardbus.eventstore import events as ev
from cardbus.eventstore.errors import CardbusError

PAY = task("pay", "pay", inputs={"payee": "Ada"})


async def _asked(make_runtime, store):  # type: ignore[no-untyped-def]
    rt = await make_runtime([Payer])
    root = await rt.orch.submit(plan(PAY))
    env = await wait_for(
        store, lambda e: isinstance(e.data, ev.ApprovalRequested) and e.data.reason == "question"
    )
    return rt, root, env.stream


async def test_a_question_waits_then_its_answer_runs_the_task_again(make_runtime, store):
    rt, root, q_task = await _asked(make_runtime, store)
    pay = tid(root, "pay")
    [q] = await open_questions(store, root)  # by the run, the asking task or its own id
    assert [x.task_id for x in await open_questions(store, pay)] == [q_task]
    assert q.task_id == q_task and q.asked_by == pay
    assert q.question == "How much should Ada be paid, in which currency?"
    assert q.schema["properties"]["currency"]["enum"] == ["EUR", "USD"]
    assert q.schema["required"] == ["amount", "currency"]

    with pytest.raises(QuestionRefused) as refused:
        await answer_question(store, pay, {"amount": "lots", "currency": "EUR"}, by="alice")
    assert refused.value.field == "amount" and "'amount'" in str(refused.value)
    with pytest.raises(QuestionRefused) as refused:
        await answer_question(store, pay, {"amount": 3}, by="alice")
    assert refused.value.field == "currency"
    assert [x.task_id for x in await open_questions(store, root)] == [q_task]  # still open
    # approving a question answers nothing: refused, it stays open
    with pytest.raises(CardbusError, match="asks a question"):
        await answer_approval(store, q_task, True, "alice")

    await answer_question(store, pay, {"amount": 12.5, "currency": "EUR"}, by="alice", door="cli")
    result = await rt.orch.wait(root, 10)
    assert result.status == "completed", result
    assert result.outputs["pay"]["text"] == "pay 12.5 EUR to Ada"
    log = await run_log(store, root)
    answered = log.first(ev.QuestionAnswered, q_task)
    assert answered.actor == "alice" and answered.data.by == "alice"
    assert answered.data.answer == {"amount": 12.5, "currency": "EUR"}
    assert answered.data.door == "cli"
    done = log.first(ev.TaskCompleted, q_task)
    assert done.data.agent_id == PERSON and done.actor == "alice"
    assert log.first(ev.InputProvided, pay).data.output == {"amount": 12.5, "currency": "EUR"}
    assert not [e for e in log.e(ev.TaskDispatched) if e.stream == q_task]  # never dispatched
    assert await open_questions(store, root) == []
    with pytest.raises(CardbusError, match="no open question"):
        await answer_question(store, q_task, {"amount": 1, "currency": "USD"}, by="bob")
    assert len(log.e(ev.QuestionAnswered)) == 1


async def test_a_declined_question_fails_the_task_that_asked(make_runtime, store):
    rt, root, q_task = await _asked(make_runtime, store)
    await answer_approval(store, q_task, False, "alice", "no payment today")
    result = await rt.orch.wait(root, 10)
    assert result.status == "failed"
    log = await run_log(store, root)
    failed = log.first(ev.TaskFailed, tid(root, "pay")).data
    assert failed.reason == "supplementary_task_failed"


def test_a_question_spec_names_choices_and_a_default_and_checks_them() -> None:
    spec = question_spec("Colour?", choices=["red", "blue"], default="red")
    assert spec == {
        "question": "Colour?",
        "schema": {},
        "choices": ["red", "blue"],
        "default": "red",
    }
    with pytest.raises(ValueError, match="not one of the choices"):
        question_spec("Colour?", choices=["red"], default="green")
    with pytest.raises(ValueError, match="does not fit the schema"):
        question_spec("How many?", {"type": "integer"}, default="many")
    with pytest.raises(ValueError, match="not a JSON Schema"):
        question_spec("How many?", {"type": 12})
    asked = AskPerson("How many?", {"type": "integer"}, default=3)
    assert asked.capability == "user_input" and asked.inputs["default"] == 3


async def test_choices_and_a_default_answer(make_runtime, store):
    from orchkit import TextOut, make_agent

    def pick(t, i, c):  # type: ignore[no-untyped-def]
        if t.supplement is None:
            raise AskPerson("Which colour?", choices=["red", "blue"], default="blue")
        return TextOut(text=f"painted {t.supplement}")

    rt = await make_runtime([make_agent("painter", "paint", pick)])
    root = await rt.orch.submit(plan(task("paint", "paint")))
    await wait_for(store, lambda e: isinstance(e.data, ev.ApprovalRequested))
    with pytest.raises(QuestionRefused, match="not one of the choices"):
        await answer_question(store, root, "green", by="alice")
    _, given = await answer_question(store, root, by="alice", use_default=True)
    assert given == "blue"
    result = await rt.orch.wait(root, 10)
    assert result.outputs["paint"] == {"text": "painted blue"}
    log = await run_log(store, root)
    assert log.first(ev.QuestionAnswered).data.defaulted
