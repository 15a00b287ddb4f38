"""``append_many`` on NATS: the appends of one call (one decision of the orchestrator) as
one JetStream atomic batch, with one acknowledgement.

Each event stays a message of its own, on its own subject
(``<prefix>.<task>.<partition>.<root>.<kind>``), at its own stream sequence
(its position), with its own ``Nats-Msg-Id`` and hash header: a consumer filtered
on one task's subjects receives exactly that task's events, and a reader cannot
tell a batched append from one published alone. The batch carries, on the first
message of each append, the expected last sequence of that append's task
(``Nats-Expected-Last-Subject-Sequence`` with its subject filter), so each task
keeps its optimistic concurrency; the server stores the whole batch or none of it
(ADR-50, nats-server 2.12+: ``Nats-Batch-Id``, ``Nats-Batch-Sequence``,
``Nats-Batch-Commit``; only the commit is acknowledged). Batches waiting behind
one in flight go out together (the group commit of ``appends.py``).

What is decided before anything is sent (an argument refused, a version that does
not match, a payload too large, the repeat of stored events) is each append's own
outcome, and an append following one that failed is ``PrerequisiteNotStored``.
If the server refuses the batch as a whole (one task's expected sequence, a
duplicate id), nothing of it was stored, and the call is made again one append
at a time (``EventStore.append_many``), where each append gets its own answer.
The same per-append path serves a stream without atomic batches (created
without ``allow_atomic``, or a server before 2.12): such a stream stays readable
and writable, one publish per event.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import cast

import nats.errors
import nats.js.errors

from cardbus.eventstore.batch import check_append_args, seal_batch
from cardbus.eventstore.envelope import Envelope
from cardbus.eventstore.errors import CardbusError, PrerequisiteNotStored
from cardbus.eventstore.nats.appends import (
    _EMPTY_HEAD,
    _MAYBE_STORED,
    Appends,
    Head,
    _Part,
    _Unit,
)
from cardbus.eventstore.nats.connection import is_transient, transient, translated
from cardbus.eventstore.nats.follow import offer_appended
from cardbus.eventstore.nats.subjects import event_subjects, stream_filter
from cardbus.eventstore.store import Append, EventStore, check_after

__all__ = ["Together"]

Outcome = list[Envelope] | Exception


class _Apart(Exception):
    """The server refused the batch as a whole: make the appends one at a time."""


class Together(Appends):
    """``append_many`` as one atomic batch (the part of ``NatsEventStore`` doing it)."""

    async def append_many(self, appends: Sequence[Append]) -> list[Outcome]:
        check_after(appends)
        streams = {a.stream for a in appends if type(a.stream) is str}  # (bad ones: below)
        events = sum(len(a.events) if isinstance(a.events, Sequence) else 0 for a in appends)
        if not self.atomic or len(appends) < 2 or len(streams) < len(appends):
            # one append is already one publish or batch; without atomic batches, or
            # with two appends to one task (one expected sequence each), one at a time
            return await self._one_at_a_time(appends)
        if events > self.max_batch:
            return await self._one_at_a_time(appends)
        try:
            self._check_open()
            outcomes = await self._retry(lambda: self._together(appends))
        except _Apart:
            return await self._one_at_a_time(appends)
        except CardbusError as e:  # the store cannot be reached: every append's outcome
            if e.__cause__ is not None and is_transient(e.__cause__):  # gave up retrying
                e.add_note(f"append_many not confirmed: {_MAYBE_STORED}")
            return [e for _ in appends]
        for outcome in outcomes:
            if isinstance(outcome, list) and outcome:
                offer_appended(self.nc, (self.stream_name, self.subject_prefix), outcome)
        return outcomes

    async def _one_at_a_time(self, appends: Sequence[Append]) -> list[Outcome]:
        """The interface's ``append_many``: each append on its own, concurrently."""
        return await EventStore.append_many(cast(EventStore, self), appends)

    async def _together(self, appends: Sequence[Append]) -> list[Outcome]:
        """One try: each append's outcome, the ones that can be stored in one batch."""
        outcomes: list[Outcome | None] = [None] * len(appends)
        ready: dict[int, tuple[str, list[str]]] = {}  # index -> (its task filter, subjects)
        for i, a in enumerate(appends):
            if not self._prerequisites_stored(appends, outcomes, i):
                continue
            try:
                check_append_args(a.stream, a.events, a.expected_version)
                subjects = event_subjects(self.subject_prefix, a.stream, a.events, self.partitions)
            except CardbusError as e:
                outcomes[i] = e
                continue
            ready[i] = (stream_filter(self.subject_prefix, a.stream), subjects)
        heads = await self._heads_of({i: appends[i] for i in ready})
        parts: dict[int, _Part] = {}
        for i, (filt, subjects) in ready.items():
            a = appends[i]
            if not self._prerequisites_stored(appends, outcomes, i):
                continue
            head = heads[i]
            try:
                if head.version != a.expected_version:  # a conflict, or the repeat of stored events
                    outcomes[i] = await self._replay_or_conflict(
                        a.stream, list(a.events), a.expected_version, head
                    )
                    continue
                sealed = seal_batch(
                    a.stream,
                    a.events,
                    a.expected_version,
                    head.version,
                    head.hash,
                    self.max_event_bytes,
                )
                part = _Part(a.stream, filt, head, sealed, subjects)
                self._check_sizes(part)
            except CardbusError as e:
                if is_transient(e):
                    raise
                outcomes[i] = e
                continue
            parts[i] = part
        if len(parts) == 1:  # one left: the plain append (its own checks and answers)
            [(i, part)] = parts.items()
            try:
                outcomes[i] = await self._append(
                    part.stream, list(appends[i].events), appends[i].expected_version
                )
            except CardbusError as e:
                if is_transient(e):
                    raise  # the whole call is tried again (store retries)
                outcomes[i] = e
        elif parts:
            unit = _Unit(list(parts.values()), asyncio.get_running_loop())
            with translated("append_many", error=transient):
                try:
                    stored = await self._commit_unit(unit)
                except (nats.js.errors.APIError, nats.errors.MaxPayloadError) as e:
                    if is_transient(e):
                        raise
                    raise _Apart from e  # nothing of the batch is stored
            for i, envs in zip(parts, stored, strict=True):
                outcomes[i] = envs
        for i in range(len(appends)):  # what follows an append refused after the checks
            if outcomes[i] is None:
                outcomes[i] = PrerequisiteNotStored(f"{appends[i].stream}: not attempted")
        return [o for o in outcomes if o is not None]

    @staticmethod
    def _prerequisites_stored(
        appends: Sequence[Append], outcomes: list[Outcome | None], i: int
    ) -> bool:
        """False (and ``PrerequisiteNotStored`` as its outcome) if an append ``i`` follows
        has failed already."""
        if all(not isinstance(outcomes[j], Exception) for j in appends[i].after):
            return True
        outcomes[i] = PrerequisiteNotStored(f"{appends[i].stream}: what it follows was not stored")
        return False

    async def _heads_of(self, appends: dict[int, Append]) -> dict[int, Head]:
        """Each append's task head: cached, taken as new when the caller says so, else
        read from the leader (the server checks each one anyway)."""
        heads: dict[int, Head] = {}
        lookups: dict[int, str] = {}
        for i, a in appends.items():
            head = self._heads.get(a.stream)
            if head is None and a.expected_version == 0:
                heads[i] = _EMPTY_HEAD
            elif head is None or head.version != a.expected_version:
                lookups[i] = a.stream
            else:
                heads[i] = head
        if lookups:
            found = await asyncio.gather(*(self._lookup_head(s) for s in lookups.values()))
            heads.update(zip(lookups, found, strict=True))
        return heads
