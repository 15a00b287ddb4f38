"""Long-term memory: the write policy, the keeper that applies it, and the API.

Three layers of memory, three owners:

* **session memory** is the run's ``RunStarted.session`` (``Plan.session``):
  what the user asked. Only the orchestrator has it; an agent gets only the
  fields a plan puts into its card.
* **task memory** is the outputs of tasks, in the log. An agent reads the
  outputs of its declared dependencies (in its card, or on request through
  ``ctx.read_output``); the orchestrator refuses anything else.
* **long-term memory** outlives runs. It is the stream ``memory`` of the log
  (see ``projections.memory``), written here and nowhere else. Each record
  belongs to a scope (``projections.scope``): ``global``, a tenant's, a
  user's; a run reads its scope chain (user, tenant, global) and writes to its
  own scope, the one its ``run.started`` names (``user``, ``tenant``).

What gets written is decided by a :class:`MemoryPolicy`, never by an agent:
the default :class:`ReusablePolicy` writes, **when a run completes**, the
entries of its session's ``preferences`` (``{"report_format": "markdown"}``
becomes the record ``pref/<user>/report_format``); and, since selection
learns from them, the reason of every failed attempt and failed task
(``failure/<task>/<attempt>``, kind ``failure``). Nothing of a failed run
is stored as reusable. Every record a policy writes for a run goes to the
run's scope (unless the policy names one), so one tenant's preferences,
failure reasons (they quote the goal) and results are never another's. A
:class:`~cardbus.bus.orchestrator.reuse.ReusePolicy` given to the keeper also
keeps completed tasks' results for reuse (``bus.orchestrator.reuse``).

:class:`MemoryKeeper` applies the policy to the log: ``settle(root_id)`` after
a run, ``follow()`` to keep up continuously. It is idempotent: each memory
event's id is derived from the event that caused it and the key, so
processing the same log twice (a restart, two keepers) writes nothing twice.
:class:`LongTermMemory` is the API for reads, search, explicit writes and
``forget`` (an event too), used by the orchestrator and ``cardbus memory``.
"""

from __future__ import annotations

import asyncio
import builtins
import hashlib
import logging
import random
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

import msgspec

from cardbus.agents.embedding import Embedder, HashingEmbedder
from cardbus.bus.orchestrator.checks import check_text
from cardbus.eventstore import ConcurrencyError, Envelope, EventStore, IdempotencyError, NewEvent
from cardbus.eventstore import events as ev
from cardbus.eventstore.errors import ConfigError, InvalidScope
from cardbus.projections.memory import (
    MEMORY_STREAM,
    MemoryFold,
    MemoryHit,
    MemoryRecord,
    Scopes,
    build_memory,
)
from cardbus.projections.scope import GLOBAL, check_key, normalize_scope, scope_of

if TYPE_CHECKING:
    from cardbus.bus.orchestrator.reuse import ReusePolicy

__all__ = [
    "MEMORY_STREAM",
    "LongTermMemory",
    "MemoryKeeper",
    "MemoryPolicy",
    "ReusablePolicy",
    "derived_id",
    "run_scope",
]

log = logging.getLogger(__name__)


def derived_id(seed: str, at: float) -> str:
    """A UUIDv7-shaped id made from ``seed``: the same seed always gives the same id."""
    ms = int(at * 1000) & 0xFFFF_FFFF_FFFF
    h = int.from_bytes(hashlib.sha256(seed.encode()).digest()[:10], "big")
    value = (
        ms << 80 | 0x7 << 76 | (h >> 68 & 0xFFF) << 64 | 0b10 << 62 | (h & 0x3FFF_FFFF_FFFF_FFFF)
    )
    x = f"{value:032x}"
    return f"{x[:8]}-{x[8:12]}-{x[12:16]}-{x[16:20]}-{x[20:]}"


