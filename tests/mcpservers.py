"""A real MCP server for the tests, written with the SDK's ``MCPServer`` (FastMCP).

Run as a script it serves over stdio (or streamable HTTP on 127.0.0.1 with
``--http PORT``); imported, :func:`stdio_server` and :func:`http_server` give
the cardbus ``MCPServer`` config that starts it. Its tools:

* ``echo(text)`` -> ``{"result": text}`` (read-only);
* ``add(a, b)`` -> ``{"sum": a + b}`` (structured, idempotent);
* ``plain(n)`` -> the text ``n=<n>`` (no structured content);
* ``fail(why)`` -> an ``isError`` result saying ``why``;
* ``hang()`` never answers;
* ``exit()`` ends the server process at once (exit code 3);
* ``count()`` appends the call's idempotency key (``_meta``) as a line to the
  file ``$MCP_COUNT_FILE``: the test reads what the server really did;
* ``big(n)`` -> ``n`` characters;
* ``pid()`` -> the server's process id.

:class:`Asker` is a plain cardbus agent that uses them through ``ctx.tool``
(importable as ``mcpservers:Asker`` for ``cardbus run``); :class:`Adder` is an LLM agent
whose model may call ``calc__add`` (the server mounted as ``calc``).
"""

import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import msgspec

# imported now, at collection: the SDK then owns the module name `mcp` even in a checkout
# whose folder is named mcp (pytest imports the root __init__.py under the folder's name)
import cardbus.agents.mcp  # noqa: F401
from cardbus.agents import LLMAgent
from cardbus.agents.agent import Agent, Capability, TaskContext
from cardbus.agents.cards import AgentConstraints, TaskCard
from cardbus.agents.mcp_config import MCPServer
from cardbus.eventstore.errors import CardbusError

SCRIPT = str(Path(__file__).resolve())


def stdio_server(name: str = "t", count_file: str | Path | None = None, **kw: Any) -> MCPServer:
    env = {"MCP_COUNT_FILE": str(count_file)} if count_file else {}
    return MCPServer(name, command=sys.executable, args=(SCRIPT,), env=env, **kw)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextmanager
def http_server(name: str = "h", **kw: Any) -> Iterator[MCPServer]:
    """This server on streamable HTTP (a subprocess on a free loopback port), killed after."""
    port = free_port()
    proc = subprocess.Popen([sys.executable, SCRIPT, "--http", str(port)])
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError("the HTTP MCP server did not start") from None
                time.sleep(0.05)
        yield MCPServer(name, url=f"http://127.0.0.1:{port}/mcp", **kw)
    finally:
        proc.kill()
        proc.wait(30)


class Ask(msgspec.Struct, frozen=True):
    text: str
    hang: bool = False  # also call t__hang (a server with a short timeout_s)


class Asker(Agent):
    """Calls t__echo and t__add, then (each caught, named in the output) t__hang when asked,
    t__add again, and u__echo, which its allow-list (``t__*``) does not name."""

    agent_id = "mcp-asker"
    capabilities = [Capability("ask", Ask, dict)]
    constraints = AgentConstraints(tools=["t__*"])

    async def handle(self, task: TaskCard, inputs: Ask, ctx: TaskContext) -> dict[str, Any]:
        out: dict[str, Any] = {
            "echo": await ctx.tool("t__echo", text=inputs.text),
            "add": await ctx.tool("t__add", a=2, b=3),
        }
        calls: list[tuple[str, str, dict[str, Any]]] = [("after", "t__add", {"a": 1, "b": 1})]
        if inputs.hang:
            calls.insert(0, ("hang", "t__hang", {}))
        calls.append(("other", "u__echo", {"text": "x"}))
        for label, name, args in calls:
            try:
                out[label] = await ctx.tool(name, **args)
            except CardbusError as e:
                out[label] = {"error": type(e).__name__}
        return out


class Question(msgspec.Struct):
    question: str


class Total(msgspec.Struct):
    answer: str
    total: int


class Adder(LLMAgent):
    agent_id = "adder"
    description = "Answers sums with the calc MCP server's add tool."
    capability = "calculate"
    input_type = Question
    output_type = Total
    instructions = "Use the add tool; answer with the total."
    tools = ("calc__add",)


def main() -> None:
    import anyio
    from mcp.server.mcpserver import Context
    from mcp.server.mcpserver import MCPServer as FastMCP
    from mcp.server.mcpserver.exceptions import ToolError
    from mcp.types import ToolAnnotations

    server = FastMCP("cardbus-test")

    @server.tool(annotations=ToolAnnotations(read_only_hint=True))
    def echo(text: str) -> str:
        """Say the text back."""
        return text

    @server.tool(annotations=ToolAnnotations(idempotent_hint=True))
    def add(a: int, b: int) -> dict[str, int]:
        """Add two integers."""
        return {"sum": a + b}

    @server.tool(structured_output=False)
    def plain(n: int) -> str:
        return f"n={n}"

    @server.tool()
    def fail(why: str) -> str:
        raise ToolError(why)

    @server.tool()
    async def hang() -> str:
        await anyio.sleep(3600)
        return ""

    @server.tool()
    def exit() -> str:
        os._exit(3)

    @server.tool()
    def count(ctx: Context) -> str:
        meta = ctx.request_context.meta or {}
        key = str(meta.get("cardbus/idempotency-key", ""))
        with open(os.environ["MCP_COUNT_FILE"], "a") as f:
            f.write(key + "\n")
        return key

    @server.tool()
    def big(n: int) -> str:
        return "x" * n

    @server.tool()
    def pid() -> int:
        return os.getpid()

    if len(sys.argv) == 3 and sys.argv[1] == "--http":
        server.run("streamable-http", host="127.0.0.1", port=int(sys.argv[2]))
    else:
        server.run()


if __name__ == "__main__":
    main()
