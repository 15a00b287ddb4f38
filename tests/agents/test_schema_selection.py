"""schema_errors against msgspec-generated schemas; selection: filter, embedder, rank."""

from __future__ import annotations

import datetime
import decimal
import enum
import uuid
from dataclasses import dataclass
from typing import Annotated, Any, Literal

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cardbus.agents import AgentCard, AgentConstraints, CapabilitySpec, HashingEmbedder
from cardbus.agents.cards import constraint_problem
from cardbus.agents.schema import schema_errors
from cardbus.bus.orchestrator.selection import AgentStat, Weights, hard_filter, rank

# -- schema_errors ----------------------------------------------------------------


class Color(enum.Enum):
    RED = "red"
    BLUE = "blue"


class Author(msgspec.Struct, frozen=True):
    name: str
    email: str | None = None


class Chapter(msgspec.Struct, frozen=True):
    title: Annotated[str, msgspec.Meta(min_length=1, max_length=20)]
    pages: Annotated[int, msgspec.Meta(ge=1, le=500)]
    authors: list[Author] = []


class Book(msgspec.Struct, frozen=True):
    title: str
    author: Author
    chapters: list[Chapter]
    subtitle: str | None = None
    kind: Literal["novel", "essay"] = "novel"
    color: Color = Color.RED
    ratings: dict[str, float] = {}
    span: tuple[int, int] = (0, 0)
    isbn: Annotated[str, msgspec.Meta(pattern=r"^\d{3}-\d$")] = "000-0"
    price: Annotated[float, msgspec.Meta(gt=0, lt=1000)] = 1.0
    copies: Annotated[int, msgspec.Meta(multiple_of=5)] = 0
    tags: Annotated[list[str], msgspec.Meta(max_length=2)] = []


SCHEMA = msgspec.json.schema(Book)
GOOD: dict[str, Any] = {
    "title": "Bees",
    "author": {"name": "Ann", "email": None},
    "chapters": [{"title": "Hive", "pages": 10, "authors": [{"name": "Bo"}]}],
    "subtitle": "all about bees",
    "kind": "essay",
    "color": "blue",
    "ratings": {"critics": 4.5, "readers": 4},
    "span": [1990, 2000],
    "isbn": "123-4",
    "price": 9.99,
    "copies": 15,
    "tags": ["x"],
}


def with_(**over: Any) -> dict[str, Any]:
    return {**GOOD, **over}


def test_the_schema_uses_refs_for_nested_structs() -> None:
    assert SCHEMA["$ref"] == "#/$defs/Book"
    book = SCHEMA["$defs"]["Book"]
    assert book["properties"]["author"] == {"$ref": "#/$defs/Author"}
    assert book["properties"]["chapters"]["items"] == {"$ref": "#/$defs/Chapter"}


@pytest.mark.parametrize(
    "value",
    [
        GOOD,
        {"title": "t", "author": {"name": "a"}, "chapters": []},  # defaults left out
        with_(subtitle=None),
        with_(kind="novel", color="red"),
        with_(extra_field="ignored, as msgspec ignores it"),
    ],
)
def test_valid_values_have_no_errors(value: dict[str, Any]) -> None:
    assert schema_errors(value, SCHEMA) == []
    msgspec.convert(value, Book)  # and msgspec agrees