def run_scope(started: ev.RunStarted | None) -> str:
    """The scope a run writes to: its user's, else its tenant's, else ``global``."""
    if started is None:
        return GLOBAL
    try:
        return scope_of(started.user, started.tenant)
    except InvalidScope:  # a context in the log no cardbus of ours wrote: not anyone's
        return GLOBAL


class MemoryPolicy(Protocol):
    """Decides what of a finished run (or a failure) is worth keeping."""

    @property
    def name(self) -> str: ...

    def on_run_completed(
        self, root_id: str, started: ev.RunStarted, outputs: dict[str, Any]
    ) -> list[ev.MemoryWritten]: ...

    def on_failure(
        self, task_id: str, created: ev.TaskCreated, agent_id: str, attempt: int, reason: str
    ) -> list[ev.MemoryWritten]: ...


@dataclass(frozen=True)
class ReusablePolicy:
    """Stores a user's preferences from session memory on success, and failure reasons.

    ``session_keys`` names the session fields whose entries are reusable
    (each a dict of preference name -> value); ``user_key`` the session field
    naming the user (``"default"`` if absent).
    """

    name: str = "reusable.v1"
    session_keys: tuple[str, ...] = ("preferences",)
    user_key: str = "user"
    record_failures: bool = True

    def __post_init__(self) -> None:
        me = "ReusablePolicy"
        check_text(me, "name", self.name)
        check_text(me, "user_key", self.user_key)
        # a bare string would be read as one key per character
        keys = self.session_keys
        if not isinstance(keys, (tuple, list)) or not all(isinstance(k, str) and k for k in keys):
            raise ConfigError(
                f"{me}.session_keys must be a tuple of non-empty strings; got {keys!r}"
            )
        object.__setattr__(self, "session_keys", tuple(keys))

    def on_run_completed(
        self, root_id: str, started: ev.RunStarted, outputs: dict[str, Any]
    ) -> list[ev.MemoryWritten]:
        session = started.session if isinstance(started.session, dict) else {}
        user = str(session.get(self.user_key) or "default")
        out = []
        for field in self.session_keys:
            prefs = session.get(field)
            if not isinstance(prefs, dict):
                continue
            for name, value in sorted(prefs.items()):
                label = str(name).replace("_", " ")
                out.append(
                    ev.MemoryWritten(
                        key=f"pref/{user}/{name}",
                        value=value,
                        text=f"{user} prefers {label}: {value}",
                        tags=["preference", f"user:{user}", str(name)],
                        kind="preference",
                        policy=self.name,
                    )
                )
        return out

    def on_failure(
        self, task_id: str, created: ev.TaskCreated, agent_id: str, attempt: int, reason: str
    ) -> list[ev.MemoryWritten]:
        if not self.record_failures:
            return []
        value = {
            "task_id": task_id,
            "root_id": created.root_id,
            "capability": created.capability,
            "agent_id": agent_id,
            "attempt": attempt,
            "reason": reason,
            "goal": created.goal,
        }
        return [
            ev.MemoryWritten(
                key=f"failure/{task_id}/{attempt}",
                value=value,
                text=f"{created.capability} by {agent_id or 'no agent'} failed: {reason}. "
                f"Goal: {created.goal}",
                tags=["failure", f"capability:{created.capability}", f"agent:{agent_id}"],
                source_task_id=task_id,
                kind="failure",
                policy=self.name,
            )
        ]


