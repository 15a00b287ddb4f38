"""The MCP server options every command that runs an orchestrator shares.

``@mcp_options`` adds ``--mcp NAME=COMMAND [ARG...]`` / ``--mcp NAME=URL``
(repeatable) and ``--mcp-config FILE`` (the ``{"mcpServers": {...}}`` file
Claude Desktop and Cursor use; repeatable); :func:`mcp_servers` turns them
into the ``MCPServer`` list a runtime mounts (``cardbus.agents.mcp_config``).
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any, TypeVar

import click

if TYPE_CHECKING:
    from cardbus.agents.mcp_config import MCPServer

__all__ = ["mcp_options", "mcp_servers"]

F = TypeVar("F", bound=Callable[..., Any])


def mcp_options(f: F) -> F:
    """Add ``--mcp`` and ``--mcp-config`` (keyword arguments ``mcp``, ``mcp_config``)."""
    f = click.option(
        "--mcp-config",
        "mcp_config",
        multiple=True,
        type=click.Path(exists=True, dir_okay=False),
        help='MCP servers to mount as tools, from a {"mcpServers": {...}} JSON file'
        " (the Claude Desktop / Cursor format); repeatable.",
    )(f)
    f = click.option(
        "--mcp",
        "mcp",
        multiple=True,
        metavar="NAME=COMMAND...|NAME=URL",
        help="An MCP server to mount as tools NAME__<tool>: a command run over stdio"
        " (split as a shell would) or a streamable-HTTP URL; repeatable.",
    )(f)
    return f


def mcp_servers(
    mcp: Iterable[str] = (), mcp_config: Iterable[str] = (), more: Iterable[MCPServer] = ()
) -> list[MCPServer]:
    """The servers the flags name, then ``more`` (e.g. a plan file's); a name given twice
    is a ``ConfigError``; servers without the ``mcp`` extra installed: ``MissingExtra``."""
    from cardbus.agents.mcp_config import load_mcp_config, parse_mcp_flag, unique_servers

    servers = [parse_mcp_flag(m) for m in mcp]
    for path in mcp_config:
        servers += load_mcp_config(path)
    servers = unique_servers([*servers, *more])
    if servers and importlib.util.find_spec("mcp") is None:
        from cardbus.eventstore.errors import MissingExtra

        raise MissingExtra("mcp", "MCP servers mounted as tools")
    return servers
