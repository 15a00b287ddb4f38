"""The LLM endpoint options every command that runs agents shares.

``@llm_options`` adds ``--llm-base-url`` (``OPENAI_BASE_URL``) and ``--model``
(``CARDBUS_MODEL``); the key is read from ``OPENAI_API_KEY`` only (never a
flag: command lines end up in shell histories and process lists).
:func:`open_llm` turns them into the ``LLM`` the agents get and says in one
line on stderr which one it is: the endpoint, or the deterministic mock when
none is configured.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

import click

if TYPE_CHECKING:
    from cardbus.agents.llm import LLM

__all__ = ["close_llm", "llm_options", "open_llm"]

F = TypeVar("F", bound=Callable[..., Any])


def llm_options(f: F) -> F:
    """Add ``--llm-base-url`` and ``--model`` (keyword arguments ``llm_base_url``, ``model``)."""
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
    """The configured LLM (call inside the event loop that will use it); one line says which."""
    from cardbus.agents.llm import configured_llm, describe_llm
    from cardbus.eventstore.errors import ConfigError

    try:
        llm = configured_llm(llm_base_url, model)
    except ConfigError as e:
        raise click.UsageError(str(e)) from e
    click.echo(describe_llm(llm), err=True)
    return llm


async def close_llm(llm: object) -> None:
    close = getattr(llm, "aclose", None)
    if close is not None:
        await close()