@pytest.mark.parametrize(
    ("value", "where"),
    [
        ("not an object", "$"),
        ({"author": {"name": "a"}, "chapters": []}, "$.title"),  # required
        (with_(title=3), "$.title"),
        (with_(author="Ann"), "$.author"),  # $ref to an object
        (with_(author={}), "$.author.name"),  # required inside a $ref
        (with_(author={"name": "a", "email": 5}), "$.author.email"),  # optional, wrong type
        (with_(chapters={"title": "x"}), "$.chapters"),  # not a list
        (with_(chapters=[{"title": "x", "pages": 0}]), "$.chapters[0].pages"),  # minimum
        (with_(chapters=[{"title": "x", "pages": 501}]), "$.chapters[0].pages"),  # maximum
        (with_(chapters=[{"title": "", "pages": 1}]), "$.chapters[0].title"),  # minLength
        (with_(chapters=[{"title": "x" * 21, "pages": 1}]), "$.chapters[0].title"),
        (with_(chapters=[{"title": "x", "pages": 2.0}]), "$.chapters[0].pages"),  # float != int
        (with_(chapters=[{"title": "x", "pages": True}]), "$.chapters[0].pages"),  # bool != int
        (with_(chapters=[GOOD["chapters"][0], {"pages": 1}]), "$.chapters[1].title"),
        (with_(chapters=[{"title": "x", "pages": 1, "authors": [{}]}]), "authors[0].name"),
        (with_(kind="poem"), "$.kind"),  # Literal -> enum
        (with_(color="green"), "$.color"),  # Enum -> $ref to an enum
        (with_(subtitle=["x"]), "$.subtitle"),  # anyOf
        (with_(ratings={"critics": "good"}), "$.ratings.critics"),  # additionalProperties
        (with_(ratings=[4.5]), "$.ratings"),
        (with_(span=[1]), "$.span"),  # tuple: minItems
        (with_(span=[1, 2, 3]), "$.span"),  # tuple: maxItems
        (with_(span=["a", 2]), "$.span[0]"),  # tuple: prefixItems
        (with_(isbn="12-34"), "$.isbn"),  # pattern
        (with_(price=0), "$.price"),  # exclusiveMinimum
        (with_(price=1000), "$.price"),  # exclusiveMaximum
        (with_(copies=7), "$.copies"),  # multipleOf
        (with_(tags=["a", "b", "c"]), "$.tags"),  # maxItems on a list
    ],
)
def test_each_violation_is_reported_with_its_path(value: Any, where: str) -> None:
    errors = schema_errors(value, SCHEMA)
    assert errors, value
    assert any(where in e for e in errors), errors
    with pytest.raises(msgspec.ValidationError):  # msgspec agrees it is invalid
        msgspec.convert(value, Book)


def test_all_errors_are_reported_at_once() -> None:
    errors = schema_errors(with_(title=1, kind="poem", color="green"), SCHEMA)
    assert len(errors) == 3


def test_an_unresolvable_ref_is_an_error_not_a_crash() -> None:
    assert schema_errors({}, {"$ref": "#/$defs/Missing"}) == [
        "$: unresolvable $ref #/$defs/Missing"
    ]


def test_an_empty_schema_accepts_anything() -> None:
    for value in (None, 1, "x", [1], {"a": {"b": []}}):
        assert schema_errors(value, {}) == []


def test_partial_mode_skips_dependency_placeholders_and_missing_fields() -> None:
    value = {
        "title": {"$dep": "research", "path": "title"},
        "author": {"$dep": "people"},
        "chapters": [{"$dep": "c1"}, {"title": "x", "pages": 1}],
    }
    assert schema_errors(value, SCHEMA, partial=True) == []
    assert schema_errors({"chapters": [{"$dep": "c1"}]}, SCHEMA, partial=True) == []
    assert schema_errors({"$dep": "all"}, SCHEMA, partial=True) == []
    # without partial, placeholders are just wrong values
    assert schema_errors(value, SCHEMA)
    # literal values are still checked in partial mode
    errors = schema_errors({"title": {"$dep": "t"}, "kind": "poem"}, SCHEMA, partial=True)
    assert errors == ["$.kind: 'poem' is not one of ['essay', 'novel']"]
    errors = schema_errors({"chapters": [{"pages": "ten"}]}, SCHEMA, partial=True)
    assert len(errors) == 1 and "$.chapters[0].pages" in errors[0]


