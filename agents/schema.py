"""A small JSON Schema checker for the schemas msgspec generates.

Agent capabilities declare input and output schemas as JSON Schema (so an
AgentCard travels over NATS and converts to A2A). The orchestrator checks
plans and outputs against them without importing the agent's code. This
covers the subset ``msgspec.json.schema`` emits: type, properties, required,
additionalProperties, items/prefixItems, min/maxItems, enum, const, anyOf,
$ref/$defs, minimum/maximum (and exclusive), multipleOf, min/maxLength,
pattern, min/maxProperties, and the string forms msgspec emits (``format``
date-time, date, time, partial-time, duration, uuid, decimal;
``contentEncoding`` base64), which msgspec itself checks. A datetime or time
without a timezone constraint has no ``format`` in msgspec's schema, so it is
checked only as a string. Types follow msgspec's decoder, so a value passes
here when an agent's ``msgspec.convert`` of it would (a float such as ``2.0``
is not an ``integer``; a bool is not a number). ``uniqueItems`` is not
checked: msgspec folds duplicates into its sets.
"""

from __future__ import annotations

import datetime
import decimal
import math
import re
import uuid
from typing import Annotated, Any

import msgspec

__all__ = ["schema_errors"]

_TYPES: dict[str, tuple[type, ...]] = {
    "object": (dict,),
    "array": (list, tuple),
    "string": (str,),
    "integer": (int,),
    "number": (int, float),
    "boolean": (bool,),
    "null": (type(None),),
}


def schema_errors(value: Any, schema: dict[str, Any], *, partial: bool = False) -> list[str]:
    """Every way ``value`` breaks ``schema`` (empty when it fits).

    ``partial=True`` skips missing required properties and values that are
    placeholders (``{"$dep": ...}``) filled in later: used to check a plan's
    literal inputs before its dependencies have run.
    """
    errors: list[str] = []
    _check(value, schema, schema.get("$defs", {}), "$", partial, errors)
    return errors


def _check(
    value: Any,
    schema: dict[str, Any],
    defs: dict[str, Any],
    path: str,
    partial: bool,
    errors: list[str],
) -> None:
    if partial and isinstance(value, dict) and "$dep" in value:
        return
    ref = schema.get("$ref")
    if isinstance(ref, str):
        target = defs.get(ref.rsplit("/", 1)[-1])
        if target is None:
            errors.append(f"{path}: unresolvable $ref {ref}")
            return
        _check(value, target, defs, path, partial, errors)
        return
    if "anyOf" in schema:
        options = schema["anyOf"]
        if not any(not _errs(value, s, defs, path, partial) for s in options):
            errors.append(f"{path}: matches none of the allowed forms")
        return
    if "enum" in schema and value not in schema["enum"]:
        errors.append(f"{path}: {value!r} is not one of {schema['enum']!r}")
    if "const" in schema and value != schema["const"]:
        errors.append(f"{path}: must be {schema['const']!r}")
    kind = schema.get("type")
    if kind is not None:
        kinds = kind if isinstance(kind, list) else [kind]
        if not any(_is(value, k) for k in kinds):
            errors.append(f"{path}: expected {'/'.join(kinds)}, got {type(value).__name__}")
            return
    if isinstance(value, dict):
        _check_object(value, schema, defs, path, partial, errors)
    elif isinstance(value, (list, tuple)):
        _check_array(value, schema, defs, path, partial, errors)
    elif isinstance(value, str):
        if len(value) < schema.get("minLength", 0):
            errors.append(f"{path}: shorter than {schema['minLength']}")
        if "maxLength" in schema and len(value) > schema["maxLength"]:
            errors.append(f"{path}: longer than {schema['maxLength']}")
        pattern = schema.get("pattern")
        if isinstance(pattern, str) and _search(pattern, value) is False:
            errors.append(f"{path}: does not match {pattern!r}")
        for key in ("format", "contentEncoding"):
            problem = _string_form(key, schema.get(key), value)
            if problem:
                errors.append(f"{path}: {problem}")
    elif isinstance(value, (int, float)) and not isinstance(value, bool):
        if "minimum" in schema and not value >= schema["minimum"]:
            errors.append(f"{path}: below {schema['minimum']}")
        if "maximum" in schema and not value <= schema["maximum"]:
            errors.append(f"{path}: above {schema['maximum']}")
        if "exclusiveMinimum" in schema and not value > schema["exclusiveMinimum"]:
            errors.append(f"{path}: not above {schema['exclusiveMinimum']}")
        if "exclusiveMaximum" in schema and not value < schema["exclusiveMaximum"]:
            errors.append(f"{path}: not below {schema['exclusiveMaximum']}")
        step = schema.get("multipleOf")
        if isinstance(step, (int, float)) and step > 0 and not _is_multiple(value, step):
            errors.append(f"{path}: not a multiple of {step}")


