"""Typed questions to a person: what an agent raises to ask, and the question's spec.

An agent that cannot go on without a person's word raises :class:`AskPerson` (a
``NeedsInput`` whose capability is :data:`USER_INPUT`) with the question, the schema of
the answer (a msgspec type or a JSON Schema), and optionally the choices and a default::

    class Amount(msgspec.Struct):
        amount: float
        currency: Literal["EUR", "USD"]

    if task.supplement is None:
        raise AskPerson("How much, in which currency?", Amount)
    answer = msgspec.convert(task.supplement, Amount)

The orchestrator asks it (``bus.orchestrator.questions``): the question waits, durably,
until a person answers it from the console, ``cardbus answer`` or an A2A client; the
answer, validated against the schema, is the task's ``supplement`` on its next attempt.

:func:`question_spec` is the spec the question travels as (the inputs of the task that
asks it): ``question``, ``schema`` (a JSON Schema; ``{}`` takes any answer), ``choices``
(``None``: any value the schema takes) and ``default`` (present only when there is one).
"""

from __future__ import annotations

from typing import Any

import msgspec

from cardbus.agents.agent import NeedsInput, _input_schema

__all__ = ["USER_INPUT", "AskPerson", "question_spec"]

#: the capability that asks a person (a question) rather than an agent
USER_INPUT = "user_input"
_NO_DEFAULT: Any = object()


def question_spec(
    question: str,
    schema: type | dict[str, Any] | None = None,
    *,
    choices: list[Any] | None = None,
    default: Any = _NO_DEFAULT,
) -> dict[str, Any]:
    """The question as the task that asks it carries it; ``ValueError`` for a schema that
    is not one, or a default the schema (or the choices) would refuse."""
    if schema is None:
        body: dict[str, Any] = {}
    elif isinstance(schema, dict):
        body = dict(schema)
    else:  # a msgspec type (a Struct, a Literal, ...): its JSON Schema, inlined at the top
        body = _input_schema(schema)
        ref = body.get("$ref")
        if isinstance(ref, str) and ref.startswith("#/$defs/"):
            # the Struct's own body at the top (a form is drawn from its properties); its
            # $defs stay for what it refers to
            defs = body.get("$defs", {})
            body = {**defs.get(ref.rsplit("/", 1)[-1], {}), "$defs": defs}
    import jsonschema  # here: what only reads questions (`cardbus answer`) pays nothing for it

    try:
        jsonschema.Draft202012Validator.check_schema(body)
    except jsonschema.SchemaError as e:
        raise ValueError(f"the question's schema is not a JSON Schema: {e.message}") from e
    spec: dict[str, Any] = {"question": question, "schema": body, "choices": None}
    if choices is not None:
        spec["choices"] = msgspec.to_builtins(list(choices))
        if not spec["choices"]:
            raise ValueError("a question with choices gives at least one")
    if default is not _NO_DEFAULT:
        spec["default"] = msgspec.to_builtins(default)
        if spec["choices"] is not None and spec["default"] not in spec["choices"]:
            raise ValueError(f"the default {spec['default']!r} is not one of the choices")
        errors = list(jsonschema.Draft202012Validator(body).iter_errors(spec["default"]))
        if errors:
            raise ValueError(f"the default does not fit the schema: {errors[0].message}")
    return spec


class AskPerson(NeedsInput):
    """Raised by a handler to ask a person a typed question (see the module's doc)."""

    def __init__(
        self,
        question: str,
        schema: type | dict[str, Any] | None = None,
        *,
        choices: list[Any] | None = None,
        default: Any = _NO_DEFAULT,
    ) -> None:
        spec = question_spec(question, schema, choices=choices, default=default)
        super().__init__(question, capability=USER_INPUT, inputs=spec)