_json = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False)
    | st.text(max_size=6)
    | st.sampled_from(["red", "blue", "novel", "essay", "123-4"]),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner),
    max_leaves=12,
)
_chapter = st.fixed_dictionaries(
    {"title": st.text(max_size=22) | _json, "pages": st.integers(-5, 600) | _json},
    optional={"authors": st.lists(st.fixed_dictionaries({"name": st.text(max_size=3)}))},
)
_book_like = st.fixed_dictionaries(
    {
        "title": st.text(max_size=6) | _json,
        "author": st.fixed_dictionaries({"name": st.text(max_size=4)}) | _json,
        "chapters": st.lists(_chapter, max_size=2) | _json,
    },
    optional={
        "subtitle": st.none() | _json,
        "kind": st.sampled_from(["novel", "essay", "poem"]),
        "color": st.sampled_from(["red", "blue", "green"]),
        "ratings": st.dictionaries(st.text(max_size=3), st.floats(allow_nan=False)) | _json,
        "span": st.lists(st.integers(), max_size=3) | _json,
        "isbn": st.from_regex(r"\d{3}-\d", fullmatch=True) | st.text(max_size=5),
        "price": st.floats(-1, 1001, allow_nan=False),
        "copies": st.integers(-20, 20),
        "tags": st.lists(st.text(max_size=2), max_size=3),
    },
)


@settings(max_examples=150, deadline=None)
@given(_book_like | _json)
def test_schema_errors_agrees_with_msgspec(value: Any) -> None:
    """A value passes schema_errors exactly when an agent's msgspec.convert accepts it."""
    try:
        msgspec.convert(value, Book)
        accepted = True
    except msgspec.ValidationError:
        accepted = False
    assert (schema_errors(value, SCHEMA) == []) == accepted


# -- constraints and hard filter -------------------------------------------------------


def spec(name: str, description: str = "", input_type: Any = None) -> CapabilitySpec:
    schema = msgspec.json.schema(input_type) if input_type is not None else {}
    return CapabilitySpec(name=name, description=description, input_schema=schema)


class TopicIn(msgspec.Struct):
    topic: str


LIMITED = AgentConstraints(
    max_timeout_s=30,
    max_input_bytes=100,
    limits={"languages": ["en", "fr"], "max_words": 1000, "tier": "gold"},
)


@pytest.mark.parametrize(
    ("constraints", "timeout_s", "size", "problem"),
    [
        ({}, 30, 100, None),
        ({"languages": "en"}, 1, 1, None),
        ({"languages": ["fr", "en"]}, 1, 1, None),
        ({"max_words": 1000}, 1, 1, None),
        ({"tier": "gold"}, 1, 1, None),
        ({}, 30.5, 1, "timeout"),
        ({}, float("nan"), 1, "timeout"),
        ({}, 1, 101, "bytes"),
        ({"languages": "de"}, 1, 1, "languages"),
        ({"languages": ["en", "de"]}, 1, 1, "languages"),
        ({"max_words": 1001}, 1, 1, "max_words"),
        ({"max_words": None}, 1, 1, "max_words"),
        ({"max_words": False}, 1, 1, "max_words"),
        ({"tier": "silver"}, 1, 1, "tier"),
        ({"gpu": "a100"}, 1, 1, "gpu"),
    ],
)
def test_constraint_problem(
    constraints: dict[str, Any], timeout_s: float, size: int, problem: str | None
) -> None:
    found = constraint_problem(LIMITED, constraints, timeout_s, size)
    if problem is None:
        assert found is None
    else:
        assert found is not None and problem in found


def test_an_agent_without_limits_accepts_any_timeout_and_size() -> None:
    assert constraint_problem(AgentConstraints(), {}, 1e9, 10**9) is None
    assert constraint_problem(AgentConstraints(), {"x": 1}, 1, 1) is not None


CARD = AgentCard(
    agent_id="r",
    name="r",
    capabilities=[spec("research", "find facts", TopicIn), spec("free")],
    constraints=LIMITED,
)


@pytest.mark.parametrize(
    ("args", "reason"),
    [
        (("research", {"topic": "bees"}, {}, 10), None),
        (("free", {"anything": [1, 2]}, {}, 10), None),  # no schema: anything goes
        (("write", {"topic": "bees"}, {}, 10), "out_of_capability"),
        (("research", {}, {}, 10), "input_schema_mismatch"),
        (("research", {"topic": 1}, {}, 10), "input_schema_mismatch"),
        (("research", {"topic": "b" * 200}, {}, 10), "over_constraint"),
        (("research", {"topic": "bees"}, {"languages": "de"}, 10), "over_constraint"),
        (("research", {"topic": "bees"}, {}, 60), "over_constraint"),
    ],
)
def test_hard_filter(args: tuple[str, dict[str, Any], dict[str, Any], float], reason: str) -> None:
    assert hard_filter(CARD, *args) == reason