class LongTermMemory:
    """Reads, search, writes and forgets of long-term memory, over an ``EventStore``.

    Reads refresh the fold from the ``memory`` stream first, so they see
    every write in the log, including other processes'.
    """

    def __init__(
        self, store: EventStore, embedder: Embedder | None = None, actor: str = "memory"
    ) -> None:
        self.store = store
        self.embedder: Embedder = embedder or HashingEmbedder()
        self.actor = actor
        self.fold = MemoryFold()
        self._lock = asyncio.Lock()
        self._writing = asyncio.Lock()  # this process's writes, one at a time (``append``)

    async def refresh(self) -> MemoryFold:
        async with self._lock:
            await build_memory(self.store, self.fold)
        return self.fold

    async def get(self, key: str, scopes: Scopes = None) -> MemoryRecord | None:
        """The record ``key`` of the first of ``scopes`` that has it (None: ``global``'s,
        else the latest of any scope)."""
        return (await self.refresh()).get(key, scopes)

    async def list(
        self,
        *,
        scopes: Scopes = None,
        tags: Sequence[str] = (),
        kind: str | None = None,
        prefix: str = "",
        where: dict[str, Any] | None = None,
        limit: int | None = None,
    ) -> builtins.list[MemoryRecord]:
        fold = await self.refresh()
        return fold.list(
            scopes=scopes, tags=tags, kind=kind, prefix=prefix, where=where, limit=limit
        )

    async def search(
        self,
        text: str,
        *,
        k: int = 5,
        scopes: Scopes = None,
        tags: Sequence[str] = (),
        kind: str | None = None,
        min_score: float = 0.0,
    ) -> builtins.list[MemoryHit]:
        fold = await self.refresh()
        return fold.search(
            text, self.embedder, k=k, scopes=scopes, tags=tags, kind=kind, min_score=min_score
        )

    async def remember(
        self,
        key: str,
        value: Any,
        *,
        text: str = "",
        tags: Iterable[str] = (),
        kind: str = "record",
        policy: str = "explicit",
        root_id: str = "",
        actor: str | None = None,
        scope: str = GLOBAL,
        agent_id: str = "",
    ) -> Envelope:
        """Write one record (an explicit write, e.g. by an operator) to ``scope``.

        A malformed key or scope is an ``InvalidScope``, before anything is written."""
        data = ev.MemoryWritten(
            key=check_key(key),
            value=value,
            text=text,
            tags=list(tags),
            kind=kind,
            policy=policy,
            root_id=root_id,
            scope=normalize_scope(scope),
            agent_id=agent_id,
        )
        (env,) = await self.append(
            [NewEvent(data=data, correlation_id=MEMORY_STREAM, actor=actor or self.actor)]
        )
        return env

    async def forget(
        self, key: str, reason: str = "", actor: str | None = None, scope: str | None = None
    ) -> bool:
        """Forget ``key`` of ``scope`` (a ``memory.forgotten`` event); False if there is no
        such record. ``scope`` None: the one scope that holds the key (``InvalidScope``
        naming them if several do)."""
        fold = await self.refresh()
        if scope is None:
            held = sorted(s for s, k in fold.records if k == key)
            if len(held) > 1:
                raise InvalidScope(f"memory key {key!r} is in several scopes: {held}; name one")
            scope = held[0] if held else GLOBAL
        scope = normalize_scope(scope)
        if fold.get(key, [scope]) is None:
            return False
        data = ev.MemoryForgotten(key=key, reason=reason, scope=scope)
        await self.append([NewEvent(data=data, correlation_id=MEMORY_STREAM, actor=actor or "cli")])
        return True

    async def append(self, events: Sequence[NewEvent]) -> builtins.list[Envelope]:
        """Append to the memory stream at its current version, retrying on a race.

        One stream, every run's records: this process's writes go one at a time (each
        reads the version it appends at), so they never race each other; only another
        process's can, and a race is retried on the fresh version with a growing pause.
        (They raced: 2,000 runs ending together each read one version, one append won
        a round, and after 20 rounds most raised ``ConcurrencyError`` from a finished
        run's ``EmbeddedRuntime.run``.)
        """
        async with self._writing:
            for attempt in range(20):
                version = await self.store.stream_version(MEMORY_STREAM)
                try:
                    stored = await self.store.append(MEMORY_STREAM, events, version)
                except ConcurrencyError:
                    await asyncio.sleep(min(0.5, 0.005 * 2**attempt) * random.random())
                    continue
                await self.refresh()
                return stored
            version = await self.store.stream_version(MEMORY_STREAM)
        raise ConcurrencyError(MEMORY_STREAM, -1, version)


