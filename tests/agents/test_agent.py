"""The Agent base class: self-check, failures, needs input, usage, isolation.

Every test drives the public API only: a subclass, ``Agent.run(task)`` and the
ResultCard it returns (which must always survive the bus: encode + decode).
"""

from __future__ import annotations

import asyncio
import math
from typing import Any

import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cardbus.agents import (
    Agent,
    AgentCard,
    AgentConstraints,
    Capability,
    MockLLM,
    NeedsInput,
    Reject,
    ResultCard,
    TaskCard,
    TaskContext,
)
from cardbus.agents.cards import decode_result_card, encode
from cardbus.bus.orchestrator.selection import hard_filter

# -- the README example: a user-written agent in about twenty lines --------------


class SummarizeIn(msgspec.Struct, frozen=True):
    text: str
    max_words: int = 20


class Summary(msgspec.Struct, frozen=True):
    summary: str
    words: int


class Summarizer(Agent):
    agent_id = "summarizer"
    description = "Summarises a text in a few words."
    capabilities = [Capability("summarize", SummarizeIn, Summary, "shorten a text")]

    async def handle(self, task: TaskCard, inputs: SummarizeIn, ctx: TaskContext) -> Summary:
        await ctx.complete(f"Summarise: {inputs.text}", system="Be brief.")
        words = inputs.text.split()[: inputs.max_words]
        ctx.confidence = 0.9
        return Summary(summary=" ".join(words), words=len(words))


def task(capability: str = "summarize", **over: Any) -> TaskCard:
    fields: dict[str, Any] = {
        "task_id": "t1",
        "root_id": "r1",
        "capability": capability,
        "inputs": {"text": "one two three four", "max_words": 2},
        "timeout_s": 10.0,
    }
    fields.update(over)
    return TaskCard(**fields)


def survives_the_bus(result: ResultCard) -> ResultCard:
    assert decode_result_card(encode(result)) == result
    return result


async def test_readme_example_agent_completes() -> None:
    llm = MockLLM()
    result = survives_the_bus(await Summarizer.run(task(attempt=2), llm))
    assert result.status == "completed"
    assert result.task_id == "t1" and result.attempt == 2 and result.agent_id == "summarizer"
    assert result.output == {"summary": "one two", "words": 2}
    assert result.confidence == 0.9
    assert result.error is None and result.reason is None
    # MockLLM counts words: system (2) + prompt (5) in, its echo out
    assert result.usage.input_tokens == 2 + 5
    assert result.usage.output_tokens > 0
    assert llm.calls == ["Summarise: one two three four"]
    assert result.duration_s >= 0


def test_card_is_derived_from_the_class() -> None:
    card = Summarizer.card()
    assert isinstance(card, AgentCard)
    assert card.agent_id == "summarizer" and card.name == "summarizer"
    (cap,) = card.capabilities
    assert cap.name == "summarize" and cap.description == "shorten a text"
    assert cap.input_schema == msgspec.json.schema(SummarizeIn)
    assert cap.output_schema == msgspec.json.schema(Summary)
    assert AgentCard.from_a2a(card.to_a2a()) == card


# -- self-check: the standard rejections --------------------------------------------


class Limited(Agent):
    agent_id = "limited"
    capabilities = [Capability("summarize", SummarizeIn, Summary)]
    constraints = AgentConstraints(
        max_timeout_s=10.0,
        max_input_bytes=200,
        limits={"languages": ["en", "fr"], "max_words": 100, "style": "plain"},
    )
    calls = 0

    async def handle(self, task: TaskCard, inputs: SummarizeIn, ctx: TaskContext) -> Summary:
        type(self).calls += 1
        return Summary(summary=inputs.text, words=1)


