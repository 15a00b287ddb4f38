"""A pydantic-ai ``Agent`` as a cardbus agent (``pip install 'cardbus[pydantic-ai]'``).

    from pydantic_ai import Agent as PydanticAgent
    from cardbus.agents.frameworks import pydantic_ai_agent

    briefer = PydanticAgent("openai:gpt-4o-mini", output_type=Brief, name="briefer",
                            instructions="Write a three-point brief.")
    Briefer = pydantic_ai_agent(briefer, capability="brief", input_type=Topic)

``Briefer`` is an ``Agent`` class like any other (``EmbeddedRuntime(store, [Briefer])``,
``"agents": ["my_agents:Briefer"]`` in a plan). Its card is derived from the
pydantic-ai agent: the id from its ``name``, the description from its
``description`` (else its instructions), the input schema from ``input_type`` (a
msgspec Struct or a pydantic model; default ``{"prompt": str}``), the output schema
from its ``output_type``. A task's card becomes the run's user prompt
(``render_prompt``, overridable as ``prompt``), the run's output the result (JSON).

Everything the run does outside the agent is journaled through pydantic-ai's public
interface, as its durable-execution integrations do, by one capability given to the
run (``CardbusJournal``):

* each model request goes through ``ctx.journal.call`` (a ``WrapperModel``): the
  messages, settings and request parameters as pydantic-ai serializes them
  (``ModelMessagesTypeAdapter``; timestamps and run ids left out of what is compared,
  so a retry asks the same thing), the response likewise. A retried or redelivered
  attempt that asks the same gets the recorded response, and the model is not called;
* the agent's own tools (its function tools, its toolsets) run in the agent through
  ``ctx.journal.tool_call`` (a ``WrapperToolset``): recorded, replayed on a retry. The
  calls of one model response run one after the other, in order (each takes the next
  place in the journal, where a retry must find it);
* the runtime's tools on the agent's allow-list (``tools_allowed``; MCP servers
  mounted in the runtime included) are offered to the model as a toolset whose
  calls are ``ctx.tool``: checked, recorded and replayed by the orchestrator;
* a call that requires approval (``requires_approval=True``) is a cardbus review
  (``handle_deferred_tool_calls``, ``cardbus.agents.frameworks.pauses``): held in
  the log, answered by a person, resumed with ``ToolApproved`` / ``ToolDenied`` on
  the next attempt; a call executed externally (an ``ExternalToolset``) is made with
  the runtime's tool of its name.

The tokens of the live model calls are the result's usage. In a worker, a live model
request streams (the wrapped model's ``request_stream``): its text goes to whoever
watches the run as it is written (``agents.streaming``), and the journal records the
whole response, as when it does not stream.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field, replace
from typing import Any, ClassVar

from cardbus.eventstore.errors import MissingExtra

try:
    import pydantic_ai
    from pydantic_ai import ModelMessagesTypeAdapter
    from pydantic_ai.capabilities import AbstractCapability
    from pydantic_ai.messages import (
        ModelMessage,
        ModelResponse,
        PartDeltaEvent,
        PartStartEvent,
        TextPart,
        TextPartDelta,
    )
    from pydantic_ai.models import (
        CompletedStreamedResponse,
        Model,
        ModelRequestParameters,
        StreamedResponse,
    )
    from pydantic_ai.models.function import FunctionModel
    from pydantic_ai.models.wrapper import WrapperModel
    from pydantic_ai.settings import ModelSettings
    from pydantic_ai.tools import (
        DeferredToolRequests,
        DeferredToolResults,
        RunContext,
        Tool,
        ToolApproved,
        ToolDenied,
    )
    from pydantic_ai.toolsets import (
        AbstractToolset,
        ExternalToolset,
        FunctionToolset,
        WrapperToolset,
    )
    from pydantic_ai.toolsets.abstract import ToolsetTool
    from pydantic_core import to_jsonable_python
except ImportError as e:  # pragma: no cover - the extra is in dev
    raise MissingExtra("pydantic-ai", "pydantic-ai agents") from e

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

__all__ = ["CardbusJournal", "JournaledModel", "PydanticAIAgent", "pydantic_ai_agent"]

#: keys of a serialized message (and of its parts) that differ at every run though
#: nothing asked differs: left out of the request the journal compares
_VOLATILE = frozenset({"timestamp", "run_id", "conversation_id"})


def _messages_request(messages: list[ModelMessage]) -> list[dict[str, Any]]:
    dumped = ModelMessagesTypeAdapter.dump_python(messages, mode="json")
    out = []
    for message in dumped:
        kept = {k: v for k, v in message.items() if k not in _VOLATILE}
        parts = kept.get("parts")
        if isinstance(parts, list):
            kept["parts"] = [
                {k: v for k, v in p.items() if k not in _VOLATILE} if isinstance(p, dict) else p
                for p in parts
            ]
        out.append(kept)
    return out


def _response_to_json(response: ModelResponse) -> dict[str, Any]:
    dumped: dict[str, Any] = ModelMessagesTypeAdapter.dump_python([response], mode="json")[0]
    return dumped


def _response_from_json(data: Any) -> ModelResponse:
    message = ModelMessagesTypeAdapter.validate_python([data])[0]
    if not isinstance(message, ModelResponse):
        raise TypeError(f"a journaled model answer is not a model response: {data!r}")
    return message


class JournaledModel(WrapperModel):
    """A model whose every request is a step of the task's journal (``ctx.journal.call``)."""

    def __init__(self, wrapped: Model, journal: CardbusJournal) -> None:
        super().__init__(wrapped)
        self._cardbus = journal

    async def request(
        self,
        messages: list[ModelMessage],
        model_settings: ModelSettings | None,
        model_request_parameters: ModelRequestParameters,
    ) -> ModelResponse:
        request = {
            "framework": "pydantic-ai",
            "model": self.model_name,
            "system": self.system,
            "messages": _messages_request(messages),
            "tools": [
                {"name": t.name, "kind": t.kind}
                for t in (
                    *model_request_parameters.function_tools,
                    *model_request_parameters.output_tools,
                )
            ],
            "settings": to_jsonable_python(model_settings, fallback=str),
            "parameters": to_jsonable_python(model_request_parameters, fallback=str),
        }

        async def live() -> dict[str, Any]:
            sink = current_sink()
            if sink is not None and _streams(self.wrapped):  # its text to whoever watches
                response = await self._streamed(
                    messages, model_settings, model_request_parameters, sink
                )
            else:
                response = await self.wrapped.request(
                    messages, model_settings, model_request_parameters
                )
            usage = response.usage
            self._cardbus.count(usage.input_tokens, usage.output_tokens)
            return {
                "response": _response_to_json(response),
                "text": response.text or "",
                "model": response.model_name or self.model_name,
                "input_tokens": usage.input_tokens,
                "output_tokens": usage.output_tokens,
            }

        # pydantic-ai's ``system`` is its provider's OpenTelemetry name (``openai``, ...)
        provider = self.system if isinstance(self.system, str) else ""
        answer = await self._cardbus.ctx.journal.call(request, live, provider)
        return _response_from_json(answer["response"])

    async def _streamed(
        self,
        messages: list[ModelMessage],
        model_settings: ModelSettings | None,
        model_request_parameters: ModelRequestParameters,
        sink: ChunkSink,
    ) -> ModelResponse:
        """The request streamed by the wrapped model, its text sent to ``sink`` as it
        comes (``agents.streaming``); the whole response, as ``request`` answers it."""
        out = sink.call()
        async with self.wrapped.request_stream(
            messages, model_settings, model_request_parameters
        ) as streamed:
            async for event in streamed:
                if isinstance(event, PartStartEvent) and isinstance(event.part, TextPart):
                    await out.send(event.part.content)
                elif isinstance(event, PartDeltaEvent) and isinstance(event.delta, TextPartDelta):
                    await out.send(event.delta.content_delta)
            response = streamed.get()
        await out.end()
        return response

    @asynccontextmanager
    async def request_stream(
        self,
        messages: list[ModelMessage],
        model_settings: ModelSettings | None,
        model_request_parameters: ModelRequestParameters,
        run_context: RunContext[Any] | None = None,
    ) -> AsyncIterator[StreamedResponse]:
        # a journaled answer is whole: the stream plays the recorded response's parts
        response = await self.request(messages, model_settings, model_request_parameters)
        yield CompletedStreamedResponse(
            response, model_request_parameters=model_request_parameters, replay_events=True
        )


