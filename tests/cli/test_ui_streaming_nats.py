"""On NATS the console hears a run's model answers as they are written (issue 31, item 4).

A real nats-server; ``cardbus ui --store nats://...`` in a subprocess (no agents:
the cluster's runtime runs them); a ``NatsRuntime`` in this process with the writer
agent, whose model is the loopback stub holding its stream before the first piece and
after it. The console's ``/api/chunks`` for the run (SSE) gets the first piece while
the call streams (the log has no ``model.answered`` for it yet), then the rest and
the end; the log then has exactly one ``model.answered``.
"""

from __future__ import annotations

import asyncio
import json
import threading
from typing import Any

import httpx
import pytest
from test_ui import Server

from cardbus.agents.llm import OpenAIChatLLM
from cardbus.eventstore import events as ev
from tests.agents.openai_stub import OpenAIStub, Reply
from tests.streaming_agents import ANSWER, PIECES, Writer, write_plan


async def _frames(lines: Any, want: str, out: list[dict[str, Any]]) -> None:
    """Read SSE lines until a frame whose data has ``want`` (chunk frames into ``out``)."""
    async for line in lines:
        if line.startswith("data: "):
            data = json.loads(line[6:])
            if data:
                out.append(data)
            if want in line:
                return
        elif want in line:
            return


@pytest.mark.timeout(180)
async def test_a_nats_console_streams_a_run_it_does_not_host(nats_url: str) -> None:
    from cardbus.bus.runtime.nats import NatsRuntime
    from cardbus.eventstore.nats.connection import NatsOptions

    opened, gate = threading.Event(), threading.Event()
    with OpenAIStub() as stub:
        stub.script(Reply(content=ANSWER, chunks=PIECES, gates={0: opened, 1: gate}))
        llm = OpenAIChatLLM(stub.url, "stub-model", max_retries=0)
        server = Server(nats_url, env={"CARDBUS_UI_HEARTBEAT_S": "1"})  # type: ignore[arg-type]
        try:
            await asyncio.to_thread(server.wait_ready)
            async with NatsRuntime(NatsOptions(url=nats_url), [Writer], llm=llm) as rt:
                root = await rt.submit(write_plan("nats-ui-1"))
                frames: list[dict[str, Any]] = []
                async with (
                    httpx.AsyncClient(timeout=60) as http,
                    http.stream("GET", server.url + "api/chunks", params={"root": root}) as resp,
                ):
                    assert resp.status_code == 200
                    lines = resp.aiter_lines()
                    await _frames(lines, ": connected", frames)
                    # the agents' own connection heard, over NATS, that the run is watched
                    agents = rt._agent_buses[0]
                    for _ in range(400):
                        if agents.chunks_watched(root):
                            break
                        await asyncio.sleep(0.05)
                    assert agents.chunks_watched(root)
                    opened.set()
                    await _frames(lines, '"seq":0', frames)
                    assert frames[0]["text"] == PIECES[0] and not frames[0]["done"]
                    events = await rt.store.read_correlation(root)
                    assert not any(isinstance(e.data, ev.ModelAnswered) for e in events)
                    gate.set()
                    await _frames(lines, '"done":true', frames)
                result = await rt.orchestrator.wait(root, 60)
                assert result.status == "completed", result
                events = await rt.store.read_correlation(root)
                assert sum(isinstance(e.data, ev.ModelAnswered) for e in events) == 1
        finally:
            opened.set()
            gate.set()
            await asyncio.to_thread(server.stop)
            await llm.aclose()
    assert "".join(f["text"] for f in frames) == ANSWER
    assert [f["seq"] for f in frames] == list(range(51))
