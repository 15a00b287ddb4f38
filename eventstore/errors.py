"""The one exception tree of cardbus: every class it raises is defined here.

Every error the library raises on purpose is a ``CardbusError``; backend
errors (sqlite3, nats, msgspec, httpx) are translated at the boundary with
``raise ... from e`` so callers never have to catch a third-party type.
Errors of misuse (a wrong argument or setting) also derive from the builtin
they resemble, so ``except ValueError`` keeps working::

    CardbusError
    ├── ConfigError(ValueError)   a setting or argument outside its allowed values
    │   └── PortInUse             a port to listen on is taken by another process
    ├── MissingExtra(ImportError) an optional extra is not installed (``cardbus[mcp]``, ...)
    ├── DecodeError               bytes that are not a valid event, card or plan
    │   ├── UnknownEventType      a well-formed envelope whose type tag we do not know
    │   └── PayloadTooLarge       over the configured size limit
    ├── StoreError                the event store could not do what was asked
    │   ├── ConcurrencyError      expected version != actual version of the stream
    │   ├── IdempotencyError      an event id re-used for different content
    │   ├── StreamNotFound        reading a stream that has no events
    │   │   └── IdNotFound        no task or run id matches what a user typed
    │   ├── StoreUnavailable      the backend (file, server) cannot be reached
    │   │   └── StoreClosed       closed by its owner: it will not be reachable again
    │   ├── PrerequisiteNotStored an append_many part whose ``after`` was not stored
    │   └── SubjectLayoutError    a JetStream stream written in another subject layout
    ├── IllegalTransition         the task state machine refuses (state, event)
    ├── ValidationError           a card, plan or agent output breaks its schema
    │   ├── InvalidPlan           a plan refused before anything runs
    │   │   └── PlanConflict      a plan id reused with a different plan body
    │   ├── InvalidSchedule       a schedule refused (cron, interval, time zone, policy)
    │   ├── InvalidScope          a memory scope or key that is not well formed
    │   └── AmbiguousId           an id prefix that matches more than one task or run
    ├── BusError                  the bus could not deliver or receive
    ├── NotStarted(RuntimeError)  a runtime used before ``async with`` started it
    ├── AccessDenied              an agent asked for something outside its card
    │   └── NotAnApprover         a person answered a wait escalated to others
    ├── EffectUnknown             a journaled tool call may have taken effect before a crash
    │   └── ToolUnderReview       a proposed tool call waits for a person's review
    ├── ReplayDiverged            a strict re-run asked what the recorded run did not ask
    ├── JournalTampered           a recorded call the log cannot vouch for (hash or digest)
    ├── LLMError                  the model endpoint failed or answered something unusable
    │   ├── LLMRateLimited        429: the endpoint asks to slow down (``retry_after`` seconds)
    │   ├── LLMTimeout            no answer within the client's timeout
    │   ├── LLMServerError        5xx, or the endpoint cannot be reached
    │   ├── LLMRequestRefused     4xx: the request was refused (bad request, key, model)
    │   ├── LLMBadOutput          an answer that is not usable (no JSON, wrong schema)
    │   └── LLMLimitExceeded      a task's conversation went past one of its agent's limits
    │       ├── LLMMaxTurns       more model turns than ``max_turns``
    │       ├── LLMMaxToolCalls   more tool calls than ``max_tool_calls``
    │       └── LLMTokenLimit     more tokens than ``max_tokens_per_task``
    │   └── BudgetExceeded        the call would cross a run's budget: refused before it was sent
    └── ToolError                 a tool call did not produce a usable result
        ├── ToolNotFound          no tool of that name is registered
        ├── ToolInputInvalid      the arguments break the tool's input schema
        ├── ToolTimeout           the tool did not answer in time
        ├── ToolResultTooLarge    the result is over the tool's size limit
        └── ToolFailed            the tool raised

Not errors, and so outside the tree: ``cardbus.agents.Reject`` and
``cardbus.agents.NeedsInput`` are signals an agent's handler raises to say
"not mine" or "ask the user" (``cardbus.agents.AskPerson``: a ``NeedsInput`` that asks
a person a typed question); the worker turns them into result cards.
Private classes (a leading underscore) are control flow inside one module
and never reach a caller.
"""

