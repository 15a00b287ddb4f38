"""Which MCP servers to mount as tools: :class:`MCPServer` and the config formats.

This module needs nothing beyond cardbus itself, so a command line can read
its flags and files without the MCP SDK; running the servers is
:mod:`cardbus.agents.mcp` (the ``mcp`` extra).

The config file is the ``mcpServers`` format Claude Desktop and Cursor use::

    {"mcpServers": {
        "time": {"command": "uvx", "args": ["mcp-server-time"], "env": {"TZ": "UTC"}},
        "docs": {"url": "https://example.org/mcp", "headers": {"Authorization": "Bearer ${TOKEN}"}}
    }}

An entry runs a command over stdio (``command``, ``args``, ``env``, ``cwd``) or
speaks streamable HTTP to ``url`` (with ``headers``). ``type`` may say which
(``stdio``, ``http``, ``streamable-http``, ``streamableHttp``); ``sse`` (the old
HTTP transport) is refused. ``"disabled": true`` leaves an entry out, and other
keys the clients add are ignored. cardbus reads four more keys per entry:
``timeout_s`` (a call's time limit), ``max_result_bytes`` (a result's size limit),
``start_timeout_s`` (for the server to start and list its tools) and ``review``
(which calls wait for a person's review before they run: ``"always"`` for every tool
of the server, or ``{"tool": "always"}`` naming tools as the server names them;
``bus.orchestrator.reviews``).
``${VAR}`` (or ``${VAR:-default}``) in a string is the environment variable
``VAR``, so a secret need not be written in the file; an unset one without a
default is a ``ConfigError``.

A plan file may carry the same mapping under ``"mcp_servers"`` (without the
``mcpServers`` level): ``cardbus run`` mounts them for that run and strips the
key before the plan is read, so the log never holds the servers' secrets.
"""

from __future__ import annotations

import math
import os
import re
import shlex
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec

from cardbus.eventstore.errors import ConfigError

__all__ = [
    "MCPServer",
    "load_mcp_config",
    "mcp_servers_of",
    "parse_mcp_flag",
    "split_plan_servers",
    "unique_servers",
]

#: a server's name: letters, digits, ``-`` and single inner ``_`` (no ``__``, which joins
#: a server's name to its tools' names, and no leading or trailing ``_``)
SERVER_NAME = re.compile(r"[A-Za-z0-9-]+(?:_[A-Za-z0-9-]+)*")
MAX_SERVER_NAME = 32

_TYPES = {"stdio": "stdio", "http": "http", "streamable-http": "http", "streamableHttp": "http"}
_VAR = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}")


