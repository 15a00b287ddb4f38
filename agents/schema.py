"""JSON Schema checks by a maintained validator: ``jsonschema``, Draft 2020-12.

Agent capabilities declare input and output schemas as JSON Schema (so an
AgentCard travels over NATS and converts to A2A). The orchestrator checks
plans and outputs against them without importing the agent's code, and so do
tools and imported cards: every schema that is not a msgspec Struct in hand
(an agent's own ``msgspec.convert`` of its inputs keeps msgspec's validation).
Every Draft 2020-12 keyword is honoured (``allOf``, ``oneOf``, ``not``,
``patternProperties``, ``dependentRequired``, ``uniqueItems``, ``if``/``then``,
``contains``, ``unevaluatedProperties``, ...); a schema's ``$schema`` does not
change the draft. ``jsonschema`` is a core dependency, imported on the first
check so that ``import cardbus`` stays cheap.

Where msgspec and the draft differ, a value passes here when an agent's
``msgspec.convert`` of it would: a float such as ``2.0`` is not an
``integer``, a bool is not a number, a tuple is an array; the string forms
msgspec emits (``format`` date-time, date, time, partial-time, duration,
uuid, decimal; ``contentEncoding`` base64) are checked by msgspec itself, and
other formats (email, uri, ...) are annotations, as the draft says. One
difference is on purpose: ``uniqueItems`` (msgspec emits it for a ``set``,
folding duplicates) refuses duplicates, as the draft says.

Each error names the place and the reason, ``$.region: expected str, got
int``; ``partial=True`` (a plan checked before its dependencies have run)
passes dependency placeholders (``{"$dep": ...}``) and missing required
fields. :func:`dep_path_problem` words a ``$dep`` path that leads nowhere.
"""

from __future__ import annotations

import datetime
import decimal
import re
import uuid
from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator
from typing import Annotated, Any

import msgspec

from cardbus.agents.schema_fits import compile_fits

__all__ = [
    "capability_schema_problems",
    "dep_path_problem",
    "resolve_path",
    "schema_errors",
    "schema_problem",
]

# JSON Schema type -> its name in messages: a scalar by the Python type msgspec decodes it
# to, a container by its JSON name (``expected str, got int``; ``expected object, got array``)
_PY_NAMES = {
    "string": "str",
    "integer": "int",
    "number": "float",
    "boolean": "bool",
    "null": "None",
    "object": "object",
    "array": "array",
}
_GOT = {dict: "object", list: "array", tuple: "array", type(None): "None"}


def schema_errors(value: Any, schema: dict[str, Any], *, partial: bool = False) -> list[str]:
    """Every way ``value`` breaks ``schema`` (empty when it fits), each ``"<path>: <reason>"``.

    ``partial=True`` skips missing required properties (and ``dependentRequired``)
    and values that are placeholders (``{"$dep": ...}``) filled in later: used to
    check a plan's literal inputs before its dependencies have run. A schema
    that cannot be used (an unknown type name, a broken regex) is an error
    naming it, never an exception.
    """
    if not schema:
        return []
    errors = (
        []
        if _string_keys_only(value)
        else [f"{p}: key {k!r} is not a string" for p, k in _non_string_keys(value, "$")]
    )
    try:
        schema_key = _schema_key(schema, partial)
        # the same value checked again (rank() asks for every candidate, a resubmitted
        # plan, replicas sharing a card): a value known to fit costs the encodes of the
        # schema and the value, and one lookup (not the validator's too)
        seen = None
        if schema_key is not None and not errors:
            if _quick(schema, partial, schema_key)(value):
                return []  # surely fits (``schema_fits``); a no is worded below
            encoded = _encoded(value)
            if encoded:
                seen = (schema_key, encoded)
                if seen in _FITS:
                    _FITS.move_to_end(seen)
                    return []
        found = list(_validator(schema, partial, schema_key).iter_errors(value))
    except Exception as e:  # a schema jsonschema cannot apply: say so, do not crash
        return [*errors, f"$: the schema cannot be checked: {type(e).__name__}: {e}"]
    if not found and seen is not None:
        _FITS[seen] = None
        if len(_FITS) > _FITS_SIZE:
            _FITS.popitem(last=False)
    for error in found:
        line = f"{_path(error.absolute_path)}: {_reason(error)}"
        if line not in errors:
            errors.append(line)
    return errors


