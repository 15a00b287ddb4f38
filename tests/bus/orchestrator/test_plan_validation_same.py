"""validate_plan, made faster (cards indexed by capability, one nesting walk over a
plan's values), refuses exactly the plans it refused before, with the same error.

The reference below is validate_plan and the two helpers it changed as they were
before (commit b0cd144); every plan and card set generated must give the same
outcome from both: accepted by both, or the same exception type and message.
"""

from __future__ import annotations

import math
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from cardbus.agents.cards import AgentCard, AgentConstraints, CapabilitySpec
from cardbus.bus.orchestrator.plan import (
    Plan,
    PlanTask,
    _check_acyclic,
    _check_conflict_options,
    _worded,
    dep_refs,
    rename_refs,
    resolve_inputs,
    task_retry,
    validate_plan,
)
from cardbus.bus.orchestrator.retry import RetryPolicy
from cardbus.bus.orchestrator.selection import hard_filter
from cardbus.eventstore.batch import MAX_DEPTH, MAX_ID_CHARS, nesting_problem
from cardbus.eventstore.errors import InvalidPlan
from cardbus.eventstore.taskspec import RetryOverride


def _reference(plan: Plan, agents: list[AgentCard] | None, retry: RetryPolicy) -> None:
    if not plan.tasks:
        raise InvalidPlan("plan has no tasks")
    if plan.budget_tokens is not None and plan.budget_tokens < 0:
        raise InvalidPlan(f"budget_tokens must be >= 0, got {plan.budget_tokens}")
    _reference_limits(plan)
    seen: set[str] = set()
    for t in plan.tasks:
        if not t.id or any(c in t.id for c in " .*>~\t\n"):
            raise InvalidPlan(f"task id {t.id!r} must be non-empty without spaces or . * > ~")
        if t.id in seen:
            raise InvalidPlan(f"task id {t.id!r} appears twice")
        seen.add(t.id)
        bad_timeout = not math.isfinite(t.timeout_s) or t.timeout_s <= 0
        bad_attempts = t.max_attempts is not None and t.max_attempts < 1
        if bad_attempts or t.fanout < 1 or bad_timeout or t.max_review_rounds < 0:
            raise InvalidPlan(
                f"task {t.id!r}: max_attempts, fanout and timeout_s must be positive"
                f" (and timeout_s finite): got {t.max_attempts}, {t.fanout}, {t.timeout_s}"
            )
        task_retry(t, retry)
        _check_conflict_options(t)
    for t in plan.tasks:
        for d in t.deps:
            if d not in seen:
                raise InvalidPlan(f"task {t.id!r} depends on unknown task {d!r}")
        for ref in dep_refs(t.inputs):
            if ref not in t.deps:
                raise InvalidPlan(
                    f"task {t.id!r} reads the output of {ref!r} without declaring it in deps"
                )
    _check_acyclic(plan)
    if agents is None:
        return
    cards = list(agents)
    by_id = {c.agent_id: c for c in cards}
    for t in plan.tasks:
        for cap in filter(None, [t.capability, t.review_by]):
            if not [c for c in cards if c.capability(cap) is not None]:
                raise InvalidPlan(f"task {t.id!r}: no registered agent offers capability {cap!r}")
        reasons = {
            c.agent_id: hard_filter(
                c, t.capability, t.inputs, t.constraints, t.timeout_s, partial_inputs=True
            )
            or _reference_missing(c, t)
            for c in cards
            if c.capability(t.capability) is not None
        }
        if all(reasons.values()):
            # the words of each refusal are the shared helper's (issue 30: they name the
            # absent field and an unmet constraint too); which tasks are refused is the test
            detail = ", ".join(f"{a}: {_worded(by_id[a], t)}" for a in sorted(reasons))
            raise InvalidPlan(f"task {t.id!r}: no agent accepts its inputs ({detail})")


def _reference_limits(plan: Plan) -> None:
    def named(what: str, value: object) -> None:
        if isinstance(value, str) and len(value) > MAX_ID_CHARS:
            raise InvalidPlan(
                f"{what} {value[:40]!r}... is {len(value)} chars, over the limit of"
                f" {MAX_ID_CHARS} (MAX_ID_CHARS)"
            )

    named("plan_id", plan.plan_id)
    problem = nesting_problem(plan.session, what="session")
    for t in plan.tasks:
        named("task id", t.id)
        for cap in (t.capability, t.review_by):
            named(f"task {t.id[:40]!r}: capability", cap)
        for d in t.deps:
            named(f"task {t.id[:40]!r}: dependency", d)
        problem = problem or nesting_problem(t.inputs, what=f"task {t.id[:40]!r}: inputs")
        problem = problem or nesting_problem(t.constraints, what=f"task {t.id[:40]!r}: constraints")
    if problem:
        raise InvalidPlan(problem)


