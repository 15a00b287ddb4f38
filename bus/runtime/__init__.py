"""Runtimes: the assemblies users start. ``embedded`` runs everything in one process
over any store; ``nats`` runs the orchestrator and agents over NATS JetStream;
``worker`` is the agent side of either (an ``Agent`` consuming its inbox).

Names are loaded on first use, so ``cardbus.bus.runtime.loop`` alone stays cheap.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from cardbus.bus.runtime.embedded import EmbeddedRuntime
    from cardbus.bus.runtime.worker import AgentWorker

# public name -> the module that defines it
_HOME = {
    "AgentWorker": "cardbus.bus.runtime.worker",
    "EmbeddedRuntime": "cardbus.bus.runtime.embedded",
}
__all__ = [
    "AgentWorker",
    "EmbeddedRuntime",
]


def __getattr__(name: str) -> Any:
    home = _HOME.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(home), name)
    globals()[name] = value  # later look-ups skip this function
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *__all__])
