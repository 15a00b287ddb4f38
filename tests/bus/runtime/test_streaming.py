"""Model answers stream to watchers while they are written; the log keeps one answer.

A real ``OpenAIChatLLM`` against the loopback stub streaming 50 pieces, an
``EmbeddedRuntime`` on SQLite, a watcher on the runtime's bus: the watcher gets
the pieces before the log has the call's ``model.answered``, the log has exactly
one, with the whole text; nobody watching, nothing is published, and the call
still streams from the provider through the pacer.
"""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path
from typing import Any

import pytest

from cardbus.agents.llm import OpenAIChatLLM
from cardbus.agents.pacing import Pacer
from cardbus.agents.streaming import Chunk
from cardbus.bus.runtime.embedded import EmbeddedRuntime
from cardbus.eventstore import SqliteEventStore
from cardbus.eventstore import events as ev
from tests.agents.openai_stub import OpenAIStub, Reply
from tests.streaming_agents import ANSWER, PIECES, Writer, write_plan


@pytest.fixture
def stub() -> Any:
    with OpenAIStub() as s:
        yield s


async def _answered(store: SqliteEventStore, root: str) -> list[ev.ModelAnswered]:
    return [
        e.data for e in await store.read_correlation(root) if isinstance(e.data, ev.ModelAnswered)
    ]


@pytest.mark.timeout(60)
async def test_a_watcher_sees_the_pieces_while_the_call_streams(
    tmp_path: Path, stub: OpenAIStub
) -> None:
    gate = threading.Event()  # the stub holds the stream after its first piece
    stub.script(Reply(content=ANSWER, chunks=PIECES, gate=gate, gate_after=1))
    seen: list[Chunk] = []
    first = asyncio.Event()

    def on_chunk(chunk: Chunk) -> None:
        seen.append(chunk)
        first.set()

    llm = OpenAIChatLLM(stub.url, "stub-model", max_retries=0)
    async with (
        await SqliteEventStore.open(tmp_path / "s.db") as store,
        EmbeddedRuntime(store, [Writer], llm=llm) as rt,
    ):
        stop = await rt.bus.watch_chunks(on_chunk)
        running = asyncio.ensure_future(rt.run(write_plan(), timeout=30))
        await asyncio.wait_for(first.wait(), 20)
        # the first piece is here while the call is still streaming: not answered yet
        root = seen[0].root_id
        assert seen[0].text == PIECES[0] and seen[0].seq == 0
        assert await _answered(store, root) == []
        # model.requested is written while the model works: it comes, the answer does not
        for _ in range(400):
            kinds = [type(e.data) for e in await store.read_correlation(root)]
            if ev.ModelRequested in kinds:
                break
            await asyncio.sleep(0.05)
        assert ev.ModelRequested in kinds
        assert await _answered(store, root) == []
        gate.set()
        result = await running
        await stop()
        await llm.aclose()
        assert result.status == "completed", result
        assert result.outputs["w"] == {"text": ANSWER}
        # every piece, in order, then the end; the log: one answer, the whole text
        texts = [c.text for c in seen if not c.done]
        assert texts == PIECES
        assert [c.seq for c in seen] == list(range(51)) and seen[-1].done
        assert {(c.task_id, c.attempt, c.call, c.agent_id) for c in seen} == {
            (seen[0].task_id, 1, 1, "writer")
        }
        answered = await _answered(store, root)
        assert len(answered) == 1
        assert stub.streamed == 1


@pytest.mark.timeout(60)
async def test_nobody_watching_publishes_nothing_and_still_paces(
    tmp_path: Path, stub: OpenAIStub, monkeypatch: pytest.MonkeyPatch
) -> None:
    stub.script(Reply(content=ANSWER, chunks=PIECES))
    pacer = Pacer()
    llm = OpenAIChatLLM(stub.url, "stub-model", max_retries=0, pacer=pacer)
    acquired: list[Any] = []
    real_acquire = pacer.acquire

    async def acquire(key: Any, *a: Any, **kw: Any) -> float:
        acquired.append(key)
        return await real_acquire(key, *a, **kw)

    monkeypatch.setattr(pacer, "acquire", acquire)
    async with (
        await SqliteEventStore.open(tmp_path / "s.db") as store,
        EmbeddedRuntime(store, [Writer], llm=llm) as rt,
    ):
        published: list[Chunk] = []

        async def publish(chunk: Chunk) -> None:
            published.append(chunk)

        monkeypatch.setattr(rt.bus, "publish_chunk", publish)
        result = await rt.run(write_plan(), timeout=30)
        await llm.aclose()
        assert result.status == "completed", result
        assert result.outputs["w"] == {"text": ANSWER}
        assert published == []  # nobody watched: not one chunk went out
        assert stub.streamed == 1 and stub.pieces_sent == 50  # yet it streamed
        assert acquired == [llm.limit_key("stub-model")]  # through the pacer
        assert len(await _answered(store, result.root_id)) == 1
        assert stub.bodies()[0]["stream_options"] == {"include_usage": True}
        # the usage came with the stream: the answer's tokens are the stub's
        answered = (await _answered(store, result.root_id))[0]
        assert (answered.input_tokens, answered.output_tokens) == (11, 7)


