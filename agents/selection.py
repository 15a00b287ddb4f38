"""Agent selection: a hard filter, then a hybrid score.

``score = w_similarity * cos(goal, capability description)
        + w_success * success rate + w_speed * speed``

Similarity comes from a pluggable ``Embedder``; the default hashes words into
a fixed-size vector, so it needs no model download and is deterministic.
Success rate and speed come from past events through any ``StatsSource``
(the agent-statistics projection is one).
"""

from __future__ import annotations

import hashlib
import itertools
import math
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import msgspec

from eventstore.events import Candidate

from .cards import AgentCard, AgentConstraints
from .schema import schema_errors

__all__ = [
    "AgentStat",
    "Embedder",
    "CachingEmbedder",
    "DEFAULT_EMBEDDER",
    "HashingEmbedder",
    "StatsSource",
    "Weights",
    "constraint_problem",
    "hard_filter",
    "rank",
]


class Embedder(Protocol):
    def embed(self, texts: Sequence[str]) -> list[list[float]]: ...


class HashingEmbedder:
    """Bag of words (and word pairs) hashed into ``dim`` buckets, L2-normalised."""

    def __init__(self, dim: int = 512) -> None:
        self.dim = dim

    def embed(self, texts: Sequence[str]) -> list[list[float]]:
        return [self._one(t) for t in texts]

    def _one(self, text: str) -> list[float]:
        words = re.findall(r"[a-z0-9]+", text.lower())
        grams = words + [f"{a} {b}" for a, b in itertools.pairwise(words)]
        vec = [0.0] * self.dim
        for g in grams:
            h = int.from_bytes(hashlib.blake2b(g.encode(), digest_size=8).digest(), "big")
            vec[h % self.dim] += 1.0 if (h >> 63) else -1.0
        norm = math.sqrt(sum(v * v for v in vec)) or 1.0
        return [v / norm for v in vec]


class CachingEmbedder:
    """Remembers embeddings: goals and capability descriptions repeat across dispatches."""

    def __init__(self, inner: Embedder, size: int = 4096) -> None:
        self.inner = inner
        self.size = size
        self._cache: dict[str, list[float]] = {}
        self._sims: dict[tuple[str, str], float] = {}

    def embed(self, texts: Sequence[str]) -> list[list[float]]:
        missing = [t for t in dict.fromkeys(texts) if t not in self._cache]
        if missing:
            if len(self._cache) + len(missing) > self.size:
                self._cache.clear()
            self._cache.update(zip(missing, self.inner.embed(missing), strict=True))
        return [self._cache[t] for t in texts]

    def similarities(self, goal: str, texts: Sequence[str]) -> list[float]:
        """Cosine of ``goal`` with each text, remembered per pair (a dispatch's hot path)."""
        sims = self._sims
        missing = [t for t in texts if (goal, t) not in sims]
        if missing:
            if len(sims) + len(missing) > self.size:
                sims.clear()
            goal_vec, *vecs = self.embed([goal, *missing])
            for t, vec in zip(missing, vecs, strict=True):
                sims[goal, t] = _cosine(goal_vec, vec)
        return [sims[goal, t] for t in texts]


def _cosine(a: Sequence[float], b: Sequence[float]) -> float:
    """Of two L2-normalised vectors; negative similarity counts as none."""
    return max(0.0, sum(x * y for x, y in zip(a, b, strict=True)))


#: hashing (no model) behind a cache: what selection uses unless given an embedder
DEFAULT_EMBEDDER = CachingEmbedder(HashingEmbedder())


@dataclass(frozen=True)
class AgentStat:
    runs: int = 0
    success_rate: float = 0.5  # prior for an agent with no history
    p50_s: float | None = None


class StatsSource(Protocol):
    def get(self, agent_id: str, capability: str) -> Any: ...


@dataclass(frozen=True)
class Weights:
    similarity: float = 0.5
    success: float = 0.3
    speed: float = 0.2


