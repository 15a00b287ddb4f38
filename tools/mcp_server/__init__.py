"""``cardbus mcp serve``: cardbus as an MCP server (the ``mcp`` extra).

:mod:`.service` is what the tools do (the console's library calls),
:mod:`.server` the MCP server over it, :mod:`.who` who a request is.
"""

from __future__ import annotations

from cardbus.tools.mcp_server.server import build_server, serve_http, serve_stdio
from cardbus.tools.mcp_server.service import RunService
from cardbus.tools.mcp_server.who import actor_of, guarded, local_actor

__all__ = [
    "RunService",
    "actor_of",
    "build_server",
    "guarded",
    "local_actor",
    "serve_http",
    "serve_stdio",
]
