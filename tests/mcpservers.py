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
* ``big(n)`` -> ``n`` characters.
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

from cardbus.agents.mcp_config import MCPServer

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

    if len(sys.argv) == 3 and sys.argv[1] == "--http":
        server.run("streamable-http", host="127.0.0.1", port=int(sys.argv[2]))
    else:
        server.run()


if __name__ == "__main__":
    main()
