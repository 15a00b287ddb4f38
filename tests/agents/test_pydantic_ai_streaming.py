"""A pydantic-ai agent's model answers stream to watchers too (issue 31, item 4).

pydantic-ai's own ``OpenAIChatModel`` against the loopback stub (which streams
50 pieces, holding after the first), run by the cardbus adapter in an
``EmbeddedRuntime``: a watcher on the bus gets the first piece while the request
streams (no ``model.answered`` yet), then every piece; the journal records the
whole response once, and the agent's output is the whole text.
"""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path

import pytest
from pydantic_ai import Agent as PydanticAgent
from pydantic_ai.models.openai import OpenAIChatModel
from pydantic_ai.providers.openai import OpenAIProvider

from cardbus.agents.frameworks import pydantic_ai_agent
from cardbus.agents.streaming import Chunk
from cardbus.bus.runtime.embedded import EmbeddedRuntime
from cardbus.eventstore import SqliteEventStore
from cardbus.eventstore import events as ev
from tests.agents.openai_stub import OpenAIStub, Reply
from tests.streaming_agents import ANSWER, PIECES


@pytest.mark.timeout(60)
async def test_a_pydantic_ai_agent_streams_its_answer(tmp_path: Path) -> None:
    gate = threading.Event()
    seen: list[Chunk] = []
    first = asyncio.Event()

    def on_chunk(chunk: Chunk) -> None:
        seen.append(chunk)
        first.set()

    with OpenAIStub() as stub:
        stub.script(Reply(content=ANSWER, chunks=PIECES, gate=gate, gate_after=1))
        model = OpenAIChatModel(
            "stub-model", provider=OpenAIProvider(base_url=stub.url, api_key="k")
        )
        Teller = pydantic_ai_agent(PydanticAgent(model, name="teller"), capability="tell")
        plan = {
            "goal": "tell",
            "tasks": [{"id": "t", "capability": "tell", "inputs": {"prompt": "tides"}}],
        }
        async with (
            await SqliteEventStore.open(tmp_path / "p.db") as store,
            EmbeddedRuntime(store, [Teller]) as rt,
        ):
            stop = await rt.bus.watch_chunks(on_chunk)
            running = asyncio.ensure_future(rt.run(plan, timeout=30))
            try:
                await asyncio.wait_for(first.wait(), 20)
                root = seen[0].root_id
                events = await store.read_correlation(root)
                assert not any(isinstance(e.data, ev.ModelAnswered) for e in events)
            finally:
                gate.set()
            result = await running
            await stop()
            events = await store.read_correlation(result.root_id)
        assert stub.streamed == 1
    assert result.status == "completed", result
    assert "".join(c.text for c in seen) == ANSWER
    assert seen[-1].done
    answered = [e.data for e in events if isinstance(e.data, ev.ModelAnswered)]
    assert len(answered) == 1 and answered[0].input_tokens == 11
    assert ANSWER.strip() in str(result.outputs["t"])
