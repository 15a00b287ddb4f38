"""The journal's check before it trusts the log: what a later attempt is answered from must
be what was recorded.

A replay hands a handler a recorded model answer or tool result as if the call had just
been made: an edit of the log would flow into the task's output unseen (and an edit that
makes a call look failed would have it made again). So before a later execution's call
is decided on the record (replayed, repeated, asked about) the journal
(``bus.orchestrator.journal``) checks that

* the task's stream verifies: the store's own ``verify(stream)``, the code ``cardbus
  verify`` runs (``envelope.event_hash`` over the stored bytes, the versions and
  ``prev_hash`` links, and on SQLite the read columns), once per stream up to the end
  the journal had folded when the execution began (a re-run's origin streams too);
* a recorded answer or result about to be used matches its digest (``answer_digest``,
  ``result_digest``: sha256 of the canonical JSON), checked by the journal at each use
  (a redacted answer's digest is over the answer as given: only the hash vouches for it).

Neither runs on a first execution's calls (there is no record to trust) and a stream is
read once per execution that consults one (the verified end is cached with the task's
journal): a live call of a first attempt checks nothing.
A failure is ``journal_tampered``: the message names the stream, the position and what
is wrong, and is kept, so every later call of the task is refused the same way.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from cardbus.eventstore.envelope import ChainProblem, Envelope
    from cardbus.eventstore.store import EventStore

__all__ = ["StreamTrust", "describe"]

#: at most this many problems are named in one message (the first is the one to look at)
_NAMED = 3


def describe(problems: list[ChainProblem]) -> str:
    """Problems of the log as one line each, the first few."""
    named = [f"stream {p.stream} position {p.position}: {p.problem}" for p in problems[:_NAMED]]
    more = len(problems) - _NAMED
    return "; ".join(named) + (f"; and {more} more" if more > 0 else "")


@dataclass(slots=True)
class StreamTrust:
    """What the log has vouched for, for one task's journal (its stream, and its origin's
    when it re-runs a recorded task)."""

    ends: dict[str, int] = field(default_factory=dict)  # stream -> last position folded
    verified: dict[str, int] = field(default_factory=dict)  # stream -> checked up to
    tampered: str = ""  # the first problem found (kept: the task is refused from then on)

    def saw(self, env: Envelope) -> None:
        if env.position > self.ends.get(env.stream, 0):
            self.ends[env.stream] = env.position

    def adopt(self, other: StreamTrust) -> None:
        """An origin's streams, folded into a re-run's journal."""
        for stream, end in other.ends.items():
            if end > self.ends.get(stream, 0):
                self.ends[stream] = end

    async def check(self, store: EventStore | None, stream: str, position: int) -> str:
        """ "" when the log vouches for the event at ``position`` of ``stream``; else what is
        wrong with the stream (kept in ``tampered``)."""
        if self.tampered:
            return self.tampered
        if store is None or not stream or self.verified.get(stream, 0) >= position > 0:
            return ""  # nothing stored to check (an in-memory journal), or checked already
        problems = await store.verify(stream)
        if problems:
            self.tampered = self.tampered or describe(problems)
            return self.tampered
        self.verified[stream] = max(position, self.ends.get(stream, 0))
        return ""
