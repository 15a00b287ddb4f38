"""Agents, servers and client helpers for the A2A tests (loopback only, free ports).

The ``cardbus a2a serve`` subprocesses import the agents from here
(``--agent a2a_support:Slow``, with this folder on PYTHONPATH).
"""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import msgspec
from a2a.client import A2ACardResolver, Client, ClientConfig, ClientFactory
from a2a.server.agent_execution import AgentExecutor, RequestContext
from a2a.server.events.event_queue_v2 import EventQueue
from a2a.server.request_handlers import DefaultRequestHandler
from a2a.server.routes import create_agent_card_routes, create_jsonrpc_routes
from a2a.server.tasks import InMemoryTaskStore, TaskUpdater
from a2a.types import AgentCard as PbAgentCard
from a2a.types import (
    Message,
    Part,
    Role,
    SendMessageRequest,
    StreamResponse,
    Task,
    TaskState,
    TaskStatus,
)
from google.protobuf import struct_pb2
from google.protobuf.json_format import ParseDict

from cardbus.agents.agent import Agent, Capability, NeedsInput, TaskContext
from cardbus.agents.cards import TaskCard
from cardbus.agents.llm_agent import LLMAgent

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[2]


# -- cardbus agents the served orchestrator runs --------------------------------------


class SlowIn(msgspec.Struct):
    text: str
    seconds: float = 0.0


class Text(msgspec.Struct):
    text: str


class Slow(Agent):
    agent_id = "slow"
    description = "Upper-cases a text after a while."
    capabilities = [Capability("shout", SlowIn, Text, "upper-case a text")]

    async def handle(self, task: TaskCard, inputs: SlowIn, ctx: TaskContext) -> Text:
        await asyncio.sleep(inputs.seconds)
        return Text(text=inputs.text.upper())


class AskIn(msgspec.Struct):
    topic: str


class Answer(msgspec.Struct):
    topic: str
    colour: Any


class Asker(Agent):
    agent_id = "asker"
    description = "Asks the user for a colour."
    capabilities = [Capability("ask", AskIn, Answer, "ask the user something")]

    async def handle(self, task: TaskCard, inputs: AskIn, ctx: TaskContext) -> Answer:
        if task.supplement is None:
            raise NeedsInput("which colour?", "user_input", {"topic": inputs.topic})
        return Answer(topic=inputs.topic, colour=task.supplement)


class Brief(msgspec.Struct):
    title: str
    points: list[str]


class Briefer(LLMAgent):
    """An LLM agent: what answers it is the model the server was given."""

    agent_id = "briefer"
    description = "Writes a brief on a topic."
    capability = "brief"
    input_type = AskIn
    output_type = Brief
    instructions = "Write a brief of three points."


def plan(tasks: list[dict[str, Any]], goal: str = "test", **extra: Any) -> dict[str, Any]:
    return {"goal": goal, "tasks": tasks, **extra}