def test_hard_filter_partial_inputs() -> None:
    placeholder = {"topic": {"$dep": "t0", "path": "topic"}}
    assert hard_filter(CARD, "research", placeholder, {}, 10) == "input_schema_mismatch"
    assert hard_filter(CARD, "research", placeholder, {}, 10, partial_inputs=True) is None
    assert hard_filter(CARD, "research", {}, {}, 10, partial_inputs=True) is None
    bad = {"topic": 5}
    assert hard_filter(CARD, "research", bad, {}, 10, partial_inputs=True) is not None


# -- the embedder ------------------------------------------------------------------------


def cos(a: list[float], b: list[float]) -> float:
    return sum(x * y for x, y in zip(a, b, strict=True))


def test_hashing_embedder_is_deterministic_and_normalised() -> None:
    texts = ["Research the history of bees", "", "Write a poem"]
    a = HashingEmbedder().embed(texts)
    b = HashingEmbedder().embed(texts)
    assert a == b
    assert all(len(v) == 512 for v in a)
    assert abs(cos(a[0], a[0]) - 1.0) < 1e-9
    assert a[1] == [0.0] * 512  # empty text: the zero vector, no division by zero
    assert len(HashingEmbedder(dim=64).embed(["x"])[0]) == 64
    # case and punctuation do not matter
    (c,) = HashingEmbedder().embed(["RESEARCH, the history of BEES!"])
    assert c == a[0]


def test_hashing_embedder_is_stable_across_processes() -> None:
    # blake2b, not hash(): the same vector in every process (PYTHONHASHSEED)
    import subprocess
    import sys

    code = (
        "from cardbus.agents.embedding import HashingEmbedder;"
        "v=HashingEmbedder(16).embed(['research bees'])[0];print([round(x,6) for x in v])"
    )
    outs = {
        subprocess.run(
            [sys.executable, "-c", code],
            capture_output=True,
            text=True,
            check=True,
            env={"PYTHONHASHSEED": seed, "PATH": ""},
            cwd=str(__import__("pathlib").Path(__file__).parents[2]),
        ).stdout
        for seed in ("1", "2")
    }
    assert len(outs) == 1


@pytest.mark.parametrize(
    ("goal", "close", "far"),
    [
        (
            "research facts about honey bees",
            "find facts and research a topic such as bees",
            "translate legal contracts into french",
        ),
        (
            "review the draft report for quality issues",
            "review a report draft and list quality issues",
            "generate images of cats",
        ),
        ("summarize this long text", "summarize a long text in a few words", "book a flight"),
    ],
)
def test_a_goal_close_to_a_description_scores_higher(goal: str, close: str, far: str) -> None:
    g, c, f = HashingEmbedder().embed([goal, close, far])
    assert cos(g, c) > cos(g, f)
    assert cos(g, c) > 0.2


# -- rank ------------------------------------------------------------------------------


def agent(agent_id: str, description: str, **kw: Any) -> AgentCard:
    return AgentCard(
        agent_id=agent_id,
        name=agent_id,
        capabilities=[spec("research", description, TopicIn)],
        **kw,
    )


class Stats:
    def __init__(self, table: dict[str, AgentStat]) -> None:
        self.table = table

    def get(self, agent_id: str, capability: str) -> AgentStat | None:
        return self.table.get(agent_id)


AGENTS = [
    agent("bees", "research facts about honey bees and hives"),
    agent("law", "research legal precedents in contract law"),
    agent("generic", "research any topic"),
]
ARGS: dict[str, Any] = {
    "capability": "research",
    "goal": "facts about honey bees",
    "inputs": {"topic": "bees"},
    "constraints": {},
    "timeout_s": 10,
}


