"""The orchestrator's tunable policy, in one frozen place, checked when it is made."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from cardbus.bus.orchestrator.checks import allowed_values, check_choice, check_number, check_text
from cardbus.bus.orchestrator.context import POLICIES, ContextPolicy
from cardbus.bus.orchestrator.retry import RetryPolicy
from cardbus.bus.orchestrator.selection import Weights
from cardbus.eventstore.errors import ConfigError

__all__ = ["LoopPolicy", "Policy", "RetryPolicy", "TiePolicy"]

#: what a fan-out whose best results tie does: try again, or ask a human
TiePolicy = Literal["retry", "approval"]
#: what loop detection does: halt the run, or pause it for a person (``loop_pause``)
LoopPolicy = Literal["halt", "pause"]


@dataclass(frozen=True)
class Policy:
    """Every setting is checked here: a bad one is a ``ConfigError`` naming what it allows."""

    weights: Weights = field(default_factory=Weights)
    retry: RetryPolicy = field(default_factory=RetryPolicy)  # a plan task's `retry` overrides it
    loop_threshold: int = 3  # the same (capability, inputs) on more tasks than this halts the run
    tie_policy: TiePolicy = "retry"
    max_needs_input_rounds: int = 10
    tick_s: float = 0.02  # how often due deadlines and backoffs are looked for
    sweep_s: float = 1.0  # how often every open run is looked at anyway
    # finished runs kept in memory (the latest); older ones are read from the log
    retain_finished_runs: int = 1000
    actor: str = "orchestrator"
    # fits upstream outputs to max_input_bytes: "trim" or "summarise" (or one added to POLICIES)
    context_policy: ContextPolicy = "trim"
    # how fast a recorded failure stops counting against an agent in selection (halves)
    failure_half_life_s: float = 3600.0
    # a plan given as a goal alone (see ``planning``): proposals per planning, the first
    # included; re-plannings after a task fails for good (a plan's own settings win)
    max_plan_rounds: int = 3
    replan_on_failure: int = 0
    max_plan_tasks: int = 200  # a proposal with more tasks is refused, whatever its limits
    plan_timeout_s: float = 120.0  # the planning card's deadline per attempt
    # how long the log may refuse writes (StoreUnavailable: disk full, read-only, server
    # gone) before the orchestrator gives up: every wait then raises it, nothing is decided
    store_grace_s: float = 2.0
    # how long a dispatched card may wait for an agent to take it (schedule-to-start);
    # past it the attempt times out with reason queue_timeout. A task's timeout_s counts
    # from the start (``deadlines``): a card queued behind others never eats into it
    queue_timeout_s: float = 3600.0
    # runs decided at once (the first open ones in log order); the others wait, queued in
    # the log, until one ends (``admission``); None: no limit
    max_runs_in_flight: int | None = 500
    # the orchestrator's state is written to its snapshot file (see ``snapshot``) after
    # this many events folded, and on stop; 0: on stop only
    snapshot_every: int = 10_000
    # a loop detected halts the run, or pauses it until a person resumes or stops it
    on_loop: LoopPolicy = "halt"
    # a webhook told when a person's word is awaited (an approval, a review, an
    # escalation, a paused run): best effort, signed with CARDBUS_NOTIFY_SECRET (``notify``)
    notify_url: str = ""
    notify_timeout_s: float = 5.0

    def __post_init__(self) -> None:
        me = "Policy"
        for name, kind in (("weights", Weights), ("retry", RetryPolicy)):
            if not isinstance(getattr(self, name), kind):
                raise ConfigError(
                    f"{me}.{name} must be a {kind.__name__}; got {getattr(self, name)!r}"
                )
        check_number(me, "loop_threshold", self.loop_threshold, at_least=0, integer=True)
        check_choice(me, "tie_policy", self.tie_policy, allowed_values(TiePolicy))
        check_choice(me, "on_loop", self.on_loop, allowed_values(LoopPolicy))
        check_number(me, "notify_timeout_s", self.notify_timeout_s, above=0)
        if self.notify_url and not self.notify_url.startswith(("http://", "https://")):
            raise ConfigError(f"{me}.notify_url must be an http(s) URL; got {self.notify_url!r}")
        check_number(
            me, "max_needs_input_rounds", self.max_needs_input_rounds, at_least=0, integer=True
        )
        check_number(me, "tick_s", self.tick_s, above=0)
        check_number(me, "sweep_s", self.sweep_s, above=0)
        check_number(
            me, "retain_finished_runs", self.retain_finished_runs, at_least=0, integer=True
        )
        check_text(me, "actor", self.actor)
        check_choice(me, "context_policy", self.context_policy, POLICIES)
        check_number(me, "failure_half_life_s", self.failure_half_life_s, above=0)
        check_number(me, "store_grace_s", self.store_grace_s, at_least=0)
        check_number(me, "snapshot_every", self.snapshot_every, at_least=0, integer=True)
        check_number(me, "max_plan_rounds", self.max_plan_rounds, at_least=1, integer=True)
        check_number(me, "replan_on_failure", self.replan_on_failure, at_least=0, integer=True)
        check_number(me, "max_plan_tasks", self.max_plan_tasks, at_least=1, integer=True)
        check_number(me, "plan_timeout_s", self.plan_timeout_s, above=0)
        check_number(me, "queue_timeout_s", self.queue_timeout_s, above=0)
        if self.max_runs_in_flight is not None:
            check_number(
                me, "max_runs_in_flight", self.max_runs_in_flight, at_least=1, integer=True
            )