@pytest.mark.timeout(90)
async def test_on_nats_the_pieces_cross_a_core_subject_to_another_connection(
    nats_url: str, stub: OpenAIStub
) -> None:
    from cardbus.bus.runtime.nats import NatsRuntime
    from cardbus.bus.transport.nats import NatsBus
    from cardbus.eventstore.nats.connection import NatsOptions

    gate = threading.Event()
    stub.script(Reply(content=ANSWER, chunks=PIECES, gate=gate, gate_after=1))
    llm = OpenAIChatLLM(stub.url, "stub-model", max_retries=0)
    seen: list[Chunk] = []
    first = asyncio.Event()

    def on_chunk(chunk: Chunk) -> None:
        seen.append(chunk)
        first.set()

    watcher = await NatsBus.connect(nats_url, name="watcher")
    try:
        stop = await watcher.watch_chunks(on_chunk)
        async with NatsRuntime(NatsOptions(url=nats_url), [Writer], llm=llm) as rt:
            running = asyncio.ensure_future(rt.run(write_plan("nats-1"), timeout=60))
            await asyncio.wait_for(first.wait(), 30)
            root = seen[0].root_id
            answered = [
                e for e in await rt.store.read_correlation(root) if e.type == "model.answered.v1"
            ]
            assert answered == []  # a piece is here while the call streams
            gate.set()
            result = await running
            assert result.status == "completed", result
            events = await rt.store.read_correlation(result.root_id)
            assert sum(isinstance(e.data, ev.ModelAnswered) for e in events) == 1
            # nothing of the chunks is in the log: no event per piece
            assert not any("chunk" in e.type for e in events)
        await stop()
        await llm.aclose()
        # the pieces came in order (core NATS from one publisher keeps order), whole
        assert [c.text for c in seen if not c.done] == PIECES
        assert seen[-1].done
    finally:
        await watcher.close()


@pytest.mark.timeout(60)
async def test_on_nats_an_agent_hears_no_watcher_and_publishes_nothing(nats_url: str) -> None:
    from cardbus.bus.transport.nats import NatsBus

    agent = await NatsBus.connect(nats_url, name="agent")
    watcher = await NatsBus.connect(nats_url, name="watcher")
    try:
        await agent.hear_watchers()
        assert not agent.chunks_watched("r1")
        stop = await watcher.watch_chunks(lambda c: None, "r1")
        for _ in range(100):  # the watcher says so on the wire; the agent hears it
            if agent.chunks_watched("r1"):
                break
            await asyncio.sleep(0.05)
        assert agent.chunks_watched("r1") and not agent.chunks_watched("r2")
        await stop()
    finally:
        await agent.close()
        await watcher.close()


@pytest.mark.timeout(60)
async def test_a_server_that_ignores_stream_is_read_whole(tmp_path: Path, stub: OpenAIStub) -> None:
    stub.ignore_stream = True  # a stand-in that answers JSON whatever it is asked
    stub.default = Reply(content=ANSWER)
    llm = OpenAIChatLLM(stub.url, "stub-model", max_retries=0)
    async with (
        await SqliteEventStore.open(tmp_path / "s.db") as store,
        EmbeddedRuntime(store, [Writer], llm=llm) as rt,
    ):
        result = await rt.run(write_plan("json-1"), timeout=30)
        await llm.aclose()
    assert result.status == "completed", result
    assert result.outputs["w"] == {"text": ANSWER}
    assert stub.bodies()[0]["stream"] is True


@pytest.mark.timeout(60)
async def test_an_endpoint_that_refuses_streaming_is_asked_whole(
    tmp_path: Path, stub: OpenAIStub
) -> None:
    stub.refuse_stream = True
    stub.default = Reply(content=ANSWER)
    llm = OpenAIChatLLM(stub.url, "stub-model", max_retries=0)
    async with (
        await SqliteEventStore.open(tmp_path / "s.db") as store,
        EmbeddedRuntime(store, [Writer], llm=llm) as rt,
    ):
        first = await rt.run(write_plan("whole-1"), timeout=30)
        second = await rt.run(write_plan("whole-2"), timeout=30)
        await llm.aclose()
    assert (first.status, second.status) == ("completed", "completed")
    assert first.outputs["w"] == {"text": ANSWER}
    # refused once streamed, asked whole, then whole from the start
    assert [bool(b.get("stream")) for b in stub.bodies()] == [True, False, False]
