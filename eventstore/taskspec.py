"""One task spec: the fields a plan task, the ``task.created`` event and the task card share.

A task is stated three times on its way to an agent: in a plan
(``PlanTask``), in the log (``TaskCreated``) and on the card an agent
receives (``TaskCard``). Their shared fields are declared here, once, and
each of the three inherits them::

    TaskSpec                what the task asks: capability, goal, inputs, ...
    ├── TaskOptions         how the orchestrator runs it: approval, fan-out, review, retry,
    │   │                   optional
    │   ├── PlanTask        (bus.orchestrator.plan)  + id, max_attempts (optional)
    │   └── TaskCreated     (eventstore.events)      + root_id, parent_id, max_attempts, ...
    └── TaskCard            (agents.cards)           + task_id, root_id, attempt, ...

``max_attempts`` is not shared on purpose: in a plan it is optional (the
orchestrator's retry policy fills it in), in the log and on the card it is
the task's resolved attempt budget. ``restate`` builds one of these from
another without listing fields.

Only field *declarations* moved here; the JSON of each type is unchanged
(msgspec reads fields by name, in any order), so stored events keep decoding
and their hashes, taken over the stored bytes, keep verifying.
"""

from __future__ import annotations

import functools
import operator
from collections.abc import Callable
from typing import Any, TypeVar

import msgspec

__all__ = ["DEFAULT_MAX_ATTEMPTS", "RetryOverride", "TaskOptions", "TaskSpec", "restate"]

#: attempts a task gets, the first included, when nothing says otherwise; the one
#: place this default is written (``RetryPolicy`` and the event and card defaults use it)
DEFAULT_MAX_ATTEMPTS = 3

S = TypeVar("S", bound=msgspec.Struct)


class RetryOverride(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """A task's own retry settings: each field given replaces the orchestrator's default.

    The fields are those of ``cardbus.bus.orchestrator.RetryPolicy`` (which
    documents and checks them); ``None`` means "the policy's". Unknown fields
    are refused so that a misspelt setting in a plan is an error, not ignored.
    """

    max_attempts: int | None = None
    initial_interval_s: float | None = None
    backoff_coefficient: float | None = None
    maximum_interval_s: float | None = None
    jitter: float | None = None
    non_retryable_reasons: list[str] | None = None
    max_host_losses: int | None = None


class TaskSpec(msgspec.Struct, frozen=True, kw_only=True):
    """What a task asks, the same in a plan, in the log and on an agent's card."""

    capability: str
    goal: str = ""
    inputs: dict[str, Any] = {}
    constraints: dict[str, Any] = {}
    deps: list[str] = []
    timeout_s: float = 30.0
    checklist: list[str] = []  # what a reviewer checks the output against (on its card too)


class TaskOptions(TaskSpec, frozen=True, kw_only=True):
    """How the orchestrator runs a task; in a plan and in the log, never on the card."""

    requires_approval: bool = False
    fanout: int = 1
    review_by: str | None = None  # capability of the reviewer, if any
    max_review_rounds: int = 3
    retry: RetryOverride | None = None  # None: the orchestrator's retry policy as it is
    # a fan-out whose best results tie with different outputs: "retry" | "approval"
    # (None: the orchestrator's Policy.tie_policy); equal outputs are agreement, not a tie
    tie_policy: str | None = None
    reviewers: int = 1  # reviewers per review round (cross-checking: different agents)
    review_quorum: str = "all"  # with several reviewers: "all" must pass, or a "majority"
    # a retried attempt is answered from the journal of the calls before it (False: every
    # attempt's model and tool calls go out fresh; they are recorded all the same)
    journal: bool = True
    # the run can do without it: if it ends failed or cancelled (its retries spent), its
    # dependents run with its output absent, and the run completes "degraded" naming it
    # (``cardbus.bus.orchestrator.optional``); False: its failure fails the run
    optional: bool = False


def restate(source: msgspec.Struct, as_type: type[S], **changes: Any) -> S:
    """An ``as_type`` made of the fields of ``source`` that ``as_type`` declares too.

    ``changes`` replace or add fields. The fields carried are the ones both
    types declare by name (for the task types: their shared spec and the
    few place fields such as ``root_id``); a test pins which fields each
    conversion carries, so a new same-named field is a decision, not an accident.
    """
    names, values = _shared(type(source), as_type)
    return as_type(**dict(zip(names, values(source), strict=True), **changes))


@functools.cache
def _shared(
    source: type[msgspec.Struct], as_type: type[msgspec.Struct]
) -> tuple[tuple[str, ...], Callable[[msgspec.Struct], tuple[Any, ...]]]:
    """The fields ``source`` and ``as_type`` share, in ``source``'s order, and a getter of
    their values: worked out once a pair of types, not by scanning ``as_type``'s field
    names for each of ``source``'s at every call (a plan task became its event 3.3 us)."""
    wanted = set(as_type.__struct_fields__)
    names = tuple(name for name in source.__struct_fields__ if name in wanted)
    if len(names) == 1:  # attrgetter of one name gives the value, not a 1-tuple
        one = operator.attrgetter(names[0])
        return names, lambda struct: (one(struct),)
    return names, operator.attrgetter(*names) if names else (lambda struct: ())
