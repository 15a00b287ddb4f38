"""Context budget policies: upstream outputs fitted into an agent's maximum input size."""

from __future__ import annotations

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cardbus.agents.cards import AgentCard, AgentConstraints, CapabilitySpec, TaskCard
from cardbus.bus.orchestrator.context import budget_for, fit_card, fit_inputs, size_of
from cardbus.eventstore import events as ev


def facts(n: int, width: int = 60) -> list[str]:
    return [f"Fact {i}. " + "detail " * (width // 7) for i in range(n)]


@pytest.mark.parametrize("policy", ["trim", "summarise"])
def test_fits_and_keeps_types_and_own_inputs(policy: str) -> None:
    inputs = {"topic": "tides", "facts": facts(40), "outline": ["Intro", "Body"]}
    assert size_of(inputs) > 1000
    out = fit_inputs(inputs, 1000, ["facts", "outline"], policy)
    assert out.fits and out.changed and out.final_bytes <= 1000
    assert out.inputs["topic"] == "tides"  # not upstream: untouched
    assert isinstance(out.inputs["facts"], list) and all(
        isinstance(f, str) for f in out.inputs["facts"]
    )
    assert out.fields == ["facts"]
    assert out.original_bytes == size_of(inputs)


def test_summarise_keeps_more_items_than_trim() -> None:
    inputs = {"facts": [f"Lead sentence {i}. " + "padding words " * 20 for i in range(20)]}
    trimmed = fit_inputs(inputs, 1200, policy="trim")
    summarised = fit_inputs(inputs, 1200, policy="summarise")
    assert summarised.fits and trimmed.fits
    assert len(summarised.inputs["facts"]) > len(trimmed.inputs["facts"])
    assert summarised.inputs["facts"][0] == "Lead sentence 0."


def test_long_string_is_cut_with_a_mark() -> None:
    out = fit_inputs({"text": "a" * 5000}, 300)
    assert out.fits and out.inputs["text"].endswith("…")


def test_already_fitting_inputs_are_unchanged() -> None:
    inputs = {"facts": ["x"]}
    out = fit_inputs(inputs, 100)
    assert out.inputs is inputs and not out.changed


def test_cannot_fit_own_inputs_reports_it() -> None:
    out = fit_inputs({"own": "y" * 500, "dep": ["z"] * 10}, 100, ["dep"])
    assert not out.fits and out.inputs["own"] == "y" * 500


def test_unknown_policy_is_an_error() -> None:
    with pytest.raises(ValueError):
        fit_inputs({"a": "b" * 100}, 10, policy="magic")


@settings(max_examples=60, deadline=None)
@given(
    st.dictionaries(
        st.sampled_from(["a", "b", "c"]),
        st.recursive(
            st.text(max_size=200) | st.integers() | st.booleans(),
            lambda inner: (
                st.lists(inner, max_size=8)
                | st.dictionaries(st.text(max_size=5), inner, max_size=4)
            ),
            max_leaves=40,
        ),
    ),
    st.integers(min_value=0, max_value=600),
    st.sampled_from(["trim", "summarise"]),
)
def test_never_grows_and_never_raises(inputs: dict, limit: int, policy: str) -> None:
    out = fit_inputs(inputs, limit, policy=policy)
    assert out.final_bytes <= out.original_bytes
    assert set(out.inputs) == set(inputs)


def _agent(agent_id: str, limit: int | None) -> AgentCard:
    return AgentCard(
        agent_id=agent_id,
        name=agent_id,
        capabilities=[CapabilitySpec(name="write")],
        constraints=AgentConstraints(max_input_bytes=limit),
    )


def test_fit_card_uses_the_largest_budget_and_records_the_event() -> None:
    card = TaskCard(
        task_id="draft-1",
        root_id="r",
        capability="write",
        attempt=2,
        inputs={"topic": "tides", "facts": facts(50)},
    )
    declared = {"topic": "tides", "facts": {"$dep": "research-1", "path": "facts"}}
    agents = [_agent("small", 500), _agent("big", 1500), AgentCard(agent_id="other", name="o")]
    assert budget_for(agents, "write") == 1500
    fitted, event = fit_card(card, declared, agents, "trim")
    assert isinstance(event, ev.ContextTrimmed)
    assert event.task_id == "draft-1" and event.attempt == 2 and event.policy == "trim"
    assert event.limit_bytes == 1500 and event.final_bytes <= 1500 < event.original_bytes
    assert event.fields == ["facts"]
    assert size_of(fitted.inputs) == event.final_bytes
    assert fitted.inputs["topic"] == "tides" and fitted.task_id == card.task_id
    msgspec.json.encode(event)
    # an agent without a limit means no trimming at all
    same, none = fit_card(card, declared, [*agents, _agent("unlimited", None)])
    assert same is card and none is None