def test_rank_orders_by_similarity_without_stats() -> None:
    ranked = rank(AGENTS, **ARGS)
    assert ranked[0].agent_id == "bees"
    assert [c.score for c in ranked] == sorted((c.score for c in ranked), reverse=True)
    for c in ranked:  # no history: priors of 0.5 for success and speed
        assert c.success_rate == 0.5 and c.speed == 0.5
        expected = 0.5 * c.similarity + 0.3 * 0.5 + 0.2 * 0.5
        assert c.score == pytest.approx(expected, abs=1e-5)
        assert 0.0 <= c.similarity <= 1.0


def test_rank_uses_success_rate_and_speed_from_stats() -> None:
    stats = Stats(
        {
            "bees": AgentStat(runs=10, success_rate=0.1, p50_s=9.0),
            "law": AgentStat(runs=10, success_rate=1.0, p50_s=0.0),
        }
    )
    ranked = rank(AGENTS, **ARGS, stats=stats)
    by_id = {c.agent_id: c for c in ranked}
    assert by_id["law"].success_rate == 1.0 and by_id["law"].speed == 1.0
    assert by_id["bees"].success_rate == 0.1 and by_id["bees"].speed == pytest.approx(0.1)
    assert by_id["generic"].success_rate == 0.5  # unknown agent: the prior
    assert ranked[0].agent_id == "law"  # history beats a better description here


def test_weights_change_the_order() -> None:
    stats = Stats({"law": AgentStat(runs=10, success_rate=1.0, p50_s=0.0)})
    only_similarity = rank(AGENTS, **ARGS, stats=stats, weights=Weights(1.0, 0.0, 0.0))
    only_success = rank(AGENTS, **ARGS, stats=stats, weights=Weights(0.0, 1.0, 0.0))
    assert only_similarity[0].agent_id == "bees"
    assert only_success[0].agent_id == "law"
    assert only_success[0].score == 1.0


def test_ties_are_broken_by_agent_id() -> None:
    twins = [agent("b", "same words"), agent("a", "same words"), agent("c", "same words")]
    assert [c.agent_id for c in rank(twins, **ARGS)] == ["a", "b", "c"]


def test_rank_excludes_and_filters() -> None:
    ranked = rank(AGENTS, **ARGS, exclude=frozenset({"bees"}))
    assert "bees" not in {c.agent_id for c in ranked} and len(ranked) == 2
    assert rank(AGENTS, **ARGS, exclude=frozenset(a.agent_id for a in AGENTS)) == []
    slow = agent("slow", "research honey bees", constraints=AgentConstraints(max_timeout_s=1))
    assert [c.agent_id for c in rank([slow], **ARGS)] == []
    assert rank(AGENTS, **{**ARGS, "capability": "write"}) == []
    assert rank(AGENTS, **{**ARGS, "inputs": {"topic": 3}}) == []
    assert rank([], **ARGS) == []


def test_rank_with_a_custom_embedder() -> None:
    @dataclass
    class Fixed:
        vectors: dict[str, list[float]]

        def embed(self, texts: list[str]) -> list[list[float]]:
            return [next((v for k, v in self.vectors.items() if k in t), [0.0, 0.0]) for t in texts]

    embedder = Fixed({"honey": [1.0, 0.0], "legal": [0.6, 0.8], "any": [0.0, 1.0]})
    ranked = rank(AGENTS, **ARGS, embedder=embedder)
    sims = {c.agent_id: c.similarity for c in ranked}
    assert sims == {"bees": 1.0, "law": 0.6, "generic": 0.0}


def test_rank_without_a_goal_uses_the_capability() -> None:
    ranked = rank(AGENTS, **{**ARGS, "goal": ""})
    assert len(ranked) == 3 and all(c.similarity > 0 for c in ranked)


