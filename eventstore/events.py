"""The event catalogue: every lifecycle fact is a frozen, tagged msgspec Struct.

Tags are stable strings such as ``task.dispatched.v1``, never class paths. A
new optional field gets a default; a changed meaning gets a new tag (``.v2``)
and the old class stays in ``EVENT_TYPES`` so the decoder keeps reading it.

Streams: a task's events live in the stream named by its task id; a run's
own facts (``run.*``) in the stream named by its root id; agent registrations
in ``agent-<agent_id>``; an orchestrator's starts in ``orchestrator-<id>``;
plan submissions in ``plan-<plan_id>``; long-term memory in ``memory``; a
schedule's life and its firings in ``schedule-<schedule_id>`` (``schedule.*``).
A run planned from a goal keeps its planning rounds
(``plan.proposed``, ``plan.refused``, ``plan.accepted``) in the run's stream;
each round's planning card is a task of its own (``<root_id>~plan<round>``,
role ``plan``).
"""

from __future__ import annotations

from typing import Any

import msgspec

from cardbus.eventstore.taskspec import (
    DEFAULT_MAX_ATTEMPTS,
    RetryOverride,
    TaskOptions,
    TaskSpec,
)

__all__ = [
    "DISPATCH_INPUTS_INLINE",
    "EVENT_TYPES",
    "TASK_EVENT_TYPES",
    "AccessRefused",
    "AgentDeregistered",
    "AgentRegistered",
    "ApprovalDenied",
    "ApprovalGranted",
    "ApprovalRequested",
    "BudgetLimit",
    "BudgetRefused",
    "Candidate",
    "ChildRunStarted",
    "ContextTrimmed",
    "Event",
    "InputProvided",
    "MemoryForgotten",
    "MemoryRead",
    "MemoryWritten",
    "ModelAnswered",
    "ModelQueued",
    "ModelRequested",
    "ModelSlotGranted",
    "NeedsInput",
    "OrchestratorStarted",
    "PlanAccepted",
    "PlanProposed",
    "PlanRefused",
    "PlanSubmitted",
    "PlanningLimits",
    "PlanningSpec",
    "ReplyRefused",
    "ResultOrigin",
    "RetryOverride",
    "ReviewIssue",
    "RevisionRequested",
    "RunCompleted",
    "RunFailed",
    "RunHalted",
    "RunPauseAnswered",
    "RunPaused",
    "RunResumed",
    "RunStarted",
    "ScheduleBuffered",
    "ScheduleCreated",
    "ScheduleDeleted",
    "ScheduleFired",
    "SchedulePaused",
    "ScheduleResumed",
    "ScheduleSkipped",
    "TaskCancelled",
    "TaskCompleted",
    "TaskCreated",
    "TaskDispatched",
    "TaskFailed",
    "TaskHalted",
    "TaskNeedsInput",
    "TaskOptions",
    "TaskRedelivered",
    "TaskRejected",
    "TaskResultIgnored",
    "TaskResultSubmitted",
    "TaskRetryScheduled",
    "TaskSpec",
    "TaskStarted",
    "TaskTimedOut",
    "ToolCalled",
    "ToolEffectUnknown",
    "ToolRequested",
    "ToolReviewAnswered",
    "QuestionAnswered",
    "ToolReviewRequested",
    "Usage",
    "WaitExpired",
    "WaitPolicy",
    "WaitStep",
    "tag_of",
]


class _Event(msgspec.Struct, frozen=True, kw_only=True, tag_field="type"):
    """Base of every event payload; the tag is written as ``data.type``."""


class Usage(msgspec.Struct, frozen=True, kw_only=True):
    input_tokens: int = 0
    output_tokens: int = 0
    model: str = ""  # the model that answered the attempt's last LLM call ("" for none)


class ReviewIssue(msgspec.Struct, frozen=True, kw_only=True):
    issue_type: str
    section: str
    severity: str  # "low" | "medium" | "high"
    suggestion: str


class ResultOrigin(msgspec.Struct, frozen=True, kw_only=True):
    """Where a task's result answered from long-term memory came from (``task.completed``'s
    ``reused``): the result a policy kept (``bus.orchestrator.reuse``) for the same
    capability and inputs; no agent was called."""

    key: str  # the memory key: "result/<capability>/<inputs digest>"
    scope: str  # the scope it was found in
    inputs_digest: str
    source_task_id: str | None = None  # the task that produced it
    source_root_id: str = ""  # and its run
    agent_id: str = ""  # the agent that produced it
    age_s: float = 0.0  # how old the result was when reused
    policy: str = ""  # the reuse policy that allowed it


class Candidate(msgspec.Struct, frozen=True, kw_only=True):
    """One agent considered by selection, with the parts of its hybrid score."""

    agent_id: str
    score: float
    similarity: float = 0.0
    success_rate: float = 0.0
    speed: float = 0.0
    recent_failures: float = 0.0  # the recent-failure penalty (0..1) subtracted from score


# --- task lifecycle -----------------------------------------------------------


