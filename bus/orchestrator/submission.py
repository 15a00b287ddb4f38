"""A run's creation: the events that start a run of a plan, and writing them from outside.

:func:`run_creation` is pure: the ``run.started`` of a new root and the
``task.created`` of each plan task (a goal alone has none yet: its planner
proposes them), refused (``InvalidPlan``) when one would be over the log's
event size limit, before anything is written. ``Orchestrator.submit`` writes
them with the run's first decisions.

:func:`submit_to_log` starts a run with no orchestrator in the process (the
web console on NATS): the plan is checked against the agents given, its plan
id claimed (``plan.submitted``; the same plan id runs once), and its creation
appended in one ``append_many``, every event by ``actor``. The orchestrators
following the log fold the new run and decide it, as they do a run another
member submitted.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import msgspec

from cardbus.agents.cards import AgentCard
from cardbus.bus.orchestrator.digest import plan_digest
from cardbus.bus.orchestrator.plan import (
    Plan,
    run_context,
    task_created,
    validate_goal_plan,
    validate_plan,
)
from cardbus.bus.orchestrator.planning import planning_spec
from cardbus.bus.orchestrator.policy import Policy
from cardbus.eventstore import (
    DEFAULT_MAX_EVENT_BYTES,
    Append,
    ConcurrencyError,
    EventStore,
    NewEvent,
    new_id,
)
from cardbus.eventstore import events as ev
from cardbus.eventstore.errors import InvalidPlan, PlanConflict

__all__ = ["event_limit", "run_creation", "submit_to_log"]

Creation = list[tuple[str, ev.Event]]


def event_limit(store: EventStore) -> int:
    """The largest event data a run's creation may hold in ``store`` (room left for the
    envelope)."""
    return int(getattr(store, "max_event_bytes", DEFAULT_MAX_EVENT_BYTES)) - 8192


def run_creation(
    plan: Plan,
    plan_id: str,
    root_id: str,
    policy: Policy,
    agents: Iterable[str] = (),
    agent_paths: Iterable[str] = (),
    limit: int | None = None,
    lineage: Mapping[str, Any] | None = None,
) -> Creation:
    """``[(root_id, run.started), (task id, task.created), ...]`` of a run of ``plan``.

    ``agents``: the run's agents (selection considers only them; none: all);
    ``agent_paths``: their classes (default ``plan.agents``). ``limit``: the largest
    event (bytes of JSON); one over it is ``InvalidPlan`` naming it. ``lineage``: the
    ``parent_*`` fields of a child run's ``run.started`` (``bus.orchestrator.children``).
    """
    goal_only = not plan.tasks
    ids = {t.id: f"{t.id}-{root_id[-12:]}" for t in plan.tasks}
    user, tenant = run_context(plan)  # whose memory the run reads and writes
    started = ev.RunStarted(
        goal=plan.goal,
        plan_id=plan_id,
        task_ids=list(ids.values()),
        budget_tokens=plan.budget_tokens,
        budget_usd=plan.budget_usd,
        budgets=dict(plan.budgets),
        on_budget=plan.on_budget,
        waits=dict(plan.waits),
        session=plan.session,
        user=user,
        tenant=tenant,
        planning=planning_spec(plan, policy) if goal_only else None,
        agents=sorted(set(agents)),
        agent_paths=list(dict.fromkeys(agent_paths)) or list(plan.agents),
        note=plan.note,
        priority=plan.priority,
        schedule=plan.schedule,
        **dict(lineage or {}),
    )
    created = {ids[t.id]: task_created(t, root_id, ids, policy.retry) for t in plan.tasks}
    if limit is not None:  # refuse what the log would refuse before writing anything
        named = [(f"task {t.id!r}", created[ids[t.id]]) for t in plan.tasks]
        for what, data in [("the run", started), *named]:
            size = len(msgspec.json.encode(data))
            if size > limit:
                raise InvalidPlan(f"{what} is {size} bytes, over the event size limit ({limit})")
    return [(root_id, started), *created.items()]


async def submit_to_log(
    store: EventStore,
    plan: Plan,
    cards: Sequence[AgentCard],
    actor: str,
    policy: Policy | None = None,
) -> str:
    """Start a run of ``plan`` by writing its creation to the log; its root id.

    ``cards``: the agents the plan is checked against (``InvalidPlan`` if none can
    take a task; for a goal alone, if none plans). A plan id already in the log
    returns its run (``PlanConflict`` if that id names another plan body).
    """
    policy = policy or Policy()
    if plan.tasks:
        validate_plan(plan, cards, policy.retry)
    else:
        validate_goal_plan(plan, cards)
    plan_id = plan.plan_id or new_id()
    digest = plan_digest(plan)
    claim_stream = f"plan-{plan_id}"
    root_id = new_id()
    if plan.plan_id is not None:  # a known id: the first claim wins, a later one joins it
        claimed = await store.read_stream(claim_stream)
        if not claimed:
            claim = ev.PlanSubmitted(plan_id=plan_id, root_id=root_id, plan_digest=digest)
            try:
                claimed = await store.append(
                    claim_stream, [NewEvent(data=claim, correlation_id=root_id, actor=actor)], 0
                )
            except ConcurrencyError:
                claimed = await store.read_stream(claim_stream)
        first = claimed[0].data
        assert isinstance(first, ev.PlanSubmitted)
        if first.plan_digest and first.plan_digest != digest:
            raise PlanConflict(plan_id, first.root_id)
        if first.root_id != root_id and await store.read_stream(first.root_id):
            return first.root_id  # started already
        root_id = first.root_id  # claimed, its creation not written yet: written now
    creation = run_creation(plan, plan_id, root_id, policy, limit=event_limit(store))
    if plan.plan_id is None:
        claim = ev.PlanSubmitted(plan_id=plan_id, root_id=root_id, plan_digest=digest)
        creation.insert(0, (claim_stream, claim))
    appends = [
        Append(stream, [NewEvent(data=data, correlation_id=root_id, actor=actor)], 0)
        for stream, data in creation
    ]
    for outcome in await store.append_many(appends):
        if isinstance(outcome, ConcurrencyError):
            continue  # written by an earlier, interrupted submit of the same plan id
        if isinstance(outcome, Exception):
            raise outcome
    return root_id
