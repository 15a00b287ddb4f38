"""Plans: a DAG of task cards, checked before anything runs.

A plan names its tasks locally (``"research"``, ``"draft"``); an input value
``{"$dep": "research", "path": "facts"}`` is replaced at dispatch by that
field of the named dependency's output, and may only name a declared
dependency: that is how context isolation is spelled in a plan.
``validate_plan`` refuses a cycle, an unknown dependency, an unknown
capability or inputs no agent accepts with ``InvalidPlan`` naming the problem.

A plan may also be a goal alone (no tasks): a planner proposes the tasks
(``cardbus.bus.orchestrator.planning``), within the plan's ``limits``, and each
proposal is checked exactly as a hand-written plan (``validate_plan``).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import Any

import msgspec

from cardbus.agents.cards import AgentCard, CapabilitySpec
from cardbus.agents.planning import PLAN_CAPABILITY
from cardbus.bus.orchestrator.children import ChildSpec, check_child
from cardbus.bus.orchestrator.refusals import worded_refusal
from cardbus.bus.orchestrator.retry import RetryPolicy
from cardbus.bus.orchestrator.selection import hard_filter
from cardbus.bus.orchestrator.waits import check_waits
from cardbus.eventstore.batch import MAX_DEPTH, MAX_ID_CHARS, nesting_problem
from cardbus.eventstore.errors import ConfigError, InvalidPlan, InvalidScope
from cardbus.eventstore.events import BudgetLimit, PlanningLimits, TaskCreated, WaitPolicy
from cardbus.eventstore.taskspec import RetryOverride, TaskOptions, restate
from cardbus.projections.scope import check_id

__all__ = [
    "Plan",
    "PlanTask",
    "as_plan",
    "decode_plan",
    "dep_refs",
    "goal_limits",
    "rename_refs",
    "resolve_inputs",
    "run_context",
    "PlanningLimits",
    "task_created",
    "task_retry",
    "validate_goal_plan",
    "validate_plan",
]


class PlanTask(TaskOptions, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """One task of a plan: its spec and options (``cardbus.eventstore.taskspec``) and a local id.

    ``retry`` replaces fields of the orchestrator's ``Policy.retry`` for this
    task; ``max_attempts`` is kept as the short form of ``retry.max_attempts``
    (giving both, they must agree). Neither given: the policy's.
    """

    id: str
    max_attempts: int | None = None
    child: ChildSpec | None = None  # run a sub-plan or sub-goal as a child run (.children)

    def retry_override(self) -> RetryOverride | None:
        """``retry`` with the short form ``max_attempts`` folded in."""
        if self.max_attempts is None:
            return self.retry
        return msgspec.structs.replace(
            self.retry or RetryOverride(), max_attempts=self.max_attempts
        )


class Plan(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """A DAG of tasks, or (``tasks`` empty) a goal for a planner to split into tasks.

    The planning fields apply to a goal alone: ``limits`` (capabilities
    allowed, the capability or output type wanted at the end, a maximum
    number of tasks), ``max_plan_rounds`` and ``replan_on_failure`` (None: the
    orchestrator's ``Policy``), ``session_fields`` (the session fields the
    planner sees; none by default).
    """

    goal: str
    tasks: list[PlanTask] = []
    plan_id: str | None = None  # submitting the same plan id twice runs it once
    budget_tokens: int | None = None
    # money budget of the run (USD), and caps per part of it ("agent:<id>", "role:<role>",
    # "capability:<name>" -> {"usd": ..., "tokens": ...}), checked before each model call
    # and dispatch (bus.orchestrator.budget); a refusal fails the task or asks for approval
    budget_usd: float | None = None
    budgets: dict[str, BudgetLimit] = {}
    on_budget: str = "fail"  # "fail" | "approval"
    # deadlines of a person's word, by kind of wait ("approval", "review") and what
    # happens when one passes (bus.orchestrator.waits)
    waits: dict[str, WaitPolicy] = {}
    session: dict[str, Any] = {}  # what the user asked; agents never see it whole
    agents: list[str] = []  # import paths "module:Class", used by `cardbus run`
    limits: PlanningLimits | None = None
    max_plan_rounds: int | None = None  # proposals in all (a refused one is re-proposed)
    replan_on_failure: int | None = None  # re-plannings after a task fails for good
    session_fields: list[str] = []
    # the inputs of its tasks whose values a planner took from the goal's own words (task
    # id -> input names): said so, never passed off as given (``cardbus plan`` marks them)
    from_goal: dict[str, list[str]] = {}
    # --- whose long-term memory the run reads and writes (``projections.scope``): the
    # run's user and tenant; None: the session's "user" / "tenant" field, if any
    user: str | None = None
    tenant: str | None = None
    # words kept with the run (``run.started``'s note: who asked, and why, as they say;
    # the run's actor is who submitted it); not part of the plan's digest
    note: str = ""
    # who goes first: admission and the model pacer serve a higher priority first (a
    # waiting run ages, so a low one is not starved for ever); not part of the digest
    priority: int = 0
    schedule: str = ""  # set by a schedule's firing: the schedule id, kept in run.started


def run_context(plan: Plan) -> tuple[str, str]:
    """``(user, tenant)`` of a run of ``plan``: its own fields, else its session's
    ``user`` / ``tenant`` ("" for none); ``InvalidPlan`` if one is not a valid id."""
    out = []
    for name in ("user", "tenant"):
        value = getattr(plan, name)
        where = f"plan.{name}"
        if value is None:
            value, where = plan.session.get(name), f"plan.session[{name!r}]"
        if value is None or value == "":
            out.append("")
            continue
        try:
            out.append(check_id(name, value))
        except InvalidScope as e:
            raise InvalidPlan(f"{where}: {e}") from e
    return out[0], out[1]


def as_plan(plan: Plan | Mapping[str, Any]) -> Plan:
    """A ``Plan``, given one or its JSON form as a mapping (what ``decode_plan`` reads)."""
    if isinstance(plan, Plan):
        return plan
    if not isinstance(plan, Mapping):
        raise InvalidPlan(
            f"a plan is a Plan or a mapping of the plan format, not {type(plan).__name__}"
        )
    try:
        return msgspec.convert(dict(plan), type=Plan)
    except (msgspec.DecodeError, msgspec.ValidationError) as e:
        raise InvalidPlan(f"plan is not valid JSON of the plan format: {e}") from e
    except RecursionError as e:
        raise InvalidPlan(f"plan is nested deeper than {MAX_DEPTH} levels (MAX_DEPTH)") from e


def decode_plan(data: bytes) -> Plan:
    try:
        return msgspec.json.decode(data, type=Plan)
    except (msgspec.DecodeError, msgspec.ValidationError) as e:
        raise InvalidPlan(f"plan is not valid JSON of the plan format: {e}") from e
    except RecursionError as e:
        raise InvalidPlan(f"plan is nested deeper than {MAX_DEPTH} levels (MAX_DEPTH)") from e


#: what a placeholder can be in (or be): the walks below call themselves for these alone
_NESTS = (dict, list)


def dep_refs(value: Any) -> Iterable[str]:
    """Every dependency named by a ``{"$dep": ...}`` placeholder inside ``value``."""
    if isinstance(value, dict):
        if "$dep" in value:
            yield str(value["$dep"])
        else:
            for v in value.values():
                if isinstance(v, _NESTS):  # a leaf names nothing: no generator made for it
                    yield from dep_refs(v)
    elif isinstance(value, list):
        for v in value:
            if isinstance(v, _NESTS):
                yield from dep_refs(v)


def rename_refs(value: Any, ids: Mapping[str, str]) -> Any:
    """``value`` with every ``{"$dep": plan id}`` naming the task id ``ids`` gives it."""
    if isinstance(value, dict):
        if "$dep" in value:
            return {**value, "$dep": ids.get(str(value["$dep"]), value["$dep"])}
        # a leaf comes back as it is, so it is not called for (most values are leaves)
        return {k: rename_refs(v, ids) if isinstance(v, _NESTS) else v for k, v in value.items()}
    if isinstance(value, list):
        return [rename_refs(v, ids) if isinstance(v, _NESTS) else v for v in value]
    return value


def resolve_inputs(
    value: Any,
    outputs: dict[str, Any],
    rename: dict[str, str],
    absent: frozenset[str] | set[str] = frozenset(),
) -> Any:
    """Replace placeholders with dependency outputs; ``rename`` maps plan ids to task ids.

    ``absent``: task ids whose output is absent (optional tasks that ended without
    completing). A placeholder naming one is left out: as a value of a mapping its key
    is omitted, as an item of a list the item is dropped (the others keep their order),
    and a placeholder that is the whole value resolves to None. A path that leads
    nowhere in an output that *is* there still resolves to None, as before.
    """
    if absent:
        out = _resolve_with_absent(value, outputs, rename, absent)
        return None if out is _ABSENT else out
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
        return {
            k: resolve_inputs(v, outputs, rename) if isinstance(v, _NESTS) else v
            for k, v in value.items()
        }
    if isinstance(value, list):
        return [resolve_inputs(v, outputs, rename) if isinstance(v, _NESTS) else v for v in value]
    return value


_ABSENT: Any = object()  # what a placeholder of an absent output resolves to: left out


def _resolve_with_absent(
    value: Any, outputs: dict[str, Any], rename: dict[str, str], absent: frozenset[str] | set[str]
) -> Any:
    """``resolve_inputs`` with absent outputs: ``_ABSENT`` for a placeholder naming one,
    and mappings and lists without the values that came out ``_ABSENT``."""
    if isinstance(value, dict):
        if "$dep" in value:
            if rename.get(str(value["$dep"]), str(value["$dep"])) in absent:
                return _ABSENT
            return resolve_inputs(value, outputs, rename)
        kept = {k: _resolve_with_absent(v, outputs, rename, absent) for k, v in value.items()}
        return {k: v for k, v in kept.items() if v is not _ABSENT}
    if isinstance(value, list):
        items = (_resolve_with_absent(v, outputs, rename, absent) for v in value)
        return [v for v in items if v is not _ABSENT]
    return value


def validate_plan(
    plan: Plan, agents: Iterable[AgentCard] | None = None, retry: RetryPolicy | None = None
) -> None:
    """Raise ``InvalidPlan`` naming the first problem; ``agents`` enables capability checks.

    Each task's retry settings are checked over ``retry`` (the orchestrator's
    ``Policy.retry``; the default ``RetryPolicy()`` when not given).
    """
    if not plan.tasks:
        raise InvalidPlan("plan has no tasks")
    agents = list(agents) if agents is not None else None  # read by child tasks' checks too
    check_budgets(plan)
    _check_limits(plan)
    seen: set[str] = set()
    for t in plan.tasks:
        if not t.id or _forbidden_in(t.id):
            raise InvalidPlan(f"task id {t.id!r} must be non-empty without spaces or . * > ~")
        if t.id in seen:
            raise InvalidPlan(f"task id {t.id!r} appears twice")
        seen.add(t.id)
        # a non-finite timeout would be stored as null and make the log unreadable
        bad_timeout = not math.isfinite(t.timeout_s) or t.timeout_s <= 0
        bad_attempts = t.max_attempts is not None and t.max_attempts < 1
        if bad_attempts or t.fanout < 1 or bad_timeout or t.max_review_rounds < 0:
            raise InvalidPlan(
                f"task {t.id!r}: max_attempts, fanout and timeout_s must be positive"
                f" (and timeout_s finite): got {t.max_attempts}, {t.fanout}, {t.timeout_s}"
            )
        if not isinstance(t.optional, bool):  # a plan built in Python is not type-checked
            raise InvalidPlan(f"task {t.id!r}: optional must be true or false, got {t.optional!r}")
        task_retry(t, retry or RetryPolicy())
        _check_conflict_options(t)
        if t.child is not None:  # its capability is a label: no agent takes it
            check_child(t.id, t.child, agents, t.goal)
            if t.fanout != 1:
                raise InvalidPlan(f"task {t.id!r}: a child-run task runs one child: fanout 1")
    earlier: set[str] = set()
    in_order = True  # each task's deps are tasks before it: that order has no cycle
    for t in plan.tasks:
        for d in t.deps:
            if d not in seen:
                raise InvalidPlan(f"task {t.id!r} depends on unknown task {d!r}")
        for ref in dep_refs(t.inputs):
            if ref not in t.deps:
                raise InvalidPlan(
                    f"task {t.id!r} reads the output of {ref!r} without declaring it in deps"
                )
        in_order = in_order and earlier.issuperset(t.deps)
        earlier.add(t.id)
    if not in_order:  # a plan written in dependency order (most are) needs no search
        _check_acyclic(plan)
    if agents is None:
        return
    cards = list(agents)
    by_id = {c.agent_id: c for c in cards}
    offers = _Offers(cards)
    for t in plan.tasks:
        if t.child is not None:  # checked with its sub-plan's agents above
            continue
        for cap in filter(None, [t.capability, t.review_by]):
            if not offers.of(cap):
                raise InvalidPlan(f"task {t.id!r}: no registered agent offers capability {cap!r}")
        reasons = {
            c.agent_id: hard_filter(
                c, t.capability, t.inputs, t.constraints, t.timeout_s, partial_inputs=True
            )
            or _missing_inputs(spec, t)
            for c, spec in offers.of(t.capability)
        }
        if all(reasons.values()):
            detail = ", ".join(f"{a}: {_worded(by_id[a], t)}" for a in sorted(reasons))
            raise InvalidPlan(f"task {t.id!r}: no agent accepts its inputs ({detail})")


def _worded(card: AgentCard, t: PlanTask) -> str | None:
    """Why ``card``'s agent refuses ``t``, naming the fields (``$.region: expected str,
    got int``; an absent required input too) or the constraint it does not meet."""
    spec = card.capability(t.capability)
    return worded_refusal(
        card,
        t.capability,
        t.inputs,
        t.constraints,
        t.timeout_s,
        partial_inputs=True,
        absent=_absent_required(spec, t) if spec is not None else (),
    )


_FORBIDDEN = " .*>~\t\n"  # in a task id (the id becomes part of stream names)
_FORBIDDEN_SET = frozenset(_FORBIDDEN)


def _forbidden_in(task_id: Any) -> bool:
    """Whether ``task_id`` holds a character of ``_FORBIDDEN``: for a ``str``, one set
    operation instead of a generator testing each character (a plan built in Python
    may hold any id, tested as it always was)."""
    if type(task_id) is str:
        return not _FORBIDDEN_SET.isdisjoint(task_id)
    return any(c in task_id for c in _FORBIDDEN)


_SCOPES = ("agent:", "role:", "capability:")


def check_budgets(plan: Plan) -> None:
    """``InvalidPlan`` for a budget out of range or a scope not known."""
    if plan.budget_tokens is not None and plan.budget_tokens < 0:
        raise InvalidPlan(f"budget_tokens must be >= 0, got {plan.budget_tokens}")
    if plan.budget_usd is not None and not (
        math.isfinite(plan.budget_usd) and plan.budget_usd >= 0
    ):
        raise InvalidPlan(f"budget_usd must be a finite number >= 0, got {plan.budget_usd}")
    if plan.on_budget not in ("fail", "approval"):
        raise InvalidPlan(f"on_budget must be 'fail' or 'approval', got {plan.on_budget!r}")
    check_waits(plan.waits)
    for scope, limit in plan.budgets.items():
        if not scope.startswith(_SCOPES) or scope.endswith(":"):
            raise InvalidPlan(
                f"budgets: scope {scope!r} must be agent:<id>, role:<role> or capability:<name>"
            )
        if limit.usd is None and limit.tokens is None:
            raise InvalidPlan(f"budgets[{scope!r}] needs usd or tokens")
        if limit.tokens is not None and limit.tokens < 0:
            raise InvalidPlan(f"budgets[{scope!r}].tokens must be >= 0, got {limit.tokens}")
        if limit.usd is not None and not (math.isfinite(limit.usd) and limit.usd >= 0):
            raise InvalidPlan(f"budgets[{scope!r}].usd must be a finite number >= 0")


def validate_goal_plan(plan: Plan, agents: Iterable[AgentCard] | None = None) -> None:
    """Raise ``InvalidPlan`` if a goal alone cannot be planned as given.

    The goal must be text; the settings must be in range; with ``agents``,
    one of them must offer the capability ``plan``.
    """
    if not isinstance(plan.goal, str) or not plan.goal.strip():
        raise InvalidPlan("a plan without tasks needs a goal to plan from")
    _check_limits(plan)
    check_budgets(plan)
    if plan.max_plan_rounds is not None and plan.max_plan_rounds < 1:
        raise InvalidPlan(f"max_plan_rounds must be >= 1, got {plan.max_plan_rounds}")
    if plan.replan_on_failure is not None and plan.replan_on_failure < 0:
        raise InvalidPlan(f"replan_on_failure must be >= 0, got {plan.replan_on_failure}")
    limits = goal_limits(plan)
    if limits.max_tasks is not None and limits.max_tasks < 1:
        raise InvalidPlan(f"limits.max_tasks must be >= 1, got {limits.max_tasks}")
    if limits.capabilities is not None and not limits.capabilities:
        raise InvalidPlan("limits.capabilities is empty: no task could be planned")
    if agents is not None and not any(c.capability(PLAN_CAPABILITY) is not None for c in agents):
        raise InvalidPlan(
            "a plan without tasks needs a planner: no registered agent offers"
            f" capability {PLAN_CAPABILITY!r}"
        )


def goal_limits(plan: Plan) -> PlanningLimits:
    """The plan's ``limits`` as ``PlanningLimits`` (given as one, as the planner's
    ``PlanLimits`` or as a mapping); ``InvalidPlan`` if they are not limits."""
    if plan.limits is None:
        return PlanningLimits()
    try:
        return msgspec.convert(msgspec.to_builtins(plan.limits), PlanningLimits)
    except (msgspec.ValidationError, TypeError) as e:
        raise InvalidPlan(f"limits: {e}") from e


def _check_limits(plan: Plan) -> None:
    """Ids within MAX_ID_CHARS and values within MAX_DEPTH (``cardbus.eventstore.batch``):
    the streams and events a plan becomes must all be storable, or nothing is written."""

    def named(what: str, value: object) -> None:
        if isinstance(value, str) and len(value) > MAX_ID_CHARS:
            raise InvalidPlan(
                f"{what} {value[:40]!r}... is {len(value)} chars, over the limit of"
                f" {MAX_ID_CHARS} (MAX_ID_CHARS)"
            )

    named("plan_id", plan.plan_id)
    values: list[object] = []
    for t in plan.tasks:
        named("task id", t.id)
        task = f"task {t.id[:40]!r}"  # once a task (it was made for each name checked)
        for cap in (t.capability, t.review_by):
            if isinstance(cap, str) and len(cap) > MAX_ID_CHARS:
                named(f"{task}: capability", cap)
        for d in t.deps:
            if isinstance(d, str) and len(d) > MAX_ID_CHARS:
                named(f"{task}: dependency", d)
        values += (t.inputs, t.constraints)
    # One walk over all the values, each one level down in ``values`` (so the limit is
    # one more), finds a problem exactly when one of them has one: 1 call instead of
    # 1 + 2 a task, an empty dict (most constraints and sessions) left out as it nests
    # nothing. Only a plan refused walks them one by one, for the first to name.
    values = [v for v in (plan.session, *values) if type(v) is not dict or v]
    if not nesting_problem(values, MAX_DEPTH + 1):
        return
    problem = nesting_problem(plan.session, what="session")
    for t in plan.tasks:
        problem = problem or nesting_problem(t.inputs, what=f"task {t.id[:40]!r}: inputs")
        problem = problem or nesting_problem(t.constraints, what=f"task {t.id[:40]!r}: constraints")
    if problem:
        raise InvalidPlan(problem)


def _check_conflict_options(t: PlanTask) -> None:
    """A task's tie policy, reviewers and quorum are among the allowed values."""
    if t.tie_policy not in (None, "retry", "approval"):
        raise InvalidPlan(
            f"task {t.id!r}: tie_policy must be 'retry' or 'approval', got {t.tie_policy!r}"
        )
    if isinstance(t.reviewers, bool) or t.reviewers < 1:
        raise InvalidPlan(f"task {t.id!r}: reviewers must be >= 1, got {t.reviewers!r}")
    if t.review_quorum not in ("all", "majority"):
        raise InvalidPlan(
            f"task {t.id!r}: review_quorum must be 'all' or 'majority', got {t.review_quorum!r}"
        )


