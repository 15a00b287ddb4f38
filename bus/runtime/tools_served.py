"""Which tools an agent needs, and who serves each: the same wherever the agent runs.

An ``LLMAgent`` declares ``tools``: ``Tool`` objects (a spec and its function),
``ToolSpec`` s or names. A ``Tool`` brings its function with it, so the worker
that runs the agent runs it too (:func:`own_tools`; journaled through the
orchestrator like any tool call: ``tool.requested`` before it runs,
``tool.called`` after), in ``cardbus run``, ``agent serve``, ``ui --agent``,
``a2a serve`` alike. A tool declared by spec or name is the runtime's to serve
(its ``ToolRegistry``: ``doc_search``, MCP servers' ``<server>__<tool>``, tools
given in Python); a runtime that runs the agent next to its orchestrator
checks at start that it has each (:func:`check_served`) and refuses to start,
in one line naming the agent, the tool and how to provide it, rather than let
a run discover it mid-way.

An agent served in a process of its own (``cardbus agent serve``) may also be
given MCP servers mounted there (:func:`worker_tools`' ``local``: run by its
worker as its own tools are), and its worker asks the orchestrator once for the
specs of the tools it declares by name (request ``tool.specs``:
:func:`specs_wanted`, :func:`with_specs`), so its model is offered their schemas.
A call to a tool that nothing serves after all fails the attempt
(``tool_not_found``, ``agents.tool_loop``).
"""

from __future__ import annotations

import types
from collections.abc import Container, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import msgspec

from cardbus.agents.agent import Agent
from cardbus.agents.llm_agent import LLMAgent
from cardbus.agents.mcp_config import MCPServer
from cardbus.agents.tools import Tool, ToolRegistry, ToolSpec
from cardbus.bus.orchestrator.access import tool_allowed
from cardbus.eventstore.errors import ConfigError

__all__ = [
    "ToolNotServed",
    "WorkerTools",
    "check_served",
    "declared_tools",
    "own_tools",
    "specs_wanted",
    "unserved",
    "with_specs",
    "worker_tools",
]


class ToolNotServed(ConfigError):
    """An agent declares a tool that neither it nor the runtime serves."""


def declared_tools(agent: type[Agent]) -> list[Tool | object]:
    """What ``agent`` declares in ``tools`` (an ``LLMAgent``'s; other agents declare none)."""
    if not issubclass(agent, LLMAgent):  # another class's ``tools`` means what it means there
        return []
    return list(agent.tools)


def own_tools(agent: type[Agent]) -> ToolRegistry:
    """The ``Tool`` s ``agent`` declares that are on its allow-list: the ones its worker
    runs. Two different tools of one name are a ``ConfigError``."""
    registry = ToolRegistry()
    for d in declared_tools(agent):
        if not isinstance(d, Tool) or not tool_allowed(d.name, agent.constraints.tools):
            continue
        have = registry.get(d.name)
        if have is None:
            registry.register(d)
        elif have is not d:
            raise ConfigError(f"agent {agent.agent_id!r} declares two tools named {d.name!r}")
    return registry


@dataclass(frozen=True)
class WorkerTools:
    """What a worker gives its agent's handler: the tools it runs itself (``here``, None:
    none; ``LOCAL_TOOLS``) and the specs of every tool on its allow-list it knows
    (``specs``, by name; ``ctx.tool_specs``)."""

    here: ToolRegistry | None
    specs: Mapping[str, ToolSpec]


def worker_tools(
    agent: type[Agent], served: ToolRegistry | None, local: ToolRegistry | None = None
) -> WorkerTools:
    """The tools of a worker of ``agent``: ``served`` is the registry its orchestrator
    serves tool calls from (in its process: the specs are known), ``local`` one this
    worker runs itself (MCP servers mounted in an agent's process). The agent's own
    ``Tool`` s and ``local`` 's allowed tools that ``served`` lacks run here."""
    allowed = agent.constraints.tools
    here = ToolRegistry()
    for registry in (own_tools(agent), local):
        for spec in registry.specs() if registry is not None else ():
            tool = registry.get(spec.name) if registry is not None else None
            if tool is None or spec.name in here or not tool_allowed(spec.name, allowed):
                continue
            if served is None or spec.name not in served:  # the runtime's own wins
                here.register(tool)
    specs = {s.name: s for s in (served.specs() if served is not None else ())}
    specs = {n: s for n, s in specs.items() if tool_allowed(n, allowed)}
    specs |= {s.name: s for s in here.specs()}
    return WorkerTools(here if here.specs() else None, types.MappingProxyType(specs))


def specs_wanted(agent: type[Agent], tools: WorkerTools) -> bool:
    """Whether ``agent`` declares (and may use) a tool by name or spec whose spec the worker
    does not know: its orchestrator, elsewhere, may (``tool.specs``)."""
    return any(
        not isinstance(d, Tool)
        and (name := _name(d))
        and name not in tools.specs
        and tool_allowed(name, agent.constraints.tools)
        for d in declared_tools(agent)
    )


def with_specs(tools: WorkerTools, specs: Mapping[str, Any]) -> WorkerTools:
    """``tools`` and the specs an orchestrator answered (``tool.specs``; a malformed one is
    left out: its tool is then offered without a schema, as before)."""
    more: dict[str, ToolSpec] = {}
    for name, raw in specs.items() if isinstance(specs, Mapping) else ():
        try:
            spec = msgspec.convert(raw, ToolSpec)
        except (msgspec.ValidationError, ConfigError):
            continue
        if spec.name == name:
            more[name] = spec
    merged = {**more, **tools.specs}  # what this process runs wins
    return WorkerTools(tools.here, types.MappingProxyType(merged))


def _name(d: object) -> str:
    return d if isinstance(d, str) else str(getattr(d, "name", ""))


def unserved(
    agents: Iterable[type[Agent]],
    registry: Container[str] | None,
    mounting: Iterable[MCPServer] = (),
) -> list[tuple[str, str]]:
    """``(agent_id, tool)`` for each tool an agent declares (and may use) that neither it
    (a ``Tool``) nor ``registry`` serves; one named ``<server>__...`` of a server in
    ``mounting`` (not started yet) counts as served, until the mounted registry says."""
    prefixes = tuple(f"{s.name}__" for s in mounting)
    out: list[tuple[str, str]] = []
    for a in agents:
        for d in declared_tools(a):
            name = _name(d)
            if not name or isinstance(d, Tool) or not tool_allowed(name, a.constraints.tools):
                continue
            if (registry is None or name not in registry) and not name.startswith(prefixes):
                out.append((a.agent_id, name))
    return list(dict.fromkeys(out))


def check_served(
    agents: Sequence[type[Agent]],
    registry: Container[str] | None,
    mounting: Iterable[MCPServer] = (),
) -> None:
    """``ToolNotServed`` (one line) for the first tool an agent declares that nobody serves
    (``registry``: the names the runtime serves; ``mounting``: as for :func:`unserved`)."""
    missing = unserved(agents, registry, mounting)
    if not missing:
        return
    agent_id, tool = missing[0]
    more = f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""
    raise ToolNotServed(
        f"agent {agent_id!r} declares tool {tool!r}, which nothing serves{more}: declare it"
        f" in the agent's tools as a Tool (Tool.define), mount the MCP server that has it"
        f" (--mcp NAME=COMMAND, its tools are NAME__<tool>), or give it in the runtime's"
        f" ToolRegistry (EmbeddedRuntime(..., tools=...))"
    )
