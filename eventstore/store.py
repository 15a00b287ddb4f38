"""The ``EventStore`` interface: the contract every backend keeps.

Backends are sibling modules (``sqlite``, ``memory``, ``nats``) and all pass
``cardbus.testing.EventStoreContract`` (``tests/contract/eventstore.py``),
which a third-party backend subclasses too. The contract:

* ``append(stream, events, expected_version)`` is atomic per call: all of the
  events are stored, in order, with versions ``expected_version + 1 ...``, or
  none is. ``expected_version`` is the version of the stream's last event
  (0 for a new stream); any other actual version raises ``ConcurrencyError``
  carrying stream, expected and actual, and changes nothing.
* Appends are idempotent by event id: re-appending events that are already
  stored (a retry after a lost reply) is a no-op that returns the originally
  stored envelopes, whatever ``expected_version`` says. Reusing an id for
  different content raises ``IdempotencyError``.
* ``append`` returns only once the events are durable, with their positions.
  Positions are global, strictly increasing, and assigned in commit order.
* ``append_many(appends)`` makes several appends at once, each atomic on its
  own (not together) and checked as if made alone, in no promised order; it
  returns one outcome per append, in the order given: the stored envelopes or
  the error that append raised. An append may name earlier ones in the list
  as ``after``: it is stored after them, and only if they all were; if not,
  its outcome is ``PrerequisiteNotStored`` and it changes nothing. (A
  decision made on a result that is itself being written goes in the same
  call, ``after`` it: both can share a commit, and the decision can never be
  in the log without the result.) A backend may commit them together (SQLite
  does, in one transaction); the default runs independent appends
  concurrently.
* ``read_stream`` returns a stream's events in version order;
  ``read_all(from_position, limit)`` the log in position order, from the
  first event whose position is >= ``from_position``;
  ``read_correlation(root_id)`` every event of a root task and its subtasks,
  in position order.
* ``subscribe(from_position)`` yields every event with position >=
  ``from_position``: first the stored ones (catch-up), then new ones as they
  are appended (live), in position order, with no gap and no duplicate.
* ``verify(stream=None)`` re-checks hash chains and names every event where a
  chain breaks.
* ``head()`` is the end of the log (position and log hash, see ``loghead``;
  ``log_hash_at(position)`` the log hash at any position, None if not kept);
  ``audit(head)`` checks the whole log (both chains, positions, and, against
  a head kept outside it, truncation). The defaults compute both from
  ``read_all``; a backend that stores the log chain answers from it.
* Bad input never changes the log: it raises a ``CardbusError`` subclass.
"""

from __future__ import annotations

import abc
import asyncio
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass

from cardbus.eventstore.audit import StoredRow, audit
from cardbus.eventstore.envelope import ChainProblem, Envelope, NewEvent, encode_body
from cardbus.eventstore.errors import PrerequisiteNotStored, ValidationError
from cardbus.eventstore.loghead import LogHead

__all__ = ["Append", "EventStore", "check_after"]


@dataclass(frozen=True, slots=True)
class Append:
    """One stream's part of ``append_many``: the arguments ``append`` takes."""

    stream: str
    events: Sequence[NewEvent]
    expected_version: int
    after: tuple[int, ...] = ()  # indexes of earlier appends in the list it must follow


class EventStore(abc.ABC):
    """Append-only, per-stream versioned, globally ordered event log."""

    @abc.abstractmethod
    async def append(
        self, stream: str, events: Sequence[NewEvent], expected_version: int
    ) -> list[Envelope]:
        """Store ``events`` at the end of ``stream``; see the module docstring."""

    async def append_many(self, appends: Sequence[Append]) -> list[list[Envelope] | Exception]:
        """Several appends at once: per append, its envelopes or its error."""
        check_after(appends)
        outcomes: list[list[Envelope] | Exception | None] = [None] * len(appends)
        todo = list(range(len(appends)))
        while todo:  # in waves: each append once everything it follows has settled
            ready = [i for i in todo if all(outcomes[j] is not None for j in appends[i].after)]
            todo = [i for i in todo if i not in ready]
            run = []
            for i in ready:
                if all(isinstance(outcomes[j], list) for j in appends[i].after):
                    run.append(i)
                else:
                    outcomes[i] = PrerequisiteNotStored(f"{appends[i].stream}: not attempted")
            results = await asyncio.gather(
                *(
                    self.append(appends[i].stream, appends[i].events, appends[i].expected_version)
                    for i in run
                ),
                return_exceptions=True,
            )
            for i, r in zip(run, results, strict=True):
                outcomes[i] = _outcome(r)
        return [o for o in outcomes if o is not None]

    @abc.abstractmethod
    async def read_stream(self, stream: str, from_version: int = 1) -> list[Envelope]:
        """Events of one stream with version >= ``from_version`` (empty if none)."""

    @abc.abstractmethod
    async def read_all(self, from_position: int = 0, limit: int = 1000) -> list[Envelope]:
        """At most ``limit`` events with position >= ``from_position``."""

    @abc.abstractmethod
    async def read_correlation(self, correlation_id: str) -> list[Envelope]:
        """Every event of a root task and its subtasks, in position order."""

    @abc.abstractmethod
    def subscribe(self, from_position: int = 0) -> AsyncIterator[Envelope]:
        """Catch-up then live events, in order, no gap, no duplicate."""

    @abc.abstractmethod
    async def stream_version(self, stream: str) -> int:
        """Version of the stream's last event, 0 if the stream has none."""

    @abc.abstractmethod
    async def last_position(self) -> int:
        """Position of the newest event, 0 for an empty log."""

    @abc.abstractmethod
    async def verify(self, stream: str | None = None) -> list[ChainProblem]:
        """Every broken link of one stream's hash chain, or of the whole log."""

    async def log_hash_at(self, position: int) -> str | None:
        """The log hash at ``position`` if the backend keeps one (SQLite does), else None."""
        return None

    async def head(self) -> LogHead:
        """The end of the log: its last position and the log hash there."""
        _, head = await self.audit()
        return head

    async def audit(self, head: LogHead | None = None) -> tuple[list[ChainProblem], LogHead]:
        """Every problem of the whole log (against ``head`` if given), and where it ends."""
        rows: list[StoredRow] = []
        position = 0
        while batch := await self.read_all(position + 1, 5000):
            rows.extend(
                StoredRow(
                    e.position,
                    e.event_id,
                    e.stream,
                    e.version,
                    e.correlation_id,
                    e.type,
                    encode_body(e),
                    e.hash,
                    None,
                )
                for e in batch
            )
            position = batch[-1].position
        return audit(rows, head, log_chain=False)

    async def close(self) -> None:  # noqa: B027 - optional for backends with nothing to close
        """Release connections; the store is unusable afterwards."""

    async def __aenter__(self) -> EventStore:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


def _outcome(result: list[Envelope] | BaseException) -> list[Envelope] | Exception:
    if isinstance(result, BaseException) and not isinstance(result, Exception):
        raise result  # cancellation and the like are not an append's outcome
    return result


def check_after(appends: Sequence[Append]) -> None:
    """``after`` may only name earlier appends of the same call."""
    for i, a in enumerate(appends):
        if any(not 0 <= j < i for j in a.after):
            raise ValidationError(
                f"append {i} ({a.stream!r}): after={a.after} must name earlier ones"
            )
