"""A typed question over A2A (issue 31 item 2): a2a-sdk's client against ``cardbus a2a
serve`` (a real subprocess) serving the demo ``Payer``.

The task is input-required with a status message whose data part carries the question's
JSON Schema (``{amount: number, currency: "EUR"|"USD"}``); ``{"amount": "lots"}`` is
refused naming ``amount`` and the task stays input-required; the answer as a data part
completes it, recorded as ``question.answered`` with the message's id, and a resent
answer answers nothing twice.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from a2a.types import GetTaskRequest, SendMessageRequest, TaskState
from a2a.utils.errors import InvalidParamsError
from a2a_support import ServeProcess, a2a_client, collect, data_message, plan
from google.protobuf.json_format import MessageToDict

from cardbus.eventstore import SqliteEventStore
from cardbus.eventstore import events as ev

PAY = plan([{"id": "pay", "capability": "pay", "inputs": {"payee": "Ada"}}], goal="pay Ada")


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServeProcess]:
    db = Path(tmp_path_factory.mktemp("a2a-questions")) / "log.db"
    proc = ServeProcess(db, ["cardbus.agents.demo:Payer"]).start()
    try:
        yield proc
    finally:
        proc.stop()


def _status(event: Any) -> Any:
    return event.task.status if event.HasField("task") else event.status_update.status


async def _log(db: Path) -> list[Any]:
    store = await SqliteEventStore.open(db, create=False)
    try:
        return await store.read_all(0, 100_000)
    finally:
        await store.close()


async def test_a_typed_question_answered_by_an_a2a_client(server: ServeProcess) -> None:
    async with a2a_client(server.url) as client:
        first = await collect(client, SendMessageRequest(message=data_message(PAY)))
        task_id = first[0].task.id
        status = _status(first[-1])
        assert TaskState.Name(status.state) == "TASK_STATE_INPUT_REQUIRED"
        text, data = status.message.parts
        assert "How much should Ada be paid" in text.text
        asked = MessageToDict(data.data)["question"]
        schema = asked["schema"]
        assert schema["properties"]["currency"]["enum"] == ["EUR", "USD"]
        assert schema["properties"]["amount"]["type"] == "number"
        assert sorted(schema["required"]) == ["amount", "currency"]

        with pytest.raises(InvalidParamsError, match="'amount'"):
            bad = data_message({"amount": "lots", "currency": "EUR"}, task_id)
            await collect(client, SendMessageRequest(message=bad))
        still = await client.get_task(GetTaskRequest(id=task_id))
        assert TaskState.Name(still.status.state) == "TASK_STATE_INPUT_REQUIRED"

        answer = data_message(
            {"task_id": asked["task_id"], "amount": 7, "currency": "USD"}, task_id
        )
        second = await collect(client, SendMessageRequest(message=answer))
        assert TaskState.Name(_status(second[-1]).state) == "TASK_STATE_COMPLETED"
        # the same message again (a client's retry): the task as it is, nothing answered twice
        again = await collect(client, SendMessageRequest(message=answer))
        assert TaskState.Name(_status(again[-1]).state) == "TASK_STATE_COMPLETED"
        task = await client.get_task(GetTaskRequest(id=task_id))
    out = MessageToDict(task.artifacts[0].parts[0].data)
    assert out["text"] == "pay 7 USD to Ada"
    users = [m for m in task.history if m.role == 1]  # ROLE_USER: the answer, from the log
    assert users[-1].message_id == answer.message_id
    assert MessageToDict(users[-1].parts[0].data) == {"amount": 7, "currency": "USD"}
    answered = [e for e in await _log(server.db) if isinstance(e.data, ev.QuestionAnswered)]
    assert len(answered) == 1
    assert answered[0].data.door == "a2a" and answered[0].data.message_id == answer.message_id
    assert answered[0].actor.startswith("local:")  # loopback without tokens: who runs it


async def test_a_remote_gateways_typed_question_is_asked_typed_here(
    server: ServeProcess, tmp_path: Path
) -> None:
    """A local run's task done by the remote gateway (``a2a+http://``): the remote's
    question comes here with its schema, is refused here naming ``amount``, and the answer
    given here goes back on the same remote task."""
    import asyncio

    from cardbus.bus import EmbeddedRuntime, answer_question, open_questions
    from cardbus.bus.a2a import remote_a2a_agent
    from cardbus.bus.orchestrator.questions import QuestionRefused

    Remote = await remote_a2a_agent("a2a+" + server.url)
    local_plan = {
        "goal": "pay Bo",
        "tasks": [{"id": "p", "capability": "pay", "inputs": {"payee": "Bo"}}],
    }
    async with (
        await SqliteEventStore.open(tmp_path / "local.db", poll_interval=0.01) as store,
        EmbeddedRuntime(store, [Remote]) as rt,
    ):
        root = await rt.orchestrator.submit(local_plan)
        for _ in range(600):
            waiting = await open_questions(store, root)
            if waiting:
                break
            await asyncio.sleep(0.05)
        [q] = waiting
        assert "How much should Bo be paid" in q.question
        assert q.schema["properties"]["currency"]["enum"] == ["EUR", "USD"]
        with pytest.raises(QuestionRefused, match="'amount'"):
            await answer_question(store, root, {"amount": "lots", "currency": "EUR"}, by="ada")
        await answer_question(store, root, {"amount": 5, "currency": "EUR"}, by="ada")
        result = await rt.orchestrator.wait(root, 60)
    assert result.status == "completed", result.detail
    assert result.outputs["p"]["text"] == "pay 5 EUR to Bo"
