"""An OpenAI Agents SDK ``Agent`` as a cardbus agent (``pip install 'cardbus[openai-agents]'``).

    from agents import Agent as SDKAgent          # the SDK (its top-level package is `agents`)
    from cardbus.agents.frameworks import openai_agents_agent

    briefer = SDKAgent(name="briefer", instructions="Write a three-point brief.",
                       output_type=Brief, model=OpenAIChatCompletionsModel(...))
    Briefer = openai_agents_agent(briefer, capability="brief", input_type=Topic)

``Briefer`` is an ``Agent`` class like any other. Its card is derived from the SDK
agent: the id from its ``name``, the description from its ``handoff_description``
(else its instructions, when they are a string), the input schema from
``input_type`` (a msgspec Struct or a pydantic model; default ``{"prompt": str}``),
the output schema from its ``output_type`` (none: a string). A task's card becomes
the run's input (``render_prompt``, overridable as ``prompt``), ``Runner.run``'s
``final_output`` the result (JSON). The SDK's tracing is off (``sdk_tracing = False``:
it would send traces to OpenAI); cardbus traces the run from its log.

What the run does outside the agent goes through cardbus's journal:

* the model of the agent (and of the agents it hands off to) is wrapped
  (``JournaledModel``, an SDK ``Model``): each ``get_response`` is a
  ``ctx.journal.call`` whose request is what the SDK asks (instructions, input items,
  settings, tools, output schema, handoffs) and whose answer is the SDK's
  ``ModelResponse`` as JSON. A retried or redelivered attempt that asks the same gets
  the recorded response, and the model is not called. In a worker the live call
  streams (the wrapped model's ``stream_response``, with ``include_usage``): its text
  goes to whoever watches the run as it is written (``agents.streaming``), and the
  journal records the completed response, as without streaming (``Runner.run``
  itself, and ``Runner.run_streamed`` on a journaled model, do not stream);
* the agent's function tools run in the agent through ``ctx.journal.tool_call``
  (recorded, replayed on a retry); hosted tools run at the provider, unjournaled;
* the runtime's tools on the allow-list (``tools_allowed``; MCP servers mounted in
  the runtime included) are added as ``FunctionTool``s whose invocation is
  ``ctx.tool``;
* a ``needs_approval`` interruption is a cardbus review
  (``cardbus.agents.frameworks.pauses``): held in the log, answered by a person, and
  approved or rejected on the run's ``RunState`` by the next attempt.

The tokens of the live model calls are the result's usage.
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import AsyncIterator, Sequence
from typing import Any, ClassVar
from urllib.parse import urlsplit

from cardbus.eventstore.errors import MissingExtra

try:
    import agents as sdk
    from agents import FunctionTool, Handoff, Model, ModelResponse, RunConfig, Runner
    from agents.agent_output import AgentOutputSchemaBase
    from agents.items import TResponseInputItem, TResponseStreamEvent
    from agents.model_settings import ModelSettings
    from agents.models.interface import ModelTracing
    from agents.models.multi_provider import MultiProvider
    from agents.run_state import RunState
    from agents.tool import Tool
    from agents.tool_context import ToolContext
    from agents.usage import Usage
    from openai.types.responses import ResponseOutputItem
    from pydantic import TypeAdapter
    from pydantic_core import to_jsonable_python
except ImportError as e:  # pragma: no cover - the extra is in dev
    raise MissingExtra("openai-agents", "OpenAI Agents SDK agents") from e

from cardbus.agents.agent import Agent, TaskContext
from cardbus.agents.cards import AgentConstraints, TaskCard
from cardbus.agents.frameworks.common import (
    FrameworkCapability,
    Prompt,
    agent_id_from,
    call_cardbus_tool,
    decode_inputs,
    json_schema,
    local_tool_call,
    render_prompt,
    to_json,
)
from cardbus.agents.frameworks.pauses import Proposal, review_proposals
from cardbus.agents.journal import BegunCall
from cardbus.agents.streaming import ChunkSink, current_sink
from cardbus.eventstore.errors import LLMBadOutput

__all__ = ["JournaledModel", "OpenAIAgentsAgent", "chat_completions_only", "openai_agents_agent"]

_OUTPUT_ITEM: TypeAdapter[Any] = TypeAdapter(ResponseOutputItem)


class _Run:
    """One task's run: its context and the tokens its live model calls spent."""

    def __init__(self, ctx: TaskContext, idempotent_tools: Sequence[str] = ()) -> None:
        self.ctx = ctx
        self.idempotent_tools = frozenset(idempotent_tools)
        self.input_tokens = 0
        self.output_tokens = 0
        #: the input schema of each function tool (a person's edit is checked on it)
        self.schemas: dict[str, dict[str, Any]] = {}
        #: interrupted calls begun in the journal and approved, by call id: run (or
        #: replayed) when the SDK invokes the tool
        self.begun: dict[str, BegunCall] = {}


