"""MCP servers mounted as cardbus tools, through the official ``mcp`` SDK (extra ``mcp``).

:class:`MCPToolset` starts the sessions of some :class:`MCPServer`\\ s (a command
over stdio, or a streamable-HTTP URL), lists each server's tools and registers
each in a :class:`~cardbus.agents.tools.ToolRegistry` as a cardbus ``Tool``;
it is an async context manager, entered when the runtime starts and left when
it stops (``EmbeddedRuntime(..., mcp_servers=...)``, ``NatsRuntime(...,
mcp_servers=...)`` do it)::

    registry = ToolRegistry()
    async with MCPToolset([MCPServer("time", command="uvx", args=("mcp-server-time",))],
                          registry):
        await registry.call("time__get_current_time", {"timezone": "UTC"})

**Names.** Tool ``t`` of server ``s`` is ``s__t``: it fits the tool-name rule
of OpenAI's and Anthropic's APIs (``^[a-zA-Z0-9_-]{1,64}$``), so an LLM agent
can offer it to a model as it is. A server's name has no ``__`` of its own, so
the first ``__`` splits the two. A tool name with other characters (``.``,
``/``) has them replaced by ``_``, and one that had to be changed or
shortened to 64 characters ends in ``_`` and 8 hex digits of a hash of the
original name, so two tools never share a name. An agent's allow-list may
name a server's tools by glob: ``"time__*"`` (``bus.orchestrator.access``).

**Specs.** Each tool's description and input schema are the server's (the
registry checks the arguments against the schema before the call), its
output schema too when it declares one; ``timeout_s`` and ``max_result_bytes``
are the server's settings; ``idempotent`` is the tool's ``idempotentHint`` or
``readOnlyHint`` annotation (hints of the server's author: trust the server,
or leave the hints out of its code).

**Calls.** A call is ``tools/call`` on the server's session with the time limit
``timeout_s`` (the registry's own limit is a second later, as a backstop),
and the call's idempotency key (``current_idempotency_key``) in the
request's ``_meta`` as ``"cardbus/idempotency-key"`` when there is one. The
result is the ``structuredContent`` when the server sends it (FastMCP sends
``{"result": ...}`` for a plain return value), else the content: the text
of a single text block, or a list of the blocks (a text block as its text,
another as its JSON). An ``isError`` result is ``ToolFailed`` with the
error's text; no answer in time is ``ToolTimeout`` (the server may go on
working; the session stays usable); a server that has exited or whose
connection closed is ``ToolFailed`` for this and every later call (a server
is not restarted: restart the runtime).

**Lifecycle.** Each server's session lives in a task of its own, which enters
and leaves the SDK's context managers (the subprocess, its pipes, the HTTP
client), so the runtime may start and stop the toolset from any task. A
server that does not start, or does not list its tools within
``start_timeout_s``, is a ``ConfigError`` naming it (the servers started
already are stopped). Stopping closes the sessions: the SDK closes a
subprocess's stdin, then terminates and kills its process group if it
lingers.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import re
import subprocess
import sys
from collections.abc import Iterable
from typing import Any, TextIO

from opentelemetry import context as otel_context
from opentelemetry import trace

from cardbus.eventstore.errors import MissingExtra

try:
    import httpx2
    import mcp_types
    from mcp import ClientSession, StdioServerParameters, stdio_client
    from mcp.client.streamable_http import streamable_http_client
    from mcp.shared.exceptions import MCPError
except ImportError as e:  # pragma: no cover - the extra is in the dev extra
    raise MissingExtra("mcp", "MCP servers mounted as tools") from e

from cardbus.agents.mcp_config import (
    MCPServer,
    load_mcp_config,
    mcp_servers_of,
    parse_mcp_flag,
    split_plan_servers,
    unique_servers,
)
from cardbus.agents.tools import Tool, ToolRegistry, ToolSpec, current_idempotency_key
from cardbus.eventstore.errors import ConfigError, ToolFailed, ToolTimeout
from cardbus.eventstore.trace_ids import span_id_for

__all__ = [
    "IDEMPOTENCY_META_KEY",
    "MCPServer",
    "MCPToolset",
    "load_mcp_config",
    "mcp_servers_of",
    "mcp_tool_name",
    "mount_mcp",
    "parse_mcp_flag",
    "split_plan_servers",
]

log = logging.getLogger(__name__)

#: the ``_meta`` key of a call's idempotency key
IDEMPOTENCY_META_KEY = "cardbus/idempotency-key"
#: OpenAI's (and Anthropic's) rule for a tool's name
TOOL_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")
_UNSAFE = re.compile(r"[^A-Za-z0-9_-]")
_STOP_GRACE_S = 10.0  # the SDK's own shutdown of a stdio server is bounded to ~6 s
_BACKSTOP_S = 1.0


def mcp_tool_name(server: str, tool: str) -> str:
    """The cardbus name of tool ``tool`` of server ``server``: ``<server>__<tool>``,
    made to fit ``^[a-zA-Z0-9_-]{1,64}$`` (see the module docstring)."""
    name = f"{server}__{_UNSAFE.sub('_', tool)}"
    if name != f"{server}__{tool}" or len(name) > 64 or not tool:
        suffix = "_" + hashlib.sha256(tool.encode()).hexdigest()[:8]
        name = name[: 64 - len(suffix)] + suffix
    return name


class _Connection:
    """One server's session, owned by one task from start to stop."""

    def __init__(self, server: MCPServer, errlog: TextIO | None) -> None:
        self.server = server
        self.errlog = errlog
        self.session: ClientSession | None = None
        self.tools: list[mcp_types.Tool] = []
        self.down = ""  # why calls are refused ("" while it serves)
        self._stop = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    @property
    def what(self) -> str:
        s = self.server
        where = " ".join([s.command or "", *s.args]) if s.command else s.url
        return f"MCP server {s.name!r} ({where})"

    async def start(self) -> None:
        ready: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._task = asyncio.create_task(self._run(ready), name=f"mcp-{self.server.name}")
        try:
            await asyncio.wait_for(asyncio.shield(ready), self.server.start_timeout_s)
        except TimeoutError:
            await self.stop()
            _consume(ready)
            raise ConfigError(
                f"{self.what} did not start and list its tools within"
                f" {self.server.start_timeout_s:g}s"
            ) from None
        except BaseException:
            await self.stop()
            _consume(ready)
            raise

    async def _run(self, ready: asyncio.Future[None]) -> None:
        # the session's own traffic (initialize, tools/list) is not a tool call of any run:
        # an unsampled parent keeps the SDK's spans of it out of the traces (one-span traces
        # otherwise) under the default parent-based sampler
        otel_context.attach(trace.set_span_in_context(_UNSAMPLED))
        try:
            async with contextlib.AsyncExitStack() as stack:
                read, write = await stack.enter_async_context(self._transport(stack))
                session = await stack.enter_async_context(ClientSession(read, write))
                await session.initialize()
                self.tools = await _list_tools(session)
                self.session = session
                ready.set_result(None)
                await self._stop.wait()
        except BaseException as e:
            if not ready.done():
                ready.set_exception(ConfigError(f"{self.what} did not start: {_why(e)}"))
            elif not isinstance(e, asyncio.CancelledError):
                self.down = f"its session failed: {_why(e)}"
                log.warning("%s: %s", self.what, self.down)
            if isinstance(e, (asyncio.CancelledError, KeyboardInterrupt, SystemExit)):
                raise
        finally:
            self.session = None
            self.down = self.down or "it was stopped"
            if not ready.done():
                ready.set_exception(ConfigError(f"{self.what} did not start"))

    def _transport(self, stack: contextlib.AsyncExitStack) -> Any:
        s = self.server
        if s.command is not None:
            params = StdioServerParameters(
                command=s.command, args=list(s.args), env=dict(s.env) or None, cwd=s.cwd
            )
            return stdio_client(params, errlog=_errlog(self.errlog))
        assert s.url is not None
        http = httpx2.AsyncClient(headers=dict(s.headers), timeout=httpx2.Timeout(30.0, read=300.0))
        stack.push_async_callback(http.aclose)
        return streamable_http_client(s.url, http_client=http)

    async def stop(self) -> None:
        self._stop.set()
        task = self._task
        if task is None or task.done():
            return
        if self.session is None:  # still starting: nothing to wind down but the transport
            task.cancel()
        _, pending = await asyncio.wait({task}, timeout=_STOP_GRACE_S)
        if pending:
            task.cancel()
            await asyncio.wait({task})

    async def call(self, cardbus_name: str, tool: str, args: dict[str, Any]) -> Any:
        session = self.session
        if session is None or self.down:
            raise ToolFailed(f"{cardbus_name}: {self.what} is not running: {self.down}")
        key = current_idempotency_key()
        meta: Any = {IDEMPOTENCY_META_KEY: key} if key else None
        timeout = self.server.timeout_s
        try:
            with _under_execute_tool(key):
                result = await session.call_tool(
                    tool, args, read_timeout_seconds=timeout, meta=meta
                )
        except MCPError as e:
            if e.code == mcp_types.REQUEST_TIMEOUT:
                raise ToolTimeout(f"{cardbus_name}: no result within {timeout:g}s") from e
            if e.code == mcp_types.CONNECTION_CLOSED:
                self.down = "its connection closed (the server exited?)"
                raise ToolFailed(f"{cardbus_name}: {self.what}: {self.down}") from e
            raise ToolFailed(f"{cardbus_name}: MCP error {e.code}: {e.message}") from e
        except Exception as e:  # e.g. the session's streams closed under the call
            raise ToolFailed(f"{cardbus_name}: {self.what}: {_why(e)}") from e
        if not isinstance(result, mcp_types.CallToolResult):
            raise ToolFailed(f"{cardbus_name}: unexpected result {type(result).__name__}")
        if result.is_error:
            text = _text(result.content) or "the tool reported an error"
            raise ToolFailed(f"{cardbus_name}: {text}")
        return _value(result)