def constraint_problem(
    agent: AgentConstraints, task_constraints: dict[str, Any], timeout_s: float, input_bytes: int
) -> str | None:
    """Why an agent cannot meet a task's constraints, or None when it can.

    Each task constraint must name one of the agent's ``limits``: a list
    offered means the wanted value (or every wanted value, for a list) must be
    in it; a number offered is a maximum; anything else must be equal.
    """
    if agent.max_timeout_s is not None and not timeout_s <= agent.max_timeout_s:
        return f"timeout {timeout_s}s over the agent's {agent.max_timeout_s}s"
    if agent.max_input_bytes is not None and input_bytes > agent.max_input_bytes:
        return f"input of {input_bytes} bytes over the agent's {agent.max_input_bytes}"
    for key, wanted in task_constraints.items():
        if key not in agent.limits:
            return f"constraint {key!r} not offered by the agent"
        offered = agent.limits[key]
        if isinstance(offered, list):
            wanted_all = wanted if isinstance(wanted, list) else [wanted]
            missing = [w for w in wanted_all if w not in offered]
            if missing:
                return f"{key}={wanted!r} not in {offered!r}"
        elif _is_number(offered):
            if not _is_number(wanted) or not wanted <= offered:
                return f"{key}={wanted!r} over the agent's {offered!r}"
        elif wanted != offered:
            return f"{key}={wanted!r} != {offered!r}"
    return None


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def hard_filter(
    card: AgentCard,
    capability: str,
    inputs: dict[str, Any],
    constraints: dict[str, Any],
    timeout_s: float,
    *,
    partial_inputs: bool = False,
) -> str | None:
    """The rejection reason this agent would give, or None if it qualifies."""
    spec = card.capability(capability)
    if spec is None:
        return "out_of_capability"
    if spec.input_schema and schema_errors(inputs, spec.input_schema, partial=partial_inputs):
        return "input_schema_mismatch"
    size = len(msgspec.json.encode(inputs))
    if constraint_problem(card.constraints, constraints, timeout_s, size):
        return "over_constraint"
    return None


def rank(
    cards: Iterable[AgentCard],
    capability: str,
    goal: str,
    inputs: dict[str, Any],
    constraints: dict[str, Any],
    timeout_s: float,
    stats: StatsSource | None = None,
    embedder: Embedder | None = None,
    weights: Weights = Weights(),
    exclude: frozenset[str] = frozenset(),
) -> list[Candidate]:
    """Qualified agents, best first, each with the parts of its score."""
    qualified = [
        c
        for c in cards
        if c.agent_id not in exclude
        and hard_filter(c, capability, inputs, constraints, timeout_s) is None
    ]
    if not qualified:
        return []
    embedder = embedder or DEFAULT_EMBEDDER
    texts = [goal or capability] + [
        f"{capability} {(c.capability(capability) or c).description} {c.description}"
        for c in qualified
    ]
    if isinstance(embedder, CachingEmbedder):
        sims = embedder.similarities(texts[0], texts[1:])
    else:
        goal_vec, *cap_vecs = embedder.embed(texts)
        sims = [_cosine(goal_vec, vec) for vec in cap_vecs]
    out = []
    for card, sim in zip(qualified, sims, strict=True):
        stat = stats.get(card.agent_id, capability) if stats else None
        success = float(getattr(stat, "success_rate", 0.5)) if stat else 0.5
        p50 = getattr(stat, "p50_s", None) if stat else None
        speed = 1.0 / (1.0 + p50) if p50 is not None else 0.5
        score = weights.similarity * sim + weights.success * success + weights.speed * speed
        out.append(
            Candidate(
                agent_id=card.agent_id,
                score=round(score, 6),
                similarity=round(sim, 6),
                success_rate=round(success, 6),
                speed=round(speed, 6),
            )
        )
    out.sort(key=lambda c: (-c.score, c.agent_id))
    return out