def _reference_missing(card: AgentCard, t: PlanTask) -> str | None:
    spec = card.capability(t.capability)
    schema: Any = spec.input_schema if spec else {}
    ref = schema.get("$ref")
    if isinstance(ref, str):
        schema = schema.get("$defs", {}).get(ref.rsplit("/", 1)[-1], {})
    required = schema.get("required", []) if isinstance(schema, dict) else []
    if any(name not in t.inputs for name in required):
        return "input_schema_mismatch"
    return None


def _nested(depth: int) -> Any:
    """``depth`` lists one in another: its deepest list is ``depth - 1`` levels down."""
    value: Any = "leaf"
    for _ in range(depth):
        value = [value]
    return value


IDS = ["a", "b", "c", "", "a b", "x.y", "i" * MAX_ID_CHARS, "j" * (MAX_ID_CHARS + 1)]
CAPS: list[Any] = ["write", "check", "nobody", "", "k" * (MAX_ID_CHARS + 1), 5]
# deep values near MAX_DEPTH, put one level down in an inputs or constraints dict
DEEP = [_nested(MAX_DEPTH - 1), _nested(MAX_DEPTH), _nested(MAX_DEPTH + 1)]
VALUES = st.one_of(
    st.sampled_from(["x", 7, 2.5, None, True, [1, {"k": "v"}], {"k": [1]}, *DEEP]),
    st.builds(lambda d: {"$dep": d, "path": "text"}, st.sampled_from([*IDS, "zz"])),
)
SCHEMAS = [
    {},
    {"type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]},
    {"type": "object", "properties": {"n": {"type": "integer"}}},
    {
        "$ref": "#/$defs/In",
        "$defs": {
            "In": {
                "type": "object",
                "properties": {"text": {"type": "string"}},
                "required": ["text"],
            }
        },
    },
]

tasks = st.builds(
    PlanTask,
    id=st.sampled_from(IDS),
    capability=st.sampled_from(CAPS),
    review_by=st.one_of(st.none(), st.sampled_from(CAPS)),
    deps=st.lists(st.sampled_from([*IDS, "zz"]), max_size=2),
    inputs=st.dictionaries(st.sampled_from(["text", "n", "extra"]), VALUES, max_size=3),
    constraints=st.sampled_from([{}, {"lang": "en"}, {"deep": DEEP[1]}, {"deep": DEEP[0]}]),
    timeout_s=st.sampled_from([30.0, 0.0, -1.0, math.inf, math.nan]),
    fanout=st.sampled_from([1, 2, 0]),
    max_attempts=st.sampled_from([None, 1, 2, 0]),
    retry=st.sampled_from([None, RetryOverride(max_attempts=2), RetryOverride(jitter=-1.0)]),
    tie_policy=st.sampled_from([None, "retry", "bogus"]),
    reviewers=st.sampled_from([1, 2, 0]),
)
plans = st.builds(
    Plan,
    goal=st.just("g"),
    tasks=st.lists(tasks, max_size=4),
    plan_id=st.sampled_from([None, "p", "q" * (MAX_ID_CHARS + 1)]),
    budget_tokens=st.sampled_from([None, 10, -1]),
    session=st.sampled_from([{}, {"user": "u"}, {"deep": DEEP[1]}, {"deep": DEEP[0]}]),
)
specs = st.builds(
    CapabilitySpec,
    name=st.sampled_from(["write", "check", "other", 5]),
    input_schema=st.sampled_from(SCHEMAS),
)
cards = st.builds(
    AgentCard,
    agent_id=st.sampled_from(["a1", "a2", "a3"]),  # repeated ids too: the last card wins
    name=st.just("n"),
    capabilities=st.lists(specs, max_size=3),  # a name twice on a card: the first counts
    constraints=st.sampled_from([AgentConstraints(), AgentConstraints(max_input_bytes=12)]),
)


def _outcome(check: Any, *args: Any) -> tuple[str, str] | None:
    try:
        check(*args)
    except Exception as e:  # any exception: TypeError from a plan built unchecked too
        return type(e).__name__, str(e)
    return None


@settings(max_examples=400, deadline=None)
@given(plans, st.one_of(st.none(), st.lists(cards, max_size=4)))
def test_the_faster_validation_refuses_exactly_what_the_old_one_did(
    plan: Plan, agents: list[AgentCard] | None
) -> None:
    retry = RetryPolicy()
    assert _outcome(validate_plan, plan, agents, retry) == _outcome(_reference, plan, agents, retry)


def test_the_generated_plans_reach_every_outcome() -> None:
    """The generator is not all refusals: a valid plan with agents passes both ways, and
    each check the faster code changed refuses in both (so the comparison above can fail)."""
    write = CapabilitySpec(name="write", input_schema=SCHEMAS[1])
    card = AgentCard(agent_id="a1", name="n", capabilities=[write])
    ok = Plan(goal="g", tasks=[PlanTask(id="a", capability="write", inputs={"text": "x"})])
    assert _outcome(validate_plan, ok, [card], RetryPolicy()) is None
    # a name twice on a card: the first spec is the card's (it requires nothing here)
    twice = AgentCard(agent_id="a1", name="n", capabilities=[CapabilitySpec(name="write"), write])
    empty = Plan(goal="g", tasks=[PlanTask(id="a", capability="write", inputs={})])
    assert _outcome(validate_plan, empty, [twice], RetryPolicy()) is None
    assert _outcome(_reference, empty, [twice], RetryPolicy()) is None
    # written out of dependency order: acyclic all the same
    b_first = [PlanTask(id="b", capability="write", deps=["a"]), PlanTask(id="a", capability="w")]
    assert _outcome(validate_plan, Plan(goal="g", tasks=b_first)) is None
    refused = [
        Plan(goal="g", tasks=[PlanTask(id="a", capability="write", inputs={})]),
        Plan(goal="g", tasks=[PlanTask(id="a", capability="nobody")]),
        Plan(goal="g", tasks=[PlanTask(id="a", capability="write", review_by="nobody")]),
        Plan(goal="g", tasks=[PlanTask(id="a", capability="write", inputs={"d": DEEP[1]})]),
        Plan(goal="g", session={"d": DEEP[1]}, tasks=[PlanTask(id="a", capability="write")]),
        Plan(goal="g", tasks=[PlanTask(id="a b", capability="write", inputs={"text": "x"})]),
        Plan(
            goal="g",
            tasks=[
                PlanTask(id="a", capability="write", inputs={"text": "x"}, deps=["b"]),
                PlanTask(id="b", capability="write", inputs={"text": "x"}, deps=["a"]),
            ],
        ),
    ]
    for plan in refused:
        got = _outcome(validate_plan, plan, [card], RetryPolicy())
        assert got is not None and got[0] == "InvalidPlan"
        assert got == _outcome(_reference, plan, [card], RetryPolicy())


def _reference_dep_refs(value: Any) -> list[str]:
    if isinstance(value, dict):
        if "$dep" in value:
            return [str(value["$dep"])]
        return [r for v in value.values() for r in _reference_dep_refs(v)]
    if isinstance(value, list):
        return [r for v in value for r in _reference_dep_refs(v)]
    return []


def _reference_rename(value: Any, ids: dict[str, str]) -> Any:
    if isinstance(value, dict):
        if "$dep" in value:
            return {**value, "$dep": ids.get(str(value["$dep"]), value["$dep"])}
        return {k: _reference_rename(v, ids) for k, v in value.items()}
    if isinstance(value, list):
        return [_reference_rename(v, ids) for v in value]
    return value


def _reference_resolve(value: Any, outputs: dict[str, Any], rename: dict[str, str]) -> Any:
    if isinstance(value, dict):
        if "$dep" in value:
            out = outputs.get(rename.get(str(value["$dep"]), str(value["$dep"])))
            for key in filter(None, str(value.get("path", "")).split(".")):
                if isinstance(out, dict):
                    out = out.get(key)
                elif isinstance(out, list) and key.isdigit() and int(key) < len(out):
                    out = out[int(key)]
                else:
                    out = None
            return out
        return {k: _reference_resolve(v, outputs, rename) for k, v in value.items()}
    if isinstance(value, list):
        return [_reference_resolve(v, outputs, rename) for v in value]
    return value


JSON = st.recursive(
    st.one_of(st.none(), st.integers(), st.text(max_size=3), VALUES),
    lambda inner: st.one_of(
        st.lists(inner, max_size=3), st.dictionaries(st.text(max_size=3), inner, max_size=3)
    ),
    max_leaves=10,
)


@settings(max_examples=300, deadline=None)
@given(JSON)
def test_the_placeholder_walks_find_and_rename_what_they_did(value: Any) -> None:
    """The placeholder walks no longer call themselves for a leaf: the same refs in the
    same order, the same renamed value, the same resolved inputs."""
    ids = {"a": "a-1", "b": "b-1"}
    assert list(dep_refs(value)) == _reference_dep_refs(value)
    assert rename_refs(value, ids) == _reference_rename(value, ids)
    outputs = {"a-1": {"text": "t"}, "b": {"text": ["u"]}}
    assert resolve_inputs(value, outputs, ids) == _reference_resolve(value, outputs, ids)
