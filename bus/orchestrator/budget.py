"""Budgets checked before the call: what a run (an agent, a role) spent, folded from the log.

A run has budgets when its plan gives ``budget_tokens``, ``budget_usd`` or
``budgets`` (``{"agent:writer": {"usd": 0.5}, "role:review": {"tokens": 2000},
"capability:research": {...}}``; a task's role is its ``role`` when the
orchestrator added it (``review``, ``supplement``, ``plan``), else its
capability). Its :class:`Ledger` (``RunView.budget``) is folded from the log:

* spent: each live ``model.answered``'s tokens and ``cost_usd`` (its reservation's
  USD when the answer's price is unknown: an upper bound); for an attempt that
  journaled no model call, its result's usage (priced when checked);
* held: each ``model.requested`` not answered yet holds its ``reserved_tokens``
  and ``reserved_usd``, so calls in flight count before they are answered.

**Before each live model call** (``Journal.model_request``), :meth:`Budgets.check_call`
estimates what the call may spend: input tokens ``ceil(request bytes / 4)`` (the
request as JSON: messages, tools, schema) plus its ``max_tokens`` (also read:
``max_completion_tokens``, ``max_output_tokens``) or, when it names none,
``Budgets.default_output_tokens`` (1024), at the model's price. If spent + held
+ that crosses a cap of a scope the call belongs to (run, its agent, its role,
its capability), the call is not sent: ``budget.refused`` is recorded and the
agent gets the typed error ``budget_exceeded`` (``BudgetExceeded``). Under a
money cap, a model with no known price is refused too (nothing bounds it).

**The estimate is a bound.** A call let through is sent with ``max_tokens`` set to
the output part of its estimate (``model.requested.max_tokens``; the journal hands
it back with its go-ahead and the model client sends it: ``current_max_tokens``),
which by the check fits what every cap leaves: an endpoint that honours it cannot
answer past a cap. A call whose ``max_tokens`` would not fit is refused, not
shrunk (a truncated answer is paid for and seldom usable). An endpoint that
ignores ``max_tokens`` is caught after the fact: ``model.answered.overrun_tokens``
records the output past the bound, the ledger counts what was spent, and the next
call and dispatch of a scope at its cap are refused.

**Before each dispatch**, :meth:`Budgets.at_cap`: a scope already spent up to its
cap dispatches nothing more. What follows a refusal is the plan's
``on_budget``: ``fail`` (the task fails ``budget_exceeded``, never retried; a run
at its own cap halts) or ``approval`` (the task waits for an operator; once
approved, its calls are not refused again).
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from cardbus.eventstore import events as ev
from cardbus.eventstore.envelope import Envelope
from cardbus.projections.pricing import PriceTable, format_usd, how_to_price

if TYPE_CHECKING:
    from cardbus.bus.orchestrator.runstate import RunState, RunView, TaskView

__all__ = [
    "BYTES_PER_TOKEN",
    "DEFAULT_OUTPUT_TOKENS",
    "ON_BUDGET",
    "Budgets",
    "Ledger",
    "Refusal",
    "limits_of",
    "new_ledger",
]

#: the input tokens of a request are estimated as its JSON size over this
BYTES_PER_TOKEN = 4
#: the output tokens a call may spend when its request names no ``max_tokens``
DEFAULT_OUTPUT_TOKENS = 1024
ON_BUDGET = ("fail", "approval")
_MAX_KEYS = ("max_tokens", "max_completion_tokens", "max_output_tokens")


@dataclass(slots=True)
class Ledger:
    """What a run's scopes spent and hold, from the log (``RunView.budget``)."""

    spent_tokens: dict[str, int] = field(default_factory=dict)  # scope -> tokens
    spent_usd: dict[str, float] = field(default_factory=dict)
    # results of attempts with no journaled call: scope -> [[model, input, output], ...]
    unjournaled: dict[str, list[tuple[str, int, int]]] = field(default_factory=dict)
    held: dict[str, tuple[list[str], int, float]] = field(default_factory=dict)  # call -> hold
    journaled: list[str] = field(default_factory=list)  # "<task>|<attempt>|<agent>"
    asking: list[str] = field(default_factory=list)  # tasks waiting for a budget approval
    exempt: list[str] = field(default_factory=list)  # tasks approved over their budget


def limits_of(started: ev.RunStarted) -> dict[str, ev.BudgetLimit]:
    """The run's caps by scope (``run`` for the run's own)."""
    limits = dict(started.budgets)
    if started.budget_usd is not None or started.budget_tokens is not None:
        limits["run"] = ev.BudgetLimit(usd=started.budget_usd, tokens=started.budget_tokens)
    return limits


