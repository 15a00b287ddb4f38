"""Framework agents' model answers stream to watchers too (issue 31, item 4).

pydantic-ai's own ``OpenAIChatModel``, and the OpenAI Agents SDK's
``OpenAIChatCompletionsModel``, against the loopback stub (which streams 50
pieces, holding after the first), each run by its cardbus adapter in an
``EmbeddedRuntime``: a watcher on the bus gets the first piece while the request
streams (no ``model.answered`` yet), then every piece; the journal records the
whole response once, with its tokens, and the agent's output is the whole text.
"""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path
from typing import Any

import pytest
from pydantic_ai import Agent as PydanticAgent
from pydantic_ai.models.openai import OpenAIChatModel
from pydantic_ai.providers.openai import OpenAIProvider

from cardbus.agents import Agent
from cardbus.agents.frameworks import openai_agents_agent, pydantic_ai_agent
from cardbus.agents.streaming import Chunk
from cardbus.bus.runtime.embedded import EmbeddedRuntime
from cardbus.eventstore import SqliteEventStore
from cardbus.eventstore import events as ev
from tests.agents.openai_stub import OpenAIStub, Reply
from tests.streaming_agents import ANSWER, PIECES


def _pydantic_ai(stub: OpenAIStub) -> type[Agent]:
    provider = OpenAIProvider(base_url=stub.url, api_key="k")
    model = OpenAIChatModel("stub-model", provider=provider)
    return pydantic_ai_agent(PydanticAgent(model, name="teller"), capability="tell")


def _openai_agents(stub: OpenAIStub) -> type[Agent]:
    from agents import Agent as SDKAgent
    from agents import OpenAIChatCompletionsModel
    from openai import AsyncOpenAI

    client = AsyncOpenAI(base_url=stub.url, api_key="k", max_retries=0)
    model = OpenAIChatCompletionsModel(model="stub-model", openai_client=client)
    inner = SDKAgent(name="teller", instructions="Tell.", model=model)
    return openai_agents_agent(inner, capability="tell")


@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    "make", [_pydantic_ai, _openai_agents], ids=["pydantic-ai", "openai-agents"]
)
async def test_a_framework_agent_streams_its_answer(tmp_path: Path, make: Any) -> None:
    gate = threading.Event()
    seen: list[Chunk] = []
    first = asyncio.Event()

    def on_chunk(chunk: Chunk) -> None:
        seen.append(chunk)
        first.set()

    with OpenAIStub() as stub:
        stub.script(Reply(content=ANSWER, chunks=PIECES, gate=gate, gate_after=1))
        Teller = make(stub)
        task = {"id": "t", "capability": "tell", "inputs": {"prompt": "tides"}}
        plan = {"goal": "tell", "tasks": [task]}
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