@pytest.mark.parametrize(
    ("card", "reason", "detail"),
    [
        (task("translate"), "out_of_capability", "translate"),
        (task(inputs={}), "input_schema_mismatch", "text"),
        (task(inputs={"text": 3}), "input_schema_mismatch", "text"),
        (task(inputs={"text": "x", "max_words": "many"}), "input_schema_mismatch", "max_words"),
        (task(inputs={"text": "x", "max_words": 2.0}), "input_schema_mismatch", "max_words"),
        (task(timeout_s=11.0), "over_constraint", "timeout"),
        (task(inputs={"text": "x" * 300}), "over_constraint", "bytes"),
        (task(constraints={"languages": "de"}), "over_constraint", "languages"),
        (task(constraints={"languages": ["en", "de"]}), "over_constraint", "languages"),
        (task(constraints={"max_words": 500}), "over_constraint", "max_words"),
        (task(constraints={"max_words": "lots"}), "over_constraint", "max_words"),
        (task(constraints={"max_words": True}), "over_constraint", "max_words"),
        (task(constraints={"style": "fancy"}), "over_constraint", "style"),
        (task(constraints={"gpu": True}), "over_constraint", "gpu"),
    ],
)
async def test_self_check_rejects_with_the_reason(card: TaskCard, reason: str, detail: str) -> None:
    Limited.calls = 0
    result = survives_the_bus(await Limited.run(card))
    assert result.status == "rejected"
    assert result.reason == reason
    assert detail in result.notes
    assert result.output is None
    assert Limited.calls == 0  # rejected before any work


@pytest.mark.parametrize(
    "constraints",
    [
        {},
        {"languages": "fr"},
        {"languages": ["en", "fr"]},
        {"max_words": 100},
        {"max_words": 99.5},
        {"style": "plain", "languages": "en"},
    ],
)
async def test_constraints_within_limits_are_accepted(constraints: dict[str, Any]) -> None:
    result = await Limited.run(task(constraints=constraints))
    assert result.status == "completed", result


# -- the handler fails ----------------------------------------------------------------


class Exploding(Agent):
    agent_id = "exploding"
    capabilities = [Capability("summarize", SummarizeIn, Summary)]

    async def handle(self, task: TaskCard, inputs: SummarizeIn, ctx: TaskContext) -> Summary:
        ctx.usage(input_tokens=7, output_tokens=1)
        raise ValueError(f"cannot summarise {inputs.text!r}")


async def test_an_exception_becomes_a_failed_result_with_the_error() -> None:
    result = survives_the_bus(await Exploding.run(task()))
    assert result.status == "failed"
    assert result.error == "ValueError: cannot summarise 'one two three four'"
    assert result.output is None
    assert (result.usage.input_tokens, result.usage.output_tokens) == (7, 1)


class Unserializable(Agent):
    agent_id = "unserializable"
    capabilities = [Capability("summarize", SummarizeIn, Summary)]
    returns: Any = None

    async def handle(self, task: TaskCard, inputs: SummarizeIn, ctx: TaskContext) -> Any:
        return self.returns


@pytest.mark.parametrize(
    "output",
    [object(), {"when": asyncio.Event()}, {(1, 2): "tuple key"}, [lambda: 0], {None: 1}],
)
async def test_unserializable_output_fails_instead_of_crashing(output: Any) -> None:
    Unserializable.returns = output
    result = survives_the_bus(await Unserializable.run(task()))
    assert result.status == "failed"
    assert result.error


async def test_output_is_what_crosses_the_bus() -> None:
    # builtins are normalised exactly as the orchestrator will see them
    Unserializable.returns = {"pair": (1, 2), "raw": b"hi", "nan": math.nan}
    result = survives_the_bus(await Unserializable.run(task()))
    assert result.status == "completed"
    assert result.output == {"pair": [1, 2], "raw": "aGk=", "nan": None}


class BadStr(Exception):
    def __str__(self) -> str:
        raise RuntimeError("no text for you")


class RaisesBadStr(Agent):
    agent_id = "bad-str"
    capabilities = [Capability("summarize", SummarizeIn, Summary)]

    async def handle(self, task: TaskCard, inputs: SummarizeIn, ctx: TaskContext) -> Summary:
        raise BadStr()


async def test_an_exception_that_cannot_be_printed_still_fails_cleanly() -> None:
    result = survives_the_bus(await RaisesBadStr.run(task()))
    assert result.status == "failed"
    assert result.error is not None and result.error.startswith("BadStr")


class NeedsConstructorArgs(Agent):
    agent_id = "needs-args"
    capabilities = [Capability("summarize", SummarizeIn, Summary)]

    def __init__(self, secret: str) -> None:
        self.secret = secret


async def test_an_agent_that_cannot_be_built_fails_cleanly() -> None:
    result = survives_the_bus(await NeedsConstructorArgs.run(task()))
    assert result.status == "failed" and "TypeError" in (result.error or "")