def _streams(model: Model) -> bool:
    """Whether ``model`` can stream a request (a ``FunctionModel`` without a stream
    function cannot)."""
    return not (isinstance(model, FunctionModel) and model.stream_function is None)


@dataclass
class _JournaledToolset(WrapperToolset[Any]):
    """The agent's own tools, each call a step of the task's journal."""

    cardbus: CardbusJournal | None = None

    async def get_tools(self, ctx: RunContext[Any]) -> dict[str, ToolsetTool[Any]]:
        # one call at a time, in the order the model asked for them: each takes the next
        # place (``seq``) in the journal, and a retry must find each at the same place
        tools = await super().get_tools(ctx)
        if self.cardbus is not None:  # a person's edit of a deferred call is checked on these
            for name, tool in tools.items():
                self.cardbus.schemas[name] = tool.tool_def.parameters_json_schema
        return {
            name: replace(tool, tool_def=replace(tool.tool_def, sequential=True))
            for name, tool in tools.items()
        }

    async def call_tool(
        self, name: str, tool_args: dict[str, Any], ctx: RunContext[Any], tool: ToolsetTool[Any]
    ) -> Any:
        journal = self.cardbus
        begun = journal.begun.pop(ctx.tool_call_id or "", None) if journal else None
        if journal is not None and begun is not None:  # a deferred call a person approved
            if begun.replayed:  # it ran in an earlier attempt: its recorded result
                return begun.result
            return await journal.ctx.journal.tool_run(
                begun, lambda _key: self.wrapped.call_tool(name, tool_args, ctx, tool)
            )
        if journal is None or name in journal.cardbus_tools:  # ctx.tool journals those
            return await self.wrapped.call_tool(name, tool_args, ctx, tool)
        return await local_tool_call(
            journal.ctx,
            name,
            tool_args,
            lambda: self.wrapped.call_tool(name, tool_args, ctx, tool),
            idempotent=name in journal.idempotent_tools,
        )