class _Offers:
    """Which cards offer a capability, and their spec of it, in the cards' order.

    ``AgentCard.capability`` scans a card's capabilities: asked for every task's
    capability and reviewer, for every card, it made 24 scans of each 3-task run
    (a quarter of ``validate_plan``). The cards are indexed by capability name
    once per validation instead; a name that is not a ``str`` (a plan built in
    Python, unchecked) is looked up by the scan, as before, never hashed.
    """

    def __init__(self, cards: list[AgentCard]) -> None:
        self.cards = cards
        self.by_name: dict[str, list[tuple[AgentCard, CapabilitySpec]]] | None = {}
        for card in cards:
            mine: set[str] = set()
            for spec in card.capabilities:
                if type(spec.name) is not str:  # compared with ==, never hashed: scan
                    self.by_name = None
                    return
                if spec.name not in mine:  # the first of a name is the card's, as capability()
                    mine.add(spec.name)
                    self.by_name.setdefault(spec.name, []).append((card, spec))

    def of(self, name: Any) -> list[tuple[AgentCard, CapabilitySpec]]:
        """(card, its spec of ``name``) for each card offering ``name``."""
        if self.by_name is not None and type(name) is str:
            return self.by_name.get(name, [])
        found = ((c, c.capability(name)) for c in self.cards)
        return [(c, spec) for c, spec in found if spec is not None]


