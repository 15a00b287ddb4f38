"""Moved: the NATS connection options live in ``cardbus.eventstore.nats.connection``.

This module only re-exports ``NatsOptions`` for the importers not yet moved
(``tests/bus/telemetry/test_nats_trace.py``, ``bench/nats_bench.py``); delete it
once they import ``cardbus.eventstore.nats.connection`` (or
``cardbus.bus.transport.nats``, which re-exports it).
"""

from __future__ import annotations

from cardbus.eventstore.nats.connection import NatsOptions

__all__ = ["NatsOptions"]
