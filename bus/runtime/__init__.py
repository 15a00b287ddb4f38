"""Runtimes: the assemblies users start. ``embedded`` runs everything in one process
over any store; ``nats`` runs the orchestrator and agents over NATS JetStream;
``worker`` is the agent side of either (an ``Agent`` consuming its inbox).
"""

from __future__ import annotations

from .embedded import EmbeddedRuntime
from .worker import AgentWorker

__all__ = ["AgentWorker", "EmbeddedRuntime"]
