"""The orchestrator's tunable policy, in one frozen place."""

from __future__ import annotations

from dataclasses import dataclass, field

from cardbus.bus.orchestrator.selection import Weights

__all__ = ["Policy"]


@dataclass(frozen=True)
class Policy:
    weights: Weights = field(default_factory=Weights)
    backoff_base_s: float = 0.05  # first retry waits about this long
    backoff_max_s: float = 10.0
    jitter: float = 0.5  # each delay is stretched by a random 0..jitter fraction
    loop_threshold: int = 3  # the same (capability, inputs) on more tasks than this halts the run
    tie_policy: str = "retry"  # fan-out tie: "retry" or "approval"
    max_needs_input_rounds: int = 10
    tick_s: float = 0.02  # how often due deadlines and backoffs are looked for
    sweep_s: float = 1.0  # how often every open run is looked at anyway
    # finished runs kept in memory (the latest); older ones are read from the log
    retain_finished_runs: int = 1000
    actor: str = "orchestrator"
    context_policy: str = "trim"  # fits upstream outputs to max_input_bytes: trim | summarise
