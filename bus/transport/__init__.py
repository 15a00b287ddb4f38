"""Transport: how cards and replies travel between the orchestrator and agents.

``interface`` documents the ``Bus`` contract once; ``inprocess`` (one process,
the embedded default) and ``nats`` (JetStream work queues) are its backends.
"""

from __future__ import annotations

from .inprocess import InProcessBus
from .interface import Bus, CardHandler, RequestHandler

__all__ = ["Bus", "CardHandler", "InProcessBus", "RequestHandler"]
