"""OpenTelemetry ids derived from the log's own ids, so every layer draws the same ones.

A run's trace id and the span id of the span an event opens are digests of the root id
and of the event id (``projections.traces`` builds the exported tree on them; the MCP
adapter parents the ``mcp`` SDK's spans on the ``execute_tool`` span of a call with
them). They live here, at the bottom of the layers, because both need them.
"""

from __future__ import annotations

import hashlib

__all__ = ["span_id_for", "trace_id_for"]


def _digest(text: str) -> bytes:
    return hashlib.sha256(text.encode("utf-8")).digest()


def trace_id_for(root_id: str) -> int:
    """The trace id of a run: the first 16 bytes of ``sha256(root_id)`` (never 0)."""
    return int.from_bytes(_digest(root_id)[:16], "big") or 1


def span_id_for(event_id: str) -> int:
    """The span id of the span opened by an event: the first 8 bytes of its sha256 (never 0)."""
    return int.from_bytes(_digest(event_id)[:8], "big") or 1