def schema_problem(schema: Any) -> str | None:
    """Why ``schema`` is no Draft 2020-12 schema (``$.properties.a.pattern: '[' is not a
    'regex'``), or None when it is one (``{}``, no schema, is one).

    Asked where a schema comes in (a card registered or announced, an agents file), so
    that a broken one is refused there, with its reason, rather than found by every
    check of a value against it. Each distinct schema is checked once.
    """
    try:
        key = msgspec.json.encode(schema)
    except Exception as e:  # a dict with keys JSON cannot carry, a value it cannot encode
        return f"$: not JSON: {e}"
    if key in _PROBLEMS:
        return _PROBLEMS[key]
    import jsonschema  # a core dependency, imported on first use (the module's docstring)

    problem = None
    try:
        jsonschema.Draft202012Validator.check_schema(schema)
    except jsonschema.SchemaError as e:
        problem = f"{_path(e.absolute_path)}: {e.message}"
    except Exception as e:  # the meta-schema's own checks met something odder still
        problem = f"$: {type(e).__name__}: {e}"
    _PROBLEMS[key] = problem
    if len(_PROBLEMS) > _CACHE_SIZE:
        _PROBLEMS.popitem(last=False)
    return problem


def capability_schema_problems(capabilities: Iterable[Any]) -> dict[str, str]:
    """Each capability (a ``CapabilitySpec``) whose schemas are not a JSON Schema, with why
    (``{"lookup": "input_schema is not a JSON Schema: $.type: ..."}``)."""
    problems: dict[str, str] = {}
    for c in capabilities:
        for which in ("input_schema", "output_schema"):
            problem = schema_problem(getattr(c, which))
            if problem is not None:
                problems.setdefault(c.name, f"{which} is not a JSON Schema: {problem}")
    return problems


def resolve_path(output: Any, path: str) -> tuple[bool, Any]:
    """Follow a ``$dep`` ``path`` ("a.b.0") into ``output``: (found, value)."""
    value = output
    for key in filter(None, path.split(".")):
        if isinstance(value, dict) and key in value:
            value = value[key]
        elif isinstance(value, list) and key.isdigit() and int(key) < len(value):
            value = value[int(key)]
        else:
            return False, None
    return True, value


def dep_path_problem(dep: str, path: str, output: Any) -> str | None:
    """``$dep 'q' has no path 'nosuch.field'`` when ``path`` leads nowhere in ``output``.

    The words a failure reason uses for a placeholder whose dependency's
    output lacks the field it names (the deepest part that exists is named
    too); None when the path resolves.
    """
    found, _ = resolve_path(output, path)
    if found:
        return None
    parts = [p for p in path.split(".") if p]
    reached: list[str] = []
    for part in parts:
        ok, _ = resolve_path(output, ".".join([*reached, part]))
        if not ok:
            break
        reached.append(part)
    where = f" (it stops after {'.'.join(reached)!r})" if reached else ""
    return f"$dep {dep!r} has no path {path!r}{where}"


# -- the validator ----------------------------------------------------------------------

_CACHE: OrderedDict[bytes, Any] = OrderedDict()
_CACHE_SIZE = 512
_CLASSES: dict[bool, Any] = {}
_QUICK: OrderedDict[bytes, Callable[[Any], bool]] = OrderedDict()
_FITS: OrderedDict[tuple[bytes, bytes], None] = OrderedDict()
_FITS_SIZE = 4096
_PROBLEMS: OrderedDict[bytes, str | None] = OrderedDict()


def _encoded(value: Any) -> bytes:
    try:
        return msgspec.json.encode(value)
    except Exception:  # not JSON (a set, an object): checked, never cached
        return b""


def _schema_key(schema: dict[str, Any], partial: bool) -> bytes | None:
    """What a schema's validator is cached under (None: a schema that is not JSON)."""
    # the schema's bytes, not its identity: a schema is a dict, which a caller may change
    # between checks
    try:
        key = msgspec.json.encode(schema)
    except Exception:
        return None
    return key + b"~partial" if partial else key


def _never(value: Any) -> bool:
    return False


def _quick(schema: dict[str, Any], partial: bool, key: bytes) -> Callable[[Any], bool]:
    """The quick yes for ``schema`` (``schema_fits``; one saying no to every value when the
    schema is outside its subset), made once per schema, cached under ``key``."""
    fits = _QUICK.get(key)
    if fits is None:
        fits = compile_fits(_inline_refs(schema), partial) or _never
        _QUICK[key] = fits
        if len(_QUICK) > _CACHE_SIZE:
            _QUICK.popitem(last=False)
    return fits