from __future__ import annotations

__all__ = [
    "AccessDenied",
    "AmbiguousId",
    "BudgetExceeded",
    "ConfigError",
    "EffectUnknown",
    "ToolUnderReview",
    "ReplayDiverged",
    "JournalTampered",
    "LLMBadOutput",
    "LLMError",
    "LLMLimitExceeded",
    "LLMMaxToolCalls",
    "LLMMaxTurns",
    "LLMRateLimited",
    "LLMRequestRefused",
    "LLMServerError",
    "LLMTimeout",
    "LLMTokenLimit",
    "IdNotFound",
    "MissingExtra",
    "PortInUse",
    "SubjectLayoutError",
    "ToolError",
    "ToolFailed",
    "ToolInputInvalid",
    "ToolNotFound",
    "ToolResultTooLarge",
    "ToolTimeout",
    "BusError",
    "CardbusError",
    "NotAnApprover",
    "NotStarted",
    "ConcurrencyError",
    "DecodeError",
    "IdempotencyError",
    "IllegalTransition",
    "InvalidPlan",
    "InvalidSchedule",
    "InvalidScope",
    "PayloadTooLarge",
    "PlanConflict",
    "PrerequisiteNotStored",
    "StoreError",
    "StoreClosed",
    "StoreUnavailable",
    "StreamNotFound",
    "UnknownEventType",
    "ValidationError",
]


class CardbusError(Exception):
    """Root of every error cardbus raises on purpose."""


class ConfigError(CardbusError, ValueError):
    """A setting or argument outside its allowed values; the message names them."""


class PortInUse(ConfigError):
    """A port to listen on is taken (``EADDRINUSE``); ``host`` and ``port`` name it."""

    def __init__(self, host: str, port: int, option: str = "--port") -> None:
        super().__init__(f"port {port} is in use on {host}: pass {option} with another port")
        self.host = host
        self.port = port


class MissingExtra(CardbusError, ImportError):
    """An optional extra is not installed; ``extra`` is its name (``mcp``, ``a2a``, ...).

    Also an ``ImportError``, so code that probes an optional import with
    ``except ImportError`` keeps working.
    """

    def __init__(self, extra: str, needed_for: str = "") -> None:
        why = f" ({needed_for})" if needed_for else ""
        super().__init__(f"cardbus[{extra}] is not installed{why}: pip install 'cardbus[{extra}]'")
        self.extra = extra


class DecodeError(CardbusError):
    """Input bytes are not a valid cardbus object."""


class UnknownEventType(DecodeError):
    def __init__(self, tag: str) -> None:
        super().__init__(f"unknown event type {tag!r}")
        self.tag = tag


class PayloadTooLarge(DecodeError):
    def __init__(self, size: int, limit: int) -> None:
        super().__init__(f"payload of {size} bytes is over the limit of {limit} bytes")
        self.size = size
        self.limit = limit


class StoreError(CardbusError):
    """The event store could not do what was asked."""


class ConcurrencyError(StoreError):
    """An append's expected version did not match the stream's actual version."""

    def __init__(self, stream: str, expected: int, actual: int) -> None:
        super().__init__(f"stream {stream!r}: expected version {expected}, actual version {actual}")
        self.stream = stream
        self.expected = expected
        self.actual = actual


class IdempotencyError(StoreError):
    """An event id that is already stored was sent again with different content."""


class StreamNotFound(StoreError):
    def __init__(self, stream: str) -> None:
        super().__init__(f"no events for {stream!r}")
        self.stream = stream


class IdNotFound(StreamNotFound):
    """No task or run id (whole, prefix, end or plan id) matches ``text``."""

    def __init__(self, text: str) -> None:
        super().__init__(text)
        self.args = (f"no task or run matches {text!r}",)