@dataclass(frozen=True)
class MCPServer:
    """One MCP server to mount: a command over stdio, or a streamable-HTTP ``url``.

    Its tools are registered as ``<name>__<tool>`` (see ``cardbus.agents.mcp``),
    each with ``timeout_s`` and ``max_result_bytes``; ``start_timeout_s`` bounds
    starting it and listing its tools. Checked when made (``ConfigError``).
    """

    name: str
    command: str | None = None
    args: tuple[str, ...] = ()
    env: Mapping[str, str] = field(default_factory=dict)
    cwd: str | None = None
    url: str | None = None
    headers: Mapping[str, str] = field(default_factory=dict)
    timeout_s: float = 30.0
    max_result_bytes: int = 64 * 1024
    start_timeout_s: float = 30.0
    #: the review policy of its tools (``Tool.review``): one for all of them ("always",
    #: "never"), or by the tool's own name (a policy: "always", "never" or a function of
    #: the arguments; a tool not named: "never")
    review: Any = "never"

    def __post_init__(self) -> None:
        me = f"MCP server {self.name!r}"
        policies = self.review.values() if isinstance(self.review, Mapping) else [self.review]
        for policy in policies:
            if policy not in ("always", "never") and not callable(policy):
                raise ConfigError(
                    f"{me}: review is 'always', 'never' or an object of tool: 'always' |"
                    f" 'never'; got {self.review!r}"
                )
        if isinstance(self.review, Mapping):
            object.__setattr__(self, "review", dict(self.review))
        if (
            not isinstance(self.name, str)
            or not SERVER_NAME.fullmatch(self.name)
            or len(self.name) > MAX_SERVER_NAME
        ):
            raise ConfigError(
                f"{me}: a server's name is 1-{MAX_SERVER_NAME} letters, digits, '-' and single"
                " inner '_' (its tools are named <server>__<tool>)"
            )
        if (self.command is None) == (self.url is None):
            raise ConfigError(f"{me}: give a command (stdio) or a url (streamable HTTP), not both")
        if self.command is not None and (not isinstance(self.command, str) or not self.command):
            raise ConfigError(f"{me}: command must be a non-empty string")
        if self.url is not None and (
            not isinstance(self.url, str) or not self.url.startswith(("http://", "https://"))
        ):
            raise ConfigError(f"{me}: url must be an http:// or https:// URL; got {self.url!r}")
        object.__setattr__(self, "args", tuple(_strings(me, "args", self.args)))
        object.__setattr__(self, "env", _string_map(me, "env", self.env))
        object.__setattr__(self, "headers", _string_map(me, "headers", self.headers))
        if self.cwd is not None and not isinstance(self.cwd, str):
            raise ConfigError(f"{me}: cwd must be a string")
        for key in ("timeout_s", "start_timeout_s"):
            t = getattr(self, key)
            if isinstance(t, bool) or not isinstance(t, (int, float)) or not 0 < t < math.inf:
                raise ConfigError(f"{me}: {key} must be a finite number > 0; got {t!r}")
        n = self.max_result_bytes
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise ConfigError(f"{me}: max_result_bytes must be an integer >= 1; got {n!r}")

    def review_of(self, tool: str) -> Any:
        """The review policy of its tool ``tool`` (as the server names it)."""
        if isinstance(self.review, Mapping):
            return self.review.get(tool, "never")
        return self.review

    @property
    def transport(self) -> str:
        """``"stdio"`` or ``"http"``."""
        return "stdio" if self.command is not None else "http"

    @classmethod
    def from_entry(
        cls, name: str, entry: Mapping[str, Any], environ: Mapping[str, str] | None = None
    ) -> MCPServer:
        """One entry of the ``mcpServers`` format (``${VAR}`` from ``environ``, default
        ``os.environ``)."""
        me = f"MCP server {name!r}"
        if not isinstance(entry, Mapping):
            raise ConfigError(f"{me}: an entry is an object, not {type(entry).__name__}")
        env = os.environ if environ is None else environ
        e = {k: _expand(me, v, env) for k, v in entry.items()}
        kind = e.get("type")
        if kind is not None:
            if kind == "sse":
                raise ConfigError(f"{me}: the SSE transport is not supported; use streamable HTTP")
            if kind not in _TYPES:
                raise ConfigError(f"{me}: unknown type {kind!r} (one of {', '.join(_TYPES)})")
            if _TYPES[kind] == "stdio" and "command" not in e:
                raise ConfigError(f"{me}: type {kind!r} needs a command")
            if _TYPES[kind] == "http" and "url" not in e:
                raise ConfigError(f"{me}: type {kind!r} needs a url")
        settings = {
            k: e[k]
            for k in ("timeout_s", "max_result_bytes", "start_timeout_s", "cwd", "review")
            if k in e and e[k] is not None
        }
        return cls(
            name,
            command=e.get("command"),
            args=e.get("args") or (),
            env=e.get("env") or {},
            url=e.get("url"),
            headers=e.get("headers") or {},
            **settings,
        )


def mcp_servers_of(
    servers: Mapping[str, Any], environ: Mapping[str, str] | None = None
) -> list[MCPServer]:
    """The servers of a ``{name: entry}`` mapping (the inside of ``mcpServers``),
    leaving out the entries marked ``"disabled": true``."""
    if not isinstance(servers, Mapping):
        raise ConfigError(f"MCP servers are an object of name: entry, not {type(servers).__name__}")
    return [
        MCPServer.from_entry(str(name), entry, environ)
        for name, entry in servers.items()
        if not (isinstance(entry, Mapping) and entry.get("disabled") is True)
    ]