class TaskCreated(_Event, TaskOptions, frozen=True, kw_only=True, tag="task.created.v1"):
    """A task entered the system: its spec and options (``taskspec``), and its place in a run.

    ``retry`` holds the plan task's own retry settings as given (None in logs
    written before it existed: the orchestrator's policy applies);
    ``max_attempts`` is the resolved attempt budget, the one the card shows.
    """

    root_id: str
    parent_id: str | None = None
    max_attempts: int = DEFAULT_MAX_ATTEMPTS
    budget_tokens: int | None = None
    plan_id: str | None = None
    forked_from: str | None = None  # event id this task's history was taken from
    role: str = ""  # "" for plan tasks, "review" or "supplement" for tasks the orchestrator adds
    # a re-run's task (``cardbus rerun``): the task of the recorded run whose calls answer
    # this one's first execution (the journal's *origin*); ``replay_strict``: a call the
    # origin did not make is refused (``replay_diverged``) instead of going live
    origin: str | None = None
    replay_strict: bool = False
    # a child-run task (``bus.orchestrator.children``): what it runs instead of a dispatch,
    # the plan's ``child`` as given (``{"plan": {...}} | {"goal": "..."}``, ``parent_close``)
    child: dict[str, Any] | None = None


#: the largest resolved inputs a ``task.dispatched`` keeps inline (bytes of JSON)
DISPATCH_INPUTS_INLINE = 16 * 1024


class TaskDispatched(_Event, frozen=True, kw_only=True, tag="task.dispatched.v1"):
    """An attempt was sent to an agent, with the selection scores and the loop hash."""

    attempt: int
    agent_id: str
    score: float = 0.0
    candidates: list[Candidate] = []
    # unix seconds after which the attempt times out if no agent took the card by then
    # (reason queue_timeout); with timeout_s 0 (logs from before it): the attempt's deadline
    deadline: float = 0.0
    # the attempt's limit from its start (task.started's recorded_at): start-to-close
    timeout_s: float = 0.0
    inputs_digest: str = ""  # sha256 of exactly what the agent was sent
    loop_hash: str = ""  # hash of (capability, normalized inputs): loop detection counts it
    # what the agent was sent ($dep resolved, context trimmed), kept inline when its JSON is
    # at most DISPATCH_INPUTS_INLINE bytes (else None: the digest and the size only)
    inputs: Any = None
    inputs_bytes: int = 0
    # deps whose output is absent: optional tasks that ended without completing; their
    # ``$dep`` placeholders were left out of the inputs sent (``bus.orchestrator.optional``)
    absent: list[str] = []
    # the orchestrator that sent the card (its orchestrator.started names its host and pid;
    # embedded, its own agents run the attempt); "" in logs from before it was recorded
    orchestrator_id: str = ""


class ChildRunStarted(_Event, frozen=True, kw_only=True, tag="task.child_started.v1"):
    """An attempt of a child-run task started its child run (``bus.orchestrator.children``):
    written with the child's ``run.started``, only if that was; the task is running until
    the child ends. ``deadline``: the attempt's limit (its ``timeout_s`` from now), past
    which the child is closed by its ``parent_close`` and the attempt times out."""

    attempt: int
    child_root: str
    deadline: float = 0.0
    parent_close: str = "terminate"


class TaskStarted(_Event, frozen=True, kw_only=True, tag="task.started.v1"):
    """The agent said it began the attempt (its ``Started`` reply, sent once the handler has run
    ``started_after_s``; a faster answer sends none); who ran it (``replica_id``, ``host``,
    ``pid``) and the card's ``delivery`` count.
    """

    attempt: int
    agent_id: str
    # True only in logs written before the orchestrator stopped recording an implied start
    # (a fast agent sends no Started; its result now stands for the start, README)
    implied: bool = False
    # who ran it: the worker process (replica) of the agent, and the card's delivery count
    replica_id: str = ""
    host: str = ""
    pid: int = 0
    delivery: int = 1


class TaskRedelivered(_Event, frozen=True, kw_only=True, tag="task.redelivered.v1"):
    """The card of ``attempt`` reached an agent again (delivery ``delivery`` > 1): the
    replica that had it died or gave it back, and the transport redelivered it."""

    attempt: int
    agent_id: str
    delivery: int
    replica_id: str = ""
    host: str = ""
    pid: int = 0


class TaskResultSubmitted(_Event, frozen=True, kw_only=True, tag="task.result_submitted.v1"):
    """A ResultCard arrived; the orchestrator decides what it means next."""

    attempt: int
    agent_id: str
    status: str  # "completed" | "failed" | "needs_input" | "rejected"
    output: Any = None
    confidence: float = 0.0
    needs_retry: bool = False
    notes: str = ""
    error: str | None = None
    usage: Usage = Usage()
    duration_s: float = 0.0
    replica_id: str = ""  # who ran it (see TaskStarted)
    host: str = ""
    pid: int = 0
    delivery: int = 1


class TaskResultIgnored(_Event, frozen=True, kw_only=True, tag="task.result_ignored.v1"):
    """A result for an attempt already settled (a second answer: ``duplicate``) or unknown
    (``stale_attempt``), or the answer of a handler the worker stopped because its task
    was cancelled or halted (``handler_cancelled``: it completed nothing); the very reply
    the log already records, delivered again, writes nothing (``repeats``)."""

    attempt: int
    agent_id: str
    reason: str  # "duplicate" | "stale_attempt" | "handler_cancelled"


class TaskRejected(_Event, frozen=True, kw_only=True, tag="task.rejected.v1"):
    """The agent refused the card (input_schema_mismatch, out_of_capability, over_constraint, …)."""

    attempt: int
    agent_id: str
    reason: str  # input_schema_mismatch | out_of_capability | over_constraint | ...
    detail: str = ""


class TaskNeedsInput(_Event, frozen=True, kw_only=True, tag="task.needs_input.v1"):
    """The agent needs more input; a supplementary task may provide it."""

    attempt: int
    agent_id: str
    missing: str
    supplementary_task_id: str | None = None


NeedsInput = TaskNeedsInput


class InputProvided(_Event, frozen=True, kw_only=True, tag="task.input_provided.v1"):
    """The missing input arrived; the task goes back to pending."""

    supplementary_task_id: str
    output: Any = None


