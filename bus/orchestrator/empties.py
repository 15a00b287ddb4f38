"""Shared immutable values for the fold's views of waiting runs (issue 34, RSS per waiting run).

A thousand runs in flight hold three thousand ``TaskView``s, most never dispatched:
an empty dict of its own per field is 64 bytes each, a one-agent frozenset 216. So
the views' mappings and sets are values, replaced on a write and never changed in
place, like a tuple: every empty one is :data:`EMPTY`, and a set of one agent (or
one attempt) is the same frozenset for every task that has it (:func:`plus`).

:data:`EMPTY` refuses writes (``TypeError``), and the fields are typed ``Mapping``
so mypy flags an in-place write: a write that forgot to replace the mapping fails
at once instead of writing into every task's.
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping
from typing import Any, NoReturn, TypeVar

__all__ = ["EMPTY", "empty", "plus", "with_item", "without"]

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")


class _Empty(dict[Any, Any]):
    """The one empty mapping the views share: reads as ``{}``, encodes as ``{}``
    (msgspec, a snapshot), refuses every write."""

    __slots__ = ()

    def _refuse(self, *args: object, **kwargs: object) -> NoReturn:
        raise TypeError("the shared empty mapping: replace the field, do not write into it")

    __setitem__ = __delitem__ = setdefault = update = pop = popitem = clear = _refuse
    __ior__ = _refuse


EMPTY: Mapping[Any, Any] = _Empty()


def empty() -> Mapping[Any, Any]:
    """``EMPTY``, as a dataclass field's ``default_factory`` (a dict is refused as a default)."""
    return EMPTY


def with_item(mapping: Mapping[K, V], key: K, value: V) -> dict[K, V]:
    """A new mapping: ``mapping`` with ``key`` set to ``value`` (these hold one or two keys)."""
    out = dict(mapping)
    out[key] = value
    return out


def without(mapping: Mapping[K, V], key: K) -> Mapping[K, V]:
    """A new mapping without ``key`` (``EMPTY`` when nothing is left)."""
    if key not in mapping:
        return mapping
    rest = {k: v for k, v in mapping.items() if k != key}
    return rest or EMPTY


# one frozenset per single member, shared by every task whose set is just that member (an
# agent id, an attempt number); bounded: past the limit it starts afresh (a set already
# handed out stays valid, it is immutable)
_ONES: dict[Hashable, frozenset[Any]] = {}
_ONES_LIMIT = 4096


def plus(members: frozenset[K], member: K) -> frozenset[K]:
    """``members | {member}``; a set of one member is a shared one."""
    if members:
        return members if member in members else members | {member}
    one = _ONES.get(member)
    if one is None:
        if len(_ONES) >= _ONES_LIMIT:
            _ONES.clear()
        one = _ONES[member] = frozenset((member,))
    return one