_MAX_OBSERVED = 10_000  # runs observed and not settled yet, at most


@dataclass(slots=True)  # one per open task: no __dict__ each (about 100 bytes)
class _TaskFacts:
    created: ev.TaskCreated
    agent_id: str = ""
    attempt: int = 0
    digest: str = ""  # inputs digest of the latest dispatch
    keepable: bool = True  # False once its inputs were trimmed or it needed more input
    completed: ev.TaskCompleted | None = None


# the event types MemoryKeeper.decide folds or acts on (the cases of its match)
_DECIDED = frozenset(
    {
        ev.RunStarted,
        ev.TaskCreated,
        ev.TaskDispatched,
        ev.RunCompleted,
        ev.RunFailed,
        ev.RunHalted,
        ev.TaskRetryScheduled,
        ev.TaskFailed,
        ev.TaskCompleted,
        ev.TaskNeedsInput,
        ev.ContextTrimmed,
    }
)


class MemoryKeeper:
    """Applies a :class:`MemoryPolicy` to the log and writes what it marks reusable."""

    def __init__(
        self,
        store: EventStore,
        policy: MemoryPolicy | None = None,
        memory: LongTermMemory | None = None,
        results: ReusePolicy | None = None,
    ) -> None:
        """``results``: which completed tasks' results to keep for reuse (None: none)."""
        self.store = store
        self.policy: MemoryPolicy = policy or ReusablePolicy()
        self.results = results
        self.memory = memory or LongTermMemory(store)
        self.position = 0
        # what the policy needs of runs not finished yet (dropped when they finish)
        self._runs: dict[str, ev.RunStarted] = {}
        self._tasks: dict[str, _TaskFacts] = {}
        self._tasks_of: dict[str, builtins.list[str]] = {}  # root -> its task streams
        # fed live by ``observe``: per run seen from its start, the groups not yet written
        self._observed: dict[str, builtins.list[builtins.list[NewEvent]]] = {}

    def decide(self, env: Envelope) -> list[NewEvent]:
        """The memory events one log event calls for (pure but for the keeper's fold)."""
        data = env.data
        if type(data) not in _DECIDED:  # most events: nothing to fold or decide
            return []
        pending: list[ev.MemoryWritten] = []
        scope = run_scope(self._runs.get(env.correlation_id))  # before a finish forgets it
        match data:
            case ev.RunStarted():
                self._runs[env.stream] = data
            case ev.TaskCreated():
                self._tasks[env.stream] = _TaskFacts(data)
                self._tasks_of.setdefault(data.root_id, []).append(env.stream)
            case ev.TaskDispatched():
                facts = self._tasks.get(env.stream)
                if facts is not None:
                    facts.agent_id, facts.attempt = data.agent_id, data.attempt
                    facts.digest = data.inputs_digest
            case ev.ContextTrimmed() | ev.TaskNeedsInput():
                facts = self._tasks.get(env.stream)
                if facts is not None:  # its output answers other inputs than its card's
                    facts.keepable = False
            case ev.TaskCompleted():
                facts = self._tasks.get(env.stream)
                if facts is not None:
                    facts.completed = data
            case ev.RunCompleted():
                started = self._runs.get(env.stream)
                if started is not None:
                    pending = self.policy.on_run_completed(env.stream, started, data.outputs)
                    pending += self._results(env.stream)
                self._forget_run(env.stream)
            case ev.RunFailed() | ev.RunHalted():
                self._forget_run(env.stream)
            case ev.TaskRetryScheduled() | ev.TaskFailed():
                facts = self._tasks.get(env.stream)
                if facts is not None:
                    error = getattr(data, "error", "")
                    reason = f"{data.reason}: {error}" if error else data.reason
                    attempt = facts.attempt
                    pending = self.policy.on_failure(
                        env.stream, facts.created, facts.agent_id, attempt, reason
                    )
            case _:
                pass
        if not pending:
            return []
        pending = [p if p.scope else msgspec.structs.replace(p, scope=scope) for p in pending]
        return [
            NewEvent(
                data=m,
                correlation_id=MEMORY_STREAM,
                causation_id=env.event_id,
                actor=f"memory-policy:{self.policy.name}",
                event_id=derived_id(f"{env.event_id}|{m.key}", env.recorded_at),
            )
            for m in (msgspec.structs.replace(p, root_id=env.correlation_id) for p in pending)
        ]

    def _results(self, root_id: str) -> list[ev.MemoryWritten]:
        """The results of a completed run's tasks the ``results`` policy keeps."""
        if self.results is None or not self.results.keep:
            return []
        out = []
        for stream in self._tasks_of.get(root_id, []):
            facts = self._tasks[stream]
            if facts.completed is None or not facts.keepable:
                continue
            kept = self.results.kept(
                facts.created.capability,
                facts.digest,
                facts.completed,
                stream,
                facts.created.goal,
            )
            if kept is not None:
                out.append(kept)
        return out

    @property
    def tracking(self) -> int:
        """Runs and tasks the keeper holds facts of: only unfinished ones (no leak)."""
        return len(self._runs) + len(self._tasks)

    def _forget_run(self, root_id: str) -> None:
        self._runs.pop(root_id, None)
        for stream in self._tasks_of.pop(root_id, []):
            self._tasks.pop(stream, None)

    async def process(self, events: Iterable[Envelope]) -> builtins.list[Envelope]:
        """Fold ``events`` and append the memory events they call for (idempotent).

        The events one log event calls for are appended together, so each
        group is stored whole or not at all and a re-run re-appends exactly
        the same group (a no-op by event id).
        """
        written: builtins.list[Envelope] = []
        for env in events:
            if env.stream == MEMORY_STREAM:
                continue
            self.position = max(self.position, env.position)
            group = self.decide(env)
            if group:
                written += await self._write(group)
        return written

    def observe(self, env: Envelope) -> None:
        """Fold one event as it happens (an orchestrator observer); ``settle`` writes."""
        if env.stream == MEMORY_STREAM:
            return
        if isinstance(env.data, ev.RunStarted):
            self._observed[env.stream] = []
            if len(self._observed) > _MAX_OBSERVED:  # never settled: read back if ever
                del self._observed[next(iter(self._observed))]
        group = self.decide(env)
        pending = self._observed.get(env.correlation_id)
        if group and pending is not None:
            pending.append(group)

    async def settle(self, root_id: str) -> builtins.list[Envelope]:
        """Apply the policy to one run (call it when the run has finished).

        A run observed from its start needs no read: what it calls for was
        decided as it happened. Any other (one resumed after a restart) is
        read back from the log.
        """
        pending = self._observed.pop(root_id, None)
        if pending is None:
            return await self.process(await self.store.read_correlation(root_id))
        written: builtins.list[Envelope] = []
        for group in pending:
            written += await self._write(group)
        return written

    async def _write(self, group: builtins.list[NewEvent]) -> builtins.list[Envelope]:
        try:
            return await self.memory.append(group)
        except IdempotencyError as e:  # the policy changed since: keep what is stored
            log.warning("memory events already stored differently: %s", e)
            return []

    async def catch_up(self) -> builtins.list[Envelope]:
        """Apply the policy to everything in the log after ``position``."""
        written: builtins.list[Envelope] = []
        while True:
            page = await self.store.read_all(self.position + 1, 5000)
            written += await self.process(page)
            if len(page) < 5000:
                return written

    async def follow(self) -> None:
        """Keep applying the policy to new events until cancelled."""
        async for env in self.store.subscribe(self.position + 1):
            await self.process([env])