class Forms(msgspec.Struct, frozen=True):
    when: Annotated[datetime.datetime, msgspec.Meta(tz=True)] | None = None
    day: datetime.date | None = None
    at: Annotated[datetime.time, msgspec.Meta(tz=True)] | None = None
    local: Annotated[datetime.time, msgspec.Meta(tz=False)] | None = None
    span: datetime.timedelta | None = None
    id: uuid.UUID | None = None
    blob: bytes | None = None
    amount: decimal.Decimal | None = None
    email: Annotated[str, msgspec.Meta(extra_json_schema={"format": "email"})] = ""


FORMS = msgspec.json.schema(Forms)


@pytest.mark.parametrize(
    ("field", "value", "ok"),
    [
        ("when", "2024-05-01T10:00:00Z", True),
        ("when", "2024-05-01T10:00:00", False),  # no timezone
        ("when", "yesterday", False),
        ("day", "2024-02-29", True),
        ("day", "2024-02-30", False),
        ("at", "10:30:00+02:00", True),
        ("at", "10:30:00", False),
        ("at", "25:00", False),
        ("local", "10:30:00", True),
        ("local", "10:30:00Z", False),
        ("span", "P1DT2H", True),
        ("span", "a while", False),
        ("id", "12345678-1234-5678-1234-567812345678", True),
        ("id", "not-a-uuid", False),
        ("blob", "aGVsbG8=", True),
        ("blob", "not base64!", False),
        ("amount", "12.50", True),
        ("amount", "twelve", False),
        ("email", "not checked", True),  # a form msgspec does not check is not checked here
    ],
)
def test_string_forms_are_checked_as_msgspec_does(field: str, value: str, ok: bool) -> None:
    errors = schema_errors({field: value}, FORMS)
    assert (errors == []) is ok, errors
    try:
        msgspec.convert({field: value}, Forms)
        accepted = True
    except msgspec.ValidationError:
        accepted = False
    assert accepted is ok


def test_caching_embedder_matches_its_inner_embedder_and_embeds_each_text_once() -> None:
    from cardbus.agents.embedding import CachingEmbedder, HashingEmbedder

    class Counting(HashingEmbedder):
        seen: list[str] = []

        def embed(self, texts):  # type: ignore[no-untyped-def]
            type(self).seen.extend(texts)
            return super().embed(texts)

    cached = CachingEmbedder(Counting(), size=3)
    texts = ["write a report", "review a draft", "write a report"]
    assert cached.embed(texts) == HashingEmbedder().embed(texts)
    assert cached.embed(["review a draft"]) == HashingEmbedder().embed(["review a draft"])
    assert Counting.seen == ["write a report", "review a draft"]
    cached.embed(["a", "b"])  # over the size: the cache starts afresh, still correct
    assert cached.embed(["write a report"]) == HashingEmbedder().embed(["write a report"])


# -- every Draft 2020-12 keyword (jsonschema) ----------------------------------------------