class StoreUnavailable(StoreError):
    """The backend cannot be reached (missing file, server down)."""


class StoreClosed(StoreUnavailable):
    """The store (or its NATS connection) was closed: unlike a server that is down, it
    will not come back, so waiting to try again is pointless."""


class PrerequisiteNotStored(StoreError):
    """Not attempted: an append it was to follow (``Append.after``) was not stored."""


class SubjectLayoutError(StoreError):
    """The JetStream stream holds events in another subject layout than this version's
    (``<prefix>.<task>.<root>.<kind>``): reading it would misread, so the store refuses it."""


class IllegalTransition(CardbusError):
    """The task state machine refuses an event in the current state."""

    def __init__(self, state: str, event_type: str) -> None:
        super().__init__(f"event {event_type!r} is not allowed in state {state!r}")
        self.state = state
        self.event_type = event_type


class ValidationError(CardbusError):
    """A card, plan or agent output does not match its schema."""


class InvalidPlan(ValidationError):
    """A plan refused before anything runs; the message names the problem."""


class InvalidSchedule(ValidationError):
    """A schedule refused before it is written (its cron expression, interval, time zone or
    a policy); the message names the problem."""


class PlanConflict(InvalidPlan):
    """A plan id submitted again with another plan body: the id names one plan for good.

    ``plan_id`` is the id, ``root_id`` the run it already started. The same
    body resumes (or returns) that run; to run the edited plan, give it a new
    ``plan_id`` or leave ``plan_id`` out.
    """

    def __init__(self, plan_id: str, root_id: str) -> None:
        super().__init__(
            f"plan id {plan_id!r} already names another plan (run {root_id}): the same plan"
            " body resumes that run; to run this one, give it a new plan_id or leave plan_id out"
        )
        self.plan_id = plan_id
        self.root_id = root_id


class InvalidScope(ValidationError):
    """A long-term memory scope (``global``, ``tenant:<id>``, ``user:<id>``,
    ``tenant:<id>/user:<id>``), user or tenant id, or memory key that is not well formed;
    the message names what was given and the form wanted."""


class AmbiguousId(ValidationError):
    """An id prefix that matches several tasks or runs; ``candidates`` are their full ids."""

    def __init__(self, text: str, candidates: list[str]) -> None:
        shown = ", ".join(candidates[:10])
        more = f" and {len(candidates) - 10} more" if len(candidates) > 10 else ""
        super().__init__(
            f"{text!r} matches {len(candidates)} ids: {shown}{more} (give more characters)"
        )
        self.text = text
        self.candidates = candidates


class BusError(CardbusError):
    """The bus could not deliver or receive a card."""


class NotStarted(CardbusError, RuntimeError):
    """A runtime (``EmbeddedRuntime``, ``NatsRuntime``) used before it was started.

    The runtime starts its store, bus, workers and orchestrator in ``async with``
    (``__aenter__``) and stops them on the way out; ``run`` and ``submit``
    outside it raise this, naming the runtime.
    """


class AccessDenied(CardbusError):
    """An agent asked for data or a tool outside what its card allows."""


class NotAnApprover(AccessDenied):
    """A person answered a wait (an approval, a review, a question) that its deadline
    escalated to others: only the approvers it names may answer now
    (``bus.orchestrator.waits``)."""

    def __init__(self, task_id: str, by: str, approvers: list[str]) -> None:
        self.task_id, self.by, self.approvers = task_id, by, list(approvers)
        super().__init__(
            f"{by!r} may not answer {task_id}: it waits for {', '.join(approvers) or 'no one'}"
        )


class EffectUnknown(CardbusError):
    """A retried attempt reached a tool call whose effect is unknown (the process died
    during it) and the tool is not idempotent: it is not repeated silently.

    Not a ``ToolError``, so a tool-calling loop that hands tool errors back to the model
    does not swallow it: the attempt ends (reason ``tool_effect_unknown``) and the task
    waits for an operator's approval to repeat the call.
    """

    error_type = "effect_unknown"


