"""Planning a goal: the planning card, the checks on a proposal, the tasks it becomes.

A plan given as a goal alone (``Plan(goal=..., tasks=[])``) starts a run whose
``run.started`` carries a :class:`~cardbus.eventstore.events.PlanningSpec`
(limits, ``max_plan_rounds``, ``replan_on_failure``, the session fields the
planner sees). The decider then plays rounds, each one logged before it takes
effect:

1. a planning task ``<root>~plan<round>`` (role ``plan``, capability ``plan``)
   whose inputs are a ``PlanRequest`` (:func:`planning_inputs`): the goal, the
   session fields let through, the live agents' capabilities with their
   schemas, the limits and, after a refusal, its errors and the refused
   proposal. It is dispatched like any task (selection, retries, time-outs);
2. its output is recorded as ``plan.proposed``, with the inputs whose values
   were taken from the goal's own words (:func:`taken_from_goal`), and checked by
   :func:`check_proposal` exactly as a hand-written plan (``validate_plan``)
   plus the limits; then ``plan.refused`` with the errors (the next round, or
   past ``max_plan_rounds`` the run fails with ``plan_invalid``) or
   ``plan.accepted`` naming the task ids;
3. after the acceptance is durable, the plan's tasks are created as
   ``task.created`` events, as a hand-written plan's are (:func:`created_tasks`).

Re-planning (``replan_on_failure``): when the run would fail because tasks
failed for good, a new round asks the planner for the rest of the plan, with
the failures as errors, the accepted plan as ``previous`` and the completed
tasks' outputs under ``completed`` (plan task id -> output). The new plan's
tasks may depend on completed ones by their plan ids (``$dep`` and ``deps``);
a proposed task named like a completed one with the same capability is that
task, reused; the unfinished tasks are superseded.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

import msgspec

from cardbus.agents.cards import AgentCard
from cardbus.agents.planning import (
    PLAN_CAPABILITY,
    PlanLimits,
    PlanProposal,
    free_text_inputs,
    plan_request,
)
from cardbus.bus.orchestrator.plan import (
    Plan,
    PlanTask,
    dep_refs,
    goal_limits,
    resolve_inputs,
    task_created,
    validate_plan,
)
from cardbus.bus.orchestrator.policy import Policy
from cardbus.bus.orchestrator.runstate import RunState, RunView, TaskView
from cardbus.eventstore import TaskState
from cardbus.eventstore import events as ev
from cardbus.eventstore.errors import InvalidPlan

__all__ = [
    "PLAN_ROLE",
    "check_proposal",
    "created_tasks",
    "judge_proposal",
    "planner_task_id",
    "planning_inputs",
    "planning_spec",
    "proposal_plan",
    "taken_from_goal",
]

PLAN_ROLE = "plan"  # TaskCreated.role of a planning task
_MAX_ERRORS = 20
_MAX_ERROR_CHARS = 500


def planning_spec(plan: Plan, policy: Policy) -> ev.PlanningSpec:
    """How a goal alone is planned: the plan's settings over the policy's."""
    return ev.PlanningSpec(
        limits=goal_limits(plan),
        max_plan_rounds=(
            plan.max_plan_rounds if plan.max_plan_rounds is not None else policy.max_plan_rounds
        ),
        replan_on_failure=(
            plan.replan_on_failure
            if plan.replan_on_failure is not None
            else policy.replan_on_failure
        ),
        session_fields=list(plan.session_fields),
    )


def planning_failure(planner: TaskView) -> str:
    """Why the planning task ended without a proposal, the planner's own words first.

    A planner that declined (``cannot_plan: no value for the inputs ...``) or
    whose model gave no usable answer (``llm_bad_output: ...``, the detail an
    LLM agent's failure carries) is named before the task's state.
    """
    said = [f"{planner.reason}: {planner.error}"] if planner.error else []
    said += [f"rejected by {r}" for r in planner.rejections]
    state = f"the planning task {planner.state}: {planner.reason}"
    return "; ".join([*said, state]) if said else state


def planner_task_id(root_id: str, round: int) -> str:
    return f"{root_id}~plan{round}"


def planned_before(run: RunView) -> bool:
    """The run came with tasks (a fork of a planned run): its first round is a re-planning."""
    return bool(run.started.task_ids)


def episode_start(run: RunView, round: int) -> int:
    """The first round of the planning ``round`` belongs to (1, or the one after an acceptance)."""
    accepted = [a.round for a in run.accepted if a.round < round]
    return (max(accepted) + 1) if accepted else 1


def replans_used(run: RunView) -> int:
    """Re-plannings started so far (a planning after an acceptance, or after forked tasks)."""
    starts = sum(1 for r in range(1, len(run.planners) + 1) if episode_start(run, r) == r)
    return starts - (0 if planned_before(run) else 1)


def planning_inputs(
    run: RunView,
    state: RunState,
    *,
    errors: list[str],
    previous: Any,
    limit_bytes: int,
) -> dict[str, Any]:
    """A planning card's inputs: a ``PlanRequest`` as JSON (and ``completed`` on a re-planning).

    ``previous`` is dropped if the card would not fit in ``limit_bytes``.
    """
    spec = run.started.planning or ev.PlanningSpec()
    session = run.started.session if isinstance(run.started.session, dict) else {}
    shown = {k: session[k] for k in spec.session_fields if k in session}
    replanning = bool(run.accepted) or planned_before(run)
    completed: dict[str, Any] = {}
    if replanning:
        failures = []
        for name, task_id in run.names.items():
            task = state.tasks.get(task_id)
            if task is None:
                continue
            if task.state is TaskState.COMPLETED:
                completed[name] = task.output
            elif task.terminal:
                failures.append(
                    f"task {name!r} (capability {task.created.capability!r}) {task.state}:"
                    f" {task.reason}; propose the rest of the plan (completed tasks can be"
                    " named in deps and $dep)"
                )
        errors = [*failures, *errors]
    proposal = _as_proposal(previous)
    request = plan_request(
        run.started.goal,
        state.agents.values(),
        session=shown,
        limits=msgspec.convert(msgspec.to_builtins(spec.limits), PlanLimits),
        errors=errors,
        previous=proposal,
    )
    inputs: dict[str, Any] = msgspec.to_builtins(request)
    if replanning:
        inputs["completed"] = completed
    if proposal is not None and len(msgspec.json.encode(inputs)) > limit_bytes:
        inputs["previous"] = None
    return inputs


def _as_proposal(value: Any) -> PlanProposal | None:
    if value is None:
        return None
    try:
        return msgspec.convert(value, PlanProposal)
    except (msgspec.ValidationError, TypeError):
        return None


def planning_task(run: RunView, inputs: dict[str, Any], policy: Policy) -> ev.TaskCreated:
    return ev.TaskCreated(
        root_id=run.root_id,
        capability=PLAN_CAPABILITY,
        goal=run.started.goal,
        inputs=inputs,
        timeout_s=policy.plan_timeout_s,
        max_attempts=policy.retry.max_attempts,
        role=PLAN_ROLE,
    )


def proposal_plan(output: Any, goal: str) -> Plan:
    """A proposal (a planner's output) as a ``Plan`` of its tasks; ``InvalidPlan`` if it is not."""
    if not isinstance(output, Mapping) or not isinstance(output.get("tasks"), list):
        raise InvalidPlan(
            'the proposal is not a plan: expected {"goal": ..., "tasks": [...]}, got '
            + _short(output)
        )
    try:
        return msgspec.convert({"goal": goal, "tasks": output["tasks"]}, Plan)
    except (msgspec.ValidationError, TypeError) as e:
        raise InvalidPlan(f"the proposal is not valid JSON of the plan format: {e}") from e


def _short(value: Any) -> str:
    try:
        text = msgspec.json.encode(value).decode()
    except (TypeError, msgspec.EncodeError):
        text = repr(value)
    return text if len(text) <= 120 else text[:117] + "..."


def completed_names(run: RunView, state: RunState) -> dict[str, str]:
    """Plan task id -> task id of the run's completed plan tasks."""
    return {
        name: tid
        for name, tid in run.names.items()
        if (t := state.tasks.get(tid)) is not None and t.state is TaskState.COMPLETED
    }


def check_proposal(
    output: Any, run: RunView, state: RunState, policy: Policy
) -> tuple[Plan | None, list[str]]:
    """The plan of new tasks a proposal makes, and every error found (none: accepted).

    The checks of a hand-written plan (``validate_plan``: task ids, capabilities
    offered, inputs accepted, ``$dep``s declared, no cycle), and the limits:
    at most ``limits.max_tasks`` (and ``Policy.max_plan_tasks``) tasks, only
    the capabilities allowed, one ending with the capability or output type
    wanted. On a re-planning, completed tasks may be depended on.
    """
    spec = run.started.planning or ev.PlanningSpec()
    limits = spec.limits
    tasks = output.get("tasks") if isinstance(output, Mapping) else None
    most = min(policy.max_plan_tasks, limits.max_tasks or policy.max_plan_tasks)
    if isinstance(tasks, list) and len(tasks) > most:
        return None, [f"the plan has {len(tasks)} tasks, at most {most} are allowed"]
    try:
        plan = proposal_plan(output, run.started.goal)
    except InvalidPlan as e:
        return None, [_clip(str(e))]
    done = completed_names(run, state)
    errors: list[str] = []
    new: list[PlanTask] = []
    for t in plan.tasks:
        if t.id in done:
            old = state.tasks[done[t.id]].created
            if old.capability != t.capability:
                errors.append(
                    f"task id {t.id!r} is a completed task's (capability {old.capability!r}):"
                    " give the new task another id"
                )
            continue  # the completed task, reused
        new.append(t)
    if not new:
        errors.append("the plan has no tasks" if not done else "the plan adds no task")
        return None, errors
    outputs = {name: state.tasks[tid].output for name, tid in done.items()}
    checked = Plan(goal=plan.goal, tasks=[_without_done(t, done, outputs) for t in new])
    agents = list(state.agents.values())
    try:
        validate_plan(checked, agents, policy.retry)
    except InvalidPlan as e:
        errors.append(_clip(str(e)))
    errors += _limit_errors(checked, limits, agents)
    if errors:
        return None, errors[:_MAX_ERRORS]
    return Plan(goal=plan.goal, tasks=new), []


def _without_done(t: PlanTask, done: Mapping[str, str], outputs: dict[str, Any]) -> PlanTask:
    """``t`` with the completed tasks it reads placed as values (so its inputs are checked)."""
    if not any(d in done for d in t.deps) and not any(r in done for r in dep_refs(t.inputs)):
        return t
    inputs = _place(t.inputs, done, outputs)
    return msgspec.structs.replace(t, inputs=inputs, deps=[d for d in t.deps if d not in done])


def _place(value: Any, done: Mapping[str, str], outputs: dict[str, Any]) -> Any:
    if isinstance(value, dict):
        if "$dep" in value:
            if str(value["$dep"]) in done:
                return resolve_inputs(value, outputs, {})
            return value
        return {k: _place(v, done, outputs) for k, v in value.items()}
    if isinstance(value, list):
        return [_place(v, done, outputs) for v in value]
    return value


def judge_proposal(
    output: Any,
    run: RunView,
    state: RunState,
    policy: Policy,
    *,
    round: int,
    planner_task_id: str,
    agent_id: str,
    event_limit: int,
) -> tuple[ev.PlanProposed, Plan | None, list[str]]:
    """The ``plan.proposed`` event of a planner's output, and the verdict on it.

    A proposal over ``event_limit`` bytes is recorded without its body and refused.
    """
    size = len(msgspec.json.encode(output))
    if size > event_limit:
        proposed = ev.PlanProposed(round=round, planner_task_id=planner_task_id, agent_id=agent_id)
        return proposed, None, [f"the proposal is {size} bytes, over the limit ({event_limit})"]
    session = run.started.session if isinstance(run.started.session, Mapping) else {}
    worded = taken_from_goal(output, run.started.goal, session)
    proposed = ev.PlanProposed(
        round=round,
        planner_task_id=planner_task_id,
        agent_id=agent_id,
        proposal=output,
        from_goal=worded,
    )
    plan, errors = check_proposal(output, run, state, policy)
    if plan is not None:
        errors = _worded_errors(plan, worded, list(state.agents.values()))
        if errors:
            plan = None
    return proposed, plan, errors


def taken_from_goal(output: Any, goal: str, session: Mapping[str, Any]) -> dict[str, list[str]]:
    """The inputs of a proposal whose values are the goal's own words: task id -> inputs.

    What the planner says so (``from_goal``), and every literal text input found
    word for word in the goal that no session value gave: a planner that copies
    the goal without saying so is found out all the same.
    """
    tasks = output.get("tasks") if isinstance(output, Mapping) else None
    if not isinstance(tasks, list):
        return {}
    said = output.get("from_goal")
    said = said if isinstance(said, Mapping) else {}
    given = {v.strip().lower() for v in session.values() if isinstance(v, str)}
    words = goal.lower()
    out: dict[str, list[str]] = {}
    for t in tasks:
        if not isinstance(t, Mapping) or not isinstance(t.get("id"), str):
            continue
        inputs = t.get("inputs")
        if not isinstance(inputs, Mapping):
            continue
        declared = said.get(t["id"])
        names = [
            n
            for n in (declared if isinstance(declared, list) else [])
            if isinstance(n, str) and n in inputs  # a planner's say, of its own inputs only
        ]
        for name, value in inputs.items():
            if name not in names and _in_goal(value, words, given):
                names.append(name)
        if names:
            out[t["id"]] = [str(n) for n in names]
    return out


def _in_goal(value: Any, goal: str, given: set[str]) -> bool:
    """A text found in the (lowercased) goal as whole words, and not a session value."""
    if not isinstance(value, str):
        return False
    text = value.strip().lower()
    if len(text) < 2 or text in given:
        return False
    return re.search(rf"(?<!\w){re.escape(text)}(?!\w)", goal) is not None


def _worded_errors(
    plan: Plan, worded: Mapping[str, list[str]], agents: list[AgentCard]
) -> list[str]:
    """An input given the goal's words that does not take free text: a guess, refused."""
    errors = []
    for t in plan.tasks:
        names = worded.get(t.id, [])
        if not names:
            continue
        free: set[str] = set()
        for card in agents:
            spec = card.capability(t.capability)
            if spec is not None:
                free |= free_text_inputs(spec.input_schema)
        for name in names:
            if name not in free:
                errors.append(
                    f"task {t.id!r}: input {name!r} is given the goal's words"
                    f" ({_short(t.inputs.get(name))}), but {t.capability!r} does not take free"
                    f" text there: give it with --input {name}=... (or declare it free text,"
                    ' "x-free-text": true in its schema)'
                )
    return errors[:_MAX_ERRORS]


def _limit_errors(plan: Plan, limits: ev.PlanningLimits, agents: list[AgentCard]) -> list[str]:
    errors = []
    allowed = limits.capabilities
    if allowed is not None:
        for t in plan.tasks:
            for cap in filter(None, [t.capability, t.review_by]):
                if cap not in allowed:
                    errors.append(f"task {t.id!r}: capability {cap!r} is not allowed")
    used = {d for t in plan.tasks for d in t.deps}
    ends = [t for t in plan.tasks if t.id not in used]
    if limits.final_capability and not any(t.capability == limits.final_capability for t in ends):
        errors.append(f"the plan must end with capability {limits.final_capability!r}")
    if limits.final_output and not any(
        _outputs(agents, t.capability, limits.final_output) for t in ends
    ):
        errors.append(f"the plan must end with a task whose output is {limits.final_output!r}")
    return errors


def _outputs(agents: list[AgentCard], capability: str, wanted: str) -> bool:
    """Some agent's ``capability`` outputs the type (or a field) named ``wanted``."""
    wanted = wanted.lower()
    for card in agents:
        spec = card.capability(capability)
        if spec is None:
            continue
        schema: Any = spec.output_schema or {}
        ref = schema.get("$ref")
        name = ref.rsplit("/", 1)[-1] if isinstance(ref, str) else str(schema.get("title", ""))
        body = schema.get("$defs", {}).get(name, schema) if isinstance(ref, str) else schema
        fields = body.get("properties", {}) if isinstance(body, dict) else {}
        if name.lower() == wanted or wanted in {str(f).lower() for f in fields}:
            return True
    return False


def _clip(text: str) -> str:
    return text if len(text) <= _MAX_ERROR_CHARS else text[: _MAX_ERROR_CHARS - 3] + "..."


def accepted_task_ids(plan: Plan, run: RunView, round: int) -> dict[str, str]:
    """The ids the accepted plan's new tasks get: ``<id>-<root[-12:]>`` as a hand-written
    plan's, or on a re-planning ``<id>-<root[-12:]>~p<round>`` (never an id in use)."""
    suffix = run.root_id[-12:]
    first = round == 1 and not planned_before(run)
    return {t.id: f"{t.id}-{suffix}" if first else f"{t.id}-{suffix}~p{round}" for t in plan.tasks}


def created_tasks(
    run: RunView, state: RunState, accepted: ev.PlanAccepted, policy: Policy
) -> dict[str, ev.TaskCreated]:
    """The ``task.created`` events of an accepted plan's tasks, by task id."""
    proposed = run.proposals.get(accepted.round)
    plan = proposal_plan(proposed.proposal if proposed else None, run.started.goal)
    ids = {**completed_names(run, state), **accepted.task_ids}
    return {
        accepted.task_ids[t.id]: task_created(t, run.root_id, ids, policy.retry)
        for t in plan.tasks
        if t.id in accepted.task_ids
    }
