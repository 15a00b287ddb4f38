"""The MCP server (the official ``mcp`` SDK's ``MCPServer``) over a :class:`RunService`.

Tools: ``start_run``, ``list_runs``, ``run_status``, ``replay``, ``waiting``,
``approve``, ``deny``, ``cancel_run``, ``fork``, ``rerun``. Resources:
``cardbus://runs`` (the newest runs), ``cardbus://runs/{root_id}`` (a run's
status, result and cost), ``cardbus://tasks/{task_id}`` (a task's row, steps
and calls) and ``cardbus://tasks/{task_id}/replay`` (its timeline as text).

Served over stdio (:func:`serve_stdio`: a desktop client starts ``cardbus mcp
serve`` itself) or streamable HTTP (:func:`serve_http`: behind the doors'
lock, :func:`.who.guarded`). What a tool writes is signed with the caller
(:func:`.who.actor_of`): the token's name over HTTP, ``local:<user>`` over stdio.
"""

from __future__ import annotations

import socket
from collections.abc import Awaitable, Mapping
from typing import Any, TypeVar

from cardbus.eventstore.errors import CardbusError, MissingExtra
from cardbus.tools.mcp_server.service import RunService
from cardbus.tools.mcp_server.who import actor_of, guarded

try:
    from mcp.server.mcpserver import Context, MCPServer
    from mcp.server.mcpserver.exceptions import ResourceError, ToolError
except ImportError as e:  # pragma: no cover - the extra is in the dev extra
    raise MissingExtra("mcp", "the MCP server") from e

__all__ = ["build_server", "serve_http", "serve_stdio"]

INSTRUCTIONS = (
    "cardbus runs multi-agent work from an append-only log. Start a run from a goal or a"
    " plan (start_run), follow it (run_status with wait_s, replay), answer the tasks that"
    " wait for a person (waiting, approve, deny, review, answer_question), cancel, fork or"
    " re-run. Ids may be given as a unique prefix."
)


T = TypeVar("T")


async def _tool(work: Awaitable[T]) -> T:
    """A refusal (bad input, a state the call does not fit) is the tool's error result
    with the reason; anything else is the SDK's unexpected error (logged)."""
    try:
        return await work
    except (CardbusError, ValueError) as e:  # ConfigError is a ValueError
        raise ToolError(f"{type(e).__name__}: {e}") from e


async def _resource(work: Awaitable[T]) -> T:
    try:
        return await work
    except (CardbusError, ValueError) as e:
        raise ResourceError(f"{type(e).__name__}: {e}") from e


def _actor(ctx: Context) -> str:
    request = ctx.request_context.request  # the HTTP request; None over stdio
    return actor_of(getattr(request, "scope", None))