@dataclass
class CardbusJournal(AbstractCapability[Any]):
    """The capability a cardbus task gives its pydantic-ai run: model requests and the
    agent's own tool calls through the task's journal; live tokens counted."""

    ctx: TaskContext
    #: names of the runtime's tools offered to the run (their calls are ``ctx.tool``)
    cardbus_tools: frozenset[str] = frozenset()
    #: names of the agent's own tools that may run again after a crash left their
    #: effect unknown (calling one twice with the same arguments does no more than once)
    idempotent_tools: frozenset[str] = frozenset()
    input_tokens: int = field(default=0, init=False)
    output_tokens: int = field(default=0, init=False)
    #: the input schema of each of the run's tools (a person's edit is checked on it)
    schemas: dict[str, dict[str, Any]] = field(default_factory=dict, init=False)
    #: deferred calls begun in the journal and approved, by tool call id: run (or
    #: replayed) when pydantic-ai calls the tool
    begun: dict[str, BegunCall] = field(default_factory=dict, init=False)

    def count(self, input_tokens: int, output_tokens: int) -> None:
        self.input_tokens += max(0, int(input_tokens or 0))
        self.output_tokens += max(0, int(output_tokens or 0))

    def get_wrapper_model(self, model: Model) -> Model | None:
        if isinstance(model, JournaledModel):
            return None
        return JournaledModel(model, self)

    def get_wrapper_toolset(self, toolset: AbstractToolset[Any]) -> AbstractToolset[Any] | None:
        return _JournaledToolset(toolset, cardbus=self)

    async def handle_deferred_tool_calls(
        self, ctx: RunContext[Any], *, requests: DeferredToolRequests
    ) -> DeferredToolResults | None:
        """pydantic-ai's deferred calls, answered inside the run from the task's log.

        A call that requires approval is a cardbus review: its place in the journal is
        taken (``tool.begin`` under review), the log holds the proposal
        (``tool.review_requested``) and the attempt ends (``ToolUnderReview``) once every
        call of the batch was asked, so the calls of one turn are reviewed together. The
        next attempt replays the journal up to here and meets the person's word:
        approved (``ToolApproved``, with their edited arguments as ``override_args``) the
        tool runs in this step of the journal; refused (``ToolDenied``) the model gets the
        reason. A call executed externally is made by the runtime's tool of that name
        (``ctx.tool``: on the allow-list, journaled, under that tool's own review
        policy; refused or failed, the model gets the error)."""
        calls: dict[str, Any] = {}
        for call in requests.calls:  # the bus executes them: the runtime's tool of the name
            calls[call.tool_call_id] = await call_cardbus_tool(
                self.ctx, call.tool_name, call.args_as_dict()
            )
        # the proposal as the model made it (what replay shows as proposed; pydantic-ai
        # validates it again, or the person's edit, when the approved call runs)
        proposals = [
            Proposal(call.tool_call_id, call.tool_name, to_json(call.args_as_dict()))
            for call in requests.approvals
        ]
        verdicts = await review_proposals(self.ctx, proposals, self.schemas, self.idempotent_tools)
        approvals: dict[str, bool | ToolApproved | ToolDenied] = {}
        for call_id, verdict in verdicts.items():
            if verdict.begun is None:
                approvals[call_id] = ToolDenied(verdict.refusal)
                continue
            self.begun[call_id] = verdict.begun
            approvals[call_id] = ToolApproved(override_args=verdict.begun.edited)
        return DeferredToolResults(approvals=approvals, calls=calls)


