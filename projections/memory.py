"""Long-term memory's read model: a pure fold over ``memory.*`` events.

Where it lives in the log: every long-term write is a ``memory.written.v1``
and every forget a ``memory.forgotten.v1`` on the one stream ``memory``
(:data:`MEMORY_STREAM`), so the whole memory has one version, one hash chain
(``cardbus verify memory``) and an exact order of writes and forgets. Their
``correlation_id`` is ``memory`` too (a run's own events stay the run's);
a written record names the run it came from (``root_id``) and the event's
``causation_id`` the event that caused it (a ``run.completed`` or
``task.failed``), so every record can be traced back to where it came from.

The fold keeps the latest write of each key; a forget removes the key, so its
content no longer appears in :meth:`MemoryFold.get`, :meth:`~MemoryFold.list`
or :meth:`~MemoryFold.search` (the old events stay in the log: the log is
never edited, and rebuilding from it gives the same model). A later write of
a forgotten key creates it again.

Scopes (``projections.scope``): each record belongs to one scope, and a key
names a record *within* its scope, so ``pref/report_format`` of
``tenant:acme`` and of ``tenant:globex`` are two records. Every read takes
``scopes``: ``None`` for all of them (the operator's view, ``cardbus memory``),
or a run's scope chain, most specific first, of which a key present in several
scopes shows only the first one's (a user's record shadows the tenant's). A
record without a scope (written before scopes) is ``global``.

Semantic search embeds each record's ``text`` with a pluggable embedder (any
object with ``embed(texts) -> vectors``, e.g. ``agents.selection.HashingEmbedder``);
vectors are a cache of the fold, not part of it. The fold itself is pure:
no I/O, no clock; :func:`build_memory` is the one helper that reads a store.
"""

from __future__ import annotations

import builtins
import math
from collections.abc import Iterable, Sequence
from typing import Any, Protocol

import msgspec

from cardbus.eventstore import events as ev
from cardbus.eventstore.envelope import Envelope
from cardbus.eventstore.store import EventStore
from cardbus.projections.scope import GLOBAL

__all__ = [
    "MEMORY_STREAM",
    "MemoryFold",
    "MemoryHit",
    "MemoryRecord",
    "TextEmbedder",
    "build_memory",
]

MEMORY_STREAM = "memory"


class TextEmbedder(Protocol):
    """What search needs: ``agents.selection.Embedder`` has this shape."""

    def embed(self, texts: Sequence[str]) -> list[list[float]]: ...


class MemoryRecord(msgspec.Struct, frozen=True, kw_only=True):
    """One live long-term memory record, as the latest write of its key left it."""

    key: str
    value: Any
    scope: str = GLOBAL
    text: str = ""
    tags: list[str] = []
    kind: str = "record"  # record | preference | failure | result
    agent_id: str = ""  # the agent that wrote it ("" for a policy or an operator)
    policy: str = ""
    source_task_id: str | None = None
    root_id: str = ""  # correlation id of the write: the run it came from
    event_id: str = ""
    position: int = 0
    version: int = 0  # version of the write in the memory stream
    recorded_at: float = 0.0

    def field(self, name: str) -> Any:
        """A field of a dict value (dotted path), None if absent."""
        out: Any = self.value
        for part in name.split("."):
            out = out.get(part) if isinstance(out, dict) else None
        return out


class MemoryHit(msgspec.Struct, frozen=True, kw_only=True):
    record: MemoryRecord
    score: float


Scopes = Sequence[str] | None  # None: every scope; else a chain, most specific first


