"""a2a-sdk's client against `cardbus a2a serve` (a real subprocess on a free loopback port)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from a2a.types import (
    CancelTaskRequest,
    GetTaskRequest,
    SendMessageConfiguration,
    SendMessageRequest,
    SubscribeToTaskRequest,
    TaskState,
)
from a2a.utils.errors import InvalidParamsError, UnsupportedOperationError
from a2a_support import ServeProcess, a2a_client, collect, data_message, plan, text_message
from google.protobuf.json_format import MessageToDict

from cardbus.agents.a2a_card import from_a2a
from cardbus.bus.a2a.fold import result_text

S = TaskState
AGENTS = ["a2a_support:Slow", "a2a_support:Asker"]


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServeProcess]:
    proc = ServeProcess(Path(tmp_path_factory.mktemp("a2a")) / "log.db", AGENTS).start()
    try:
        yield proc
    finally:
        proc.stop()


def _states(events: list) -> list[str]:  # type: ignore[type-arg]
    out = []
    for e in events:
        if e.HasField("task"):
            out.append("task:" + S.Name(e.task.status.state))
        elif e.HasField("status_update"):
            out.append(S.Name(e.status_update.status.state))
        elif e.HasField("artifact_update"):
            out.append("artifact:" + e.artifact_update.artifact.artifact_id)
    return out


def _final(events: list) -> str:  # type: ignore[type-arg]
    """The last state streamed: from a status update, or from the task itself when the run
    got there before the stream started (then the stream opens and ends with the task)."""
    return _states(events)[-1].removeprefix("task:")


def shout(text: str = "hi", seconds: float = 0.0, **task: object) -> dict:  # type: ignore[type-arg]
    return plan(
        [{"id": "s", "capability": "shout", "inputs": {"text": text, "seconds": seconds}, **task}]
    )


async def test_card_is_served_and_imports_with_schemas(server: ServeProcess) -> None:
    doc = httpx.get(server.url + ".well-known/agent-card.json").json()
    assert doc["supportedInterfaces"][0]["url"] == server.url
    assert doc["capabilities"]["streaming"] is True
    imported = from_a2a(doc)
    assert imported.agent_id == "cardbus"
    assert imported.capability("run_plan").input_schema["$ref"].endswith("/Plan")


async def test_send_returns_the_completed_run(server: ServeProcess) -> None:
    async with a2a_client(server.url, streaming=False) as client:
        (resp,) = await collect(client, SendMessageRequest(message=data_message(shout("abc"))))
    task = resp.task
    assert S.Name(task.status.state) == "TASK_STATE_COMPLETED"
    assert MessageToDict(task.artifacts[0].parts[0].data) == {"text": "ABC"}
    # asked with a data part: answered with the data part alone
    assert [p.WhichOneof("content") for p in task.artifacts[0].parts] == ["data"]


async def test_stream_follows_the_run_to_completion(server: ServeProcess) -> None:
    async with a2a_client(server.url) as client:
        events = await collect(client, SendMessageRequest(message=data_message(shout("x", 0.3))))
    states = _states(events)
    assert states[0].startswith("task:")
    assert "TASK_STATE_WORKING" in states
    assert "artifact:s" in states
    assert states[-1] == "TASK_STATE_COMPLETED"


async def test_get_has_the_history_and_the_first_message(server: ServeProcess) -> None:
    msg = data_message(shout("hist"))
    async with a2a_client(server.url, streaming=False) as client:
        (resp,) = await collect(client, SendMessageRequest(message=msg))
        task = await client.get_task(GetTaskRequest(id=resp.task.id))
        short = await client.get_task(GetTaskRequest(id=resp.task.id, history_length=2))
    assert task.history[0].message_id == msg.message_id
    assert MessageToDict(task.history[0].parts[0].data)["tasks"][0]["capability"] == "shout"
    texts = [p.text for m in task.history for p in m.parts if p.text]
    assert any("dispatched to slow" in t for t in texts)
    assert len(short.history) == 2


async def test_a_text_goal_is_planned_and_streams_to_completion(server: ServeProcess) -> None:
    """Issue 13's done-when: the client sends a goal and streams the run to completion."""
    goal = "Upper-case a text: high tide"
    async with a2a_client(server.url) as client:
        events = await collect(client, SendMessageRequest(message=text_message(goal)))
        task_id = events[0].task.id
        task = await client.get_task(GetTaskRequest(id=task_id))
    assert _final(events) == "TASK_STATE_COMPLETED"
    # planned by the orchestrator's planner agent (the rule planner), then run
    streamed = [
        p.text
        for e in events
        if e.HasField("status_update") and e.status_update.status.HasField("message")
        for p in e.status_update.status.message.parts
    ]
    assert any("plan" in t and "rule-planner" in t for t in streamed), streamed
    assert any("dispatched to slow" in t for t in streamed), streamed
    (artifact,) = [e.artifact_update.artifact for e in events if e.HasField("artifact_update")]
    assert MessageToDict(artifact.parts[0].data) == {"text": goal.upper()}
    # asked in words: the result in words too, beside the data, for a text-only client
    assert [p.WhichOneof("content") for p in artifact.parts] == ["data", "text"]
    assert artifact.parts[1].text == goal.upper()
    assert artifact.parts[1].media_type == "text/plain"
    assert [p.text for a in task.artifacts for p in a.parts if p.text] == [goal.upper()]
    assert S.Name(task.status.state) == "TASK_STATE_COMPLETED"
    assert task.history[0].parts[0].text == goal