def cardbus_toolset(
    ctx: TaskContext, external: frozenset[str] = frozenset()
) -> FunctionToolset[Any]:
    """The runtime's tools on the agent's allow-list, for a pydantic-ai run: each call
    is ``ctx.tool`` (a refusal or a failure is the tool's answer to the model). Those the
    agent declares as external (``external``) are its to offer: their deferred calls are
    made with ``ctx.tool`` too (``CardbusJournal.handle_deferred_tool_calls``)."""
    tools = []
    for name, spec in ctx.tool_specs.items():
        if name in external:
            continue
        schema = spec.input_schema or {"type": "object", "properties": {}}
        tools.append(Tool.from_schema(_caller(ctx, name), name, spec.description or None, schema))
    return FunctionToolset(tools)


def _caller(ctx: TaskContext, name: str) -> Any:
    async def call(**arguments: Any) -> Any:
        return await call_cardbus_tool(ctx, name, arguments)

    return call


class PydanticAIAgent(Agent):
    """A cardbus agent that runs a pydantic-ai agent (``agent``) for each task.

    Subclass it with ``agent = <pydantic_ai.Agent>`` (and any of ``agent_id``,
    ``capability``, ``description``, ``input_type``, ``output_type``, ``tools_allowed``;
    derived from the agent when left out), or call ``pydantic_ai_agent``. Override
    ``prompt`` to render the card otherwise, ``deps`` to give the run dependencies.
    """

    agent: ClassVar[pydantic_ai.Agent[Any, Any]]
    capability: ClassVar[str] = ""
    input_type: ClassVar[Any] = Prompt
    #: the output's type for the card's schema (None: the agent's ``output_type``)
    output_type: ClassVar[Any] = None
    #: the runtime's tools (names or globs) the agent may call, offered to its model
    tools_allowed: ClassVar[Sequence[str]] = ()
    #: the agent's own tools that may run again when a crash left their effect unknown
    idempotent_tools: ClassVar[Sequence[str]] = ()

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        agent = cls.__dict__.get("agent")
        if agent is None:
            return
        own = cls.__dict__
        if "agent_id" not in own:
            cls.agent_id = agent_id_from(agent.name, None)
        if "description" not in own:
            cls.description = agent.description or _static_instructions(agent)
        if "name" not in own:
            cls.name = agent.name or cls.agent_id
        output_schema = json_schema(
            cls.output_type if cls.output_type is not None else _output_type(agent)
        )
        cls.capabilities = [
            FrameworkCapability(
                cls.capability or cls.agent_id, cls.input_type, output_schema, cls.description
            )
        ]
        if "constraints" not in own and cls.tools_allowed:
            cls.constraints = AgentConstraints(tools=list(cls.tools_allowed))

    def prompt(self, task: TaskCard, inputs: Any) -> str:
        """The run's user prompt (see ``cardbus.agents.frameworks.common.render_prompt``)."""
        return render_prompt(task, inputs)

    def deps(self, task: TaskCard, inputs: Any) -> Any:
        """The run's dependencies (``deps=``); None unless overridden."""
        return None

    async def handle(self, task: TaskCard, inputs: Any, ctx: TaskContext) -> Any:
        inputs = decode_inputs(self.capability_for(task.capability), inputs)
        toolsets = [cardbus_toolset(ctx, _external(self.agent))] if ctx.tool_specs else []
        journal = CardbusJournal(ctx, frozenset(ctx.tool_specs), frozenset(self.idempotent_tools))
        try:
            result = await self.agent.run(
                self.prompt(task, inputs),
                deps=self.deps(task, inputs),
                toolsets=toolsets,
                capabilities=[journal],
            )
        finally:
            ctx.usage(journal.input_tokens, journal.output_tokens)
        return to_json(result.output)