class ToolUnderReview(EffectUnknown):
    """A tool call the model proposed waits for a person's review (the tool's review
    policy): it did not run. Like ``EffectUnknown`` no tool-calling loop swallows it: the
    attempt ends (reason ``tool_review``) and the task waits in ``awaiting_approval``;
    the next attempt, after the person's word, runs it, runs it edited, or answers the
    model with the refusal.
    """

    error_type = "tool_review"


class ReplayDiverged(CardbusError):
    """An offline re-run (``cardbus rerun --offline``) reached a model or tool call that
    the recorded run did not make: another request at that place, or a call past the
    recorded ones. The message names the task and the call and shows the difference.

    Not a ``ToolError`` or an ``LLMError``, so no loop swallows it: the attempt ends
    (reason ``replay_diverged``) and the task fails without a retry.
    """

    error_type = "replay_diverged"


class JournalTampered(CardbusError):
    """A later attempt reached a recorded model answer or tool result that the log cannot
    vouch for: its event's hash does not match its content, the task's chain is broken,
    or the content does not match its digest. Nothing is replayed from it.

    The orchestrator has failed the task already (reason ``journal_tampered``, the error
    naming the stream and position); like ``ReplayDiverged`` no loop swallows it.
    """

    error_type = "journal_tampered"


class LLMError(CardbusError):
    """The model endpoint failed or answered something unusable.

    ``error_type`` is the reason a failed attempt carries (``ResultCard.reason``).
    """

    error_type = "llm_error"


class LLMRateLimited(LLMError):
    """HTTP 429; ``retry_after`` is the server's Retry-After in seconds, if it sent one."""

    error_type = "llm_rate_limited"

    def __init__(self, message: str, retry_after: float | None = None) -> None:
        super().__init__(message)
        self.retry_after = retry_after


class LLMTimeout(LLMError):
    error_type = "llm_timeout"


class LLMServerError(LLMError):
    error_type = "llm_server_error"


class LLMRequestRefused(LLMError):
    """A 4xx other than 429; ``status`` is the HTTP status (0: refused by the client side)."""

    error_type = "llm_request_refused"

    def __init__(self, message: str, status: int = 0) -> None:
        super().__init__(message)
        self.status = status


class LLMBadOutput(LLMError):
    error_type = "llm_bad_output"


class LLMLimitExceeded(LLMError):
    """A task's model conversation went past a limit of its agent (``LLMAgent.max_turns``,
    ``max_tool_calls``, ``max_tokens_per_task``); ``limit`` is the limit's value."""

    error_type = "llm_limit_exceeded"

    def __init__(self, message: str, limit: int = 0) -> None:
        super().__init__(message)
        self.limit = limit


class LLMMaxTurns(LLMLimitExceeded):
    error_type = "llm_max_turns"


class LLMMaxToolCalls(LLMLimitExceeded):
    error_type = "llm_max_tool_calls"


class LLMTokenLimit(LLMLimitExceeded):
    error_type = "llm_token_limit"


class BudgetExceeded(LLMError):
    """The orchestrator refused a model call before it was sent: it would cross a budget of
    the run (its money or tokens, or an agent's or role's; ``bus.orchestrator.budget``)."""

    error_type = "budget_exceeded"


class ToolError(CardbusError):
    """A tool call did not produce a usable result."""

    error_type = "tool_error"


class ToolNotFound(ToolError):
    error_type = "not_found"


class ToolInputInvalid(ToolError):
    error_type = "invalid_input"


class ToolTimeout(ToolError):
    error_type = "timeout"


class ToolResultTooLarge(ToolError):
    error_type = "result_too_large"

    def __init__(self, message: str, size: int = 0, limit: int = 0) -> None:
        super().__init__(message)
        self.size = size
        self.limit = limit


class ToolFailed(ToolError):
    error_type = "tool_error"
