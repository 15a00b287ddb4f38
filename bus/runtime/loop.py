"""The process a runtime runs in: its event loop and its garbage collector.

* :func:`run` -- run a coroutine on uvloop when it is installed (the
  ``cardbus[fast]`` extra), else on asyncio's own loop; ``CARDBUS_UVLOOP=0``
  keeps asyncio's loop. Every ``cardbus`` command runs through it.
* :func:`tune_gc` -- raise the cyclic collector's first threshold. The
  orchestrator makes many small, short-lived containers (events, cards,
  decisions) and keeps few cycles; at CPython's default of 700 allocations the
  collector took 11% of the 3-step pipeline's CPU (753 collections in 3,000
  runs, the 6 full ones walking every live object), at 10,000 it took 2%.
  At 1,000 runs in flight (200 ms agents) 10,000 still made it about a quarter
  of a step's CPU; 50,000 took the collector from 0.135 to 0.065 ms a step
  for about 1 KiB more RSS per waiting run (``bench/step_profile.py``).
  The runtimes call it when they start; ``CARDBUS_GC=default`` leaves the
  collector as it is.
"""

from __future__ import annotations

import asyncio
import gc
import os
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

__all__ = ["GC_THRESHOLDS", "loop_factory", "run", "tune_gc"]

T = TypeVar("T")

# (first generation, second, third): a young collection every 50,000 net
# allocations, an older one every 10 of those, a full one every 10 older ones
# (CPython also waits until a quarter of the long-lived objects are new).
GC_THRESHOLDS = (50_000, 10, 10)


def loop_factory() -> Callable[[], asyncio.AbstractEventLoop] | None:
    """uvloop's ``new_event_loop`` when it is installed and not turned off, else None."""
    if os.environ.get("CARDBUS_UVLOOP", "1") == "0":
        return None
    try:
        import uvloop
    except ImportError:
        return None
    return uvloop.new_event_loop


def run(main: Coroutine[Any, Any, T], *, debug: bool | None = None) -> T:
    """``asyncio.run(main)`` on the loop :func:`loop_factory` names."""
    with asyncio.Runner(debug=debug, loop_factory=loop_factory()) as runner:
        return runner.run(main)


def tune_gc() -> None:
    """Raise the collector's thresholds to :data:`GC_THRESHOLDS`; never lowers one a
    program set higher, and does nothing when ``CARDBUS_GC=default``."""
    if os.environ.get("CARDBUS_GC", "") == "default":
        return
    current = gc.get_threshold()
    if current[0] == 0:  # collection turned off by the program: leave it off
        return
    gc.set_threshold(*(max(c, t) for c, t in zip(current, GC_THRESHOLDS, strict=True)))