def build_server(service: RunService) -> MCPServer:
    """The MCP server whose tools and resources call ``service`` (opened by the caller)."""
    mcp: MCPServer = MCPServer("cardbus", instructions=INSTRUCTIONS, log_level="WARNING")

    @mcp.tool()
    async def start_run(
        ctx: Context, goal: str | None = None, plan: dict[str, Any] | str | None = None
    ) -> dict[str, Any]:
        """Start a run: a goal (text, planned into tasks over the server's agents) or a plan
        (a cardbus plan, JSON object or text); one of them. Returns its root_id."""
        return await _tool(service.start(_actor(ctx), goal, plan))

    @mcp.tool()
    async def list_runs(
        status: str | None = None,
        text: str | None = None,
        plan: str | None = None,
        agent: str | None = None,
        limit: int = 20,
        offset: int = 0,
    ) -> dict[str, Any]:
        """The runs, newest first: status (running, awaiting_approval, completed, failed,
        halted), a piece of the goal (text), of the plan id, or an agent that worked on it."""
        return await _tool(service.runs(status, text, plan, agent, limit, offset))

    @mcp.tool()
    async def run_status(run: str, wait_s: float = 0.0) -> dict[str, Any]:
        """A run's status, result (each completed task's output) and cost in USD. wait_s:
        first wait up to that many seconds while the run is running."""
        return await _tool(service.status(run, wait_s))

    @mcp.tool()
    async def replay(task: str) -> str:
        """The timeline of a task or a run (its root id), as `cardbus replay` prints it."""
        return await _tool(service.replay_text(task))

    @mcp.tool()
    async def waiting(run: str | None = None) -> dict[str, Any]:
        """The tasks waiting for a person's answer (approve or deny), of one run if given."""
        return await _tool(service.waiting(run))

    @mcp.tool()
    async def approve(ctx: Context, task: str, note: str = "") -> dict[str, Any]:
        """Approve a task waiting for approval (it runs)."""
        return await _tool(service.answer(_actor(ctx), task, True, note))

    @mcp.tool()
    async def deny(ctx: Context, task: str, note: str = "") -> dict[str, Any]:
        """Deny a task waiting for approval (it is cancelled, and what depends on it)."""
        return await _tool(service.answer(_actor(ctx), task, False, note))

    @mcp.tool()
    async def review(
        ctx: Context,
        task: str,
        decision: str,
        arguments: dict[str, Any] | None = None,
        reason: str = "",
        call: str = "",
    ) -> dict[str, Any]:
        """Answer a tool call held for review: approve, edit (with the arguments the tool
        runs with, checked against its schema) or refuse (with a reason the model gets)."""
        work = service.review(_actor(ctx), task, decision, arguments, reason, call)
        return await _tool(work)

    @mcp.tool()
    async def answer_question(
        ctx: Context, task: str, answer: Any = None, use_default: bool = False
    ) -> dict[str, Any]:
        """Answer a question an agent asked a person (``waiting`` shows it, with the JSON
        Schema of the answer): refused naming the field when the answer does not fit."""
        return await _tool(service.answer_question(_actor(ctx), task, answer, use_default))

    @mcp.tool()
    async def cancel_run(ctx: Context, run: str, note: str = "") -> dict[str, Any]:
        """Cancel a run and every task of it not yet ended."""
        return await _tool(service.cancel(_actor(ctx), run, note))

    @mcp.tool()
    async def fork(
        ctx: Context,
        task: str,
        at: str | None = None,
        inputs: dict[str, Any] | None = None,
        model: str | None = None,
    ) -> dict[str, Any]:
        """A new run from a task of an earlier one (as `cardbus fork`): what completed before
        it is reused; at: an event id to fork from; inputs or model override the task's."""
        return await _tool(service.fork(_actor(ctx), task, at, inputs, model))

    @mcp.tool()
    async def rerun(ctx: Context, task: str, model: str | None = None) -> dict[str, Any]:
        """Re-run a failed task as a new run (as `cardbus rerun`), reusing what completed."""
        return await _tool(service.rerun(_actor(ctx), task, model))

    @mcp.resource("cardbus://runs", mime_type="application/json")
    async def runs_resource() -> dict[str, Any]:
        """The newest runs."""
        return await _resource(service.runs())

    @mcp.resource("cardbus://runs/{root_id}", mime_type="application/json")
    async def run_resource(root_id: str) -> dict[str, Any]:
        """A run's status, result and cost."""
        return await _resource(service.status(root_id))

    @mcp.resource("cardbus://tasks/{task_id}", mime_type="application/json")
    async def task_resource(task_id: str) -> dict[str, Any]:
        """A task: its row, its steps (events) and its model and tool calls."""
        return await _resource(service.task(task_id))

    @mcp.resource("cardbus://tasks/{task_id}/replay", mime_type="text/plain")
    async def task_replay(task_id: str) -> str:
        """A task's timeline as text."""
        return await _resource(service.replay_text(task_id))

    return mcp


async def serve_stdio(service: RunService) -> None:
    """Serve on this process's stdin and stdout until the client closes them."""
    async with service:
        await build_server(service).run_stdio_async()


async def serve_http(
    service: RunService,
    sock: socket.socket,
    *,
    hosts: list[str],
    tokens: Mapping[str, str] | None = None,
    path: str = "/mcp",
) -> None:
    """Serve streamable HTTP on the bound ``sock`` (at ``path``) until stopped."""
    import uvicorn

    async with service:
        app = build_server(service).streamable_http_app(
            streamable_http_path=path, host=sock.getsockname()[0]
        )
        config = uvicorn.Config(
            guarded(app, hosts=hosts, tokens=tokens or {}),
            log_level="warning",
            timeout_graceful_shutdown=1,
            lifespan="on",
        )
        await uvicorn.Server(config).serve(sockets=[sock])
