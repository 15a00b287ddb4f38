"""Money in the command line: the ``--prices`` option and the costs ``runs``, ``stats`` and
``replay`` show (``projections.pricing``, ``projections.spend``)."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any, TypeVar

import click

from cardbus.eventstore.errors import ConfigError
from cardbus.projections.pricing import ENV_PRICES, Money, PriceTable, how_to_price
from cardbus.projections.replay import AttemptSpan, ModelCall, TaskNode, Timeline

__all__ = [
    "attempt_money",
    "call_cost",
    "prices_option",
    "say_unpriced",
    "task_money",
    "timeline_money",
]

F = TypeVar("F", bound=Callable[..., Any])


def _load(ctx: click.Context, param: click.Parameter, value: str | None) -> PriceTable:
    try:
        return PriceTable.load(value) if value else PriceTable()
    except ConfigError as e:
        raise click.BadParameter(str(e)) from e


def prices_option(f: F) -> F:
    """``--prices FILE`` (or ``CARDBUS_PRICES``): the user's price table, over genai-prices."""
    return click.option(
        "--prices",
        "prices",
        envvar=ENV_PRICES,
        show_envvar=True,
        default=None,
        callback=_load,
        metavar="FILE",
        help=(
            "Price table (JSON or TOML: model name or glob -> input/output USD per million"
            f" tokens); it wins over genai-prices' bundled data. Default: ${ENV_PRICES}."
        ),
    )(f)


def call_cost(call: ModelCall, table: PriceTable) -> float | None:
    """What one journaled model call cost: 0 when answered from the journal (nothing was
    sent), the table's price of the model that answered, else the price recorded with it."""
    if call.replayed_from is not None:
        return 0.0
    if call.status == "open":
        return None  # no answer recorded: what it spent is not known
    model = call.response_model or call.model
    cost = table.cost(model, call.input_tokens, call.output_tokens)
    if cost is None and call.cost_usd is not None:
        return call.cost_usd
    if cost is None and call.input_tokens == call.output_tokens == 0 and call.error:
        return 0.0  # failed without spending (the endpoint answered an error)
    return cost


def attempt_money(span: AttemptSpan, table: PriceTable) -> Money:
    """An attempt's cost: its journaled model calls; for an agent that journals none, the
    usage its result reported, at the price of the model it names."""
    models = [c for c in span.calls if isinstance(c, ModelCall)]
    if models:  # a call answered from the journal spent nothing: not a part of the sum
        return Money.total(call_cost(c, table) for c in models if c.replayed_from is None)
    if span.input_tokens == span.output_tokens == 0:
        return Money()
    return Money().add(table.cost(span.model or "", span.input_tokens, span.output_tokens))


def task_money(node: TaskNode, table: PriceTable) -> Money:
    """A task's own cost (its attempts and calls shown outside them; not its subtasks)."""
    m = Money()
    for span in node.spans:
        m += attempt_money(span, table)
    m += Money.total(
        call_cost(c, table)
        for c in node.calls
        if isinstance(c, ModelCall) and c.replayed_from is None
    )
    return m


def timeline_money(t: Timeline, table: PriceTable) -> Money:
    m = Money()
    for _, node in t.walk():
        m += task_money(node, table)
    return m


def money_rows(rows: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """``priced`` rows for ``--json``: ``money`` as ``{"usd", "complete", "text"}``."""
    return [{**r, "money": r["money"].json()} for r in rows]


def say_unpriced(models: Iterable[str]) -> None:
    """After a table that shows "unknown price": one line per model that has none (each
    name once), saying how to give it one."""
    for model in sorted(set(models)):
        click.echo(f"unknown price: no price known for model {model!r}; {how_to_price(model)}")