# -- processes and ports ---------------------------------------------------------------


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class ServeProcess:
    """``cardbus a2a serve`` in a real subprocess, on a free port, over a SQLite file."""

    def __init__(
        self, db: Path, agents: list[str], port: int | None = None, extra: tuple[str, ...] = ()
    ) -> None:
        self.db = db
        self.agents = agents
        self.extra = list(extra)  # more options: --token, --public-url, ...
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}/"
        self.proc: subprocess.Popen[bytes] | None = None
        self.log = db.with_suffix(f".{self.port}.log")

    def start(self, timeout: float = 30.0) -> ServeProcess:
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(HERE), str(ROOT)])}
        env.pop("CARDBUS_A2A_TOKEN", None)
        env.pop("CARDBUS_A2A_TOKEN_FILE", None)
        cmd = [sys.executable, "-m", "cardbus.tools", "a2a", "serve"]
        cmd += ["--db", str(self.db), "--port", str(self.port)]
        for a in self.agents:
            cmd += ["--agent", a]
        cmd += self.extra
        with self.log.open("ab") as out:
            self.proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited: {self.log.read_text()}")
            try:
                r = httpx.get(self.url + ".well-known/agent-card.json", timeout=1)
                if r.status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        raise RuntimeError(f"server did not come up: {self.log.read_text()}")

    def kill(self) -> None:
        """SIGKILL: no shutdown at all, as a crash."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(10)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.kill()


@asynccontextmanager
async def a2a_client(url: str, streaming: bool = True) -> AsyncIterator[Client]:
    async with httpx.AsyncClient(timeout=30) as http:
        card = await A2ACardResolver(http, url).get_agent_card()
        client = ClientFactory(ClientConfig(streaming=streaming, httpx_client=http)).create(card)
        yield client


def data_message(value: Any, task_id: str = "", message_id: str | None = None) -> Message:
    msg = Message(
        role=Role.ROLE_USER,
        message_id=message_id or f"m-{time.time_ns()}",
        parts=[Part(data=ParseDict(value, struct_pb2.Value()))],
    )
    if task_id:
        msg.task_id = task_id
    return msg


def text_message(text: str, task_id: str = "") -> Message:
    msg = Message(role=Role.ROLE_USER, message_id=f"m-{time.time_ns()}", parts=[Part(text=text)])
    if task_id:
        msg.task_id = task_id
    return msg


async def collect(client: Client, request: SendMessageRequest) -> list[StreamResponse]:
    return [r async for r in client.send_message(request)]


# -- an a2a-sdk agent (not cardbus) ------------------------------------------------------


class EchoExecutor(AgentExecutor):
    """Upper-cases the text it gets; "fail" fails the task; records the traceparents seen."""

    def __init__(self) -> None:
        self.traceparents: list[str] = []
        self.messages: list[Message] = []

    async def execute(self, context: RequestContext, event_queue: EventQueue) -> None:
        headers = context.call_context.state.get("headers", {})
        self.traceparents.append(headers.get("traceparent", ""))
        assert context.message is not None
        self.messages.append(context.message)
        task_id, context_id = context.task_id or "", context.context_id or ""
        submitted = TaskStatus(state=TaskState.TASK_STATE_SUBMITTED)
        await event_queue.enqueue_event(
            Task(id=task_id, context_id=context_id, status=submitted, history=[context.message])
        )
        updater = TaskUpdater(event_queue, task_id, context_id)
        await updater.start_work()
        text = context.get_user_input()
        if text == "fail":
            await updater.failed(updater.new_agent_message([Part(text="asked to fail")]))
            return
        await updater.add_artifact([Part(text=text.upper())], name="shout")
        await updater.complete()

    async def cancel(self, context: RequestContext, event_queue: EventQueue) -> None:
        raise NotImplementedError


ECHO_CARD: dict[str, Any] = {
    "name": "Echo Agent",
    "description": "Shouts back",
    "version": "1.0.0",
    "capabilities": {"streaming": True},
    "defaultInputModes": ["text/plain"],
    "defaultOutputModes": ["text/plain"],
    "skills": [
        {
            "id": "echo",
            "name": "Echo",
            "description": "upper-case a text",
            "tags": ["text"],
        }
    ],
}


@asynccontextmanager
async def echo_server() -> AsyncIterator[tuple[str, EchoExecutor]]:
    """An a2a-sdk server (DefaultRequestHandler, in-memory task store) on a free port."""
    import uvicorn
    from starlette.applications import Starlette

    port = free_port()
    url = f"http://127.0.0.1:{port}/"
    doc = {
        **ECHO_CARD,
        "supportedInterfaces": [
            {"url": url, "protocolBinding": "JSONRPC", "protocolVersion": "1.0"}
        ],
    }
    card = ParseDict(doc, PbAgentCard())
    executor = EchoExecutor()
    handler = DefaultRequestHandler(executor, InMemoryTaskStore(), card)
    app = Starlette(
        routes=[*create_agent_card_routes(card), *create_jsonrpc_routes(handler, rpc_url="/")]
    )
    server = uvicorn.Server(
        uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", lifespan="off")
    )
    task = asyncio.create_task(server.serve())
    while not server.started:
        if task.done():
            task.result()
        await asyncio.sleep(0.02)
    try:
        yield url, executor
    finally:
        server.should_exit = True
        await task