def _missing_inputs(spec: CapabilitySpec, t: PlanTask) -> str | None:
    """``input_schema_mismatch`` if a required top-level input is absent.

    The partial check skips missing required fields; but a plan's inputs are
    all there is (a dependency fills a placeholder, never an absent key), so
    an absent required field can be refused before anything runs. ``spec``: the
    agent's spec of the task's capability.
    """
    return "input_schema_mismatch" if _absent_required(spec, t) else None


def _absent_required(spec: CapabilitySpec, t: PlanTask) -> list[str]:
    """The required top-level inputs of ``spec`` that ``t`` does not give."""
    schema: Any = spec.input_schema
    ref = schema.get("$ref")
    if isinstance(ref, str):
        schema = schema.get("$defs", {}).get(ref.rsplit("/", 1)[-1], {})
    required = schema.get("required", []) if isinstance(schema, dict) else []
    return [name for name in required if name not in t.inputs]


def _check_acyclic(plan: Plan) -> None:
    deps = {t.id: set(t.deps) for t in plan.tasks}
    done: set[str] = set()
    while len(done) < len(deps):
        ready = [t for t, ds in deps.items() if t not in done and ds <= done]
        if not ready:
            cycle = sorted(t for t in deps if t not in done)
            raise InvalidPlan(f"plan has a dependency cycle among {cycle}")
        done.update(ready)


