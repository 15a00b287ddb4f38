"""Checks for configuration objects, run where the object is made.

A setting outside its allowed values is a ``ConfigError`` naming the
setting, the allowed values and what was given: refused at construction,
not discovered later as a run that hangs or silently does something else.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Iterable
from typing import Any, get_args

from cardbus.eventstore.errors import ConfigError

__all__ = ["allowed_values", "check_choice", "check_choices", "check_number", "check_text"]


def allowed_values(literal: Any) -> tuple[str, ...]:
    """The values of a ``Literal[...]`` type, sorted: the one list a check names."""
    return tuple(sorted(get_args(literal)))


def check_choice(owner: str, name: str, value: object, allowed: Collection[str]) -> None:
    """``value`` must be one of ``allowed`` (e.g. ``allowed_values(SomeLiteral)``)."""
    allowed = sorted(allowed)
    if not isinstance(value, str) or value not in allowed:
        raise ConfigError(f"{owner}.{name} must be one of {_listed(allowed)}; got {value!r}")


def check_choices(
    owner: str, name: str, values: object, allowed: Collection[str]
) -> frozenset[str]:
    """Each of ``values`` one of ``allowed``; returned as a frozenset."""
    allowed = sorted(allowed)
    if isinstance(values, (str, bytes)) or not isinstance(values, Iterable):
        raise ConfigError(
            f"{owner}.{name} must be a collection of {_listed(allowed)}; got {values!r}"
        )
    items = list(values)
    wrong = [v for v in items if not isinstance(v, str) or v not in allowed]
    if wrong:
        raise ConfigError(
            f"{owner}.{name}: {_listed(wrong)} not allowed; each must be one of {_listed(allowed)}"
        )
    return frozenset(items)


def check_number(
    owner: str,
    name: str,
    value: object,
    *,
    at_least: float | None = None,
    above: float | None = None,
    integer: bool = False,
) -> None:
    """A finite number (an int if ``integer``), ``>= at_least`` and ``> above`` when given."""
    kind = "an integer" if integer else "a finite number"
    bounds = [f">= {at_least:g}"] if at_least is not None else []
    bounds += [f"> {above:g}"] if above is not None else []
    wanted = " ".join([kind, *bounds])
    # bool is an int to Python, never a count or a duration to us
    ok_type = isinstance(value, int) if integer else isinstance(value, (int, float))
    if isinstance(value, bool) or not ok_type:
        raise ConfigError(f"{owner}.{name} must be {wanted}; got {value!r}")
    # ints compare exactly (a huge one has no float); floats must also be finite
    number: float = value if isinstance(value, int) else float(value)  # type: ignore[arg-type]
    if (
        (isinstance(number, float) and not math.isfinite(number))
        or (at_least is not None and number < at_least)
        or (above is not None and number <= above)
    ):
        raise ConfigError(f"{owner}.{name} must be {wanted}; got {value!r}")


def check_text(owner: str, name: str, value: object) -> None:
    """A non-empty string."""
    if not isinstance(value, str) or not value:
        raise ConfigError(f"{owner}.{name} must be a non-empty string; got {value!r}")


def _listed(values: Iterable[object]) -> str:
    return ", ".join(repr(v) for v in values)
