"""What the runtimes share of MCP servers: start their toolset when they start."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from cardbus.agents.mcp_config import MCPServer
from cardbus.agents.tools import ToolRegistry

__all__ = ["start_mcp"]


async def start_mcp(servers: Sequence[MCPServer], tools: ToolRegistry) -> Any:
    """The started ``MCPToolset`` of ``servers`` over ``tools``, or None when there are
    none: the SDK (the ``mcp`` extra) is imported only when a server is configured.
    The caller stops it (``await toolset.stop()``) when the runtime stops."""
    if not servers:
        return None
    from cardbus.agents.mcp import MCPToolset

    toolset = MCPToolset(servers, tools)
    await toolset.start()
    return toolset
