"""Results kept for reuse: a successful task's output answers an identical later task.

Two halves, both off by default, both set by one :class:`ReusePolicy`:

* **keep** (``MemoryKeeper``, when a run completes): each completed task of the
  run whose capability the policy names becomes a long-term memory record of
  kind ``result``, key ``result/<capability>/<inputs digest>``, in the run's
  scope (``projections.scope``). Not kept: a task whose inputs were trimmed
  to fit an agent (``context.trimmed``: the output answers other inputs), one
  that needed more input from the user (``task.needs_input``), one completed
  with its review not passed (``quality_met`` False), a result that was itself
  reused, and anything of a run that did not complete.
* **reuse** (the orchestrator, before a dispatch): a pending task whose
  capability the policy names, never attempted, looks up the same key in its
  run's scope chain (user, then tenant, then global). A record no older than
  ``max_age_s`` answers it: ``task.completed`` with ``reused_from`` the id of
  the ``memory.written`` it comes from and ``reused`` (``ResultOrigin``: the
  key, the scope, the producing task, run and agent, its age, the policy).
  No agent is called, and the agent statistics do not count it.

The inputs digest is the one ``task.dispatched`` records (sha256 of the card's
inputs, keys sorted), so a record is found exactly when the later task's card
would carry the same inputs. :class:`ResultIndex` is what the decision loop
looks in: a bounded fold of the ``memory`` stream's result records, kept
current from the log like the rest of the orchestrator's state, so the
decision itself stays pure (no read, no clock of its own).
"""

from __future__ import annotations

import collections
import fnmatch
import hashlib
from dataclasses import dataclass
from typing import Any

import msgspec

from cardbus.bus.orchestrator.checks import check_number, check_text
from cardbus.eventstore import Envelope, EventStore
from cardbus.eventstore import events as ev
from cardbus.eventstore.errors import ConfigError, InvalidScope
from cardbus.projections.memory import MEMORY_STREAM
from cardbus.projections.scope import GLOBAL, scope_chain

__all__ = [
    "RESULT_KIND",
    "ResultEntry",
    "ResultIndex",
    "ReusePolicy",
    "inputs_digest",
    "result_key",
]

RESULT_KIND = "result"


def inputs_digest(inputs: Any) -> str:
    """The digest ``task.dispatched`` records for a card's inputs."""
    return hashlib.sha256(msgspec.json.encode(inputs, order="sorted")).hexdigest()


def result_key(capability: str, digest: str) -> str:
    return f"result/{capability}/{digest}"


@dataclass(frozen=True)
class ReusePolicy:
    """Which successful results long-term memory keeps, and whether they answer later tasks.

    ``keep``: store completed tasks' results when their run completes;
    ``reuse``: answer a pending task from a stored result instead of dispatching it;
    ``max_age_s``: a result older than this is not reused (it stays in memory);
    ``capabilities``: the capabilities it applies to (names or globs, ``"*"``: all);
    ``name``: recorded in each record's ``policy`` and each reuse (``ResultOrigin``);
    ``max_results``: result records the orchestrator indexes (the latest).
    """

    keep: bool = False
    reuse: bool = False
    max_age_s: float = 24 * 3600.0
    capabilities: tuple[str, ...] = ("*",)
    name: str = "results.v1"
    max_results: int = 10_000

    def __post_init__(self) -> None:
        me = "ReusePolicy"
        for flag in ("keep", "reuse"):
            if not isinstance(getattr(self, flag), bool):
                raise ConfigError(f"{me}.{flag} must be True or False; got {getattr(self, flag)!r}")
        check_number(me, "max_age_s", self.max_age_s, above=0)
        check_number(me, "max_results", self.max_results, at_least=1, integer=True)
        check_text(me, "name", self.name)
        caps = self.capabilities
        if not isinstance(caps, (tuple, list)) or not all(isinstance(c, str) and c for c in caps):
            raise ConfigError(
                f"{me}.capabilities must be a tuple of non-empty strings; got {caps!r}"
            )
        object.__setattr__(self, "capabilities", tuple(caps))

    def applies_to(self, capability: str) -> bool:
        return any(fnmatch.fnmatchcase(capability, p) for p in self.capabilities)

    def kept(
        self,
        capability: str,
        digest: str,
        completed: ev.TaskCompleted,
        task_id: str,
        goal: str,
    ) -> ev.MemoryWritten | None:
        """The record that keeps one completed task's result (None: not kept)."""
        if not self.keep or not self.applies_to(capability) or not digest:
            return None
        if completed.reused_from is not None or not completed.quality_met:
            return None
        return ev.MemoryWritten(
            key=result_key(capability, digest),
            value={
                "output": completed.output,
                "capability": capability,
                "inputs_digest": digest,
                "task_id": task_id,
                "agent_id": completed.agent_id,
                "confidence": completed.confidence,
            },
            text=f"result of {capability}: {goal}"[:2000],
            tags=[RESULT_KIND, f"capability:{capability}"],
            source_task_id=task_id,
            kind=RESULT_KIND,
            policy=self.name,
        )


