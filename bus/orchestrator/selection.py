"""Agent selection: a hard filter, then a hybrid score.

``score = w_similarity * cos(goal, capability description)
        + w_success * success rate + w_speed * speed
        - w_failures * recent failures``

``recent failures`` (0..1) comes from the failure reasons recorded in
long-term memory (``failure/<task>/<attempt>`` records of this agent on this
capability): ``min(1, sum of weight(reason) * 0.5 ** (age / half_life))``,
``weight`` 1 for ``timeout`` and ``agent_lost``, 0.5 for ``agent_error``,
``output_schema_mismatch`` and ``all_candidates_failed``, 0 for reasons
that are not the agent's doing (``conflict_tie``, ...).

Similarity comes from a pluggable ``Embedder``; the default hashes words into
a fixed-size vector, so it needs no model download and is deterministic.
Success rate and speed come from past events through any ``StatsSource``
(the agent-statistics projection is one).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, Protocol

import msgspec

from cardbus.agents.cards import AgentCard, constraint_problem
from cardbus.agents.embedding import DEFAULT_EMBEDDER, CachingEmbedder, Embedder, cosine
from cardbus.agents.schema import schema_errors
from cardbus.bus.orchestrator.checks import check_number
from cardbus.eventstore.events import Candidate

__all__ = [
    "AgentStat",
    "StatsSource",
    "Weights",
    "hard_filter",
    "rank",
]


@dataclass(frozen=True)
class AgentStat:
    runs: int = 0
    success_rate: float = 0.5  # prior for an agent with no history
    p50_s: float | None = None


class StatsSource(Protocol):
    def get(self, agent_id: str, capability: str) -> Any: ...


@dataclass(frozen=True)
class Weights:
    """The weight of each part of the hybrid score; each a finite number >= 0."""

    similarity: float = 0.5
    success: float = 0.3
    speed: float = 0.2
    failures: float = 0.3  # subtracted, times the recent-failure penalty (0..1)

    def __post_init__(self) -> None:
        for name in ("similarity", "success", "speed", "failures"):
            check_number("Weights", name, getattr(self, name), at_least=0)


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
    penalty: Callable[[str], float] | None = None,
) -> list[Candidate]:
    """Qualified agents, best first, each with the parts of its score.

    ``penalty(agent_id)``: the agent's recent-failure penalty (0..1) on this capability.
    """
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
        sims = [cosine(goal_vec, vec) for vec in cap_vecs]
    out = []
    for card, sim in zip(qualified, sims, strict=True):
        stat = stats.get(card.agent_id, capability) if stats else None
        success = float(getattr(stat, "success_rate", 0.5)) if stat else 0.5
        p50 = getattr(stat, "p50_s", None) if stat else None
        speed = 1.0 / (1.0 + p50) if p50 is not None else 0.5
        failed = min(1.0, max(0.0, penalty(card.agent_id))) if penalty else 0.0
        score = weights.similarity * sim + weights.success * success + weights.speed * speed
        score -= weights.failures * failed
        out.append(
            Candidate(
                agent_id=card.agent_id,
                score=round(score, 6),
                similarity=round(sim, 6),
                success_rate=round(success, 6),
                speed=round(speed, 6),
                recent_failures=round(failed, 6),
            )
        )
    out.sort(key=lambda c: (-c.score, c.agent_id))
    return out