# (keyword, schema, a value that fits, a value that breaks it, words of the reason)
KEYWORDS: list[tuple[str, dict[str, Any], Any, Any, str]] = [
    ("allOf", {"allOf": [{"minimum": 0}, {"maximum": 10}]}, 5, 11, "$: above 10"),
    (
        "oneOf",
        {"oneOf": [{"multipleOf": 2}, {"multipleOf": 3}]},
        4,
        6,
        "$: matches 2 of the forms under 'oneOf', not exactly one",
    ),
    ("not", {"not": {"type": "string"}}, 1, "x", "$: must not match the schema under 'not'"),
    (
        "patternProperties",
        {"patternProperties": {"^n_": {"type": "integer"}}, "additionalProperties": False},
        {"n_a": 1},
        {"n_a": "one"},
        "$.n_a: expected int, got str",
    ),
    (
        "patternProperties+additionalProperties",
        {"patternProperties": {"^n_": {"type": "integer"}}, "additionalProperties": False},
        {"n_a": 1},
        {"other": 1},
        "$.other: unexpected field (it matches no property pattern)",
    ),
    (
        "dependentRequired",
        {"dependentRequired": {"card": ["expiry"]}},
        {"card": "4111", "expiry": "01/30"},
        {"card": "4111"},
        "$.expiry: required when 'card' is present",
    ),
    ("uniqueItems", {"uniqueItems": True}, [1, 2], [1, 1], "$: items are not unique"),
    (
        "if/then",
        {
            "if": {"properties": {"kind": {"const": "file"}}, "required": ["kind"]},
            "then": {"required": ["path"]},
        },
        {"kind": "file", "path": "/x"},
        {"kind": "file"},
        "$.path: required field missing",
    ),
    (
        "if/else",
        {"if": {"type": "integer"}, "then": {"minimum": 0}, "else": {"type": "string"}},
        "x",
        [1],
        "$: expected str, got array",
    ),
    (
        "contains",
        {"contains": {"type": "integer", "minimum": 10}},
        [1, 12],
        [1, 2],
        "$: no item matches the schema under 'contains'",
    ),
    (
        "minContains",
        {"contains": {"const": 1}, "minContains": 2},
        [1, 1],
        [1, 2],
        "$: Too few items match the given schema",
    ),
    (
        "propertyNames",
        {"propertyNames": {"pattern": "^[a-z]+$"}},
        {"ab": 1},
        {"A": 1},
        "does not match '^[a-z]+$'",
    ),
    (
        "dependentSchemas",
        {"dependentSchemas": {"a": {"required": ["b"]}}},
        {"a": 1, "b": 2},
        {"a": 1},
        "$.b: required field missing",
    ),
    (
        "unevaluatedProperties",
        {"properties": {"a": {}}, "unevaluatedProperties": False},
        {"a": 1},
        {"a": 1, "z": 2},
        "$: Unevaluated properties are not allowed",
    ),
    ("const", {"const": "yes"}, "yes", "no", "$: must be 'yes'"),
    ("false schema", {"properties": {"x": False}}, {}, {"x": 1}, "$.x: nothing is allowed here"),
    ("false item", {"prefixItems": [{}, False]}, [1], [1, 2], "$[1]: nothing is allowed here"),
]


@pytest.mark.parametrize(
    ("schema", "good", "bad", "words"),
    [k[1:] for k in KEYWORDS],
    ids=[k[0] for k in KEYWORDS],
)
def test_every_keyword_is_honoured_and_named(
    schema: dict[str, Any], good: Any, bad: Any, words: str
) -> None:
    assert schema_errors(good, schema) == []
    errors = schema_errors(bad, schema)
    assert errors, f"{bad!r} broke {schema} and was accepted"
    assert any(words in e for e in errors), errors


class Where(msgspec.Struct):
    region: str
    zone: str | None = None
    sites: list[Author] = []


WHERE = msgspec.json.schema(Where)


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ({"region": 5}, "$.region: expected str, got int"),
        ({"region": "eu", "zone": 3}, "$.zone: expected str or None, got int"),
        ({}, "$.region: required field missing (expected str)"),
        ({"region": "eu", "sites": [{"name": 1}]}, "$.sites[0].name: expected str, got int"),
        ({"region": "eu", "sites": ["x"]}, "$.sites[0]: expected object, got str"),
        ({"region": True}, "$.region: expected str, got bool"),
        ({1: "x", "region": "eu"}, "$: key 1 is not a string"),
    ],
)
def test_an_error_names_the_field_and_the_reason(value: Any, message: str) -> None:
    assert message in schema_errors(value, WHERE)


def test_a_union_of_objects_names_the_closest_form() -> None:
    schema = {"anyOf": [{"type": "object", "required": ["a"]}, {"type": "integer"}]}
    (error,) = schema_errors({"b": 1}, schema)
    assert error.startswith("$: matches none of the forms under 'anyOf'")
    assert "$.a: required field missing" in error


@settings(max_examples=100, deadline=None)
@given(st.lists(st.integers(-3, 3), max_size=5))
def test_unique_items_and_contains_as_the_draft_says(items: list[int]) -> None:
    assert (schema_errors(items, {"uniqueItems": True}) == []) == (len(set(items)) == len(items))
    assert (schema_errors(items, {"contains": {"minimum": 2}}) == []) == any(i >= 2 for i in items)
    one_of = {"oneOf": [{"items": {"minimum": 0}}, {"minItems": 3}]}
    fits = [all(i >= 0 for i in items), len(items) >= 3]
    assert (schema_errors(items, one_of) == []) == (sum(fits) == 1)