def task_retry(task: PlanTask, default: RetryPolicy) -> RetryPolicy:
    """The retry policy ``task`` runs with: ``default`` with the task's own settings.

    ``InvalidPlan`` names the task when its settings are not allowed, or when
    ``max_attempts`` and ``retry.max_attempts`` are both given and differ.
    """
    given = task.retry.max_attempts if task.retry is not None else None
    if given is not None and task.max_attempts is not None and given != task.max_attempts:
        raise InvalidPlan(
            f"task {task.id!r}: max_attempts ({task.max_attempts}) and retry.max_attempts"
            f" ({given}) differ; give one of them"
        )
    try:
        return default.overridden_by(task.retry_override())
    except ConfigError as e:
        raise InvalidPlan(f"task {task.id!r}: retry: {e}") from e


def task_created(
    task: PlanTask, root_id: str, ids: Mapping[str, str], retry: RetryPolicy
) -> TaskCreated:
    """The ``task.created`` event of a plan task in run ``root_id``; ``ids`` maps plan ids
    to task ids (the task's own, its deps' and those its inputs name)."""
    return restate(
        task,
        TaskCreated,
        root_id=root_id,
        inputs=rename_refs(task.inputs, ids),
        deps=[ids[d] for d in task.deps],
        # the attempt budget is resolved now and logged; the task's other
        # retry settings are logged as given (`retry`, over Policy.retry)
        max_attempts=task_retry(task, retry).max_attempts,
        plan_id=task.id,
        child=msgspec.to_builtins(task.child) if task.child is not None else None,
    )
