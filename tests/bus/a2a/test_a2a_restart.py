"""`cardbus a2a serve` killed (SIGKILL) mid-run and started again over the same log."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from a2a.types import (
    GetTaskRequest,
    SendMessageConfiguration,
    SendMessageRequest,
    SubscribeToTaskRequest,
    TaskState,
)
from a2a.utils.errors import UnsupportedOperationError
from a2a_support import ServeProcess, a2a_client, collect, data_message, plan
from google.protobuf.json_format import MessageToDict

S = TaskState


async def test_the_task_survives_a_crash_of_the_server(tmp_path: Path) -> None:
    server = ServeProcess(tmp_path / "log.db", ["a2a_support:Slow"]).start()
    two = plan(
        [
            {"id": "first", "capability": "shout", "inputs": {"text": "a", "seconds": 0.1}},
            {
                "id": "second",
                "capability": "shout",
                "deps": ["first"],
                "timeout_s": 3.0,
                "inputs": {"text": "b", "seconds": 2.0},
            },
        ]
    )
    message = data_message(two)
    config = SendMessageConfiguration(return_immediately=True)
    try:
        async with a2a_client(server.url, streaming=False) as client:
            (resp,) = await collect(
                client, SendMessageRequest(message=message, configuration=config)
            )
            task_id = resp.task.id
            for _ in range(100):  # until the second task is running
                got = await client.get_task(GetTaskRequest(id=task_id))
                if any("second: slow started" in p.text for m in got.history for p in m.parts):
                    break
                await asyncio.sleep(0.05)
            else:
                raise AssertionError("the second task never started")
        server.kill()  # mid-run: the second attempt is lost with the process
        server.start()  # same port, same log: the orchestrator resumes the run
        async with a2a_client(server.url, streaming=False) as client:
            task = None
            for _ in range(200):
                task = await client.get_task(GetTaskRequest(id=task_id))
                if task.status.state == S.TASK_STATE_COMPLETED:
                    break
                await asyncio.sleep(0.1)
            assert task is not None and S.Name(task.status.state) == "TASK_STATE_COMPLETED"
        assert task.history[0].message_id == message.message_id
        texts = [p.text for m in task.history for p in m.parts if p.text]
        assert any("timed out" in t for t in texts)  # the lost attempt, read from the log
        outputs = {a.artifact_id: MessageToDict(a.parts[0].data) for a in task.artifacts}
        assert outputs == {"first": {"text": "A"}, "second": {"text": "B"}}
        # the task is finished: a subscription is refused (A2A 3.1.6), GetTask reads it whole
        async with a2a_client(server.url) as client:
            with pytest.raises(UnsupportedOperationError, match="TASK_STATE_COMPLETED"):
                _ = [e async for e in client.subscribe(SubscribeToTaskRequest(id=task_id))]
            again = await client.get_task(GetTaskRequest(id=task_id))
        assert [m.message_id for m in again.history] == [m.message_id for m in task.history]
    finally:
        server.stop()