def _external(agent: pydantic_ai.Agent[Any, Any]) -> frozenset[str]:
    """The names of the tools ``agent`` declares as executed externally."""
    names: set[str] = set()

    def visit(toolset: AbstractToolset[Any]) -> None:
        if isinstance(toolset, ExternalToolset):
            names.update(t.name for t in toolset.tool_defs)

    for toolset in agent.toolsets:
        toolset.apply(visit)
    return frozenset(names)


def _output_type(agent: pydantic_ai.Agent[Any, Any]) -> Any:
    output = agent.output_type
    if isinstance(output, type) or getattr(output, "__origin__", None) is not None:
        return output
    return Any  # an output spec (ToolOutput, a list of them, a function): no schema


def _static_instructions(agent: pydantic_ai.Agent[Any, Any]) -> str:
    texts = []
    for item in getattr(agent, "_instructions", None) or ():
        instruction = getattr(item, "instruction", item)
        if isinstance(instruction, str):
            texts.append(instruction)
    return "\n".join(texts)


def pydantic_ai_agent(
    agent: pydantic_ai.Agent[Any, Any],
    *,
    agent_id: str | None = None,
    capability: str | None = None,
    description: str | None = None,
    input_type: Any = None,
    output_type: Any = None,
    tools_allowed: Sequence[str] = (),
    idempotent_tools: Sequence[str] = (),
    constraints: AgentConstraints | None = None,
) -> type[PydanticAIAgent]:
    """A cardbus agent class running ``agent`` for each task (see the module docstring).

    ``agent_id``: default the agent's ``name``; ``capability``: default the agent id;
    ``description``: default the agent's description, else its instructions;
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
    if description is not None:
        attrs["description"] = description
    if input_type is not None:
        attrs["input_type"] = input_type
    if output_type is not None:
        attrs["output_type"] = output_type
    if constraints is not None:
        attrs["constraints"] = constraints
    name = "".join(p.capitalize() for p in ident.replace("-", "_").split("_")) or "Agent"
    return type(name, (PydanticAIAgent,), attrs)