@settings(max_examples=100, deadline=None)
@given(st.dictionaries(st.sampled_from(["a", "b", "n_1", "n_x", "z"]), st.integers() | st.text()))
def test_object_keywords_as_the_draft_says(value: dict[str, Any]) -> None:
    pattern = {"patternProperties": {"^n_": {"type": "integer"}}, "additionalProperties": False}
    fits = all(k.startswith("n_") and isinstance(v, int) for k, v in value.items())
    assert (schema_errors(value, pattern) == []) == fits
    dep = {"dependentRequired": {"a": ["b"]}}
    assert (schema_errors(value, dep) == []) == ("a" not in value or "b" in value)
    neg = {"not": {"required": ["z"]}}
    assert (schema_errors(value, neg) == []) == ("z" not in value)
    cond = {"if": {"required": ["a"]}, "then": {"properties": {"a": {"type": "integer"}}}}
    assert (schema_errors(value, cond) == []) == ("a" not in value or isinstance(value["a"], int))


def test_partial_mode_with_the_new_keywords() -> None:
    dep = {"$dep": "q", "path": "x"}
    # a placeholder fits every branch and every whole-value check until it is filled in
    assert schema_errors([dep, dep], {"uniqueItems": True}, partial=True) == []
    assert schema_errors(dep, {"not": {"type": "object"}}, partial=True) == []
    assert schema_errors({"a": dep}, {"not": {"required": ["a"]}}, partial=True) == []
    one_of = {"oneOf": [{"type": "string"}, {"type": "object"}]}
    assert schema_errors({"v": dep}, {"properties": {"v": one_of}}, partial=True) == []
    assert schema_errors([dep], {"oneOf": [{"minItems": 1}, {"maxItems": 5}]}, partial=True) == []
    assert schema_errors({"card": 1}, {"dependentRequired": {"card": ["e"]}}, partial=True) == []
    assert schema_errors({"a": dep}, {"properties": {"a": {"const": 3}}}, partial=True) == []
    # literal values are still checked, and a literal matching no branch is refused
    assert schema_errors(3, one_of, partial=True) == ["$: expected str or object, got int"]
    assert schema_errors([1, 1], {"uniqueItems": True}, partial=True)
    assert schema_errors({"card": 1}, {"dependentRequired": {"card": ["e"]}}) != []


@pytest.mark.parametrize(
    ("schema", "words"),
    [
        ({"type": "text"}, "the schema cannot be checked"),
        ({"pattern": "("}, "the schema cannot be checked"),
        ({"properties": {"a": {"$ref": "#/$defs/Gone"}}}, "$.a: unresolvable $ref #/$defs/Gone"),
    ],
)
def test_a_schema_that_cannot_be_used_is_an_error_not_a_crash(
    schema: dict[str, Any], words: str
) -> None:
    errors = schema_errors({"a": "x"} if "properties" in schema else "x", schema)
    assert errors and any(words in e for e in errors), errors


def test_dep_path_problem_names_the_dependency_and_the_path() -> None:
    from cardbus.agents.schema import dep_path_problem, resolve_path

    output = {"facts": ["a", "b"], "meta": {"n": 2}}
    assert dep_path_problem("q", "facts.1", output) is None
    assert dep_path_problem("q", "", output) is None
    assert dep_path_problem("q", "nosuch.field", output) == "$dep 'q' has no path 'nosuch.field'"
    assert dep_path_problem("q", "meta.x", output) == (
        "$dep 'q' has no path 'meta.x' (it stops after 'meta')"
    )
    assert dep_path_problem("q", "facts.5", output) is not None
    assert resolve_path(output, "meta.n") == (True, 2)
    assert resolve_path(output, "facts.x") == (False, None)
    assert resolve_path({"v": None}, "v") == (True, None)  # a null value is found, not missing