async def test_the_base_handler_is_not_implemented() -> None:
    class Lazy(Agent):
        agent_id = "lazy"
        capabilities = [Capability("summarize", SummarizeIn, Summary)]

    result = await Lazy.run(task())
    assert result.status == "failed" and "NotImplementedError" in (result.error or "")


async def test_cancellation_is_not_swallowed() -> None:
    class Slow(Agent):
        agent_id = "slow"
        capabilities = [Capability("summarize", SummarizeIn, Summary)]

        async def handle(self, task: TaskCard, inputs: SummarizeIn, ctx: TaskContext) -> Summary:
            await asyncio.sleep(30)
            raise AssertionError("not reached")

    running = asyncio.ensure_future(Slow.run(task()))
    await asyncio.sleep(0.01)
    running.cancel()
    with pytest.raises(asyncio.CancelledError):
        await running


# -- needs input and reject -----------------------------------------------------------


class Asker(Agent):
    agent_id = "asker"
    capabilities = [Capability("summarize", SummarizeIn, Summary)]

    async def handle(self, task: TaskCard, inputs: SummarizeIn, ctx: TaskContext) -> Summary:
        if task.supplement is None:
            await ctx.complete("what is missing?")
            raise NeedsInput(
                "a glossary", capability="define", inputs={"terms": inputs.text.split()}
            )
        return Summary(summary=f"{inputs.text} + {task.supplement}", words=0)


async def test_needs_input_reports_what_is_missing_and_who_could_supply_it() -> None:
    result = survives_the_bus(await Asker.run(task()))
    assert result.status == "needs_input"
    assert result.missing == "a glossary"
    assert result.supplement_capability == "define"
    assert result.supplement_inputs == {"terms": ["one", "two", "three", "four"]}
    assert result.usage.input_tokens > 0  # tokens spent before asking are reported
    again = await Asker.run(task(supplement={"one": "1"}))
    assert again.status == "completed"


async def test_needs_input_with_only_a_description() -> None:
    class Vague(Agent):
        agent_id = "vague"
        capabilities = [Capability("summarize", SummarizeIn, Summary)]

        async def handle(self, task: TaskCard, inputs: SummarizeIn, ctx: TaskContext) -> Any:
            raise NeedsInput("more context")

    result = survives_the_bus(await Vague.run(task()))
    assert result.status == "needs_input"
    assert result.missing == "more context"
    assert result.supplement_capability is None and result.supplement_inputs == {}


async def test_needs_input_with_junk_inputs_fails_cleanly() -> None:
    class Junk(Agent):
        agent_id = "junk"
        capabilities = [Capability("summarize", SummarizeIn, Summary)]

        async def handle(self, task: TaskCard, inputs: SummarizeIn, ctx: TaskContext) -> Any:
            raise NeedsInput("x", inputs=["not", "a", "dict"])  # type: ignore[arg-type]

    result = survives_the_bus(await Junk.run(task()))
    assert result.status == "failed" and result.error


class Picky(Agent):
    agent_id = "picky"
    capabilities = [Capability("summarize", SummarizeIn, Summary)]

    async def handle(self, task: TaskCard, inputs: SummarizeIn, ctx: TaskContext) -> Summary:
        ctx.usage(input_tokens=3)
        raise Reject("out_of_capability", "only poems")


async def test_reject_after_looking_gives_a_rejection_with_the_reason() -> None:
    result = survives_the_bus(await Picky.run(task()))
    assert result.status == "rejected"
    assert result.reason == "out_of_capability"
    assert result.notes == "only poems"
    assert result.usage.input_tokens == 3


# -- usage and confidence ---------------------------------------------------------------


class Reporter(Agent):
    agent_id = "reporter"
    capabilities = [Capability("summarize", SummarizeIn, Summary)]
    confidence: Any = 1.0
    tokens: Any = (0, 0)

    async def handle(self, task: TaskCard, inputs: SummarizeIn, ctx: TaskContext) -> Summary:
        ctx.confidence = self.confidence
        ctx.usage(input_tokens=10, output_tokens=4)
        ctx.usage(input_tokens=1)
        await ctx.complete("a b c")  # 3 in
        ctx.notes = "done"
        return Summary(summary="s", words=1)