def test_a_results_text_is_its_text_field_else_its_json() -> None:
    assert result_text("plain") == "plain"
    assert result_text({"report": "Tides rise.", "sources": ["a"]}) == "Tides rise."
    assert result_text({"text": "", "answer": "42"}) == "42"  # an empty field is no text
    assert json.loads(result_text({"facts": ["a", "b"]})) == {"facts": ["a", "b"]}
    assert json.loads(result_text([1, 2])) == [1, 2]


async def test_an_invalid_plan_is_refused_with_the_reason(server: ServeProcess) -> None:
    """A plan refused before anything runs is no task (GetTask would not know it): -32602."""
    bad = plan([{"id": "s", "capability": "fly", "inputs": {}}])
    async with a2a_client(server.url, streaming=False) as client:
        with pytest.raises(InvalidParamsError, match="fly"):
            await collect(client, SendMessageRequest(message=data_message(bad)))


async def test_cancel_cancels_the_run(server: ServeProcess) -> None:
    config = SendMessageConfiguration(return_immediately=True)
    request = SendMessageRequest(message=data_message(shout("z", 5.0)), configuration=config)
    async with a2a_client(server.url, streaming=False) as client:
        (resp,) = await collect(client, request)
        assert S.Name(resp.task.status.state) in ("TASK_STATE_SUBMITTED", "TASK_STATE_WORKING")
        cancelled = await client.cancel_task(CancelTaskRequest(id=resp.task.id))
        again = await client.get_task(GetTaskRequest(id=resp.task.id))
    assert S.Name(cancelled.status.state) == "TASK_STATE_CANCELED"
    assert S.Name(again.status.state) == "TASK_STATE_CANCELED"


async def test_resubscribe_replays_what_was_missed_then_follows(server: ServeProcess) -> None:
    config = SendMessageConfiguration(return_immediately=True)
    request = SendMessageRequest(message=data_message(shout("late", 1.0)), configuration=config)
    async with a2a_client(server.url, streaming=False) as client:
        (resp,) = await collect(client, request)
    await asyncio.sleep(0.3)  # the run goes on without a listener
    async with a2a_client(server.url) as client:
        events = [e async for e in client.subscribe(SubscribeToTaskRequest(id=resp.task.id))]
    first = events[0].task
    assert first.history[0].message_id == request.message.message_id  # the whole past
    assert any("dispatched to slow" in p.text for m in first.history for p in m.parts)
    assert _final(events) == "TASK_STATE_COMPLETED"
    # a finished task: a subscription is refused (A2A 3.1.6); GetTask reads it whole
    async with a2a_client(server.url) as client:
        with pytest.raises(UnsupportedOperationError, match="TASK_STATE_COMPLETED"):
            _ = [e async for e in client.subscribe(SubscribeToTaskRequest(id=resp.task.id))]
        again = await client.get_task(GetTaskRequest(id=resp.task.id))
    assert again.artifacts[0].artifact_id == "s"


async def test_input_required_round_trip(server: ServeProcess) -> None:
    ask = plan([{"id": "a", "capability": "ask", "inputs": {"topic": "car"}}])
    async with a2a_client(server.url) as client:
        first = await collect(client, SendMessageRequest(message=data_message(ask)))
        assert _final(first) == "TASK_STATE_INPUT_REQUIRED"
        task_id = first[0].task.id
        waiting = first[-1].status_update.status.message.parts[0].text
        assert "which colour?" in waiting
        answer = text_message("blue", task_id)
        second = await collect(client, SendMessageRequest(message=answer))
        assert _final(second) == "TASK_STATE_COMPLETED"
        task = await client.get_task(GetTaskRequest(id=task_id))
    assert MessageToDict(task.artifacts[0].parts[0].data) == {
        "topic": "car",
        "colour": {"text": "blue"},
    }
    users = [m.message_id for m in task.history if m.role == 1]  # ROLE_USER
    assert users[-1] == answer.message_id  # the answer is in the history, from the log


async def test_approval_is_input_required_and_a_yes_approves(server: ServeProcess) -> None:
    async with a2a_client(server.url) as client:
        first = await collect(
            client, SendMessageRequest(message=data_message(shout("ok", requires_approval=True)))
        )
        assert _final(first) == "TASK_STATE_INPUT_REQUIRED"
        # the last status: an update, or the task itself when the run got there first
        last = first[-1]
        status = last.task.status if last.HasField("task") else last.status_update.status
        assert "awaits approval" in status.message.parts[0].text
        task_id = first[0].task.id
        second = await collect(client, SendMessageRequest(message=text_message("yes", task_id)))
    assert _final(second) == "TASK_STATE_COMPLETED"


async def test_a_message_on_a_finished_task_is_unsupported(
    server: ServeProcess,
) -> None:
    async with a2a_client(server.url, streaming=False) as client:
        (resp,) = await collect(client, SendMessageRequest(message=data_message(shout("done"))))
        # a finished task takes no more messages (A2A 3.1.1)
        with pytest.raises(UnsupportedOperationError, match="finished task"):
            await collect(client, SendMessageRequest(message=text_message("hm", resp.task.id)))
        with pytest.raises(Exception, match="no task"):
            await client.get_task(GetTaskRequest(id="nope"))