def new_ledger(started: ev.RunStarted) -> Ledger | None:
    return Ledger() if limits_of(started) else None


def scopes_of(task: TaskView, agent_id: str) -> list[str]:
    c = task.created
    return [
        "run",
        f"agent:{agent_id}",
        f"role:{c.role or c.capability}",
        f"capability:{c.capability}",
    ]


def _capped(
    run: RunView, task: TaskView, agent_id: str, above: list[RunView] | None = None
) -> Iterator[tuple[Ledger, str, ev.BudgetLimit]]:
    """The run's ledger with each scope of this task on this agent that has a cap (none
    when the run has no budget, or the task is exempt); then, for a child run, those of
    the runs ``above`` it (``RunState.ancestors``), their scopes named ``parent:<scope>``."""
    for i, r in enumerate([run, *(above or ())]):
        ledger = r.budget
        if ledger is None or task.task_id in ledger.exempt:
            continue
        limits = limits_of(r.started)
        for scope in scopes_of(task, agent_id):
            cap = limits.get(scope)
            if cap is not None:
                yield ledger, scope if i == 0 else f"parent:{scope}", cap


def _scope(scope: str) -> str:
    """A scope as its ledger keeps it (``parent:run`` is the parent's ``run``)."""
    return scope.removeprefix("parent:")


def call_key(task_id: str, execution: str, seq: int) -> str:
    return f"{task_id}|{execution}|{seq}"


# -- the fold (RunState calls it for the events of a run with a ledger) ----------------


def fold(ledger: Ledger, run: RunView, task: TaskView | None, env: Envelope) -> None:
    data: Any = env.data
    t = type(data)
    if t is ev.ModelRequested and task is not None:
        _mark(ledger, f"{env.stream}|{data.attempt}|{data.agent_id}")
        limits = limits_of(run.started)
        scopes = [s for s in scopes_of(task, data.agent_id) if s in limits]
        ledger.held[call_key(env.stream, data.execution, data.seq)] = (
            scopes,
            max(0, data.reserved_tokens),
            max(0.0, data.reserved_usd or 0.0),
        )
    elif t is ev.ModelAnswered and task is not None:
        _mark(ledger, f"{env.stream}|{data.attempt}|{data.agent_id}")
        hold = ledger.held.pop(call_key(env.stream, data.execution, data.seq), None)
        if data.replayed_from is not None:
            return
        tokens = max(0, data.input_tokens) + max(0, data.output_tokens)
        usd = data.cost_usd if data.cost_usd is not None else (hold[2] if hold else 0.0)
        limits = limits_of(run.started)
        for scope in scopes_of(task, data.agent_id):
            if scope in limits:
                ledger.spent_tokens[scope] = ledger.spent_tokens.get(scope, 0) + tokens
                ledger.spent_usd[scope] = ledger.spent_usd.get(scope, 0.0) + max(0.0, usd)
    elif t is ev.TaskResultSubmitted and task is not None:
        if f"{env.stream}|{data.attempt}|{data.agent_id}" in ledger.journaled:
            return  # counted from its calls
        u = data.usage
        tokens_in, tokens_out = max(0, u.input_tokens), max(0, u.output_tokens)
        if tokens_in + tokens_out == 0:
            return
        limits = limits_of(run.started)
        for scope in scopes_of(task, data.agent_id):
            if scope in limits:
                ledger.spent_tokens[scope] = (
                    ledger.spent_tokens.get(scope, 0) + tokens_in + tokens_out
                )
                ledger.unjournaled.setdefault(scope, []).append((u.model, tokens_in, tokens_out))
    elif t is ev.ApprovalRequested and data.reason == "budget_exceeded":
        if env.stream not in ledger.asking:
            ledger.asking.append(env.stream)
    elif t is ev.ApprovalGranted and env.stream in ledger.asking:
        ledger.asking.remove(env.stream)
        if env.stream not in ledger.exempt:
            ledger.exempt.append(env.stream)
    elif t in (ev.TaskCompleted, ev.TaskFailed, ev.TaskCancelled, ev.TaskHalted):
        # a finished task's unanswered calls hold nothing any more
        gone = [k for k in ledger.held if k.startswith(f"{env.stream}|")]
        for k in gone:
            del ledger.held[k]
        if len(ledger.journaled) > 4096:
            ledger.journaled = [j for j in ledger.journaled if not j.startswith(f"{env.stream}|")]


