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

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

import click

if TYPE_CHECKING:
    from cardbus.agents.llm import LLM

__all__ = [
    "announce_on_first_call",
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


def open_llm(llm_base_url: str | None, model: str | None) -> LLM:
    """The configured LLM (call inside the event loop that will use it); its first call
    says which it is, in one line on stderr (:func:`announce_on_first_call`)."""
    from cardbus.agents.llm import configured_llm
    from cardbus.eventstore.errors import ConfigError

    try:
        llm = configured_llm(llm_base_url, model)
    except ConfigError as e:
        raise click.UsageError(str(e)) from e
    return announce_on_first_call(llm)


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
    """
    from cardbus.eventstore import events as ev

    say = _notices.get(id(llm))
    if say is None:
        return

    def observe(env: Any) -> None:
        if isinstance(env.data, ev.ModelRequested):
            say()

    orchestrator.observers.append(observe)


# id(llm) -> its notice; an LLM lives as long as the command that opened it
_notices: dict[int, Callable[[], None]] = {}


async def close_llm(llm: object) -> None:
    _notices.pop(id(llm), None)
    close = getattr(llm, "aclose", None)
    if close is not None:
        await close()
