"""The LLM endpoint options every command that runs agents shares.

``@llm_options`` adds ``--llm-base-url`` (``OPENAI_BASE_URL``), ``--model``
(``CARDBUS_MODEL``) and ``--limits`` (``CARDBUS_LIMITS``: a file of the providers'
limits, which the process's pacer then keeps instead of learning them from the
headers: ``cardbus.agents.pacing.LimitTable``); the key is read from
``OPENAI_API_KEY`` only (never a flag: command lines end up in shell histories and
process lists).
:func:`open_llm` turns them into the ``LLM`` the agents get; the first time
an agent calls it, one line on stderr says which one it is (the endpoint, or
the deterministic mock when none is configured). Said once per command, and
only by a command whose agents do call a model: a plan of agents that never
ask one, a re-run answered from the log, says nothing about models.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

import click

if TYPE_CHECKING:
    from cardbus.agents.llm import LLM

__all__ = [
    "announce_on_first_call",
    "asks_default_model",
    "close_llm",
    "llm_options",
    "open_llm",
    "watch_model_calls",
]

F = TypeVar("F", bound=Callable[..., Any])
T = TypeVar("T")


def _use_limits(ctx: click.Context, param: click.Parameter, value: str | None) -> None:
    if not value:
        return
    from cardbus.agents.pacing import LimitTable, process_pacer
    from cardbus.eventstore.errors import ConfigError

    try:
        process_pacer().use_limits(LimitTable.load(value))
    except ConfigError as e:
        raise click.BadParameter(str(e)) from e


def llm_options(f: F) -> F:
    """Add ``--llm-base-url`` and ``--model`` (keyword arguments ``llm_base_url``, ``model``),
    and ``--limits`` (no argument: it configures the process's pacer)."""
    f = click.option(
        "--limits",
        default=None,
        envvar="CARDBUS_LIMITS",
        show_envvar=True,
        expose_value=False,
        callback=_use_limits,
        metavar="FILE",
        help="Providers' limits (JSON or TOML: model name or glob -> requests_per_minute,"
        " tokens_per_minute, concurrent, endpoint); the others are learned from the answers'"
        " rate-limit headers. Env CARDBUS_LIMITS.",
    )(f)
    f = click.option(
        "--model",
        "model",
        default=None,
        envvar="CARDBUS_MODEL",
        show_envvar=True,
        help="Model the LLM agents ask (env CARDBUS_MODEL); an LLM agent's own wins.",
    )(f)
    f = click.option(
        "--llm-base-url",
        "llm_base_url",
        default=None,
        envvar="OPENAI_BASE_URL",
        show_envvar=True,
        help="OpenAI-compatible endpoint, e.g. http://localhost:8000/v1 (env OPENAI_BASE_URL;"
        " key from OPENAI_API_KEY). None: the deterministic mock.",
    )(f)
    return f


def open_llm(
    llm_base_url: str | None, model: str | None, agents: Sequence[type] | None = None
) -> LLM:
    """The configured LLM (call inside the event loop that will use it); its first call
    says which it is, in one line on stderr (:func:`announce_on_first_call`).

    An endpoint without a model is a usage error up front when ``agents`` (None: not
    known) hold an ``LLMAgent`` with no model of its own, the agents that ask the
    endpoint's default. Otherwise nothing is demanded before a call names no model:
    ``OPENAI_BASE_URL`` may be set for another SDK's agent (the OpenAI Agents SDK reads
    it too) in a run where no cardbus LLM agent runs.
    """
    from cardbus.agents.llm import configured_llm
    from cardbus.eventstore.errors import ConfigError

    try:
        llm = configured_llm(llm_base_url, model, model_required=asks_default_model(agents))
    except ConfigError as e:
        raise click.UsageError(str(e)) from e
    return announce_on_first_call(llm)


def asks_default_model(agents: Sequence[type] | None) -> bool:
    """Whether one of ``agents`` (None: unknown, so perhaps) asks the endpoint's default
    model: an ``LLMAgent`` (a planner included) that names no model of its own."""
    if agents is None:
        return True
    from cardbus.agents.llm_agent import LLMAgent

    return any(issubclass(a, LLMAgent) and not a.model for a in agents)


def announce_on_first_call(llm: T, line: str | None = None) -> T:
    """``llm`` itself, whose first ``complete`` or ``chat`` first prints ``line`` (default:
    ``describe_llm``'s) on stderr; once, also counting :func:`watch_model_calls`.

    The methods are wrapped on the instance, not by a proxy object: the agents and the
    journal look at the model's class (``MockLLM``, ``ChatLLM``), which stays as it was.
    """
    from cardbus.agents.llm import describe_llm

    text = line if line is not None else describe_llm(llm)  # type: ignore[arg-type]
    said: list[bool] = []

    def say() -> None:
        if not said:
            said.append(True)
            click.echo(text, err=True)

    def wrap(name: str) -> None:
        method = getattr(llm, name, None)
        if method is None:
            return

        async def call(*args: Any, **kw: Any) -> Any:
            say()
            return await method(*args, **kw)

        setattr(llm, name, call)

    wrap("complete")
    wrap("chat")
    _notices[id(llm)] = say
    return llm


def watch_model_calls(orchestrator: Any, llm: object) -> None:
    """Also say ``llm``'s line (once) when ``orchestrator`` folds a ``model.requested``.

    An ``LLMAgent`` on the mock answers through a mock of its own making (its
    ``mock_answer``), which never calls ``llm``: the log tells that a model was asked.
    Only then: an endpoint's calls say it themselves, and a framework agent's model
    calls (pydantic-ai, the OpenAI Agents SDK; journaled with ``"framework"`` in their
    request) go to the framework's own model, not to ``llm``.
    """
    from cardbus.agents.llm import MockLLM
    from cardbus.eventstore import events as ev

    say = _notices.get(id(llm))
    if say is None or not isinstance(llm, MockLLM):
        return

    def observe(env: Any) -> None:
        if isinstance(env.data, ev.ModelRequested) and not _framework_call(env.data.request):
            say()

    orchestrator.observers.append(observe)


def _framework_call(request: object) -> bool:
    return isinstance(request, dict) and "framework" in request


# id(llm) -> its notice; an LLM lives as long as the command that opened it
_notices: dict[int, Callable[[], None]] = {}


async def close_llm(llm: object) -> None:
    _notices.pop(id(llm), None)
    close = getattr(llm, "aclose", None)
    if close is not None:
        await close()