class RevisionRequested(_Event, frozen=True, kw_only=True, tag="task.revision_requested.v1"):
    """A reviewer asked for changes, with structured review issues."""

    round: int
    reviewer_task_id: str
    issues: list[ReviewIssue] = []


class TaskRetryScheduled(_Event, frozen=True, kw_only=True, tag="task.retry_scheduled.v1"):
    """Another attempt will run after a delay, and why."""

    attempt: int  # the attempt that will run next
    delay_s: float
    reason: str
    not_before: float = 0.0


class TaskTimedOut(_Event, frozen=True, kw_only=True, tag="task.timed_out.v1"):
    """The attempt passed its deadline (``reason`` ``deadline``), or its agent went first
    (``agent_lost``: lease lapsed or deregistered; ``host_lost``: it ran in an embedded
    process that died or stopped, not the agent's fault).
    """

    attempt: int
    agent_id: str
    deadline: float
    # "deadline"; "queue_timeout": no agent took the card by the dispatch's deadline;
    # "agent_lost": its agent went (lease lapsed, deregistered, its card unsendable), so
    # the attempt was timed out at once; "host_lost": it died with the embedded process
    # that ran it (timed out at once, retried without spending an attempt: ``hostloss``)
    reason: str = "deadline"


class TaskCompleted(_Event, frozen=True, kw_only=True, tag="task.completed.v1"):
    """The task's final output was accepted."""

    attempt: int
    agent_id: str
    output: Any = None
    confidence: float = 0.0
    quality_met: bool = True
    open_issues: list[ReviewIssue] = []
    # event id of a forked-from completion, or of the memory.written a kept result is
    reused_from: str | None = None
    reused: ResultOrigin | None = None  # answered from long-term memory: where from


class TaskFailed(_Event, frozen=True, kw_only=True, tag="task.failed.v1"):
    """The task failed for good (attempts or budget spent, or an error)."""

    reason: str
    error: str = ""
    attempts: int = 0


class TaskCancelled(_Event, frozen=True, kw_only=True, tag="task.cancelled.v1"):
    """A task stopped before it completed: by the orchestrator (``reason``
    ``dependency_failed`` and the like, ``cause_task_id`` the dependency), or from
    outside. ``whole_run``: the whole run was cancelled (``cancel_run``), so an optional
    task cancelled so is not an absence the run completes without: the run fails."""

    reason: str
    cause_task_id: str | None = None
    whole_run: bool = False
    # what the person who cancelled it said besides the reason (a name they gave): the
    # envelope's actor is who they authenticated as
    note: str = ""


class TaskHalted(_Event, frozen=True, kw_only=True, tag="task.halted.v1"):
    """The task was stopped by a guard (loop detected, budget exceeded)."""

    reason: str  # loop_detected | budget_exceeded
    detail: str = ""


class ApprovalRequested(_Event, frozen=True, kw_only=True, tag="task.approval_requested.v1"):
    """The task waits for a human approval."""

    reason: str
    proposed_output: Any = None
    detail: str = ""  # what is to be decided (e.g. the tool call whose effect is unknown)


class ApprovalGranted(_Event, frozen=True, kw_only=True, tag="task.approval_granted.v1"):
    """Approval given; the task resumes in the state it names."""

    by: str
    resume: str = "pending"  # the state the task returns to
    note: str = ""


class ApprovalDenied(_Event, frozen=True, kw_only=True, tag="task.approval_denied.v1"):
    """Approval refused; the task is cancelled."""

    by: str
    note: str = ""


# --- runs, plans, agents ------------------------------------------------------


