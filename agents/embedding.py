"""Text embeddings for similarity: a pluggable ``Embedder`` and a model-free default.

The default hashes words (and word pairs) into a fixed-size vector, so it needs
no model download and is deterministic. Selection scores goals against
capability descriptions with it; tool search and long-term memory use it too.
"""

from __future__ import annotations

import hashlib
import itertools
import math
import re
from collections.abc import Sequence
from typing import Protocol

__all__ = ["DEFAULT_EMBEDDER", "CachingEmbedder", "Embedder", "HashingEmbedder", "cosine"]


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
                sims[goal, t] = cosine(goal_vec, vec)
        return [sims[goal, t] for t in texts]


def cosine(a: Sequence[float], b: Sequence[float]) -> float:
    """Of two L2-normalised vectors; negative similarity counts as none."""
    return max(0.0, sum(x * y for x, y in zip(a, b, strict=True)))


#: hashing (no model) behind a cache: what selection uses unless given an embedder
DEFAULT_EMBEDDER = CachingEmbedder(HashingEmbedder())
