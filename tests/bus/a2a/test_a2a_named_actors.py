"""The A2A gateway's actor is who authenticated (issue 30, item 8).

``cardbus a2a serve`` in a real process on a free loopback port, with a token
file of two named tokens (``ops``, ``bob``); a2a-sdk's client sends each
person's action with one of them. The log (the real SQLite file) records each
by the token's name: a run started, an approval answered, a question answered,
a run cancelled; the message id is kept as a note, and the task's history
still shows the answer under the message's id.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path

import httpx
import pytest
from a2a.client import Client, ClientConfig, ClientFactory
from a2a.types import AgentCard, CancelTaskRequest, GetTaskRequest, SendMessageRequest
from a2a_support import ServeProcess, collect, data_message, plan, text_message
from google.protobuf.json_format import ParseDict

from cardbus.bus.a2a.fold import split_approval_note
from cardbus.eventstore import Envelope, SqliteEventStore
from cardbus.eventstore import events as ev

OPS, BOB = "ops-secret-1", "bob-secret-2"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServeProcess]:
    tmp = Path(tmp_path_factory.mktemp("a2a-actors"))
    (tmp / "tokens").write_text(f"# name token\nops {OPS}\nbob {BOB}\n")
    proc = ServeProcess(
        tmp / "log.db",
        ["a2a_support:Slow", "a2a_support:Asker"],
        extra=("--token-file", str(tmp / "tokens")),
    ).start()
    try:
        yield proc
    finally:
        proc.stop()


@asynccontextmanager
async def client_as(server: ServeProcess, token: str) -> AsyncIterator[Client]:
    async with httpx.AsyncClient(timeout=60, headers={"Authorization": f"Bearer {token}"}) as http:
        card = (await http.get(server.url + ".well-known/agent-card.json")).json()
        config = ClientConfig(streaming=True, httpx_client=http)
        yield ClientFactory(config).create(ParseDict(card, AgentCard()))


async def _log(db: Path, root: str) -> list[Envelope]:
    store = await SqliteEventStore.open(db, create=False)
    try:
        return list(await store.read_correlation(root))
    finally:
        await store.close()


def _task_id(first: list) -> str:  # type: ignore[type-arg]
    return str(first[0].task.id)


async def test_an_approval_is_by_the_tokens_name(server: ServeProcess) -> None:
    shout = plan(
        [{"id": "s", "capability": "shout", "inputs": {"text": "hi"}, "requires_approval": True}]
    )
    async with client_as(server, OPS) as ops:
        first = await collect(ops, SendMessageRequest(message=data_message(shout)))
        root = _task_id(first)
    async with client_as(server, BOB) as bob:
        yes = text_message("yes, go", root)
        await collect(bob, SendMessageRequest(message=yes))
        task = await bob.get_task(GetTaskRequest(id=root))
    log = await _log(server.db, root)
    [started] = [e for e in log if isinstance(e.data, ev.RunStarted)]
    assert started.actor == "ops"
    [granted] = [e for e in log if isinstance(e.data, ev.ApprovalGranted)]
    assert (granted.actor, granted.data.by) == ("bob", "bob")
    assert split_approval_note(granted.data.note) == ("yes, go", yes.message_id)
    # the history shows the answer as the user's message, under its own id
    assert yes.message_id in [m.message_id for m in task.history]


async def test_a_question_answered_and_a_cancel_are_by_the_tokens_name(
    server: ServeProcess,
) -> None:
    ask = plan([{"id": "a", "capability": "ask", "inputs": {"topic": "car"}}])
    async with client_as(server, BOB) as bob:
        first = await collect(bob, SendMessageRequest(message=data_message(ask)))
        root = _task_id(first)
    async with client_as(server, OPS) as ops:
        answer = text_message("blue", root)
        await collect(ops, SendMessageRequest(message=answer))
    log = await _log(server.db, root)
    # the answer is the question's question.answered, by the token's name, under the
    # message's id (logs before typed questions: a2a-user's result, split_answer_notes)
    [result] = [e for e in log if isinstance(e.data, ev.QuestionAnswered)]
    assert isinstance(result.data, ev.QuestionAnswered)
    assert (result.actor, result.data.by, result.data.door) == ("ops", "ops", "a2a")
    assert result.data.message_id == answer.message_id

    slow = plan([{"id": "s", "capability": "shout", "inputs": {"text": "x", "seconds": 30}}])
    async with client_as(server, OPS) as ops:
        stream = ops.send_message(SendMessageRequest(message=data_message(slow)))
        async for first_event in stream:  # the task, as soon as the run is started
            root = first_event.task.id
            break
        await stream.aclose()  # type: ignore[attr-defined]
    async with client_as(server, BOB) as bob:
        await bob.cancel_task(CancelTaskRequest(id=root))  # answers once it is written
    log = await _log(server.db, root)
    cancels = [e for e in log if isinstance(e.data, ev.TaskCancelled)]
    assert cancels and {e.actor for e in cancels} == {"bob"}
    assert {e.actor for e in log if isinstance(e.data, ev.RunStarted)} == {"ops"}
