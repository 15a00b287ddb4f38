"""The agent -> orchestrator request path itself: codec, bus contract, typed errors."""

from __future__ import annotations

import asyncio

import pytest

from cardbus.agents.requests import (
    REQUEST_KINDS,
    AgentRequest,
    AgentResponse,
    decode_request,
    decode_response,
    encode,
    error_for,
)
from cardbus.agents.tools import ToolResultTooLarge, ToolTimeout
from cardbus.bus.transport.inprocess import InProcessBus
from cardbus.bus.transport.interface import Bus
from cardbus.eventstore.errors import AccessDenied, BusError, DecodeError, ValidationError

REQ = AgentRequest(
    request_id="r1",
    task_id="t",
    attempt=2,
    agent_id="a",
    kind="tool",
    target="echo",
    args={"q": [1, "x", None]},
    traceparent="00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
)


def test_request_and_response_round_trip() -> None:
    assert decode_request(encode(REQ)) == REQ
    resp = AgentResponse(request_id="r1", ok=True, result={"a": 1}, duration_s=0.5)
    assert decode_response(encode(resp)) == resp
    assert set(REQUEST_KINDS) == {
        "read_output",
        "write_output",
        "tool",
        "memory.get",
        "memory.list",
        "memory.search",
        "memory.put",
        "model.request",
        "model.answer",
        "model.queue",  # a model call waiting for its provider's limit (limit_waits)
        "tool.begin",
        "tool.end",
        "attempt.live",  # the worker: is its attempt still wanted (cancel_notices)
        "tool.specs",
    }


@pytest.mark.parametrize(
    "data",
    [
        b"",
        b"[]",
        b'{"type":"agent_request"}',
        b'{"type":"agent_request","request_id":"1","task_id":"t","attempt":1,"agent_id":"a","kind":"rm"}',
        encode(AgentResponse(request_id="x", ok=True)),
    ],
)
def test_malformed_requests_are_decode_errors(data: bytes) -> None:
    with pytest.raises(DecodeError):
        decode_request(data)


@pytest.mark.parametrize(
    ("error_type", "cls"),
    [
        ("access_denied", AccessDenied),
        ("timeout", ToolTimeout),
        ("result_too_large", ToolResultTooLarge),
        ("bad_request", ValidationError),
        ("unavailable", BusError),
        (None, BusError),
    ],
)
def test_error_types_map_to_typed_errors(error_type: str | None, cls: type) -> None:
    err = error_for(AgentResponse(request_id="1", ok=False, error="nope", error_type=error_type))
    assert type(err) is cls
    assert "nope" in str(err)


async def test_in_process_bus_serves_requests_through_the_codec() -> None:
    bus = InProcessBus()
    seen: list[AgentRequest] = []

    async def handler(req: AgentRequest) -> AgentResponse:
        seen.append(req)
        return AgentResponse(request_id=req.request_id, ok=True, result=req.args)

    with pytest.raises(BusError):  # nobody serves yet
        await bus.request(REQ)
    await bus.serve_requests(handler)
    resp = await bus.request(REQ)
    assert resp.ok and resp.result == REQ.args and seen == [REQ] and seen[0] is not REQ
    await bus.close()
    with pytest.raises(BusError):
        await bus.request(REQ)


async def test_no_answer_in_time_or_a_broken_server_is_bus_error() -> None:
    bus = InProcessBus()

    async def slow(req: AgentRequest) -> AgentResponse:
        await asyncio.sleep(10)
        raise AssertionError

    await bus.serve_requests(slow)
    with pytest.raises(BusError, match="no answer"):
        await bus.request(REQ, timeout=0.05)

    async def broken(req: AgentRequest) -> AgentResponse:
        raise RuntimeError("bug")

    await bus.serve_requests(broken)
    with pytest.raises(BusError, match="bug"):
        await bus.request(REQ)


async def test_a_bus_without_the_request_path_says_so() -> None:
    class Minimal(Bus):
        async def consume(self, agent_id, handler):  # type: ignore[no-untyped-def]
            pass

        async def send_task(self, agent_id, card):  # type: ignore[no-untyped-def]
            pass

        async def reply(self, message):  # type: ignore[no-untyped-def]
            pass

        async def replies(self):  # type: ignore[no-untyped-def]
            yield None

        async def close(self) -> None:
            pass

    bus = Minimal()
    with pytest.raises(BusError):
        await bus.request(REQ)
    with pytest.raises(BusError):
        await bus.serve_requests(lambda r: None)  # type: ignore[arg-type,return-value]