@dataclass(frozen=True)
class ResultEntry:
    """A stored result, as the decision loop needs it."""

    scope: str
    key: str
    event_id: str
    recorded_at: float
    output: Any
    agent_id: str
    source_task_id: str | None
    root_id: str
    confidence: float


class ResultIndex:
    """The result records of the ``memory`` stream by (scope, key): a bounded fold.

    Fed the log's events in order (``apply``), like ``RunState``; built on start by
    :meth:`build` (the memory stream alone: a snapshot of the run state skips it).
    """

    def __init__(self, policy: ReusePolicy) -> None:
        self.policy = policy
        self.version = 0  # the memory stream's version folded
        self.entries: collections.OrderedDict[tuple[str, str], ResultEntry] = (
            collections.OrderedDict()
        )

    def apply(self, env: Envelope) -> None:
        if env.stream != MEMORY_STREAM or env.version <= self.version:
            return
        self.version = env.version
        data = env.data
        if isinstance(data, ev.MemoryWritten):
            where = (data.scope or GLOBAL, data.key)
            self.entries.pop(where, None)  # a later write replaces (or, not a result, hides)
            value = data.value if isinstance(data.value, dict) else {}
            if data.kind == RESULT_KIND and "output" in value:
                self.entries[where] = ResultEntry(
                    scope=where[0],
                    key=data.key,
                    event_id=env.event_id,
                    recorded_at=env.recorded_at,
                    output=value["output"],
                    agent_id=str(value.get("agent_id") or ""),
                    source_task_id=data.source_task_id,
                    root_id=data.root_id,
                    confidence=float(value.get("confidence") or 0.0),
                )
                while len(self.entries) > self.policy.max_results:
                    self.entries.popitem(last=False)
        elif isinstance(data, ev.MemoryForgotten):
            self.entries.pop((data.scope or GLOBAL, data.key), None)

    async def build(self, store: EventStore) -> ResultIndex:
        for env in await store.read_stream(MEMORY_STREAM, self.version + 1):
            self.apply(env)
        return self

    def answer(
        self,
        started: ev.RunStarted,
        created: ev.TaskCreated,
        task_id: str,
        inputs: Any,
        now: float,
    ) -> ev.TaskCompleted | None:
        """The completion that answers a task from memory, or None (dispatch it).

        Only a plan's own tasks (no review, supplement or planner), never attempted."""
        policy = self.policy
        if not policy.reuse or created.role or not policy.applies_to(created.capability):
            return None
        digest = inputs_digest(inputs)
        key = result_key(created.capability, digest)
        try:
            chain = scope_chain(started.user, started.tenant)
        except InvalidScope:  # a context the log holds but we cannot read: no reuse
            return None
        for scope in chain:
            entry = self.entries.get((scope, key))
            if entry is None:
                continue
            age = max(0.0, now - entry.recorded_at)
            if age > policy.max_age_s:
                continue  # too old to answer with (it stays in memory)
            return ev.TaskCompleted(
                attempt=0,
                agent_id=entry.agent_id,
                output=entry.output,
                confidence=entry.confidence,
                reused_from=entry.event_id,
                reused=ev.ResultOrigin(
                    key=key,
                    scope=scope,
                    inputs_digest=digest,
                    source_task_id=entry.source_task_id,
                    source_root_id=entry.root_id,
                    agent_id=entry.agent_id,
                    age_s=round(age, 3),
                    policy=policy.name,
                ),
            )
        return None