@pytest.mark.parametrize(
    ("given", "reported"),
    [
        (0.42, 0.42),
        (1, 1.0),
        (0, 0.0),
        (1.7, 1.0),
        (-3, 0.0),
        (math.inf, 1.0),
        (-math.inf, 0.0),
        (math.nan, 0.0),
        ("0.5", 0.5),
        ("very sure", 0.0),
        (None, 0.0),
    ],
)
async def test_confidence_is_clamped_to_0_1(given: Any, reported: float) -> None:
    Reporter.confidence = given
    result = survives_the_bus(await Reporter.run(task(), MockLLM(respond=lambda p: "x y")))
    assert result.status == "completed"
    assert result.confidence == reported
    assert (result.usage.input_tokens, result.usage.output_tokens) == (10 + 1 + 3, 4 + 2)
    assert result.notes == "done"


async def test_junk_in_the_context_never_breaks_the_result() -> None:
    class Messy(Agent):
        agent_id = "messy"
        capabilities = [Capability("summarize", SummarizeIn, Summary)]

        async def handle(self, task: TaskCard, inputs: SummarizeIn, ctx: TaskContext) -> Summary:
            ctx.notes = ["not", "text"]  # type: ignore[assignment]
            ctx.input_tokens = -5
            ctx.output_tokens = "lots"  # type: ignore[assignment]
            return Summary(summary="s", words=1)

    result = survives_the_bus(await Messy.run(task()))
    assert result.status == "completed"
    assert result.notes == "['not', 'text']"
    assert (result.usage.input_tokens, result.usage.output_tokens) == (0, 0)


async def test_mock_llm_is_the_default() -> None:
    class Echo(Agent):
        agent_id = "echo"
        capabilities = [Capability("summarize", SummarizeIn, Summary)]

        async def handle(self, task: TaskCard, inputs: SummarizeIn, ctx: TaskContext) -> Summary:
            text = await ctx.complete(inputs.text)
            return Summary(summary=text, words=0)

    a, b = await Echo.run(task()), await Echo.run(task())
    assert a.output == b.output and a.usage == b.usage
    assert a.usage.input_tokens == 4


# -- no state leaks between tasks ----------------------------------------------------


class Stateful(Agent):
    agent_id = "stateful"
    capabilities = [Capability("summarize", SummarizeIn, Summary)]
    seen: list[tuple[Any, Any, int]] = []

    def __init__(self) -> None:
        self.count = 0

    async def handle(self, task: TaskCard, inputs: SummarizeIn, ctx: TaskContext) -> Summary:
        before_self = getattr(self, "scratch", None)
        before_ctx = getattr(ctx, "scratch", None)
        self.scratch = inputs.text
        ctx.scratch = inputs.text  # type: ignore[attr-defined]
        self.count += 1
        ctx.usage(input_tokens=1)
        type(self).seen.append((before_self, before_ctx, self.count))
        return Summary(summary=inputs.text, words=ctx.input_tokens)


async def test_each_task_gets_a_fresh_instance_and_context() -> None:
    Stateful.seen = []
    first = await Stateful.run(task(inputs={"text": "first"}))
    second = await Stateful.run(task(task_id="t2", inputs={"text": "second"}))
    assert Stateful.seen == [(None, None, 1), (None, None, 1)]
    assert first.output == {"summary": "first", "words": 1}
    assert second.output == {"summary": "second", "words": 1}  # usage did not carry over
    assert second.usage.input_tokens == 1


async def test_concurrent_tasks_do_not_share_context() -> None:
    class Sleeper(Agent):
        agent_id = "sleeper"
        capabilities = [Capability("summarize", SummarizeIn, Summary)]

        async def handle(self, task: TaskCard, inputs: SummarizeIn, ctx: TaskContext) -> Summary:
            ctx.usage(input_tokens=len(inputs.text))
            await asyncio.sleep(0.01)
            assert ctx.task is task
            return Summary(summary=ctx.task.task_id, words=ctx.input_tokens)

    cards = [task(task_id=f"t{i}", inputs={"text": "x" * i}) for i in range(1, 8)]
    results = await asyncio.gather(*(Sleeper.run(c) for c in cards))
    for i, r in enumerate(results, start=1):
        assert r.output == {"summary": f"t{i}", "words": i}
        assert r.usage.input_tokens == i


