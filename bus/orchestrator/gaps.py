"""Folding a stream without gaps: ``RunState.apply`` takes any version newer than the one
it has, so an event folded across a gap would hide the missing ones for good (they are
"already applied" by version). The orchestrator reads a gap from the log first."""

from __future__ import annotations

import logging
from collections.abc import Callable

from cardbus.bus.orchestrator.runstate import RunState
from cardbus.eventstore import Envelope, EventStore
from cardbus.eventstore.errors import CardbusError

__all__ = ["fill_gap"]

log = logging.getLogger(__name__)


async def fill_gap(
    store: EventStore, state: RunState, env: Envelope, apply: Callable[[Envelope], bool]
) -> None:
    """Before ``env`` is folded: fold the events of its stream between the version folded
    and ``env`` from the log, if any are missing. A stream never folded (0) is left alone:
    a finished run dropped from memory (``retain_finished``) is not read back."""
    folded = state.versions.get(env.stream, 0)
    if folded == 0 or env.version <= folded + 1:
        return
    log.warning(
        "%s: version %d came with %d folded: reading the gap", env.stream, env.version, folded
    )
    try:
        for missing in await store.read_stream(env.stream, folded + 1):
            if missing.version >= env.version:
                break
            apply(missing)
    except CardbusError as e:  # the log cannot be read now: folded as before, with the gap
        log.warning("%s: the gap could not be read: %s", env.stream, e)