class MCPToolset:
    """Mount ``servers`` in ``registry`` while entered (``async with``); see the module doc.

    ``errlog``: where stdio servers' stderr goes (a file with a ``fileno``; default
    ``sys.stderr``, or the process's own stderr when ``sys.stderr`` is not a file).
    Entered again after a stop, it starts the servers again and serves the
    same names.
    """

    def __init__(
        self,
        servers: Iterable[MCPServer],
        registry: ToolRegistry | None = None,
        *,
        errlog: TextIO | None = None,
    ) -> None:
        self.servers = unique_servers(servers)
        self.registry = registry if registry is not None else ToolRegistry()
        self.errlog = errlog
        self._connections: dict[str, _Connection] = {}
        self._mounted: dict[str, str] = {}  # cardbus name -> server name

    @property
    def tool_names(self) -> list[str]:
        """The cardbus names of the tools mounted (in the servers' order)."""
        return list(self._mounted)

    async def __aenter__(self) -> MCPToolset:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    async def start(self) -> None:
        if self._connections:
            raise ConfigError("this MCPToolset is started already")
        connections = {s.name: _Connection(s, self.errlog) for s in self.servers}
        results = await asyncio.gather(
            *(c.start() for c in connections.values()), return_exceptions=True
        )
        failed = [r for r in results if isinstance(r, BaseException)]
        if failed:
            await asyncio.gather(*(c.stop() for c in connections.values()))
            raise failed[0]
        self._connections = connections
        try:
            for conn in connections.values():
                self._mount(conn)
        except BaseException:
            await self.stop()
            raise

    async def stop(self) -> None:
        connections, self._connections = self._connections, {}
        await asyncio.gather(*(c.stop() for c in connections.values()))

    def _mount(self, conn: _Connection) -> None:
        server = conn.server
        for t in conn.tools:
            name = mcp_tool_name(server.name, t.name)
            if self._mounted.get(name) == server.name and name in self.registry:
                continue  # mounted by an earlier start: its function finds the new session
            problem = _schema_problem(t.input_schema)
            if problem:
                log.warning("%s: tool %r not mounted: %s", conn.what, t.name, problem)
                continue
            annotations = t.annotations
            spec = ToolSpec(
                name=name,
                description=t.description or (annotations.title if annotations else None) or "",
                input_schema=t.input_schema,
                output_schema=t.output_schema or {},
                timeout_s=server.timeout_s + _BACKSTOP_S,
                max_result_bytes=server.max_result_bytes,
                idempotent=bool(
                    annotations and (annotations.idempotent_hint or annotations.read_only_hint)
                ),
            )
            caller = self._caller(server.name, name, t.name)
            self.registry.register(Tool(spec, caller, review=server.review_of(t.name)))
            self._mounted[name] = server.name

    def _caller(self, server: str, name: str, tool: str) -> Any:
        async def call(args: dict[str, Any]) -> Any:
            conn = self._connections.get(server)
            if conn is None:
                raise ToolFailed(f"{name}: MCP server {server!r} is not running")
            return await conn.call(name, tool, args)

        return call