def _jsonable(value: Any) -> Any:
    return to_jsonable_python(value, fallback=str)


class JournaledModel(Model):
    """An SDK model whose every ``get_response`` is a step of the task's journal."""

    def __init__(self, wrapped: Model, run: _Run, name: str = "") -> None:
        self.wrapped = wrapped
        self._run = run
        self.name = name or str(getattr(wrapped, "model", "") or type(wrapped).__name__)

    async def get_response(
        self,
        system_instructions: str | None,
        input: str | list[TResponseInputItem],
        model_settings: ModelSettings,
        tools: list[Tool],
        output_schema: AgentOutputSchemaBase | None,
        handoffs: list[Handoff[Any, Any]],
        tracing: ModelTracing,
        *,
        previous_response_id: str | None,
        conversation_id: str | None,
        prompt: Any | None,
    ) -> ModelResponse:
        plain = output_schema is None or output_schema.is_plain_text()
        request = {
            "framework": "openai-agents",
            "model": self.name,
            "system": system_instructions,
            "input": _jsonable(input),
            "settings": model_settings.to_json_dict(),
            "tools": [
                {"name": t.name, "parameters": getattr(t, "params_json_schema", None)}
                for t in tools
            ],
            "output_schema": None
            if plain or output_schema is None
            else output_schema.json_schema(),
            "handoffs": [h.tool_name for h in handoffs],
            "previous_response_id": previous_response_id,
            "conversation_id": conversation_id,
            "prompt": _jsonable(prompt),
        }

        async def live() -> dict[str, Any]:
            sink = current_sink()
            if sink is not None:  # in a worker: its text to whoever watches, as it comes
                return await self._streamed(
                    sink,
                    system_instructions,
                    input,
                    model_settings,
                    tools,
                    output_schema,
                    handoffs,
                    tracing,
                    previous_response_id=previous_response_id,
                    conversation_id=conversation_id,
                    prompt=prompt,
                )
            response = await self.wrapped.get_response(
                system_instructions,
                input,
                model_settings,
                tools,
                output_schema,
                handoffs,
                tracing,
                previous_response_id=previous_response_id,
                conversation_id=conversation_id,
                prompt=prompt,
            )
            usage = response.usage
            self._run.input_tokens += max(0, usage.input_tokens)
            self._run.output_tokens += max(0, usage.output_tokens)
            return {
                "output": [item.model_dump(mode="json") for item in response.output],
                # the model's words beside its calls: what a review shows as the proposal's
                "text": _text_of(response.output),
                "response_id": response.response_id,
                "request_id": response.request_id,
                "model": self.name,
                "input_tokens": usage.input_tokens,
                "output_tokens": usage.output_tokens,
                "total_tokens": usage.total_tokens,
            }

        answer = await self._run.ctx.journal.call(request, live, _provider(self.wrapped))
        return ModelResponse(
            output=[_OUTPUT_ITEM.validate_python(item) for item in answer["output"]],
            usage=Usage(
                requests=1,
                input_tokens=int(answer.get("input_tokens") or 0),
                output_tokens=int(answer.get("output_tokens") or 0),
                total_tokens=int(answer.get("total_tokens") or 0),
            ),
            response_id=answer.get("response_id"),
            request_id=answer.get("request_id"),
        )

    async def _streamed(self, sink: ChunkSink, *args: Any, **kwargs: Any) -> dict[str, Any]:
        """The request streamed by the wrapped model (``stream_response``), its text sent to
        ``sink`` as it comes; what ``live`` records, from the stream's completed response."""
        out = sink.call()
        done: Any = None
        settings = args[2]
        if settings.include_usage is None:  # the tokens the budget and costs need
            args = (*args[:2], dataclasses.replace(settings, include_usage=True), *args[3:])
        events: Any = self.wrapped.stream_response(*args, **kwargs)
        async for event in events:
            kind = getattr(event, "type", "")
            if kind == "response.output_text.delta":
                await out.send(str(getattr(event, "delta", "") or ""))
            elif kind == "response.completed":
                done = event.response
        if done is None:
            raise LLMBadOutput("the model's stream ended without a completed response")
        await out.end()
        usage = done.usage
        spent = (
            (usage.input_tokens, usage.output_tokens, usage.total_tokens)
            if usage is not None
            else (0, 0, 0)
        )
        self._run.input_tokens += max(0, spent[0])
        self._run.output_tokens += max(0, spent[1])
        return {
            "output": [item.model_dump(mode="json") for item in done.output],
            "text": _text_of(done.output),
            "response_id": done.id,
            "request_id": None,
            "model": self.name,
            "input_tokens": spent[0],
            "output_tokens": spent[1],
            "total_tokens": spent[2],
        }

    async def stream_response(
        self,
        system_instructions: str | None,
        input: str | list[TResponseInputItem],
        model_settings: ModelSettings,
        tools: list[Tool],
        output_schema: AgentOutputSchemaBase | None,
        handoffs: list[Handoff[Any, Any]],
        tracing: ModelTracing,
        *,
        previous_response_id: str | None,
        conversation_id: str | None,
        prompt: Any | None,
    ) -> AsyncIterator[TResponseStreamEvent]:
        raise NotImplementedError("a journaled model answers whole: run it with Runner.run")
        yield  # an async generator, as the interface has it

    async def close(self) -> None:
        await self.wrapped.close()


