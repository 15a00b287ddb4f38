"""Configuration is checked where it is made: a bad setting is a ConfigError naming
what is allowed, not a run that hangs or quietly does something else."""

from __future__ import annotations

import math
from typing import Any, get_args

import pytest
from hypothesis import given
from hypothesis import strategies as st

from cardbus.agents.tools import Tool, ToolSpec
from cardbus.bus.orchestrator import Policy
from cardbus.bus.orchestrator.access import AccessPolicy
from cardbus.bus.orchestrator.context import POLICIES, ContextPolicy
from cardbus.bus.orchestrator.memory import ReusablePolicy
from cardbus.bus.orchestrator.policy import TiePolicy
from cardbus.bus.orchestrator.selection import Weights
from cardbus.eventstore.errors import CardbusError, ConfigError


def test_a_misspelt_context_policy_is_refused_naming_the_allowed_ones() -> None:
    # it was accepted, and then every run whose card needed trimming hung
    with pytest.raises(ConfigError) as info:
        Policy(context_policy="summarize")  # type: ignore[arg-type]
    assert str(info.value) == (
        "Policy.context_policy must be one of 'summarise', 'trim'; got 'summarize'"
    )
    assert isinstance(info.value, CardbusError) and isinstance(info.value, ValueError)


def test_a_misspelt_tie_policy_is_refused() -> None:
    # it behaved as "retry", silently
    with pytest.raises(ConfigError, match="tie_policy must be one of 'approval', 'retry'"):
        Policy(tie_policy="aproval")  # type: ignore[arg-type]


def test_the_literal_types_name_the_values_that_are_accepted() -> None:
    assert set(get_args(ContextPolicy)) == set(POLICIES)  # the built-in context policies
    assert set(get_args(TiePolicy)) == {"retry", "approval"}
    for tie in get_args(TiePolicy):
        Policy(tie_policy=tie)
    for name in get_args(ContextPolicy):
        Policy(context_policy=name)


def test_a_context_policy_registered_later_is_accepted() -> None:
    POLICIES["keep_all"] = lambda inputs, limit, fields: inputs
    try:
        assert Policy(context_policy="keep_all").context_policy == "keep_all"  # type: ignore[arg-type]
    finally:
        del POLICIES["keep_all"]


POLICY_BAD: list[tuple[dict[str, Any], str]] = [
    ({"loop_threshold": -1}, r"Policy\.loop_threshold must be an integer >= 0; got -1"),
    ({"max_needs_input_rounds": 1.5}, "max_needs_input_rounds must be an integer"),
    ({"tick_s": 0}, r"Policy\.tick_s must be a finite number > 0; got 0"),
    ({"sweep_s": math.inf}, "sweep_s must be a finite number > 0"),
    ({"retain_finished_runs": -5}, "retain_finished_runs must be an integer >= 0"),
    ({"actor": ""}, "Policy.actor must be a non-empty string"),
    ({"weights": {"similarity": 1.0}}, "Policy.weights must be a Weights"),
    ({"retry": {"max_attempts": 2}}, "Policy.retry must be a RetryPolicy"),
]


@pytest.mark.parametrize(("fields", "message"), POLICY_BAD, ids=[str(f) for f, _ in POLICY_BAD])
def test_bad_policy_settings(fields: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        Policy(**fields)


@given(st.text().filter(lambda s: s not in POLICIES))
def test_any_other_context_policy_is_refused(name: str) -> None:
    with pytest.raises(ConfigError, match="must be one of 'summarise', 'trim'"):
        Policy(context_policy=name)  # type: ignore[arg-type]


def test_weights_are_finite_and_not_negative() -> None:
    Weights(similarity=0.0, success=1.0, speed=0.0)
    with pytest.raises(ConfigError, match=r"Weights\.speed must be a finite number >= 0"):
        Weights(speed=-0.1)
    with pytest.raises(ConfigError, match=r"Weights\.similarity"):
        Weights(similarity=math.nan)


def test_access_policy_settings() -> None:
    assert AccessPolicy(arguments="digest").arguments == "digest"
    with pytest.raises(ConfigError, match="arguments must be one of 'digest', 'full'; got 'hash'"):
        AccessPolicy(arguments="hash")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="max_inline_bytes must be an integer >= 0"):
        AccessPolicy(max_inline_bytes=-1)
    with pytest.raises(ConfigError, match="max_memory_results must be an integer >= 1"):
        AccessPolicy(max_memory_results=0)
    with pytest.raises(ConfigError, match="memory_reads must be True or False"):
        AccessPolicy(memory_reads="no")  # type: ignore[arg-type]


def test_the_memory_policy_refuses_a_bare_string_of_session_keys() -> None:
    # a string would be read one character at a time: "p", "r", "e", ...
    with pytest.raises(ConfigError, match="session_keys must be a tuple of non-empty strings"):
        ReusablePolicy(session_keys="preferences")  # type: ignore[arg-type]
    assert ReusablePolicy(session_keys=["a", "b"]).session_keys == ("a", "b")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match=r"ReusablePolicy\.name"):
        ReusablePolicy(name="")


def test_a_tool_spec_checks_its_limits() -> None:
    assert Tool.define("t", lambda a: a, timeout_s=0.05).spec.timeout_s == 0.05
    with pytest.raises(ConfigError, match=r"ToolSpec\.timeout_s must be a finite number > 0"):
        Tool.define("t", lambda a: a, timeout_s=0)
    with pytest.raises(ConfigError, match="timeout_s"):
        ToolSpec(name="t", timeout_s=math.nan)
    with pytest.raises(ConfigError, match=r"ToolSpec\.max_result_bytes must be an integer >= 1"):
        ToolSpec(name="t", max_result_bytes=0)
