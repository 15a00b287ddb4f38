"""What the decision loop's queue carries besides the log's events and agents' replies.

``Orchestrator._step`` takes, in order of arrival, the log's events (``Envelope``),
agents' replies and announcements, and these: the clock's signals (``TICK``,
``DUE``, ``LAPSED``), a request to send again what was dispatched and not taken
(``RESEND``), runs just written (``Changed``) and an agent request's events to
record (``Record``).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from cardbus.eventstore import Envelope
from cardbus.eventstore import events as ev

__all__ = ["DUE", "LAPSED", "RESEND", "TICK", "Changed", "Record"]

TICK = object()  # look at every open run
RESEND = object()  # send again the cards of our runs dispatched and not taken (resend)
DUE = object()  # look at the runs whose deadline or backoff has come
LAPSED = object()  # an agent's lease ran out: deregister it


@dataclass(frozen=True)
class Changed:
    """Runs whose streams were just written: only they need looking at again."""

    roots: frozenset[str]


@dataclass
class Record:
    """Events an agent request produced, for the decision loop to append to ``stream``."""

    stream: str
    events: list[ev.Event]
    done: asyncio.Future[list[Envelope]]
    tries: int = 0