def mount_mcp(
    registry: ToolRegistry, servers: Iterable[MCPServer], *, errlog: TextIO | None = None
) -> MCPToolset:
    """An :class:`MCPToolset` of ``servers`` over ``registry``: ``async with`` it."""
    return MCPToolset(servers, registry, errlog=errlog)


_UNSAMPLED = trace.NonRecordingSpan(
    trace.SpanContext(trace_id=1, span_id=1, is_remote=False, trace_flags=trace.TraceFlags(0))
)


@contextlib.contextmanager
def _under_execute_tool(key: str) -> Any:
    """Make the journal's ``execute_tool`` span of this call (its id derived from the call's
    ``tool.requested``, the idempotency key) the parent of the ``mcp`` SDK's ``tools/call``
    span, in the run's trace; as is outside a recorded call or a trace."""
    current = trace.get_current_span().get_span_context()
    if not key or not current.is_valid:
        yield
        return
    parent = trace.SpanContext(
        trace_id=current.trace_id,
        span_id=span_id_for(key),
        is_remote=True,
        trace_flags=current.trace_flags,
    )
    token = otel_context.attach(trace.set_span_in_context(trace.NonRecordingSpan(parent)))
    try:
        yield
    finally:
        otel_context.detach(token)


async def _list_tools(session: ClientSession) -> list[mcp_types.Tool]:
    tools: list[mcp_types.Tool] = []
    cursor: str | None = None
    for _ in range(100):  # a server that pages forever cannot hang the start
        params = mcp_types.PaginatedRequestParams(cursor=cursor) if cursor else None
        page = await session.list_tools(params=params)
        tools += page.tools
        cursor = page.next_cursor
        if not cursor:
            break
    return tools