def _mark(ledger: Ledger, mark: str) -> None:
    if mark not in ledger.journaled:
        ledger.journaled.append(mark)


#: the events the fold reads (beyond ``run.started``): RunState passes these on
FOLDED = frozenset(
    {
        ev.ModelRequested,
        ev.ModelAnswered,
        ev.TaskResultSubmitted,
        ev.ApprovalRequested,
        ev.ApprovalGranted,
        ev.TaskCompleted,
        ev.TaskFailed,
        ev.TaskCancelled,
        ev.TaskHalted,
    }
)


# -- the checks -------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Refusal:
    """Why a call or dispatch would cross a budget (what ``budget.refused`` records)."""

    scope: str
    spent_tokens: int
    spent_usd: float
    estimate_tokens: int
    estimate_usd: float | None
    cap: ev.BudgetLimit
    reason: str


class Budgets:
    """The orchestrator's budget checks, over the ledgers ``RunState`` folds; ``prices``
    turns tokens into USD (``projections.pricing``)."""

    def __init__(
        self,
        state: RunState | None = None,
        prices: PriceTable | None = None,
        default_output_tokens: int = DEFAULT_OUTPUT_TOKENS,
    ) -> None:
        self.state = state
        self.prices = prices if prices is not None else PriceTable.default()
        self.default_output_tokens = default_output_tokens
        # reservations decided and not folded yet (their model.requested is being written):
        # call -> (root -> its scopes held, for the run and each run above it), tokens, USD
        self.pending: dict[str, tuple[dict[str, list[str]], int, float]] = {}

    # -- what a call may cost -----------------------------------------------------------

    def output_bound(self, request: dict[str, Any]) -> int:
        """The output tokens a call may be answered with: its ``max_tokens`` (or
        ``max_completion_tokens``, ``max_output_tokens``), else the default."""
        return next(
            (
                v
                for k in _MAX_KEYS
                if isinstance(v := request.get(k), int) and not isinstance(v, bool) and v > 0
            ),
            self.default_output_tokens,
        )

    def estimate(self, model: str, request: dict[str, Any], size: int) -> tuple[int, float | None]:
        """Tokens and USD (None: no price) a call may spend: the request's size over
        ``BYTES_PER_TOKEN`` in, its ``output_bound`` out."""
        out = self.output_bound(request)
        tokens_in = math.ceil(max(0, size) / BYTES_PER_TOKEN)
        return tokens_in + out, self.prices.cost(model, tokens_in, out)

    # -- totals -------------------------------------------------------------------------

    def spent(self, ledger: Ledger, scope: str) -> tuple[int, float]:
        usd = ledger.spent_usd.get(scope, 0.0)
        for model, tokens_in, tokens_out in ledger.unjournaled.get(scope, ()):
            usd += self.prices.cost(model, tokens_in, tokens_out) or 0.0
        return ledger.spent_tokens.get(scope, 0), usd

    def held(self, ledger: Ledger, root_id: str, scope: str) -> tuple[int, float]:
        tokens, usd = 0, 0.0
        for scopes, t, u in self._holds(ledger, root_id):
            if scope in scopes:
                tokens += t
                usd += u
        return tokens, usd

    def _holds(self, ledger: Ledger, root_id: str) -> Iterator[tuple[list[str], int, float]]:
        yield from ledger.held.values()
        for key, (roots, t, u) in self.pending.items():
            if root_id in roots and key not in ledger.held:
                yield roots[root_id], t, u

    def _above(self, run: RunView) -> list[RunView]:
        """The runs above a child run whose budgets bound it too."""
        if run.started.parent_root is None or self.state is None:
            return []
        return self.state.ancestors(run)

    def applies(self, run: RunView) -> bool:
        """The run, or a run above it, has budgets."""
        return run.budget is not None or any(r.budget is not None for r in self._above(run))

    # -- before a call ------------------------------------------------------------------

    def check_request(
        self,
        task_id: str,
        agent_id: str,
        key: str,
        model: str,
        request: dict[str, Any],
        size: int,
    ) -> tuple[int, float | None, Refusal | None, str, int | None]:
        """A journaled call about to go live: its estimate (tokens, USD; 0 and None for a run
        without budgets), the budget it would cross (or None: it is held now, until
        ``release(key)``), the run's ``on_budget``, and the ``max_tokens`` it is to be sent
        with (the output part of the estimate; None: no cap applies to it)."""
        state = self.state
        task = state.tasks.get(task_id) if state is not None else None
        run = state.runs.get(task.created.root_id) if state is not None and task else None
        if run is None or task is None or not self.applies(run):
            return 0, None, None, "fail", None  # no budget: nothing to estimate or hold
        tokens, usd = self.estimate(model, request, size)
        refusal = self.check_call(run, task, agent_id, tokens, usd, model)
        if refusal is None:
            self.hold(key, run, task, agent_id, tokens, usd)
        capped = any(True for _ in _capped(run, task, agent_id, self._above(run)))
        bound = self.output_bound(request) if capped else None
        return tokens, usd, refusal, run.started.on_budget, bound

    def check_call(
        self,
        run: RunView,
        task: TaskView,
        agent_id: str,
        tokens: int,
        usd: float | None,
        model: str,
    ) -> Refusal | None:
        """The budget a call of ``tokens`` / ``usd`` would cross, or None."""
        chain = [run, *self._above(run)]
        roots = {id(r.budget): r.root_id for r in chain}
        for ledger, scope, cap in _capped(run, task, agent_id, chain[1:]):
            spent_t, spent_u = self.spent(ledger, _scope(scope))
            held_t, held_u = self.held(ledger, roots[id(ledger)], _scope(scope))
            base = Refusal(scope, spent_t + held_t, spent_u + held_u, tokens, usd, cap, "")
            if cap.tokens is not None and spent_t + held_t + tokens > cap.tokens:
                why = (
                    f"{scope}: {spent_t} tokens spent and {held_t} held, this call may spend"
                    f" {tokens}: over the cap of {cap.tokens} tokens"
                )
                return _with(base, why)
            if cap.usd is not None:
                if usd is None:
                    why = f"{scope}: no price known for model {model!r} under a cap of USD"
                    return _with(base, f"{why} {cap.usd:g}; {how_to_price(model)}")
                if spent_u + held_u + usd > cap.usd:
                    why = (
                        f"{scope}: {format_usd(spent_u)} spent and {format_usd(held_u)} held,"
                        f" this call may cost {format_usd(usd)}: over the cap of"
                        f" {format_usd(cap.usd)}"
                    )
                    return _with(base, why)
        return None

    def hold(
        self, key: str, run: RunView, task: TaskView, agent_id: str, tokens: int, usd: float | None
    ) -> None:
        """A call let through holds its estimate until its ``model.requested`` is folded
        (in its run's ledger and in those of the runs above it)."""
        roots: dict[str, list[str]] = {}
        for r in [run, *self._above(run)]:
            if r.budget is not None:
                limits = limits_of(r.started)
                roots[r.root_id] = [s for s in scopes_of(task, agent_id) if s in limits]
        if roots:
            self.pending[key] = (roots, tokens, usd or 0.0)

    def release(self, key: str) -> None:
        self.pending.pop(key, None)

    # -- before a dispatch --------------------------------------------------------------

    def at_cap(self, run: RunView, task: TaskView, agent_id: str) -> Refusal | None:
        """A scope of this dispatch that has already spent its cap, or None."""
        for ledger, scope, cap in _capped(run, task, agent_id, self._above(run)):
            spent_t, spent_u = self.spent(ledger, _scope(scope))
            base = Refusal(scope, spent_t, spent_u, 0, 0.0, cap, "")
            if cap.tokens is not None and spent_t >= cap.tokens:
                return _with(base, f"{scope}: {spent_t} tokens spent of {cap.tokens}")
            if cap.usd is not None and spent_u >= cap.usd:
                why = f"{scope}: {format_usd(spent_u)} spent of {format_usd(cap.usd)}"
                return _with(base, why)
        return None


def _with(r: Refusal, reason: str) -> Refusal:
    return Refusal(
        r.scope, r.spent_tokens, r.spent_usd, r.estimate_tokens, r.estimate_usd, r.cap, reason
    )


def refused_event(
    r: Refusal,
    *,
    task_id: str,
    agent_id: str,
    attempt: int,
    action: str,
    decision: str,
    model: str = "",
    execution: str = "",
    seq: int = -1,
) -> ev.BudgetRefused:
    return ev.BudgetRefused(
        task_id=task_id,
        agent_id=agent_id,
        attempt=attempt,
        action=action,
        scope=r.scope,
        reason=r.reason[:1000],
        model=model,
        execution=execution,
        seq=seq,
        spent_tokens=r.spent_tokens,
        spent_usd=round(r.spent_usd, 10),
        estimate_tokens=r.estimate_tokens,
        estimate_usd=None if r.estimate_usd is None else round(r.estimate_usd, 10),
        cap_tokens=r.cap.tokens,
        cap_usd=r.cap.usd,
        decision=decision,
    )
