"""RetryPolicy: its checks, its one formula, and how a task's settings override it."""

from __future__ import annotations

import math
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from cardbus.bus.orchestrator import RetryPolicy
from cardbus.bus.orchestrator.retry import RETRY_REASONS
from cardbus.eventstore.errors import ConfigError
from cardbus.eventstore.taskspec import DEFAULT_MAX_ATTEMPTS, RetryOverride


def test_the_formula() -> None:
    """min(maximum, initial * coefficient ** (failures - 1)) * (1 + jitter * draw)."""
    p = RetryPolicy(
        initial_interval_s=0.5, backoff_coefficient=3.0, maximum_interval_s=10.0, jitter=0.5
    )
    assert [p.delay_s(n) for n in (1, 2, 3, 4, 5)] == [0.5, 1.5, 4.5, 10.0, 10.0]
    assert p.delay_s(2, draw=0.5) == 1.5 * 1.25
    assert p.delay_s(9, draw=0.999) == pytest.approx(10.0 * 1.4995)
    # a very long run of failures stays at the cap, never overflows
    assert RetryPolicy(backoff_coefficient=1e300).delay_s(10_000) == 10.0


def test_the_defaults() -> None:
    p = RetryPolicy()
    assert p.max_attempts == DEFAULT_MAX_ATTEMPTS == 3
    assert (p.initial_interval_s, p.backoff_coefficient, p.maximum_interval_s) == (0.05, 2.0, 10.0)
    assert p.jitter == 0.5
    # a refused request or unusable answers after the repairs would only fail again
    assert p.non_retryable_reasons == frozenset(
        {
            "llm_request_refused",
            "llm_bad_output",
            "remote_refused",
            "replay_diverged",
            "budget_exceeded",
            "journal_tampered",
            "tool_not_found",
        }
    )
    assert not p.retries(1, "llm_bad_output") and p.retries(1, "llm_timeout")
    # host losses have their own bound (``hostloss``)
    assert p.max_host_losses == 5


@given(
    initial=st.floats(0, 100),
    coefficient=st.floats(1, 10),
    maximum=st.floats(0, 1000),
    jitter=st.floats(0, 2),
    draw=st.floats(0, 1, exclude_max=True),
    failures=st.integers(1, 2000),
)
def test_every_delay_is_finite_bounded_and_never_shrinks(
    initial: float, coefficient: float, maximum: float, jitter: float, draw: float, failures: int
) -> None:
    p = RetryPolicy(
        initial_interval_s=initial,
        backoff_coefficient=coefficient,
        maximum_interval_s=maximum,
        jitter=jitter,
    )
    d = p.delay_s(failures, draw)
    assert math.isfinite(d) and 0 <= d <= maximum * (1 + jitter) + 1e-9
    assert p.delay_s(failures + 1) >= p.delay_s(failures)  # without jitter: monotone


def test_retries_counts_attempts_and_skips_non_retryable_reasons() -> None:
    p = RetryPolicy(max_attempts=3, non_retryable_reasons=frozenset({"output_schema_mismatch"}))
    assert p.retries(1, "timeout") and p.retries(2, "agent_error")
    assert not p.retries(3, "timeout")  # the third attempt was the last
    assert not p.retries(1, "output_schema_mismatch")
    assert not RetryPolicy(max_attempts=1).retries(1, "timeout")


BAD: list[tuple[dict[str, Any], str]] = [
    ({"max_attempts": 0}, r"RetryPolicy\.max_attempts must be an integer >= 1; got 0"),
    ({"max_attempts": 2.5}, "max_attempts must be an integer"),
    ({"max_attempts": True}, "max_attempts must be an integer"),
    ({"initial_interval_s": -0.1}, r"initial_interval_s must be a finite number >= 0"),
    ({"initial_interval_s": math.nan}, "initial_interval_s must be a finite number"),
    ({"backoff_coefficient": 0.5}, r"backoff_coefficient must be a finite number >= 1"),
    ({"maximum_interval_s": math.inf}, "maximum_interval_s must be a finite number"),
    ({"jitter": -1}, r"jitter must be a finite number >= 0"),
    ({"jitter": "0.5"}, "jitter must be a finite number"),
    ({"maximum_interval_s": 1e308, "jitter": 10.0}, r"maximum_interval_s \* \(1 \+ jitter\)"),
    ({"non_retryable_reasons": "timeout"}, "must be a collection of 'agent_error'"),
    ({"max_host_losses": -1}, r"RetryPolicy\.max_host_losses must be an integer >= 0; got -1"),
    ({"max_host_losses": 1.5}, "max_host_losses must be an integer"),
    ({"non_retryable_reasons": ["timout"]}, r"'timout' not allowed; each must be one of"),
]


@pytest.mark.parametrize(("fields", "message"), BAD, ids=[str(f) for f, _ in BAD])
def test_a_bad_setting_is_a_config_error_naming_what_is_allowed(
    fields: dict[str, Any], message: str
) -> None:
    with pytest.raises(ConfigError, match=message):
        RetryPolicy(**fields)


def test_the_reasons_error_lists_every_allowed_reason() -> None:
    with pytest.raises(ConfigError) as info:
        RetryPolicy(non_retryable_reasons=frozenset({"nope"}))  # type: ignore[arg-type]
    assert all(repr(r) in str(info.value) for r in RETRY_REASONS)
    assert isinstance(info.value, ValueError)  # misuse: except ValueError still works


def test_reasons_given_as_a_list_are_kept_as_a_frozenset() -> None:
    p = RetryPolicy(non_retryable_reasons=["timeout", "timeout"])  # type: ignore[arg-type]
    assert p.non_retryable_reasons == frozenset({"timeout"})
    hash(p)  # a frozen value object


def test_an_override_replaces_only_the_fields_it_gives() -> None:
    base = RetryPolicy(initial_interval_s=1.0, jitter=0.0)
    assert base.overridden_by(None) is base
    assert base.overridden_by(RetryOverride()) is base
    p = base.overridden_by(RetryOverride(initial_interval_s=2.0, non_retryable_reasons=["timeout"]))
    assert p == RetryPolicy(
        initial_interval_s=2.0, jitter=0.0, non_retryable_reasons=frozenset({"timeout"})
    )
    assert base.overridden_by(None, max_attempts=7).max_attempts == 7
    assert base.overridden_by(RetryOverride(max_host_losses=0)).max_host_losses == 0


def test_a_bad_override_is_checked_like_the_policy() -> None:
    with pytest.raises(ConfigError, match="backoff_coefficient"):
        RetryPolicy().overridden_by(RetryOverride(backoff_coefficient=0.0))
