"""Context budget: fit upstream outputs into an agent's maximum input size.

An agent declares ``AgentConstraints.max_input_bytes``; a task's inputs hold
the outputs of its dependencies, which can be larger than that. Before a
dispatch the orchestrator calls :func:`fit_card`, which applies a declared
policy to the fields that came from dependencies (the task's own literal
inputs are never touched) and returns the ``context.trimmed`` event to
record when it changed anything.

Policies are pure, deterministic functions ``(inputs, limit, fields) ->
inputs`` that keep every value's type (a list stays a list of the same
kind of items, a string a string), so the result still fits the agent's
input schema:

* ``trim``: drop items from the end of the largest list, or cut the end of
  the longest string (marked with ``…``), until the inputs fit;
* ``summarise``: first shorten every long string to its first sentence
  (an extractive summary, so each item keeps its lead), then trim if that
  is not enough.

Register another one in :data:`POLICIES` (``Policy.context_policy`` accepts
any name registered there; ``ContextPolicy`` types the built-in ones).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Collection, Iterable
from typing import Any, Literal

import msgspec

from cardbus.agents.cards import AgentCard, TaskCard
from cardbus.eventstore import events as ev
from cardbus.eventstore.errors import ConfigError

__all__ = [
    "POLICIES",
    "ContextPolicy",
    "Fitted",
    "budget_for",
    "fit_card",
    "fit_inputs",
    "summarise",
    "trim",
]

ELLIPSIS = "…"
Policy = Callable[[dict[str, Any], int, Collection[str]], dict[str, Any]]
#: the built-in context policies, the keys :data:`POLICIES` starts with
ContextPolicy = Literal["trim", "summarise"]


def size_of(value: Any) -> int:
    return len(msgspec.json.encode(value))


def _shrink(value: Any, excess: int) -> Any:
    """``value`` made smaller by about ``excess`` encoded bytes, same type; None if it can't."""
    if isinstance(value, str):
        if not value:
            return None
        keep = max(0, len(value) - max(excess, len(value) // 8, 1) - 1)
        cut = value[:keep].rstrip() + ELLIPSIS
        return cut if size_of(cut) < size_of(value) else ""
    if isinstance(value, list):
        if not value:
            return None
        sizes = [size_of(v) for v in value]
        if len(value) > 1 and max(sizes) <= max(excess, 1) * 4:
            out = list(value)  # many small items: drop from the end
            while out and excess > 0:
                excess -= size_of(out.pop()) + 1
            return out
        i = max(range(len(value)), key=lambda j: (sizes[j], -j))
        smaller = _shrink(value[i], excess)
        if smaller is None:
            return value[:-1]
        return [*value[:i], smaller, *value[i + 1 :]]
    if isinstance(value, dict):
        if not value:
            return None
        key = max(value, key=lambda k: size_of(value[k]))
        smaller = _shrink(value[key], excess)
        if smaller is None:
            return None
        return {**value, key: smaller}
    return None


def trim(inputs: dict[str, Any], limit: int, fields: Collection[str]) -> dict[str, Any]:
    out = dict(inputs)
    for _ in range(10_000):
        excess = size_of(out) - limit
        if excess <= 0:
            break
        live = [f for f in fields if f in out and _shrink(out[f], excess) is not None]
        if not live:
            break
        field = max(live, key=lambda f: size_of(out[f]))
        out[field] = _shrink(out[field], excess)
    return out


_SENTENCE = re.compile(r"(.+?[.!?])(\s|$)", re.S)


def _lead(value: Any, min_len: int) -> Any:
    if isinstance(value, str):
        if len(value) <= min_len:
            return value
        m = _SENTENCE.match(value)
        lead = m.group(1) if m else value
        return lead if len(lead) < len(value) else value
    if isinstance(value, list):
        return [_lead(v, min_len) for v in value]
    if isinstance(value, dict):
        return {k: _lead(v, min_len) for k, v in value.items()}
    return value


def summarise(inputs: dict[str, Any], limit: int, fields: Collection[str]) -> dict[str, Any]:
    out = dict(inputs)
    for f in fields:
        if f in out:
            out[f] = _lead(out[f], 80)
    return trim(out, limit, fields)


POLICIES: dict[str, Policy] = {"trim": trim, "summarise": summarise}


class Fitted(msgspec.Struct, frozen=True, kw_only=True):
    inputs: dict[str, Any]
    policy: str
    original_bytes: int
    final_bytes: int
    limit_bytes: int
    fields: list[str]  # fields that changed

    @property
    def changed(self) -> bool:
        return bool(self.fields)

    @property
    def fits(self) -> bool:
        return self.final_bytes <= self.limit_bytes


def fit_inputs(
    inputs: dict[str, Any], limit: int, fields: Iterable[str] | None = None, policy: str = "trim"
) -> Fitted:
    """Apply ``policy`` to ``fields`` of ``inputs`` (default: every field) to fit ``limit``."""
    original = size_of(inputs)
    names = list(inputs if fields is None else fields)
    if original <= limit:
        return Fitted(
            inputs=inputs,
            policy=policy,
            original_bytes=original,
            final_bytes=original,
            limit_bytes=limit,
            fields=[],
        )
    try:
        fn = POLICIES[policy]
    except KeyError:
        raise ConfigError(
            f"unknown context policy {policy!r}; must be one of {sorted(POLICIES)}"
        ) from None
    out = fn(inputs, limit, names)
    changed = [f for f in names if f in inputs and out.get(f) != inputs[f]]
    return Fitted(
        inputs=out,
        policy=policy,
        original_bytes=original,
        final_bytes=size_of(out),
        limit_bytes=limit,
        fields=changed,
    )


def _has_dep(value: Any) -> bool:
    if isinstance(value, dict):
        return "$dep" in value or any(_has_dep(v) for v in value.values())
    if isinstance(value, list):
        return any(_has_dep(v) for v in value)
    return False


def budget_for(agents: Iterable[AgentCard], capability: str) -> int | None:
    """The largest input any agent offering ``capability`` accepts; None if one has no limit."""
    limits = []
    for card in agents:
        if card.capability(capability) is None:
            continue
        if card.constraints.max_input_bytes is None:
            return None
        limits.append(card.constraints.max_input_bytes)
    return max(limits) if limits else None


def fit_card(
    card: TaskCard,
    declared_inputs: dict[str, Any],
    agents: Iterable[AgentCard],
    policy: str = "trim",
) -> tuple[TaskCard, ev.ContextTrimmed | None]:
    """``card`` with its upstream fields fitted to the capability's input budget.

    Upstream fields are the inputs whose declared value names a dependency
    (``{"$dep": ...}``). Returns the card unchanged and None when it fits
    already (or no agent declares a limit); otherwise the fitted card and the
    ``context.trimmed`` event that records what was done.
    """
    limit = budget_for(agents, card.capability)
    if limit is None:
        return card, None
    upstream = [k for k, v in declared_inputs.items() if _has_dep(v)]
    fitted = fit_inputs(card.inputs, limit, upstream, policy)
    if not fitted.changed:
        return card, None
    event = ev.ContextTrimmed(
        task_id=card.task_id,
        policy=policy,
        original_bytes=fitted.original_bytes,
        final_bytes=fitted.final_bytes,
        limit_bytes=limit,
        attempt=card.attempt,
        fields=fitted.fields,
    )
    return msgspec.structs.replace(card, inputs=fitted.inputs), event