def _text_of(output: Sequence[Any]) -> str:
    """The text of a response's message items (none: "")."""
    texts = []
    for item in output:
        if getattr(item, "type", "") != "message":
            continue
        for part in getattr(item, "content", None) or ():
            text = getattr(part, "text", None)
            if isinstance(text, str):
                texts.append(text)
    return "".join(texts)


def _journaled_tool(tool: Tool, run: _Run, idempotent: bool) -> Tool:
    """A function tool of the agent, its invocations journaled; other tools as they are."""
    if not isinstance(tool, FunctionTool):
        return tool
    invoke = tool.on_invoke_tool

    async def on_invoke_tool(context: ToolContext[Any], arguments: str) -> Any:
        begun = run.begun.pop(context.tool_call_id, None)
        if begun is not None:  # an interrupted call a person approved: its journal step
            if begun.replayed:  # it ran in an earlier attempt: its recorded result
                return begun.result
            given = json.dumps(begun.edited) if begun.edited is not None else arguments
            return await run.ctx.journal.tool_run(begun, lambda _key: invoke(context, given))
        try:
            parsed = json.loads(arguments) if arguments else {}
        except ValueError:
            parsed = {"_raw": arguments}
        return await local_tool_call(
            run.ctx,
            tool.name,
            parsed if isinstance(parsed, dict) else {"_args": parsed},
            lambda: invoke(context, arguments),
            idempotent=idempotent,
        )

    return dataclasses.replace(tool, on_invoke_tool=on_invoke_tool)


def cardbus_tools(ctx: TaskContext) -> list[Tool]:
    """The runtime's tools on the agent's allow-list, as SDK function tools: each call is
    ``ctx.tool`` (a refusal or a failure is the tool's answer to the model)."""
    tools: list[Tool] = []
    for name, spec in ctx.tool_specs.items():

        async def invoke(_context: ToolContext[Any], arguments: str, _name: str = name) -> Any:
            parsed = json.loads(arguments) if arguments else {}
            return await call_cardbus_tool(ctx, _name, parsed if isinstance(parsed, dict) else {})

        tools.append(
            FunctionTool(
                name=name,
                description=spec.description,
                params_json_schema=spec.input_schema or {"type": "object", "properties": {}},
                on_invoke_tool=invoke,
                strict_json_schema=False,
            )
        )
    return tools