def _schema_problem(schema: Any) -> str:
    if not isinstance(schema, dict):
        return "its input schema is not an object"
    from jsonschema import Draft202012Validator
    from jsonschema.exceptions import SchemaError

    try:
        Draft202012Validator.check_schema(schema)
    except SchemaError as e:
        return f"its input schema is not a valid JSON Schema: {e.message}"
    return ""


def _text(blocks: Iterable[Any]) -> str:
    return "\n".join(b.text for b in blocks if isinstance(b, mcp_types.TextContent))


def _value(result: mcp_types.CallToolResult) -> Any:
    if result.structured_content is not None:
        return result.structured_content
    blocks = result.content
    if len(blocks) == 1 and isinstance(blocks[0], mcp_types.TextContent):
        return blocks[0].text
    return [
        b.text
        if isinstance(b, mcp_types.TextContent)
        else b.model_dump(mode="json", by_alias=True, exclude_none=True)
        for b in blocks
    ]


def _errlog(given: TextIO | None) -> Any:
    """Where a stdio server's stderr goes: ``given``, else ``sys.stderr`` if it is a real
    file (a test runner's or a CLI runner's stand-in is not), else the process's own
    stderr, else nowhere."""
    for f in (given, sys.stderr, sys.__stderr__):
        if f is None:
            continue
        try:
            f.fileno()
        except (OSError, ValueError, AttributeError):
            continue
        return f
    return subprocess.DEVNULL


def _consume(future: asyncio.Future[None]) -> None:
    """Mark a start's outcome as seen (no "exception was never retrieved" at exit)."""
    if future.done() and not future.cancelled():
        future.exception()


def _why(e: BaseException) -> str:
    if isinstance(e, BaseExceptionGroup):
        return "; ".join(_why(x) for x in e.exceptions)
    if isinstance(e, MCPError):
        return f"MCP error {e.code}: {e.message}"
    return f"{type(e).__name__}: {e}" if str(e) else type(e).__name__