def _validator(schema: dict[str, Any], partial: bool, key: bytes | None) -> Any:
    """The validator for ``schema`` (made once per schema, cached under ``key``)."""
    if key is not None:
        cached = _CACHE.get(key)
        if cached is not None:
            _CACHE.move_to_end(key)
            return cached
    cls = _CLASSES.get(partial)
    if cls is None:
        cls = _CLASSES[partial] = _make_class(partial)
    validator = cls(_false_with_path(_inline_refs(schema)))
    if key is not None:
        _CACHE[key] = validator
        if len(_CACHE) > _CACHE_SIZE:
            _CACHE.popitem(last=False)
    return validator


class _Recursive(Exception):
    pass


def _inline_refs(schema: Any) -> Any:
    """``schema`` with each ``{"$ref": "#/$defs/X"}`` replaced by the definition itself, as
    msgspec's schemas name every Struct: jsonschema resolves a ``$ref`` on every check
    (most of the time of checking a small output). A recursive definition, or any other
    kind of reference, leaves the schema as it is."""
    if not isinstance(schema, dict) or not isinstance(schema.get("$defs"), dict):
        return schema
    defs = schema["$defs"]

    def walk(node: Any, stack: tuple[str, ...]) -> Any:
        if isinstance(node, list):
            return [walk(x, stack) for x in node]
        if not isinstance(node, dict):
            return node
        ref = node.get("$ref")
        if isinstance(ref, str) and set(node) - {"$defs"} == {"$ref"}:
            name = ref[len("#/$defs/") :]
            if (
                not ref.startswith("#/$defs/")
                or name in stack
                or name not in defs
                or "/" in name
                or "~" in name
                or not isinstance(defs[name], dict)
            ):
                raise _Recursive(name)
            found = walk(defs[name], (*stack, name))
            return {**found, "$defs": node["$defs"]} if "$defs" in node else found
        return {k: (v if k == "$defs" else walk(v, stack)) for k, v in node.items()}

    try:
        return walk(schema, ())
    except (_Recursive, RecursionError):
        return schema


_ONE = ("not", "if", "then", "else", "contains", "propertyNames", "items", "additionalProperties")
_MANY = ("allOf", "anyOf", "oneOf")
_MAPS = ("$defs", "dependentSchemas")
_NAMED = ("properties", "patternProperties")


def _false_with_path(schema: Any) -> Any:
    """``schema`` with each ``false`` under properties/patternProperties/prefixItems as
    ``{"not": {}}``: the same meaning, but jsonschema reports the field's path only for
    the latter."""
    if not isinstance(schema, dict):
        return schema
    out = dict(schema)
    for k in _ONE:
        if k in out:
            out[k] = _false_with_path(out[k])
    for k in _MANY:
        if isinstance(out.get(k), list):
            out[k] = [_false_with_path(s) for s in out[k]]
    for k in _MAPS:
        if isinstance(out.get(k), dict):
            out[k] = {n: _false_with_path(s) for n, s in out[k].items()}
    for k in _NAMED:
        if isinstance(out.get(k), dict):
            out[k] = {n: _NOTHING if s is False else _false_with_path(s) for n, s in out[k].items()}
    if isinstance(out.get("prefixItems"), list):
        out["prefixItems"] = [
            _NOTHING if s is False else _false_with_path(s) for s in out["prefixItems"]
        ]
    return out


_NOTHING: dict[str, Any] = {"not": {}}


