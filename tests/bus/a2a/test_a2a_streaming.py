"""A2A streaming clients see a model answer as it is written (issue 31, item 4).

``cardbus a2a serve`` in a real subprocess, its agent asking the loopback stub,
which streams 50 pieces 50 ms apart; an a2a-sdk client with ``SendStreamingMessage``
gets artifact updates that append, before the task completes, and the log has one
``model.answered`` for the call.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from a2a.types import SendMessageRequest, TaskState
from a2a_support import ServeProcess, a2a_client, data_message, plan

from cardbus.eventstore import SqliteEventStore
from cardbus.eventstore import events as ev
from tests.agents.openai_stub import OpenAIStub, Reply
from tests.streaming_agents import ANSWER, PIECES


@pytest.mark.timeout(120)
async def test_a_streaming_client_gets_appending_updates_before_the_task_completes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    db = tmp_path / "log.db"
    with OpenAIStub() as stub:
        stub.script(Reply(content=ANSWER, chunks=PIECES, chunk_delay_s=0.05))
        monkeypatch.setenv("OPENAI_BASE_URL", stub.url)
        monkeypatch.setenv("CARDBUS_MODEL", "stub-model")
        server = ServeProcess(db, ["tests.streaming_agents:Writer"]).start()
        order: list[str] = []  # what the client got, in order
        appended: list[str] = []
        try:
            job = plan([{"id": "w", "capability": "write", "inputs": {"topic": "tides"}}])
            async with a2a_client(server.url) as client:
                request = SendMessageRequest(message=data_message(job))
                async for resp in client.send_message(request):
                    kind = resp.WhichOneof("payload")
                    if kind == "artifact_update":
                        update = resp.artifact_update
                        if update.artifact.artifact_id.endswith("~stream"):
                            order.append("append" if update.append else "open")
                            if update.append and not update.last_chunk:
                                appended.append(update.artifact.parts[0].text)
                        else:
                            order.append("result")
                    elif kind == "status_update":
                        state = TaskState.Name(resp.status_update.status.state)
                        order.append(state)
                    elif kind == "task":
                        order.append(TaskState.Name(resp.task.status.state))
        finally:
            server.stop()
    completed = order.index("TASK_STATE_COMPLETED")
    before = [o for o in order[:completed] if o == "append"]
    assert len(before) >= 10, order
    assert order.index("open") < order.index("append") < order.index("result") < completed
    # what was appended is the answer's pieces, in order (a late watcher may miss the first)
    assert "".join(appended) in ANSWER and len(appended) >= 10
    store = await SqliteEventStore.open(db)
    try:
        events = [e.data for e in await store.read_all()]
    finally:
        await store.close()
    answered = [e for e in events if isinstance(e, ev.ModelAnswered)]
    assert len(answered) == 1
