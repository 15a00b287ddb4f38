"""A quick yes for the schemas most cards declare: does a value fit, told without jsonschema.

``schema_errors`` (``agents.schema``) checks every value a dispatch, an output and a plan
carry; jsonschema's validator walks generators and descends per keyword, about 10 us for
a one-field object, which a run at 1,000 in flight pays several times per step. Most
schemas an agent declares are msgspec's for a Struct: objects of typed properties,
``required``, arrays of items, a ``None`` alternative (``anyOf``). :func:`compile_fits`
turns such a schema (its ``$ref`` already inlined) into a predicate; any keyword outside
that subset, or a malformed one, gives None and jsonschema decides as before.

The predicate only ever says yes for a value jsonschema would pass: a no (or no
predicate) sends the value to jsonschema, which finds the errors and words them. Types are
judged as ``schema._make_class`` redefines them (msgspec's view: a bool is not a number, a
tuple is an array). ``partial`` is the plan check's leniency: a ``{"$dep": ...}``
placeholder fits anywhere and ``required`` waits for the dependencies.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

__all__ = ["compile_fits"]

Fits = Callable[[Any], bool]

#: keywords that never judge a value (annotations): ``$defs`` only matters through a
#: ``$ref``, and a ``$ref`` left after inlining is outside the subset
_IGNORED = frozenset(
    {
        "title",
        "description",
        "default",
        "examples",
        "$comment",
        "$defs",
        "$schema",
        "$id",
        "deprecated",
        "readOnly",
        "writeOnly",
    }
)
_KNOWN = _IGNORED | {"type", "properties", "required", "additionalProperties", "items", "anyOf"}


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


_TYPES: dict[str, Fits] = {
    "string": lambda v: isinstance(v, str),
    "integer": _is_int,
    "number": _is_number,
    "boolean": lambda v: isinstance(v, bool),
    "null": lambda v: v is None,
    "object": lambda v: isinstance(v, dict),
    "array": lambda v: isinstance(v, (list, tuple)),
}


class _Outside(Exception):
    """The schema uses something this module does not judge: jsonschema does."""


def compile_fits(schema: Any, partial: bool = False) -> Fits | None:
    """A predicate saying which values surely fit ``schema``; None when it is outside the
    subset (jsonschema alone decides then)."""
    try:
        return _node(schema, partial)
    except (_Outside, RecursionError):
        return None


def _is_placeholder(value: Any) -> bool:
    return isinstance(value, dict) and "$dep" in value


def _node(schema: Any, partial: bool) -> Fits:
    if schema is True:
        return lambda v: True
    if schema is False or not isinstance(schema, dict) or not set(schema) <= _KNOWN:
        raise _Outside
    checks: list[Fits] = []
    if "type" in schema:
        checks.append(_type(schema["type"]))
    props = schema.get("properties")
    if props is not None:
        if not isinstance(props, dict):
            raise _Outside
        checks.append(_properties({k: _node(s, partial) for k, s in props.items()}))
    required = schema.get("required")
    if required is not None:
        if not isinstance(required, list) or not all(isinstance(n, str) for n in required):
            raise _Outside
        if not partial:  # a plan's missing inputs may come from its dependencies
            checks.append(_required(tuple(required)))
    if "additionalProperties" in schema:
        checks.append(_additional(schema["additionalProperties"], set(props or ()), partial))
    if "items" in schema:
        checks.append(_items(_node(schema["items"], partial)))
    if "anyOf" in schema:
        branches = schema["anyOf"]
        if not isinstance(branches, list) or not branches:
            raise _Outside
        compiled = [_node(b, partial) for b in branches]
        checks.append(lambda v: any(f(v) for f in compiled))
    if partial:
        return lambda v: _is_placeholder(v) or all(f(v) for f in checks)
    if len(checks) == 1:
        return checks[0]
    return lambda v: all(f(v) for f in checks)


def _type(kind: Any) -> Fits:
    kinds = kind if isinstance(kind, list) else [kind]
    if not kinds or not all(isinstance(k, str) and k in _TYPES for k in kinds):
        raise _Outside  # an unknown type name: jsonschema's message names it
    tests = [_TYPES[k] for k in kinds]
    if len(tests) == 1:
        return tests[0]
    return lambda v: any(t(v) for t in tests)


def _properties(props: dict[str, Fits]) -> Fits:
    def fits(v: Any) -> bool:
        if not isinstance(v, dict):
            return True
        return all(check(v[name]) for name, check in props.items() if name in v)

    return fits


def _required(names: tuple[str, ...]) -> Fits:
    return lambda v: not isinstance(v, dict) or all(n in v for n in names)


def _additional(extra: Any, declared: set[str], partial: bool) -> Fits:
    if extra is True:
        return lambda v: True
    if extra is False:
        return lambda v: not isinstance(v, dict) or all(k in declared for k in v)
    check = _node(extra, partial)
    return lambda v: (
        not isinstance(v, dict) or all(check(x) for k, x in v.items() if k not in declared)
    )


def _items(check: Fits) -> Fits:
    return lambda v: not isinstance(v, (list, tuple)) or all(check(x) for x in v)
