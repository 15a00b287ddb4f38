"""A log that refuses writes: a hiccup is retried, a refusal that lasts stops the deciding.

The orchestrator reports each write the log refused (``StoreUnavailable``: disk full,
read-only, gone) and each that worked. A refusal starts the grace
(``Policy.store_grace_s``); a write that works within it ends it; once the grace is
over with no write working, ``on_failed`` is told (once): the orchestrator then ends
every wait with the error and decides no more (``Orchestrator.store_failure``).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

from cardbus.eventstore.errors import StoreUnavailable

__all__ = ["StoreTrouble"]

log = logging.getLogger(__name__)


class StoreTrouble:
    def __init__(self, grace_s: float, on_failed: Callable[[StoreUnavailable], None]) -> None:
        self.grace_s = grace_s
        self.on_failed = on_failed
        self.since: float | None = None  # the first refusal since the last write that worked

    def worked(self) -> None:
        """A write went through: the log takes writes again."""
        self.since = None

    def refused(self, error: StoreUnavailable) -> None:
        """A write refused by the log: retried (the step is decided again) until the log has
        refused writes for ``grace_s``; then ``on_failed``."""
        now = time.monotonic()
        if self.since is None:
            self.since = now
            log.warning("cannot write to the log, retrying: %s", error)
            # nothing may try to write again soon (the decision lost was the only one):
            # look again when the grace is over; a write that worked meanwhile resets it
            asyncio.get_running_loop().call_later(self.grace_s, self._grace_over, now, error)
        elif now - self.since >= self.grace_s:
            self.on_failed(error)

    def _grace_over(self, since: float, error: StoreUnavailable) -> None:
        if self.since == since:  # no write has worked since that refusal
            self.on_failed(error)
