"""``$ref``s to ``$defs`` are inlined once per schema: the same verdicts, recursion kept."""

from __future__ import annotations

import msgspec

from cardbus.agents.schema import _inline_refs, schema_errors


class Inner(msgspec.Struct):
    n: int
    tags: list[str] = []


class Outer(msgspec.Struct):
    inner: Inner
    more: list[Inner] = []
    maybe: Inner | None = None


class Tree(msgspec.Struct):
    name: str
    children: list[Tree] = []


def test_local_refs_are_inlined_and_the_verdicts_stay_the_same():
    schema = msgspec.json.schema(Outer)
    assert "$ref" in msgspec.json.encode(schema).decode()
    inlined = _inline_refs(schema)
    assert (
        '"$ref"'
        not in msgspec.json.encode({k: v for k, v in inlined.items() if k != "$defs"}).decode()
    )
    good = {"inner": {"n": 1}, "more": [{"n": 2, "tags": ["a"]}], "maybe": None}
    bad = {"inner": {"n": "x"}, "more": [{"tags": [1]}], "maybe": {"n": 1.5}}
    assert schema_errors(good, schema) == []
    errors = schema_errors(bad, schema)
    assert errors == sorted(errors) or errors  # named by path, whatever the order
    assert any("$.inner.n" in e for e in errors), errors
    assert any("$.more[0]" in e for e in errors), errors


def test_a_recursive_schema_is_left_as_it_is_and_still_checked():
    schema = msgspec.json.schema(Tree)
    assert _inline_refs(schema) is schema
    assert schema_errors({"name": "a", "children": [{"name": "b"}]}, schema) == []
    assert schema_errors({"name": "a", "children": [{"name": 3}]}, schema)


def test_a_schema_whose_type_is_not_a_name_is_worded_not_raised():
    # Found by test_loop_never_stops: an agent card announced {"type": {}} and the
    # wording of the misfit raised TypeError (unhashable dict) inside a decision step.
    errors = schema_errors("x", {"type": {}})
    assert errors and "expected {}" in errors[0]
    assert schema_errors({"a": 1}, {"properties": {"a": {"type": [{}, "string"]}}})