class PlanningLimits(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """What a planned plan may be (the planner's ``PlanLimits``, the same fields)."""

    capabilities: list[str] | None = None  # the capabilities a plan may use (None: all)
    final_capability: str | None = None  # the capability wanted at the end
    final_output: str | None = None  # or the output type wanted at the end (e.g. "Draft")
    max_tasks: int | None = None


class BudgetLimit(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """A cap on what a run, or a part of it (an agent, a role), may spend: USD and/or tokens."""

    usd: float | None = None
    tokens: int | None = None


class PlanningSpec(msgspec.Struct, frozen=True, kw_only=True):
    """How a run given only a goal is planned, resolved when it starts."""

    limits: PlanningLimits = PlanningLimits()
    max_plan_rounds: int = 3  # proposals per planning, the first included
    replan_on_failure: int = 0  # re-plannings allowed after tasks fail for good
    session_fields: list[str] = []  # the session fields the planner sees


class WaitStep(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """One step of a wait's policy, applied when its deadline passes (``bus.orchestrator.waits``).

    ``action``: ``escalate`` (only ``to`` and the members of ``group`` may answer from now
    on, within ``deadline_s``, default the policy's), ``deny``, ``approve`` (by rule) or
    ``fail`` (the task fails ``wait_expired``). ``note``: said with it, in the log.
    """

    action: str
    to: list[str] = []
    group: str = ""
    deadline_s: float | None = None
    note: str = ""


class WaitPolicy(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """How long a person's word may be waited for, and what happens then, step by step.

    ``deadline_s``: from the moment the wait begins; ``then``: the steps, one per expiry,
    in order (an escalation starts a new deadline; after the last step nothing more
    happens); ``to`` / ``group``: who may answer before any escalation (none: anyone);
    ``groups``: group name -> its members, for ``group`` here and in the steps.
    """

    deadline_s: float
    then: list[WaitStep] = []
    to: list[str] = []
    group: str = ""
    groups: dict[str, list[str]] = {}


class RunStarted(_Event, frozen=True, kw_only=True, tag="run.started.v1"):
    """A run of a plan began (goal, plan, task ids, budget; ``agents``: the run's agents, the only
    ones selection considers; ``agent_paths``: their import paths; ``rerun_of``, ``offline``: a
    re-run of that root).
    """

    goal: str
    plan_id: str
    task_ids: list[str] = []
    budget_tokens: int | None = None
    forked_from: str | None = None  # "<root_id>@<event_id>"
    session: dict[str, Any] = {}  # session memory: what the user asked
    # set when the plan was a goal alone: the tasks come from a planner (plan.* events)
    planning: PlanningSpec | None = None
    agents: list[str] = []  # the run's named agents: selection considers only them ([]: all)
    # the import paths ("module:Class") of the agents of the runtime that started it
    agent_paths: list[str] = []
    rerun_of: str | None = None  # the root id of the run this one re-runs (cardbus rerun)
    offline: bool = False  # a re-run answered from the log alone (every call replayed)
    # money budget of the whole run (USD), checked before each model call and dispatch
    budget_usd: float | None = None
    # caps of parts of the run: "agent:<id>", "role:<role>", "capability:<name>" -> limit
    budgets: dict[str, BudgetLimit] = {}
    on_budget: str = "fail"  # a refused call or dispatch: "fail" the task | ask for "approval"
    # whose long-term memory the run reads and writes (``projections.scope``): "" for none
    user: str = ""
    tenant: str = ""
    # what the person who started it said (a name they gave, why): words, not evidence;
    # the envelope's actor is who they authenticated as
    note: str = ""
    # admission and the model pacer serve a higher priority first (``Plan.priority``)
    priority: int = 0
    schedule: str = ""  # the schedule whose firing started it ("" for none)
    # a child run's lineage (``bus.orchestrator.children``): the parent run's root, the
    # parent task and attempt that started it, and what happens to it when the parent
    # ends ("terminate" | "request_cancel" | "abandon"); None: a run of its own
    parent_root: str | None = None
    parent_task: str | None = None
    parent_attempt: int | None = None
    parent_close: str = "terminate"
    # deadlines of a person's word, by the kind of wait ("approval", "review"):
    # ``bus.orchestrator.waits``
    waits: dict[str, WaitPolicy] = {}


class RunResumed(_Event, frozen=True, kw_only=True, tag="run.resumed.v1"):
    """An orchestrator that started found the run open and goes on with it (its
    ``orchestrator.started`` lists the run too): replay shows the restart here."""

    orchestrator_id: str
    host: str = ""
    pid: int = 0
    lost_attempts: list[str] = []  # "<task>#<attempt>" of this run timed out at once


class RunCompleted(_Event, frozen=True, kw_only=True, tag="run.completed.v1"):
    """Every task of the plan completed, or only ``optional`` ones did not.

    ``outputs``: each completed plan task's output, by plan task id. ``degraded``:
    the plan task ids of the optional tasks that ended without completing (failed,
    cancelled or halted; their outputs are absent): a run with any is a *degraded*
    completion, and ``detail`` says why each ended (``name: reason (error)``).
    """

    outputs: dict[str, Any] = {}
    degraded: list[str] = []
    detail: str = ""


class RunFailed(_Event, frozen=True, kw_only=True, tag="run.failed.v1"):
    """The run failed, naming the failed tasks (or ``plan_invalid``, ``planning_failed`` and
    why). ``cancelled``: it did not complete because it was cancelled (a whole-run
    ``task.cancelled`` left a task it needed undone): reason ``cancelled``, ``cancelled_by``
    who cancelled it; its status is ``cancelled``, not ``failed`` (older logs: False).
    """

    reason: str  # tasks_not_completed | plan_invalid | planning_failed | cancelled
    failed_tasks: list[str] = []
    detail: str = ""
    cancelled: bool = False
    cancelled_by: str = ""


class RunHalted(_Event, frozen=True, kw_only=True, tag="run.halted.v1"):
    """The run was stopped by a guard (loop, budget)."""

    reason: str  # loop_detected | budget_exceeded
    detail: str = ""


class PlanSubmitted(_Event, frozen=True, kw_only=True, tag="plan.submitted.v1"):
    """A plan was submitted for a root task."""

    plan_id: str
    root_id: str
    # sha256 of the plan body (its fields but plan_id, defaults left out): a later submit of
    # the same plan id must match it ("" in older logs: not checked)
    plan_digest: str = ""


class PlanProposed(_Event, frozen=True, kw_only=True, tag="plan.proposed.v1"):
    """A planner's proposal for a goal run (in the run's stream), before it is checked."""

    round: int  # 1, 2, ... in the run, re-plannings included
    planner_task_id: str
    agent_id: str = ""
    proposal: Any = None  # the planner's output, as it came (the plan format, or not)
    # the inputs whose values were taken from the goal's own words, not given by anyone:
    # plan task id -> input names (what the planner said so, and what the orchestrator found)
    from_goal: dict[str, list[str]] = {}


class PlanRefused(_Event, frozen=True, kw_only=True, tag="plan.refused.v1"):
    """The proposal of ``round`` failed the checks a hand-written plan must pass."""

    round: int
    errors: list[str]
    reason: str = "plan_invalid"


class PlanAccepted(_Event, frozen=True, kw_only=True, tag="plan.accepted.v1"):
    """The proposal of ``round`` passed; its tasks are created next, under these ids."""

    round: int
    task_ids: dict[str, str]  # plan task id -> task id, in the plan's order
    superseded: list[str] = []  # a re-planning: the unfinished tasks the new ones replace


class AgentRegistered(_Event, frozen=True, kw_only=True, tag="agent.registered.v1"):
    """An agent joined, with its AgentCard and ``lease_s`` (0: registered by the operator)."""

    agent_id: str
    card: dict[str, Any]  # the AgentCard as JSON
    # the lease its workers renew (every lease_s / 3, in memory, never logged); 0: registered
    # by the operator, live while the orchestrator that registered it runs
    lease_s: float = 0.0


class AgentDeregistered(_Event, frozen=True, kw_only=True, tag="agent.deregistered.v1"):
    """An agent left: ``reason`` ``stopped`` (its last worker stopped) or ``lease_expired`` (no
    renewal came in time).
    """

    agent_id: str
    reason: str = ""  # "stopped" (its workers left) | "lease_expired" (no renewal came)


class OrchestratorStarted(_Event, frozen=True, kw_only=True, tag="orchestrator.started.v1"):
    """An orchestrator started (stream ``orchestrator-<id>``): the runs it resumed."""

    orchestrator_id: str
    resumed: list[str] = []  # root ids of the open runs it found in the log
    host: str = ""
    pid: int = 0
    lost_attempts: list[str] = []  # "<task>#<attempt>" timed out at once (embedded resume)


# --- memory, tools and access (issue 7) ---------------------------------------


class MemoryWritten(_Event, frozen=True, kw_only=True, tag="memory.written.v1"):
    """A long-term memory record (stream ``memory``); a later write of a key replaces it."""

    key: str
    value: Any
    text: str = ""  # what semantic search embeds
    tags: list[str] = []
    source_task_id: str | None = None
    kind: str = "record"  # "record" | "preference" | "failure"
    root_id: str = ""  # the run it came from ("" for an explicit write)
    policy: str = ""  # the write policy that marked it reusable
    # whose it is (``projections.scope``): "global", "tenant:<t>", "user:<u>" or
    # "tenant:<t>/user:<u>"; "" (every record written before scopes) reads as global
    scope: str = ""
    agent_id: str = ""  # the agent that wrote it through a request ("" for a policy's)


class MemoryForgotten(_Event, frozen=True, kw_only=True, tag="memory.forgotten.v1"):
    """A memory record was removed."""

    key: str
    reason: str = ""
    scope: str = ""  # the scope of the record forgotten ("": global)


class MemoryRead(_Event, frozen=True, kw_only=True, tag="memory.read.v1"):
    """An agent read memory through the orchestrator (on the reading task's stream)."""

    task_id: str
    query: str
    keys: list[str] = []  # what was returned: memory keys, or the task ids read
    agent_id: str = ""
    attempt: int = 0
    mode: str = "search"  # "get" | "list" | "search" (long-term) | "output" (task memory)
    duration_s: float = 0.0
    scopes: list[str] = []  # the scopes the read looked in, most specific first


class ToolRequested(_Event, frozen=True, kw_only=True, tag="tool.requested.v1"):
    """A tool call about to run: logged before its side effect (invariant 2), so a crash
    between the two shows as a ``tool.requested`` without its ``tool.called``."""

    task_id: str
    agent_id: str
    tool: str
    request_id: str
    arguments: Any = None  # per AccessPolicy.arguments, as in tool.called
    arguments_digest: str = ""
    attempt: int = 0
    # the journal's coordinates (``model.requested`` has the same): the handler run and the
    # call's place in it; ``idempotency_key`` is this event's id, or on a call made again
    # after its effect was unknown the key of the call it repeats
    execution: str = ""
    seq: int = -1
    idempotency_key: str = ""
    local: bool = False  # run by the agent itself (``ctx.journal.tool_call``), not a registry


class ToolCalled(_Event, frozen=True, kw_only=True, tag="tool.called.v1"):
    """An agent called a tool, with arguments, result or error and duration; ``replayed_from`` names
    the call a retry was answered from. ``recorded_by`` names the operator who recorded a
    call whose effect was unknown as done (``cardbus approve TASK --done``): the result is
    theirs, the tool did not run, and the event's actor is theirs too.
    """

    task_id: str
    agent_id: str
    tool: str
    arguments: Any = None
    result: Any = None
    error: str | None = None
    duration_s: float = 0.0
    attempt: int = 0
    error_type: str | None = None  # timeout | result_too_large | invalid_input | tool_error
    arguments_digest: str = ""  # sha256 of the arguments (always; ``arguments`` per policy)
    result_digest: str = ""
    result_bytes: int = 0
    request_id: str = ""  # of the tool.requested it answers ("" in logs before it existed)
    execution: str = ""
    seq: int = -1
    idempotency_key: str = ""
    #: set on a call answered from the journal: the ``tool.called`` whose result (or error)
    #: this is; the tool did not run again
    local: bool = False
    replayed_from: str | None = None
    #: set when an operator recorded the call as done (its effect unknown after a crash, or
    #: met again after a first difference): who said so; the tool did not run. The result
    #: is the operator's (given or confirmed) and later attempts replay it. "": the tool ran
    recorded_by: str = ""


# --- inside an attempt: the journal of model and tool calls --------------------


class ModelRequested(_Event, frozen=True, kw_only=True, tag="model.requested.v1"):
    """A model call about to go out (made through ``ctx.llm``), on the task's stream.

    ``request`` is what was asked (``op``, ``model``, ``messages`` or ``prompt``,
    ``response_format``, ``tools``) as the journal policy keeps it: whole, redacted,
    or None with only its digest and size. ``request_digest`` is over the request as
    asked, so a retry that asks the same thing is answered from the journal.
    """

    task_id: str
    agent_id: str
    attempt: int = 0
    execution: str = ""
    seq: int = 0
    model: str = ""
    request: Any = None
    request_digest: str = ""
    request_bytes: int = 0
    tools_offered: list[str] = []
    # what the call may spend, held against the run's budgets until it is answered: its
    # input estimated from the request's size plus its max_tokens (bus.orchestrator.budget)
    reserved_tokens: int = 0
    reserved_usd: float | None = None  # None: no price known for the model
    # the output bound the call was sent with (the reservation's output part: what the
    # run's tightest cap leaves, or less); None: the run has no budget, nothing bounds it
    max_tokens: int | None = None
    # ``gen_ai.provider.name`` of the client that makes the call (``openai``, a local
    # endpoint's host, ``cardbus.mock``); "" when the client did not say (older events)
    provider: str = ""


class ModelAnswered(_Event, frozen=True, kw_only=True, tag="model.answered.v1"):
    """A model call's answer (or typed error), durable before the handler sees it.

    ``answer`` is the completion (``text``, ``tool_calls``, tokens, ``model``) as the
    policy keeps it. A call answered from the journal names the ``model.answered`` it
    replays (``replayed_from``), has no ``answer`` of its own and costs nothing: its
    tokens are 0 (the original's were counted once, where they were spent).
    """

    task_id: str
    agent_id: str
    attempt: int = 0
    execution: str = ""
    seq: int = 0
    request_digest: str = ""
    model: str = ""  # the model that answered
    answer: Any = None
    answer_digest: str = ""
    answer_bytes: int = 0
    input_tokens: int = 0
    output_tokens: int = 0
    latency_s: float = 0.0
    error: str | None = None
    error_type: str | None = None
    replayed_from: str | None = None
    cost_usd: float | None = None  # as the orchestrator priced it (None: unknown or replayed)
    # ``answer`` is what the access policy's redact hook returned (``answer_digest`` is
    # over the answer as given): a replay checks the event's hash, not that digest
    redacted: bool = False
    # output tokens past the ``max_tokens`` the call was sent with (its budget's bound): an
    # endpoint that ignored it; the tokens are counted all the same (bus.orchestrator.budget)
    overrun_tokens: int = 0
    # of ``latency_s``, the seconds the call waited for the provider's limit before it was
    # sent (queued by the pacer, not running: ``cardbus.agents.pacing``)
    queued_s: float = 0.0


class ModelQueued(_Event, frozen=True, kw_only=True, tag="model.queued.v1"):
    """A model call waits for its provider's limit before it is sent (``limit``: the
    endpoint and model whose pace it waits for; ``cardbus.agents.pacing``): queued, not
    running. The attempt's run time (``timeout_s``) stops until ``model.slot_granted``;
    the wait is bounded by ``max_wait_s`` (then the call fails: ``llm_rate_limited``)."""

    task_id: str
    agent_id: str
    attempt: int = 0
    execution: str = ""
    seq: int = 0
    model: str = ""
    limit: str = ""
    max_wait_s: float = 0.0


class ModelSlotGranted(_Event, frozen=True, kw_only=True, tag="model.slot_granted.v1"):
    """The queued model call got its slot after ``waited_s`` and is sent now: the
    attempt's run time goes on from where ``model.queued`` stopped it."""

    task_id: str
    agent_id: str
    attempt: int = 0
    execution: str = ""
    seq: int = 0
    waited_s: float = 0.0


class ToolEffectUnknown(_Event, frozen=True, kw_only=True, tag="tool.effect_unknown.v1"):
    """A journaled tool call with a ``tool.requested`` and no result: the process died
    during the call, and whether its effect happened is unknown.

    ``decision``: ``repeat`` (the tool is idempotent, or an operator approved: called
    again with the same ``idempotency_key``) or ``ask`` (the task stops and waits for
    an operator's word on the call; it is never repeated silently).

    ``reason``: ``no_result`` (the call has no result in the log: the process died
    during it) or ``after_difference`` (an attempt that went live after a first
    difference asks for a call an earlier attempt recorded, the same tool with the same
    arguments: it reuses that call's key).
    """

    task_id: str
    agent_id: str
    tool: str
    requested_event_id: str
    idempotency_key: str
    attempt: int = 0
    execution: str = ""
    seq: int = 0
    decision: str = "ask"
    reason: str = "no_result"


class ToolReviewRequested(_Event, frozen=True, kw_only=True, tag="tool.review_requested.v1"):
    """A tool call the model proposed waits for a person's word before it runs: the
    tool's review policy (``Tool.review``) asked for it. Written before any effect; the
    attempt ends (reason ``tool_review``) and the task waits in ``awaiting_approval``.

    ``call`` names the review (this event's own id is not known before it is written:
    the digest of the tool and the proposed arguments); ``arguments`` as the model
    proposed them; ``schema`` the tool's input schema (an edit is checked against it);
    ``text`` the model's words in the turn that proposed the call.
    """

    task_id: str
    agent_id: str
    tool: str
    call: str
    arguments: Any = None
    schema: dict[str, Any] = {}
    text: str = ""
    attempt: int = 0
    execution: str = ""
    seq: int = 0


class ToolReviewAnswered(_Event, frozen=True, kw_only=True, tag="tool.review_answered.v1"):
    """A person's word on a tool call under review (``call``: its review's ``call``).

    ``decision``: ``approve`` (runs as proposed), ``edit`` (runs with ``arguments``,
    checked against the tool's schema) or ``refuse`` (does not run; the model gets
    ``reason`` as the tool's answer). ``by`` is the person (the authenticated actor).
    """

    task_id: str
    tool: str
    call: str
    decision: str
    by: str
    proposed: Any = None
    arguments: Any = None
    reason: str = ""


class QuestionAnswered(_Event, frozen=True, kw_only=True, tag="question.answered.v1"):
    """A person's answer to a question an agent asked (``AskPerson``), on the question's
    own task, just before the ``task.completed`` whose output it is.

    ``answer`` as given, validated against the question's schema (an answer that does not
    validate is refused and writes nothing); ``by`` the person (the authenticated actor);
    ``door`` where it came from (``console``, ``cli``, ``a2a``, ``api``); ``message_id``
    the A2A message that carried it (a resent message answers nothing twice).
    """

    task_id: str
    answer: Any = None
    by: str = ""
    door: str = ""
    message_id: str = ""
    defaulted: bool = False  # no answer given: the question's default


class WaitExpired(_Event, frozen=True, kw_only=True, tag="task.wait_expired.v1"):
    """A wait for a person's word passed its deadline, and a step of its policy applied
    (``bus.orchestrator.waits``): ``kind`` (``approval``, ``review``, ``question``),
    ``step`` (1-based, in the policy's ``then``), ``action`` (``escalate``, ``deny``,
    ``approve``, ``fail``), ``deadline`` (the moment that passed). An escalation names
    who alone may answer now (``approvers``, ``group``) and by when (``next_deadline``);
    the other actions are followed, in the same write, by the events that carry them
    out."""

    kind: str
    step: int
    action: str
    deadline: float
    approvers: list[str] = []
    group: str = ""
    next_deadline: float | None = None
    note: str = ""


class RunPaused(_Event, frozen=True, kw_only=True, tag="run.paused.v1"):
    """The run waits for a person instead of halting (``Policy.on_loop="pause"``): the
    evidence of the loop: ``task_id`` would have been dispatched with ``capability`` and
    ``inputs`` (loop hash ``loop_hash``) on ``count`` tasks, ``tasks`` those already sent.
    Nothing more is dispatched until a ``run.pause_answered``."""

    reason: str  # loop_detected
    task_id: str
    detail: str = ""
    capability: str = ""
    loop_hash: str = ""
    count: int = 0
    inputs: Any = None
    tasks: list[str] = []


class RunPauseAnswered(_Event, frozen=True, kw_only=True, tag="run.pause_answered.v1"):
    """A person's word on a paused run: ``resume`` (the paused task goes on, with
    ``inputs`` merged over its own when given) or ``stop`` (the run halts). ``by`` is
    the person (the envelope's actor)."""

    decision: str  # resume | stop
    by: str
    task_id: str = ""
    note: str = ""
    inputs: dict[str, Any] | None = None


class AccessRefused(_Event, frozen=True, kw_only=True, tag="access.refused.v1"):
    """An agent asked for something outside its card and was refused."""

    task_id: str
    agent_id: str
    action: str
    target: str
    reason: str
    attempt: int = 0


class ReplyRefused(_Event, frozen=True, kw_only=True, tag="reply.refused.v1"):
    """A reply, announcement or request refused for who sent it: never acted on.

    On the task's stream when the task is known, else on ``agent-<sender>``.
    ``kind``: result | started | announce | request. ``sender`` is the agent the
    transport knows sent it (NATS: the subject its user may publish on; ""
    when it cannot tell); ``claimed_agent_id`` the one the message names.
    """

    kind: str
    claimed_agent_id: str
    sender: str
    reason: str
    task_id: str = ""
    attempt: int = 0
    subject: str = ""


class ContextTrimmed(_Event, frozen=True, kw_only=True, tag="context.trimmed.v1"):
    """A task's context was cut to fit, and by which policy."""

    task_id: str
    policy: str
    original_bytes: int
    final_bytes: int
    limit_bytes: int = 0
    attempt: int = 0
    fields: list[str] = []  # input fields that were cut


class BudgetRefused(_Event, frozen=True, kw_only=True, tag="budget.refused.v1"):
    """A model call or a dispatch refused before it happened: it would cross a budget.

    On the task's stream. ``action``: ``model_call`` (the call was never sent; the
    agent got the typed error ``budget_exceeded``) or ``dispatch`` (the task was not
    sent). ``scope``: the budget crossed (``run``, ``agent:<id>``, ``role:<role>``,
    ``capability:<name>``); ``spent_*``: what the scope had spent and held for calls
    in flight; ``estimate_*``: what this call may cost; ``cap_*``: the limit.
    ``decision``: what follows (``fail``, ``approval``, ``halt``).
    """

    task_id: str
    agent_id: str = ""
    attempt: int = 0
    action: str = "model_call"
    scope: str = "run"
    reason: str = ""
    model: str = ""
    execution: str = ""
    seq: int = -1
    spent_tokens: int = 0
    spent_usd: float = 0.0
    estimate_tokens: int = 0
    estimate_usd: float | None = None
    cap_tokens: int | None = None
    cap_usd: float | None = None
    decision: str = "fail"


class ScheduleCreated(_Event, frozen=True, kw_only=True, tag="schedule.created.v1"):
    """A schedule: when it fires (``cron``, a 5-field expression read in ``timezone``, or
    ``interval_seconds`` counted from ``start``, epoch seconds), what each firing runs
    (``plan``: a plan's JSON form; its goal alone if it has no tasks), and how it meets an
    overlap (``overlap``: ``skip`` | ``buffer_one`` | ``allow_all``) and downtime
    (``catchup``: ``none`` | ``one`` | ``all`` of the firings missed within
    ``catchup_window_seconds``). ``jitter_seconds``: each firing waits a fixed pseudo-random
    part of it (the same on every member)."""

    schedule_id: str
    plan: dict[str, Any]
    cron: str = ""
    interval_seconds: float = 0.0
    start: float = 0.0
    timezone: str = "UTC"
    overlap: str = "skip"
    catchup: str = "one"
    catchup_window_seconds: float = 3600.0
    jitter_seconds: float = 0.0


class SchedulePaused(_Event, frozen=True, kw_only=True, tag="schedule.paused.v1"):
    """The schedule fires no more until resumed (due times meanwhile are missed ones)."""

    reason: str = ""


class ScheduleResumed(_Event, frozen=True, kw_only=True, tag="schedule.resumed.v1"):
    """The schedule fires again; due times while it was paused are not caught up."""


class ScheduleDeleted(_Event, frozen=True, kw_only=True, tag="schedule.deleted.v1"):
    """The schedule is gone: it never fires again."""


class ScheduleFired(_Event, frozen=True, kw_only=True, tag="schedule.fired.v1"):
    """One firing of the schedule for the due time ``due`` (epoch seconds), the run of
    plan id ``plan_id``. Written with the schedule stream's expected version: of the
    members that find it due, the first writer wins. ``late``: a missed due time caught
    up (or one buffered behind a running run); ``manual``: triggered by hand."""

    due: float
    plan_id: str
    late: bool = False
    manual: bool = False
    member: str = ""


class ScheduleSkipped(_Event, frozen=True, kw_only=True, tag="schedule.skipped.v1"):
    """The due time ``due`` does not fire, and why (``overlap``: the run of ``plan_id`` was
    still running; ``missed``: downtime beyond the catch-up policy or window; ``refused``:
    it fired, and its run ``plan_id`` was refused, ``detail`` saying why)."""

    due: float
    reason: str
    detail: str = ""
    plan_id: str = ""


class ScheduleBuffered(_Event, frozen=True, kw_only=True, tag="schedule.buffered.v1"):
    """The due time ``due`` fires once the running run of ``plan_id`` ends (overlap
    ``buffer_one``)."""

    due: float
    plan_id: str = ""


EVENT_TYPES: tuple[type[_Event], ...] = (
    TaskCreated,
    TaskDispatched,
    ChildRunStarted,
    TaskStarted,
    TaskRedelivered,
    TaskResultSubmitted,
    TaskResultIgnored,
    TaskRejected,
    TaskNeedsInput,
    InputProvided,
    RevisionRequested,
    TaskRetryScheduled,
    TaskTimedOut,
    TaskCompleted,
    TaskFailed,
    TaskCancelled,
    TaskHalted,
    ApprovalRequested,
    ApprovalGranted,
    ApprovalDenied,
    RunStarted,
    RunResumed,
    RunCompleted,
    RunFailed,
    RunHalted,
    PlanSubmitted,
    PlanProposed,
    PlanRefused,
    PlanAccepted,
    AgentRegistered,
    AgentDeregistered,
    OrchestratorStarted,
    MemoryWritten,
    MemoryForgotten,
    MemoryRead,
    ToolRequested,
    ToolCalled,
    AccessRefused,
    ContextTrimmed,
    ReplyRefused,
    ModelRequested,
    ModelAnswered,
    ToolEffectUnknown,
    BudgetRefused,
    ModelQueued,
    ModelSlotGranted,
    ScheduleBuffered,
    ScheduleCreated,
    ScheduleDeleted,
    ScheduleFired,
    SchedulePaused,
    ScheduleResumed,
    ScheduleSkipped,
    ToolReviewRequested,
    ToolReviewAnswered,
    QuestionAnswered,
    WaitExpired,
    RunPaused,
    RunPauseAnswered,
)

TASK_EVENT_TYPES: tuple[type[_Event], ...] = tuple(
    t for t in EVENT_TYPES if str(t.__struct_config__.tag).startswith("task.")
)

Event = (
    TaskCreated
    | TaskDispatched
    | ChildRunStarted
    | TaskStarted
    | TaskRedelivered
    | TaskResultSubmitted
    | TaskResultIgnored
    | TaskRejected
    | TaskNeedsInput
    | InputProvided
    | RevisionRequested
    | TaskRetryScheduled
    | TaskTimedOut
    | TaskCompleted
    | TaskFailed
    | TaskCancelled
    | TaskHalted
    | ApprovalRequested
    | ApprovalGranted
    | ApprovalDenied
    | RunStarted
    | RunResumed
    | RunCompleted
    | RunFailed
    | RunHalted
    | PlanSubmitted
    | PlanProposed
    | PlanRefused
    | PlanAccepted
    | AgentRegistered
    | AgentDeregistered
    | OrchestratorStarted
    | MemoryWritten
    | MemoryForgotten
    | MemoryRead
    | ToolRequested
    | ToolCalled
    | AccessRefused
    | ContextTrimmed
    | ReplyRefused
    | ModelRequested
    | ModelAnswered
    | ToolEffectUnknown
    | BudgetRefused
    | ModelQueued
    | ModelSlotGranted
    | ScheduleBuffered
    | ScheduleCreated
    | ScheduleDeleted
    | ScheduleFired
    | SchedulePaused
    | ScheduleResumed
    | ScheduleSkipped
    | ToolReviewRequested
    | ToolReviewAnswered
    | QuestionAnswered
    | WaitExpired
    | RunPaused
    | RunPauseAnswered
)


def tag_of(event: _Event | type[_Event]) -> str:
    """The stable type tag of an event or event class, e.g. ``task.created.v1``."""
    return str(event.__struct_config__.tag)