def _make_class(partial: bool) -> Any:
    import jsonschema  # lazily: the first check pays the import, `import cardbus` does not
    import jsonschema.validators
    from jsonschema import Draft202012Validator
    from jsonschema.exceptions import ValidationError
    from referencing.exceptions import Unresolvable

    base = Draft202012Validator
    checker = base.TYPE_CHECKER.redefine_many(
        {  # as msgspec decodes
            "integer": lambda _, v: isinstance(v, int) and not isinstance(v, bool),
            "number": lambda _, v: isinstance(v, (int, float)) and not isinstance(v, bool),
            "array": lambda _, v: isinstance(v, (list, tuple)),
        }
    )
    original = base.VALIDATORS

    def required(validator: Any, names: Any, instance: Any, schema: Any) -> Iterator[Any]:
        if not validator.is_type(instance, "object"):
            return
        properties = schema.get("properties") if isinstance(schema, dict) else None
        for name in names:
            if name not in instance:
                wanted = _declared_type(
                    properties.get(name) if isinstance(properties, dict) else None
                )
                said = f" (expected {wanted})" if wanted else ""
                yield ValidationError(f"required field missing{said}", path=(name,))

    def dependent_required(validator: Any, deps: Any, instance: Any, schema: Any) -> Iterator[Any]:
        if not validator.is_type(instance, "object"):
            return
        for name, needed in deps.items():
            if name in instance:
                for other in needed:
                    if other not in instance:
                        yield ValidationError(f"required when {name!r} is present", path=(other,))

    def additional(validator: Any, extra: Any, instance: Any, schema: Any) -> Iterator[Any]:
        if extra is not False or not validator.is_type(instance, "object"):
            yield from original["additionalProperties"](validator, extra, instance, schema) or ()
            return
        props = schema.get("properties", {})
        patterns = schema.get("patternProperties", {})
        why = (
            "unexpected field (it matches no property pattern)" if patterns else "unexpected field"
        )
        for name in instance:
            if name not in props and not any(re.search(p, name) for p in patterns):
                yield ValidationError(why, path=(name,))

    def ref(validator: Any, target: Any, instance: Any, schema: Any) -> Iterator[Any]:
        try:
            found = list(original["$ref"](validator, target, instance, schema) or ())
        except Unresolvable:
            yield ValidationError(f"unresolvable $ref {target}")
            return
        yield from found

    def fmt(validator: Any, form: Any, instance: Any, schema: Any) -> Iterator[Any]:
        if isinstance(instance, str):
            problem = _string_form("format", form, instance)
            if problem:
                yield ValidationError(problem)

    def encoding(validator: Any, form: Any, instance: Any, schema: Any) -> Iterator[Any]:
        if isinstance(instance, str):
            problem = _string_form("contentEncoding", form, instance)
            if problem:
                yield ValidationError(problem)

    keywords: dict[str, Callable[..., Any]] = {
        **original,
        "required": required,
        "dependentRequired": dependent_required,
        "additionalProperties": additional,
        "$ref": ref,
        "format": fmt,
        "contentEncoding": encoding,
    }
    if partial:
        keywords = {k: _lenient(k, f, original) for k, f in keywords.items()}
    cls = jsonschema.validators.extend(base, validators=keywords, type_checker=checker)
    return cls


#: keywords that judge a value as a whole: a placeholder inside it makes them unknowable
_WHOLE = frozenset({"enum", "const", "uniqueItems", "not"})


def _lenient(keyword: str, check: Callable[..., Any], original: dict[str, Any]) -> Any:
    """``check`` for a partial plan: placeholders pass, missing fields are not missing yet."""
    if keyword in ("required", "dependentRequired"):
        return lambda *_: ()
    any_of = original["anyOf"]

    def lenient(validator: Any, value: Any, instance: Any, schema: Any) -> Iterable[Any]:
        if _is_placeholder(instance):
            return ()
        if keyword in _WHOLE and _holds_placeholder(instance):
            return ()
        if keyword == "oneOf" and _holds_placeholder(instance):
            # a placeholder fits every branch: only "none fits" can be known now
            return any_of(validator, value, instance, schema) or ()
        return check(validator, value, instance, schema) or ()

    return lenient


def _is_placeholder(value: Any) -> bool:
    return isinstance(value, dict) and "$dep" in value


def _holds_placeholder(value: Any) -> bool:
    if isinstance(value, dict):
        return "$dep" in value or any(_holds_placeholder(v) for v in value.values())
    if isinstance(value, (list, tuple)):
        return any(_holds_placeholder(v) for v in value)
    return False


_LEAVES = frozenset({str, int, float, bool, type(None)})


def _string_keys_only(value: Any) -> bool:
    """True when every key of every dict in ``value`` is a string: the usual answer, told
    without the generators and paths :func:`_non_string_keys` builds for the messages."""
    if isinstance(value, dict):
        for k, v in value.items():
            if not isinstance(k, str):
                return False
            if type(v) not in _LEAVES and not _string_keys_only(v):
                return False
    elif isinstance(value, (list, tuple)):
        for v in value:
            if type(v) not in _LEAVES and not _string_keys_only(v):
                return False
    return True


def _non_string_keys(value: Any, path: str) -> Iterator[tuple[str, Any]]:
    if isinstance(value, dict):
        for k, v in value.items():
            if not isinstance(k, str):
                yield path, k
            else:
                yield from _non_string_keys(v, f"{path}.{k}")
    elif isinstance(value, (list, tuple)):
        for i, v in enumerate(value):
            yield from _non_string_keys(v, f"{path}[{i}]")


# -- messages ---------------------------------------------------------------------------


def _path(parts: Iterable[Any]) -> str:
    return "$" + "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in parts)


def _got(value: Any) -> str:
    return _GOT.get(type(value), type(value).__name__)