def _journaled_agent(
    agent: sdk.Agent[Any],
    run: _Run,
    config: RunConfig,
    extra_tools: Sequence[Tool],
    seen: dict[int, sdk.Agent[Any]],
) -> sdk.Agent[Any]:
    """A clone of ``agent`` (and of the agents it hands off to) whose model and function
    tools go through the journal."""
    done = seen.get(id(agent))
    if done is not None:
        return done
    if isinstance(agent.model, Model):
        model: Model = agent.model
    else:
        model = config.model_provider.get_model(agent.model)
    name = agent.model if isinstance(agent.model, str) else ""
    for tool in agent.tools:
        if isinstance(tool, FunctionTool):
            run.schemas[tool.name] = tool.params_json_schema
    clone = agent.clone(
        model=JournaledModel(model, run, name),
        tools=[_journaled_tool(t, run, t.name in run.idempotent_tools) for t in agent.tools]
        + list(extra_tools),
    )
    seen[id(agent)] = clone
    clone.handoffs = [
        _journaled_agent(h, run, config, extra_tools, seen) if isinstance(h, sdk.Agent) else h
        for h in agent.handoffs
    ]
    return clone


class OpenAIAgentsAgent(Agent):
    """A cardbus agent that runs an OpenAI Agents SDK agent (``agent``) for each task.

    Subclass it with ``agent = <agents.Agent>`` (and any of ``agent_id``,
    ``capability``, ``description``, ``input_type``, ``output_type``, ``tools_allowed``,
    ``max_turns``; derived from the agent when left out), or call
    ``openai_agents_agent``. Override ``prompt`` to render the card otherwise,
    ``context`` to give the run a context object.
    """

    agent: ClassVar[sdk.Agent[Any]]
    capability: ClassVar[str] = ""
    input_type: ClassVar[Any] = Prompt
    #: the output's type for the card's schema (None: the agent's ``output_type``)
    output_type: ClassVar[Any] = None
    #: the runtime's tools (names or globs) the agent may call, offered to its model
    tools_allowed: ClassVar[Sequence[str]] = ()
    #: the agent's own tools that may run again when a crash left their effect unknown
    idempotent_tools: ClassVar[Sequence[str]] = ()
    #: ``Runner.run``'s limit on model turns
    max_turns: ClassVar[int] = 10
    #: the SDK's own tracing (it exports to OpenAI's servers): off
    sdk_tracing: ClassVar[bool] = False

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        agent = cls.__dict__.get("agent")
        if agent is None:
            return
        own = cls.__dict__
        if "agent_id" not in own:
            cls.agent_id = agent_id_from(agent.name, None)
        if "description" not in own:
            instructions = agent.instructions if isinstance(agent.instructions, str) else ""
            cls.description = agent.handoff_description or instructions
        if "name" not in own:
            cls.name = agent.name
        output = cls.output_type if cls.output_type is not None else agent.output_type
        output_schema = json_schema(str if output is None else output)
        cls.capabilities = [
            FrameworkCapability(
                cls.capability or cls.agent_id, cls.input_type, output_schema, cls.description
            )
        ]
        if "constraints" not in own and cls.tools_allowed:
            cls.constraints = AgentConstraints(tools=list(cls.tools_allowed))

    def prompt(self, task: TaskCard, inputs: Any) -> str:
        """The run's input (see ``cardbus.agents.frameworks.common.render_prompt``)."""
        return render_prompt(task, inputs)

    def context(self, task: TaskCard, inputs: Any) -> Any:
        """The run's context object (``Runner.run(context=...)``); None unless overridden."""
        return None

    def run_config(self) -> RunConfig:
        """``Runner.run``'s settings: the SDK's tracing as ``sdk_tracing`` says, and the
        chat completions API when ``OPENAI_BASE_URL`` is not OpenAI's (override to change)."""
        if chat_completions_only(os.environ.get("OPENAI_BASE_URL")):
            return RunConfig(
                tracing_disabled=not self.sdk_tracing,
                model_provider=MultiProvider(openai_use_responses=False),
            )
        return RunConfig(tracing_disabled=not self.sdk_tracing)

    async def handle(self, task: TaskCard, inputs: Any, ctx: TaskContext) -> Any:
        inputs = decode_inputs(self.capability_for(task.capability), inputs)
        run = _Run(ctx, self.idempotent_tools)
        config = self.run_config()
        agent = _journaled_agent(self.agent, run, config, cardbus_tools(ctx), {})
        try:
            result = await Runner.run(
                agent,
                self.prompt(task, inputs),
                context=self.context(task, inputs),
                max_turns=self.max_turns,
                run_config=config,
            )
            while result.interruptions:  # ``needs_approval`` calls: cardbus reviews
                state = result.to_state()
                await _decide(run, result.interruptions, state)
                result = await Runner.run(agent, state, max_turns=self.max_turns, run_config=config)
        finally:
            ctx.usage(run.input_tokens, run.output_tokens)
        return to_json(result.final_output)


