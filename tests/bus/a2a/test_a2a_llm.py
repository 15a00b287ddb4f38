"""`cardbus a2a serve` asks the model endpoint its environment names, as `cardbus run` does
(a real subprocess, the loopback OpenAI stub, driven by a2a-sdk's client)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from a2a.types import SendMessageRequest, TaskState
from a2a_support import ServeProcess, a2a_client, collect, data_message, plan
from google.protobuf.json_format import MessageToDict

from tests.agents.openai_stub import OpenAIStub, Reply

BRIEF = {"title": "Tides", "points": ["The Moon pulls.", "Two a day.", "Spring tides."]}


async def test_a2a_serve_sends_its_agents_model_calls_to_the_endpoint(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with OpenAIStub() as stub:
        stub.script(Reply(content=json.dumps(BRIEF)))
        monkeypatch.setenv("OPENAI_BASE_URL", stub.url)
        monkeypatch.setenv("CARDBUS_MODEL", "served-model")
        server = ServeProcess(tmp_path / "log.db", ["a2a_support:Briefer"]).start()
        try:
            brief = plan([{"id": "b", "capability": "brief", "inputs": {"topic": "tides"}}])
            async with a2a_client(server.url, streaming=False) as client:
                (resp,) = await collect(client, SendMessageRequest(message=data_message(brief)))
        finally:
            server.stop()
        bodies = stub.bodies()
    task = resp.task
    assert TaskState.Name(task.status.state) == "TASK_STATE_COMPLETED"
    # the answer came from the endpoint, asked for the model the environment names
    assert MessageToDict(task.artifacts[0].parts[0].data) == BRIEF
    assert [b["model"] for b in bodies] == ["served-model"]
    # and the server said which model answers, in one line
    said = [line for line in server.log.read_text().splitlines() if line.startswith("LLM:")]
    assert said == [f"LLM: served-model at {stub.url} ({stub.url.split('/')[2]})"]