class MemoryFold:
    """Live records by (scope, key), folded from ``memory.*`` events in version order."""

    handles = frozenset({ev.MemoryWritten, ev.MemoryForgotten})

    def __init__(self) -> None:
        self.records: dict[tuple[str, str], MemoryRecord] = {}
        self.version = 0  # last applied version of the memory stream
        self._vectors: dict[str, list[float]] = {}  # text -> embedding (a cache)

    # -- the fold -------------------------------------------------------------

    def apply(self, env: Envelope) -> bool:
        """Fold one event; False for events of other streams or already applied ones."""
        if env.stream != MEMORY_STREAM or env.version <= self.version:
            return False
        self.version = env.version
        data = env.data
        if isinstance(data, ev.MemoryWritten):
            scope = data.scope or GLOBAL  # a record from before scopes is everyone's
            self.records[scope, data.key] = MemoryRecord(
                key=data.key,
                value=data.value,
                scope=scope,
                text=data.text,
                tags=list(data.tags),
                kind=data.kind,
                agent_id=data.agent_id,
                policy=data.policy,
                source_task_id=data.source_task_id,
                root_id=data.root_id,
                event_id=env.event_id,
                position=env.position,
                version=env.version,
                recorded_at=env.recorded_at,
            )
        elif isinstance(data, ev.MemoryForgotten):
            self.records.pop((data.scope or GLOBAL, data.key), None)
        return True

    def apply_all(self, events: Iterable[Envelope]) -> MemoryFold:
        for env in events:
            self.apply(env)
        return self

    # -- reads ------------------------------------------------------------------

    def get(self, key: str, scopes: Scopes = None) -> MemoryRecord | None:
        """Exact look-up by key: in the first scope of ``scopes`` that has it (None:
        ``global``'s, else any scope's, the latest written)."""
        if scopes is None:
            found = self.records.get((GLOBAL, key))
            if found is None:
                mine = [r for (_, k), r in self.records.items() if k == key]
                found = max(mine, key=lambda r: r.version) if mine else None
            return found
        for scope in scopes:
            found = self.records.get((scope, key))
            if found is not None:
                return found
        return None

    def visible(self, scopes: Scopes = None) -> Iterable[MemoryRecord]:
        """The records ``scopes`` sees: all (None), or those of the chain, a key present
        in several of its scopes as the most specific one's."""
        if scopes is None:
            yield from self.records.values()
            return
        rank = {s: i for i, s in enumerate(scopes)}
        best: dict[str, MemoryRecord] = {}
        for r in self.records.values():
            i = rank.get(r.scope)
            if i is None:
                continue
            other = best.get(r.key)
            if other is None or i < rank[other.scope]:
                best[r.key] = r
        yield from best.values()

    def list(
        self,
        *,
        scopes: Scopes = None,
        tags: Sequence[str] = (),
        kind: str | None = None,
        prefix: str = "",
        where: dict[str, Any] | None = None,
        limit: int | None = None,
    ) -> builtins.list[MemoryRecord]:
        """Records of ``scopes`` with every tag in ``tags``, of ``kind``, whose key starts
        with ``prefix`` and whose dict value has ``where``'s fields equal; oldest first."""
        out = [
            r
            for r in self.visible(scopes)
            if (kind is None or r.kind == kind)
            and r.key.startswith(prefix)
            and all(t in r.tags for t in tags)
            and all(r.field(k) == v for k, v in (where or {}).items())
        ]
        out.sort(key=lambda r: (r.version, r.key, r.scope))
        return out if limit is None else out[: max(0, limit)]

    def search(
        self,
        text: str,
        embedder: TextEmbedder,
        *,
        k: int = 5,
        scopes: Scopes = None,
        tags: Sequence[str] = (),
        kind: str | None = None,
        min_score: float = 0.0,
    ) -> builtins.list[MemoryHit]:
        """The ``k`` records of ``scopes`` whose text is closest to ``text`` (cosine above
        ``min_score``), best first; ties by key."""
        candidates = [r for r in self.list(scopes=scopes, tags=tags, kind=kind) if r.text or r.key]
        if not candidates or k <= 0:
            return []
        texts = [r.text or r.key for r in candidates]
        missing = [t for t in dict.fromkeys(texts) if t not in self._vectors]
        if missing:
            if len(self._vectors) > 50_000:
                self._vectors.clear()
                missing = list(dict.fromkeys(texts))
            self._vectors.update(zip(missing, embedder.embed(missing), strict=True))
        (query,) = embedder.embed([text])
        hits = []
        for r, t in zip(candidates, texts, strict=True):
            score = _cosine(query, self._vectors[t])
            if score > min_score:  # nothing in common (0 or below) is no hit
                hits.append(MemoryHit(record=r, score=round(score, 6)))
        hits.sort(key=lambda h: (-h.score, h.record.key, h.record.scope))
        return hits[:k]

    def failures(
        self, *, capability: str | None = None, agent_id: str | None = None
    ) -> builtins.list[MemoryRecord]:
        """Recorded failure reasons, optionally of one capability and/or agent."""
        where: dict[str, Any] = {}
        if capability is not None:
            where["capability"] = capability
        if agent_id is not None:
            where["agent_id"] = agent_id
        return self.list(kind="failure", where=where)


def _cosine(a: Sequence[float], b: Sequence[float]) -> float:
    dot = sum(x * y for x, y in zip(a, b, strict=False))
    na = math.sqrt(sum(x * x for x in a))
    nb = math.sqrt(sum(y * y for y in b))
    if na == 0.0 or nb == 0.0:
        return 0.0
    return dot / (na * nb)


async def build_memory(store: EventStore, fold: MemoryFold | None = None) -> MemoryFold:
    """Bring ``fold`` (or a new one) up to date with the store's ``memory`` stream."""
    fold = fold if fold is not None else MemoryFold()
    return fold.apply_all(await store.read_stream(MEMORY_STREAM, fold.version + 1))