async def _decide(run: _Run, interruptions: Sequence[Any], state: RunState[Any, Any]) -> None:
    """The person's word on each interrupted call, from the log
    (``cardbus.agents.frameworks.pauses``), given to the SDK's ``RunState``: approved
    (the tool then runs in its journal step, with the edited arguments), or rejected
    with the reason as the model's message. ``ToolUnderReview`` while any waits."""
    proposals = []
    for item in interruptions:
        try:
            parsed = json.loads(item.arguments or "{}")
        except ValueError:
            parsed = {"_raw": item.arguments}
        proposals.append(
            Proposal(
                str(item.call_id or ""),
                str(item.name or ""),
                parsed if isinstance(parsed, dict) else {"_args": parsed},
            )
        )
    verdicts = await review_proposals(run.ctx, proposals, run.schemas, run.idempotent_tools)
    for item, proposal in zip(interruptions, proposals, strict=True):
        verdict = verdicts[proposal.call_id]
        if verdict.begun is None:
            state.reject(item, rejection_message=verdict.refusal)
        else:
            run.begun[proposal.call_id] = verdict.begun
            state.approve(item)


def chat_completions_only(base_url: str | None) -> bool:
    """Whether an endpoint is asked through chat completions rather than the Responses
    API: any base URL but OpenAI's own. Local servers (vLLM, llama.cpp, Ollama, LiteLLM)
    serve ``/v1/chat/completions``; few serve ``/v1/responses``, the SDK's default."""
    if not base_url:
        return False
    return urlsplit(base_url).hostname != "api.openai.com"


def openai_agents_agent(
    agent: sdk.Agent[Any],
    *,
    agent_id: str | None = None,
    capability: str | None = None,
    description: str | None = None,
    input_type: Any = None,
    output_type: Any = None,
    tools_allowed: Sequence[str] = (),
    idempotent_tools: Sequence[str] = (),
    constraints: AgentConstraints | None = None,
    max_turns: int | None = None,
) -> type[OpenAIAgentsAgent]:
    """A cardbus agent class running ``agent`` for each task (see the module docstring).

    ``agent_id``: default the agent's ``name``; ``capability``: default the agent id;
    ``description``: default its ``handoff_description``, else its instructions;
    ``input_type``: a msgspec Struct or pydantic model (default ``{"prompt": str}``);
    ``output_type``: for the card's schema (default the agent's); ``tools_allowed``:
    the runtime's tools it may call (``constraints`` replaces the whole constraints);
    ``idempotent_tools``: its own tools that may run again after a crash during them.
    """
    ident = agent_id_from(agent.name, agent_id)
    attrs: dict[str, Any] = {
        "agent": agent,
        "agent_id": ident,
        "capability": capability or ident,
        "tools_allowed": tuple(tools_allowed),
        "idempotent_tools": tuple(idempotent_tools),
        "__module__": __name__,
    }
    for key, value in (
        ("description", description),
        ("input_type", input_type),
        ("output_type", output_type),
        ("constraints", constraints),
        ("max_turns", max_turns),
    ):
        if value is not None:
            attrs[key] = value
    name = "".join(p.capitalize() for p in ident.replace("-", "_").split("_")) or "Agent"
    return type(name, (OpenAIAgentsAgent,), attrs)


def _provider(model: Any) -> str:
    """``gen_ai.provider.name`` of an Agents SDK model: from its OpenAI client's base URL
    (``openai`` for OpenAI's own, the host for another endpoint), else ``openai``."""
    from cardbus.agents.llm import provider_of_url

    base = getattr(getattr(model, "_client", None), "base_url", None)
    return provider_of_url(str(base)) if base else "openai"