# -- property: random inputs never crash run -----------------------------------------

_key = st.text(max_size=8)
_json = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats()
    | st.text(max_size=20)
    | st.binary(max_size=8),
    lambda inner: (
        st.lists(inner, max_size=3)
        | st.dictionaries(_key, inner, max_size=3)
        | st.tuples(inner, inner)
    ),
    max_leaves=10,
)
_weird_keys = st.one_of(_key, st.integers(), st.none(), st.floats(), st.tuples(st.integers()))


class Everything(Agent):
    agent_id = "everything"
    capabilities = [
        Capability("summarize", SummarizeIn, Summary),
        Capability("anything", dict, dict),
    ]
    constraints = AgentConstraints(max_input_bytes=10_000, limits={"max_words": 10})

    async def handle(self, task: TaskCard, inputs: Any, ctx: TaskContext) -> Any:
        if isinstance(inputs, SummarizeIn):
            return Summary(summary=inputs.text[:5], words=1)
        return inputs  # echo whatever came in: may be unserializable


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    capability=st.sampled_from(["summarize", "anything", "nothing"]),
    inputs=st.dictionaries(_weird_keys, _json, max_size=4)
    | st.fixed_dictionaries({"text": _json}, optional={"max_words": _json}),
    constraints=st.dictionaries(_key, _json, max_size=2),
    timeout_s=st.floats(allow_nan=True),
)
async def test_random_inputs_never_crash_run(
    capability: str, inputs: dict[Any, Any], constraints: dict[str, Any], timeout_s: float
) -> None:
    card = TaskCard(
        task_id="t",
        root_id="r",
        capability=capability,
        inputs=inputs,
        constraints=constraints,
        timeout_s=timeout_s,
    )
    result = await Everything.run(card)
    assert isinstance(result, ResultCard)
    assert result.status in ("completed", "failed", "rejected")
    survives_the_bus(result)


# -- property: the orchestrator's pre-check agrees with the agent's self-check ----------

_plain_json = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(_key, inner, max_size=3),
    max_leaves=10,
)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    capability=st.sampled_from(["summarize", "anything", "nothing"]),
    inputs=st.dictionaries(_key, _plain_json, max_size=3)
    | st.fixed_dictionaries({"text": _plain_json}, optional={"max_words": _plain_json}),
    constraints=st.dictionaries(st.sampled_from(["max_words", "other"]), _plain_json, max_size=2),
    timeout_s=st.floats(0, 100),
)
async def test_hard_filter_agrees_with_the_self_check(
    capability: str, inputs: dict[str, Any], constraints: dict[str, Any], timeout_s: float
) -> None:
    """A card the orchestrator lets through is not rejected by the agent, and vice versa."""
    card = TaskCard(
        task_id="t",
        root_id="r",
        capability=capability,
        inputs=inputs,
        constraints=constraints,
        timeout_s=timeout_s,
    )
    reason = hard_filter(Everything.card(), capability, inputs, constraints, timeout_s)
    result = await Everything.run(card)
    assert result.reason == reason
    assert (result.status == "rejected") == (reason is not None)


class TaggedIn(msgspec.Struct, frozen=True, tag="order"):
    item: str
    qty: int = 1


class TaggedAgent(Agent):
    agent_id = "tagged"
    capabilities = [Capability("order", TaggedIn, Summary)]

    async def handle(self, task: TaskCard, inputs: TaggedIn, ctx: TaskContext) -> Summary:
        return Summary(summary=inputs.item, words=inputs.qty)


@pytest.mark.parametrize(
    ("inputs", "accepted"),
    [
        ({"item": "tea"}, True),  # the tag is optional at the top level, as in msgspec
        ({"type": "order", "item": "tea", "qty": 2}, True),
        ({"type": "refund", "item": "tea"}, False),
        ({"qty": 2}, False),
    ],
)
async def test_a_tagged_input_struct_is_checked_alike(
    inputs: dict[str, Any], accepted: bool
) -> None:
    reason = hard_filter(TaggedAgent.card(), "order", inputs, {}, 10)
    result = await TaggedAgent.run(task("order", inputs=inputs))
    assert (reason is None) is accepted
    assert (result.status == "completed") is accepted
    assert result.reason == reason
