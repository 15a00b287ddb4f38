"""plan_digest, made faster (plain values taken as they are, not recursed into), gives
every plan the digest it had: the digest is logged (PlanSubmitted.plan_digest) and a
plan id submitted again is compared with it, so a changed digest is a PlanConflict.

The reference is ``_canonical`` as it was before (commit b0cd144).
"""

from __future__ import annotations

import enum
import hashlib
from collections import OrderedDict
from typing import Any

import msgspec
from hypothesis import given, settings
from hypothesis import strategies as st

from cardbus.bus.orchestrator.digest import _canonical, _fields_of, plan_digest
from cardbus.bus.orchestrator.plan import Plan, PlanTask
from cardbus.eventstore.taskspec import RetryOverride


def _reference(value: Any) -> Any:
    if isinstance(value, msgspec.Struct):
        out = {}
        for name, encode_name, default in _fields_of(type(value)):
            v = getattr(value, name)
            if default is msgspec.NODEFAULT or v != default:
                out[encode_name] = _reference(v)
        return out
    if isinstance(value, dict):
        return {str(k): _reference(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_reference(v) for v in value]
    return msgspec.to_builtins(value)


def _reference_digest(plan: Plan) -> str:
    body = _reference(msgspec.structs.replace(plan, plan_id=None))
    return hashlib.sha256(msgspec.json.encode(body, order="sorted")).hexdigest()


class Level(enum.IntEnum):  # an int subclass: converted by to_builtins, not taken as it is
    LOW = 1


class Name(enum.StrEnum):
    A = "a"


class Inner(msgspec.Struct, rename="camel"):  # a Struct inside inputs: its defaults left out
    some_field: int = 0
    other: list[int] = []


PLAIN = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**63), max_value=2**64 - 1),
    st.floats(allow_nan=False),
    st.text(max_size=5),
)
ODD = st.sampled_from(
    [Level.LOW, Name.A, b"raw", Inner(), Inner(some_field=2, other=[1]), frozenset()]
)
VALUES = st.recursive(
    st.one_of(PLAIN, ODD),
    lambda inner: st.one_of(
        st.lists(inner, max_size=3),
        st.lists(inner, max_size=3).map(tuple),
        st.dictionaries(st.one_of(st.text(max_size=3), st.integers(0, 3)), inner, max_size=3),
        st.dictionaries(st.text(max_size=3), inner, max_size=2).map(OrderedDict),
    ),
    max_leaves=12,
)
TASKS = st.builds(
    PlanTask,
    id=st.text(min_size=1, max_size=4),
    capability=st.sampled_from(["write", "check"]),
    inputs=st.dictionaries(st.text(max_size=3), VALUES, max_size=3),
    constraints=st.dictionaries(st.text(max_size=3), VALUES, max_size=2),
    deps=st.lists(st.text(max_size=3), max_size=2),
    timeout_s=st.sampled_from([30.0, 5.0]),
    max_attempts=st.sampled_from([None, 2]),
    retry=st.sampled_from([None, RetryOverride(), RetryOverride(jitter=0.5)]),
)
PLANS = st.builds(
    Plan,
    goal=st.text(max_size=5),
    tasks=st.lists(TASKS, max_size=3),
    plan_id=st.sampled_from([None, "p"]),
    budget_tokens=st.sampled_from([None, 0, 100]),
    session=st.dictionaries(st.text(max_size=3), VALUES, max_size=2),
)


@settings(max_examples=300, deadline=None)
@given(VALUES)
def test_any_value_is_made_the_builtins_it_was(value: Any) -> None:
    got = _canonical(value)
    want = _reference(value)
    assert got == want
    assert msgspec.json.encode(got, order="sorted") == msgspec.json.encode(want, order="sorted")


@settings(max_examples=300, deadline=None)
@given(PLANS)
def test_every_plan_keeps_its_digest(plan: Plan) -> None:
    assert plan_digest(plan) == _reference_digest(plan)


def test_a_subclass_of_a_plain_type_is_still_converted() -> None:
    """An IntEnum is an int but not taken as it is: to_builtins makes it its value."""
    got = _canonical({"level": Level.LOW, "name": Name.A, "inner": Inner(some_field=3)})
    assert got == {"level": 1, "name": "a", "inner": {"someField": 3}}
    assert type(got["level"]) is int and type(got["name"]) is str