def _check_object(
    value: dict[Any, Any],
    schema: dict[str, Any],
    defs: dict[str, Any],
    path: str,
    partial: bool,
    errors: list[str],
) -> None:
    props = schema.get("properties", {})
    extra = schema.get("additionalProperties")
    if not partial:
        for name in schema.get("required", []):
            if name not in value:
                errors.append(f"{path}.{name}: required field missing")
    if "minProperties" in schema and len(value) < schema["minProperties"]:
        errors.append(f"{path}: fewer than {schema['minProperties']} properties")
    if "maxProperties" in schema and len(value) > schema["maxProperties"]:
        errors.append(f"{path}: more than {schema['maxProperties']} properties")
    for name, sub in value.items():
        if not isinstance(name, str):
            errors.append(f"{path}: key {name!r} is not a string")
        elif name in props:
            _check(sub, props[name], defs, f"{path}.{name}", partial, errors)
        elif extra is False:
            errors.append(f"{path}.{name}: unexpected field")
        elif isinstance(extra, dict):
            _check(sub, extra, defs, f"{path}.{name}", partial, errors)


def _check_array(
    value: list[Any] | tuple[Any, ...],
    schema: dict[str, Any],
    defs: dict[str, Any],
    path: str,
    partial: bool,
    errors: list[str],
) -> None:
    if "minItems" in schema and len(value) < schema["minItems"]:
        errors.append(f"{path}: fewer than {schema['minItems']} items")
    if "maxItems" in schema and len(value) > schema["maxItems"]:
        errors.append(f"{path}: more than {schema['maxItems']} items")
    prefix = schema.get("prefixItems")
    head = prefix if isinstance(prefix, list) else []
    for i, (item, sub) in enumerate(zip(value, head, strict=False)):
        _check(item, sub, defs, f"{path}[{i}]", partial, errors)
    items = schema.get("items")
    rest = value[len(head) :]
    if items is False and rest:
        errors.append(f"{path}: more than {len(head)} items")
    elif isinstance(items, dict):
        for i, item in enumerate(rest, start=len(head)):
            _check(item, items, defs, f"{path}[{i}]", partial, errors)


#: string forms msgspec emits, checked by msgspec itself so both agree
_FORMATS: dict[tuple[str, str], Any] = {
    ("format", "date-time"): Annotated[datetime.datetime, msgspec.Meta(tz=True)],
    ("format", "date"): datetime.date,
    ("format", "time"): Annotated[datetime.time, msgspec.Meta(tz=True)],
    ("format", "partial-time"): Annotated[datetime.time, msgspec.Meta(tz=False)],
    ("format", "duration"): datetime.timedelta,
    ("format", "uuid"): uuid.UUID,
    ("format", "decimal"): decimal.Decimal,
    ("contentEncoding", "base64"): bytes,
}


def _string_form(key: str, form: Any, value: str) -> str | None:
    target = _FORMATS.get((key, form)) if isinstance(form, str) else None
    if target is None:  # a form we do not know (email, uri, ...) is not checked
        return None
    try:
        msgspec.convert(value, target)
    except msgspec.ValidationError as e:
        return f"not a valid {form}: {e}"
    return None


def _search(pattern: str, value: str) -> bool | None:
    """Whether ``pattern`` matches somewhere in ``value``; None if it is not a valid regex."""
    try:
        return re.search(pattern, value) is not None
    except re.error:
        return None


def _is_multiple(value: float, step: float) -> bool:
    q = value / step
    return math.isfinite(q) and abs(q - round(q)) < 1e-9


def _errs(
    value: Any, schema: dict[str, Any], defs: dict[str, Any], path: str, partial: bool
) -> list[str]:
    errors: list[str] = []
    _check(value, schema, defs, path, partial, errors)
    return errors


def _is(value: Any, kind: str) -> bool:
    # as msgspec decodes: a bool is not a number and a float (even 2.0) is not an integer
    if kind in ("integer", "number") and isinstance(value, bool):
        return False
    return isinstance(value, _TYPES.get(kind, (object,)))