def _declared_type(schema: Any) -> str:
    """What a property's schema asks for, in the words of ``expected ...`` (``str``,
    ``str or None``); "" when it names no type (a ``$ref``, a constraint alone)."""
    if not isinstance(schema, dict):
        return ""
    if "type" in schema:
        return _expected(schema["type"])
    forms = schema.get("anyOf") or schema.get("oneOf")
    if (
        isinstance(forms, list)
        and forms
        and all(isinstance(f, dict) and "type" in f for f in forms)
    ):
        return " or ".join(_expected(f["type"]) for f in forms)
    return ""


def _expected(kind: Any) -> str:
    # A card registered before schemas were checked at intake (``schema_problem``), or a
    # tool's, may say anything in "type" (a dict: unhashable): worded as it is, never
    # raised from inside a decision step.
    kinds = kind if isinstance(kind, list) else [kind]
    return " or ".join(_PY_NAMES.get(k, str(k)) if isinstance(k, str) else repr(k) for k in kinds)


def _reason(error: Any) -> str:
    """The reason part of a message, in the words of the keyword that failed."""
    kw, want, value, schema = error.validator, error.validator_value, error.instance, error.schema
    match kw:
        case "type":
            return f"expected {_expected(want)}, got {_got(value)}"
        case "enum":
            return f"{value!r} is not one of {want!r}"
        case "const":
            return f"must be {want!r}"
        case "anyOf" | "oneOf" if not _matching_branches(error):
            return _none_matched(error)
        case "oneOf":
            return (
                f"matches {_matching_branches(error)} of the forms under 'oneOf', not exactly one"
            )
        case "not" if want == {}:
            return "nothing is allowed here (the schema is false)"
        case "not":
            return f"must not match the schema under 'not' ({want!r})"
        case "allOf":
            return f"does not match every schema under 'allOf': {error.message}"
        case "minLength":
            return f"shorter than {want}"
        case "maxLength":
            return f"longer than {want}"
        case "pattern":
            return f"does not match {want!r}"
        case "minimum":
            return f"below {want}"
        case "maximum":
            return f"above {want}"
        case "exclusiveMinimum":
            return f"not above {want}"
        case "exclusiveMaximum":
            return f"not below {want}"
        case "multipleOf":
            return f"not a multiple of {want}"
        case "minItems":
            return f"fewer than {want} items"
        case "maxItems":
            return f"more than {want} items"
        case "items" if want is False:
            return f"more than {len(schema.get('prefixItems', []))} items"
        case "minProperties":
            return f"fewer than {want} properties"
        case "maxProperties":
            return f"more than {want} properties"
        case "uniqueItems":
            return "items are not unique (uniqueItems)"
        case "contains":
            return f"no item matches the schema under 'contains' ({error.message})"
        case None:  # the schema `false`
            return "nothing is allowed here (the schema is false)"
    return str(error.message)


def _matching_branches(error: Any) -> int:
    """How many branches of an anyOf/oneOf the value matched (0: none)."""
    branches = error.validator_value if isinstance(error.validator_value, list) else []
    failed = {e.schema_path[0] for e in error.context if e.schema_path}
    return len(branches) - len(failed)


def _none_matched(error: Any) -> str:
    context = list(error.context)
    tops = [e for e in context if not e.relative_path and e.validator == "type"]
    branches = error.validator_value if isinstance(error.validator_value, list) else []
    if (
        context
        and len(tops) == len(branches)
        and len({e.schema_path[0] for e in tops}) == len(branches)
    ):  # every branch wanted another type: name them all
        kinds: list[str] = []
        for e in tops:
            for k in (
                e.validator_value if isinstance(e.validator_value, list) else [e.validator_value]
            ):
                name = _PY_NAMES.get(k, str(k))
                if name not in kinds:
                    kinds.append(name)
        return f"expected {' or '.join(kinds)}, got {_got(error.instance)}"
    if not context:
        return f"matches none of the forms under {error.validator!r}"
    # the closest form: one the value has the type of (the others fail on "type" at once)
    wrong_type = {e.schema_path[0] for e in tops if e.schema_path}
    near = [e for e in context if e.schema_path and e.schema_path[0] not in wrong_type]
    if not near:
        from jsonschema.exceptions import best_match

        near = [best_match(context)]
    closest = near[0]
    return (
        f"matches none of the forms under {error.validator!r}"
        f" (closest: {_path(closest.absolute_path)}: {_reason(closest)})"
    )


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
    if target is None:  # a form msgspec does not emit (email, uri, ...): an annotation
        return None
    try:
        msgspec.convert(value, target)
    except msgspec.ValidationError as e:
        return f"not a valid {form}: {e}"
    return None
