"""A small JSON Schema checker for the schemas msgspec generates.

Agent capabilities declare input and output schemas as JSON Schema (so an
AgentCard travels over NATS and converts to A2A). The orchestrator checks
plans and outputs against them without importing the agent's code. This
covers the subset ``msgspec.json.schema`` emits: type, properties, required,
items, enum, const, anyOf, $ref/$defs, minimum/maximum, min/maxLength.
"""

from __future__ import annotations

from typing import Any

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
        props = schema.get("properties", {})
        if not partial:
            for name in schema.get("required", []):
                if name not in value:
                    errors.append(f"{path}.{name}: required field missing")
        for name, sub in value.items():
            if name in props:
                _check(sub, props[name], defs, f"{path}.{name}", partial, errors)
            elif schema.get("additionalProperties") is False:
                errors.append(f"{path}.{name}: unexpected field")
    elif isinstance(value, (list, tuple)) and isinstance(schema.get("items"), dict):
        for i, item in enumerate(value):
            _check(item, schema["items"], defs, f"{path}[{i}]", partial, errors)
    elif isinstance(value, str):
        if len(value) < schema.get("minLength", 0):
            errors.append(f"{path}: shorter than {schema['minLength']}")
        if "maxLength" in schema and len(value) > schema["maxLength"]:
            errors.append(f"{path}: longer than {schema['maxLength']}")
    elif isinstance(value, (int, float)) and not isinstance(value, bool):
        if "minimum" in schema and value < schema["minimum"]:
            errors.append(f"{path}: below {schema['minimum']}")
        if "maximum" in schema and value > schema["maximum"]:
            errors.append(f"{path}: above {schema['maximum']}")


def _errs(
    value: Any, schema: dict[str, Any], defs: dict[str, Any], path: str, partial: bool
) -> list[str]:
    errors: list[str] = []
    _check(value, schema, defs, path, partial, errors)
    return errors


def _is(value: Any, kind: str) -> bool:
    if kind in ("integer", "number") and isinstance(value, bool):
        return False
    if kind == "integer" and isinstance(value, float):
        return value.is_integer()
    return isinstance(value, _TYPES.get(kind, (object,)))
