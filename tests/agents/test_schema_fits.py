"""The quick yes (``schema_fits``) agrees with jsonschema on every schema it compiles."""

from __future__ import annotations

from typing import Any

import msgspec
from hypothesis import given, settings
from hypothesis import strategies as st

from cardbus.agents.schema import _validator, schema_errors
from cardbus.agents.schema_fits import compile_fits

_TYPES = ["string", "integer", "number", "boolean", "null", "object", "array"]
_NAMES = st.sampled_from(["a", "b", "c"])


def _schemas() -> st.SearchStrategy[Any]:
    leaf = st.one_of(
        st.just(True),
        st.builds(lambda t: {"type": t}, st.sampled_from(_TYPES)),
        st.builds(lambda ts: {"type": ts}, st.lists(st.sampled_from(_TYPES), min_size=1)),
    )

    def nested(inner: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
        obj = st.fixed_dictionaries(
            {"type": st.just("object"), "properties": st.dictionaries(_NAMES, inner)},
            optional={
                "required": st.lists(_NAMES, unique=True),
                "additionalProperties": st.one_of(st.booleans(), inner),
                "title": st.just("T"),
            },
        )
        arr = st.fixed_dictionaries({"type": st.just("array"), "items": inner})
        any_of = st.builds(lambda bs: {"anyOf": bs}, st.lists(inner, min_size=1, max_size=3))
        return st.one_of(obj, arr, any_of)

    return st.recursive(leaf, nested, max_leaves=6)


_PLACEHOLDER = {"$dep": "q", "path": "x"}
_values = st.recursive(
    st.one_of(
        st.none(),
        st.booleans(),
        st.integers(-3, 3),
        st.floats(-2, 2, allow_nan=False),
        st.text(max_size=2),
        st.just(_PLACEHOLDER),
    ),
    lambda inner: st.one_of(
        st.lists(inner, max_size=3),
        st.tuples(inner),
        st.dictionaries(_NAMES, inner, max_size=3),
    ),
    max_leaves=8,
)


@settings(max_examples=400, deadline=None)
@given(_schemas(), _values, st.booleans())
def test_the_quick_answer_is_jsonschemas(schema: Any, value: Any, partial: bool) -> None:
    fits = compile_fits(schema, partial)
    assert fits is not None  # every schema drawn is inside the subset
    errors = list(_validator(schema, partial, None).iter_errors(value))
    assert fits(value) == (not errors), (schema, value, errors)


def test_outside_the_subset_there_is_no_quick_answer() -> None:
    for schema in (
        {"type": "string", "minLength": 2},
        {"type": "strnig"},
        {"enum": [1, 2]},
        {"$ref": "#/$defs/X"},
        {"properties": {"a": False}},
        {"anyOf": []},
    ):
        assert compile_fits(schema) is None, schema


class Text(msgspec.Struct):
    text: str
    n: int | None = None


def test_a_misfit_is_still_worded_by_jsonschema() -> None:
    schema = msgspec.json.schema(Text)
    assert schema_errors({"text": "x", "n": None}, schema) == []
    assert schema_errors({"text": 1}, schema) == ["$.text: expected str, got int"]
    assert schema_errors({"n": 2}, schema) == ["$.text: required field missing (expected str)"]
    assert schema_errors({"text": _PLACEHOLDER}, schema, partial=True) == []
    assert schema_errors({"text": "x", "n": True}, schema) != []