def load_mcp_config(
    path: str | os.PathLike[str], environ: Mapping[str, str] | None = None
) -> list[MCPServer]:
    """The servers of a config file: ``{"mcpServers": {name: entry, ...}}``."""
    try:
        data = msgspec.json.decode(Path(path).read_bytes())
    except OSError as e:
        raise ConfigError(f"cannot read the MCP config {str(path)!r}: {e}") from e
    except msgspec.DecodeError as e:
        raise ConfigError(f"the MCP config {str(path)!r} is not JSON: {e}") from e
    if not isinstance(data, dict) or not isinstance(data.get("mcpServers"), dict):
        raise ConfigError(f'the MCP config {str(path)!r} must be {{"mcpServers": {{name: ...}}}}')
    return mcp_servers_of(data["mcpServers"], environ)


def parse_mcp_flag(text: str) -> MCPServer:
    """``NAME=COMMAND ARG...`` (split as a shell would) or ``NAME=URL`` (http/https)."""
    name, sep, rest = text.partition("=")
    if not sep or not rest.strip():
        raise ConfigError(f"--mcp {text!r}: give NAME=COMMAND [ARG...] or NAME=URL")
    rest = rest.strip()
    if rest.startswith(("http://", "https://")):
        return MCPServer(name.strip(), url=rest)
    try:
        words = shlex.split(rest)
    except ValueError as e:
        raise ConfigError(f"--mcp {text!r}: {e}") from e
    return MCPServer(name.strip(), command=words[0], args=tuple(words[1:]))


def split_plan_servers(
    data: bytes, environ: Mapping[str, str] | None = None
) -> tuple[bytes, list[MCPServer]]:
    """A plan file's JSON without its ``"mcp_servers"``, and those servers.

    Anything that is not a JSON object comes back as it is, for the plan decoder
    to refuse with its own message.
    """
    try:
        doc = msgspec.json.decode(data)
    except (msgspec.DecodeError, RecursionError):
        return data, []
    if not isinstance(doc, dict) or "mcp_servers" not in doc:
        return data, []
    servers = mcp_servers_of(doc.pop("mcp_servers") or {}, environ)
    return msgspec.json.encode(doc), servers


def unique_servers(servers: Iterable[MCPServer]) -> list[MCPServer]:
    """``servers``, refusing two of one name (``ConfigError``)."""
    out: dict[str, MCPServer] = {}
    for s in servers:
        if s.name in out:
            raise ConfigError(f"MCP server {s.name!r} is configured twice")
        out[s.name] = s
    return list(out.values())


def _expand(me: str, value: Any, environ: Mapping[str, str]) -> Any:
    if isinstance(value, str):

        def var(m: re.Match[str]) -> str:
            name, default = m.group(1), m.group(2)
            if name in environ:
                return environ[name]
            if default is not None:
                return default
            raise ConfigError(f"{me}: ${{{name}}} is not set in the environment")

        return _VAR.sub(var, value)
    if isinstance(value, list):
        return [_expand(me, v, environ) for v in value]
    if isinstance(value, dict):
        return {k: _expand(me, v, environ) for k, v in value.items()}
    return value


def _strings(me: str, key: str, values: Any) -> list[str]:
    if isinstance(values, str) or not isinstance(values, (list, tuple)):
        raise ConfigError(f"{me}: {key} must be a list of strings")
    if not all(isinstance(v, str) for v in values):
        raise ConfigError(f"{me}: {key} must be a list of strings")
    return list(values)


def _string_map(me: str, key: str, values: Any) -> dict[str, str]:
    if not isinstance(values, Mapping) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in values.items()
    ):
        raise ConfigError(f"{me}: {key} must be an object of strings")
    return dict(values)
