"""How a failed attempt is retried: one value object, its checks and its formula.

The orchestrator's ``Policy.retry`` is the default for every task; a plan
task's ``retry`` (a ``RetryOverride``, recorded in its ``task.created``
event) replaces the fields it gives. Delivery of a card again by the bus is
*redelivery*, and an event store repeating a failed write is a *store
retry*: both belong to the transports, not here.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any, Literal

from cardbus.bus.orchestrator.checks import allowed_values, check_choices, check_number
from cardbus.eventstore.errors import ConfigError
from cardbus.eventstore.taskspec import DEFAULT_MAX_ATTEMPTS, RetryOverride

__all__ = [
    "DEFAULT_MAX_HOST_LOSSES",
    "DEFAULT_NON_RETRYABLE",
    "RETRY_REASONS",
    "RetryPolicy",
    "RetryReason",
]

#: why an attempt failed, as ``task.retry_scheduled`` and ``task.failed`` record it
RetryReason = Literal[
    "agent_error",  # the agent answered status "failed"
    "all_candidates_failed",  # a fan-out in which no candidate produced a valid output
    "conflict_tie",  # a fan-out tie, under Policy(tie_policy="retry")
    "output_schema_mismatch",  # the output broke the capability's output schema
    "timeout",  # no result by the deadline
    # an LLM agent's typed failures (eventstore.errors.LLMError's error_type)
    "llm_rate_limited",  # 429, after the SDK's own retries
    "llm_timeout",  # the model did not answer in time
    "llm_server_error",  # 5xx, or the endpoint unreachable
    "llm_request_refused",  # another 4xx (key, model): not retried by default
    "llm_bad_output",  # no usable answer after the repairs: not retried by default
    "llm_max_turns",  # an LLMAgent's conversation past its max_turns
    "llm_max_tool_calls",  # ... past its max_tool_calls
    "llm_token_limit",  # ... past its max_tokens_per_task
    # a remote A2A agent refused the request (a JSON-RPC error such as -32602 or -32004,
    # or HTTP 4xx: no token, a foreign Host): the same request is refused again
    "remote_refused",
    # an offline re-run asked what the recorded run did not (the journal's strict mode)
    "replay_diverged",
    # a recorded call the log cannot vouch for (bus.orchestrator.journal_trust): the
    # orchestrator fails the task itself; another attempt would meet the same record
    "journal_tampered",
    # a model call the orchestrator refused before it was sent: it would cross a budget
    # (never retried: bus.orchestrator.budget)
    "budget_exceeded",
    # a tool on the agent's allow-list that nothing serves (a deployment's error: a
    # retry would find it missing again)
    "tool_not_found",
]
RETRY_REASONS = allowed_values(RetryReason)
#: attempts of one task that may die with the runtime's process and be retried anyway
DEFAULT_MAX_HOST_LOSSES = 5
#: failures that another attempt would only repeat (``RetryPolicy.non_retryable_reasons``)
DEFAULT_NON_RETRYABLE: frozenset[RetryReason] = frozenset(
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


@dataclass(frozen=True)
class RetryPolicy:
    """When and how soon a task's failed attempt is tried again.

    Every field is checked when the policy is made (``ConfigError`` naming
    the field and what it allows).

    Attributes:
        max_attempts: attempts in all, the first one included; 1 never retries.
        initial_interval_s: the wait before the first retry, in seconds.
        backoff_coefficient: each further wait is this many times the one before (>= 1).
        maximum_interval_s: no wait grows past this (before jitter is added).
        jitter: each wait is stretched by a random fraction of itself in
            ``[0, jitter)``, so that tasks failing together do not retry together.
        non_retryable_reasons: failure reasons (``RETRY_REASONS``) that fail
            the task at once instead of retrying it; by default
            ``llm_request_refused``, ``llm_bad_output`` and ``remote_refused``
            (``DEFAULT_NON_RETRYABLE``).
        max_host_losses: how many attempts of one task may die with the runtime's own
            process (an embedded process killed or stopped mid-attempt: reason
            ``host_lost``, ``bus.orchestrator.hostloss``) and be retried anyway. Such a
            retry spends none of ``max_attempts``; one loss more fails the task
            ``host_lost``, so a run that crashes its host every time still ends.
    """

    max_attempts: int = DEFAULT_MAX_ATTEMPTS
    initial_interval_s: float = 0.05
    backoff_coefficient: float = 2.0
    maximum_interval_s: float = 10.0
    jitter: float = 0.5
    non_retryable_reasons: frozenset[RetryReason] = DEFAULT_NON_RETRYABLE
    max_host_losses: int = DEFAULT_MAX_HOST_LOSSES

    def __post_init__(self) -> None:
        me = "RetryPolicy"
        check_number(me, "max_attempts", self.max_attempts, at_least=1, integer=True)
        check_number(me, "initial_interval_s", self.initial_interval_s, at_least=0)
        check_number(me, "backoff_coefficient", self.backoff_coefficient, at_least=1)
        check_number(me, "maximum_interval_s", self.maximum_interval_s, at_least=0)
        check_number(me, "jitter", self.jitter, at_least=0)
        check_number(me, "max_host_losses", self.max_host_losses, at_least=0, integer=True)
        if not math.isfinite(self.maximum_interval_s * (1 + self.jitter)):
            # the longest wait is written into task.retry_scheduled: it must be a number
            raise ConfigError(
                f"{me}: maximum_interval_s * (1 + jitter) must be finite; got"
                f" {self.maximum_interval_s!r} and {self.jitter!r}"
            )
        reasons = check_choices(
            me, "non_retryable_reasons", self.non_retryable_reasons, RETRY_REASONS
        )
        # a list or set given is kept as the frozenset the type says (hashable, immutable)
        object.__setattr__(self, "non_retryable_reasons", reasons)

    def delay_s(self, failures: int, draw: float = 0.0) -> float:
        """The wait after the ``failures``-th failed attempt (1 for the first).

        ``min(maximum_interval_s, initial_interval_s * backoff_coefficient **
        (failures - 1)) * (1 + jitter * draw)``, with ``draw`` a random number
        in ``[0, 1)`` (0 gives the wait without jitter).
        """
        try:
            grown = self.initial_interval_s * self.backoff_coefficient ** (failures - 1)
        except OverflowError:  # past any float: capped below like any long wait
            grown = math.inf
        return min(self.maximum_interval_s, grown) * (1 + self.jitter * draw)

    def retries(self, failures: int, reason: str) -> bool:
        """Whether a task that has failed ``failures`` attempts, the last for ``reason``,
        gets another attempt."""
        return failures < self.max_attempts and reason not in self.non_retryable_reasons

    def overridden_by(self, override: RetryOverride | None, **changes: Any) -> RetryPolicy:
        """This policy with the fields ``override`` gives (and ``changes``) replaced; checked."""
        given = {} if override is None else _given(override)
        given.update(changes)
        return dataclasses.replace(self, **given) if given else self


def _given(override: RetryOverride) -> dict[str, Any]:
    return {
        name: getattr(override, name)
        for name in override.__struct_fields__
        if getattr(override, name) is not None
    }
