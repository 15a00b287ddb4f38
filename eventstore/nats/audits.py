"""Whole-log tamper evidence on JetStream: ``head()`` and ``audit(head)``.

The position of an event is its stream sequence, and JetStream never reuses
a sequence: a message deleted (``STREAM.MSG.DELETE``), a subject purged or
the tail cut leaves a gap, and the stream's state still names the last
sequence it assigned. So the audit reads every stored message of the log
(direct get, no consumer) with the stream's state taken just before, and
names, each at its position:

* every gap in the sequences (``positions a..b missing (deleted)``), from 1
  on (a purge of the oldest events moves the stream's ``first_seq``);
* missing events at the end: the stream's ``last_seq`` is past the last
  stored event (its last events deleted or purged);
* the columns reads use, here the subject's tokens (task, root, kind) and
  the ``Nats-Msg-Id`` header (the event id), against the body;
* each body against its ``Cardbus-Hash`` and each task's hash chain
  (``eventstore.audit``);
* against a head kept outside the log (``cardbus head``): a log that ends
  before it, or another log hash at its position (``loghead``).

JetStream keeps no log chain beside the messages (an event's sequence is
only known once it is stored, and several writers append at once), so the
log hash is computed here, over the sequences: a head kept elsewhere is what
catches a stream deleted and written again from a shorter copy.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import NamedTuple

from cardbus.eventstore.audit import LOG_STREAM, StoredRow, audit
from cardbus.eventstore.envelope import ChainProblem, decode_body
from cardbus.eventstore.errors import DecodeError
from cardbus.eventstore.loghead import LogHead
from cardbus.eventstore.nats.connection import transient, translated
from cardbus.eventstore.nats.reads import Reads
from cardbus.eventstore.nats.subjects import (
    DEFAULT_PARTITIONS,
    all_filter,
    decode_token,
    kind_token,
    partition_token,
)
from cardbus.eventstore.nats.wire import Stored

__all__ = ["Audits", "StreamState", "audit_messages"]


class StreamState(NamedTuple):
    """What the stream says about itself (``STREAM.INFO``'s state)."""

    first_seq: int
    last_seq: int
    messages: int
    num_deleted: int


def _subject_problems(prefix: str, msg: Stored, partitions: int) -> list[ChainProblem]:
    """What the message's subject tokens and msg id get wrong about its body."""
    try:
        env = decode_body(msg.data, max_bytes=1 << 62)
    except DecodeError:
        return []  # the stream chain names an undecodable body
    where = (env.stream, msg.seq, env.event_id, env.version)
    if not msg.subject.startswith(prefix + "."):
        return [ChainProblem(*where, f"subject {msg.subject!r} is not under {prefix}.>")]
    tokens = msg.subject[len(prefix) + 1 :].split(".")
    if len(tokens) != 4:
        return [
            ChainProblem(*where, f"subject {msg.subject!r} is not <task>.<partition>.<root>.<kind>")
        ]
    task, part, root, kind = decode_token(tokens[0]), tokens[1], decode_token(tokens[2]), tokens[3]
    problems = []
    for name, got, want in (
        ("task", task, env.stream),
        ("partition", part, partition_token(env.correlation_id, partitions)),
        ("root", root, env.correlation_id),
        ("kind", kind, kind_token(env.type)),
    ):
        if got != want:
            problems.append(
                ChainProblem(*where, f"subject {name} is {got!r}, the body says {want!r}")
            )
    if msg.msg_id and msg.msg_id != env.event_id:
        problems.append(
            ChainProblem(*where, f"Nats-Msg-Id is {msg.msg_id!r}, the body says {env.event_id!r}")
        )
    return problems


def _row(msg: Stored) -> StoredRow:
    """The message as ``eventstore.audit`` reads rows: the columns are the body's own (the
    subject's tokens are checked by ``_subject_problems``), the hash is the header."""
    try:
        env = decode_body(msg.data, max_bytes=1 << 62)
    except DecodeError:
        return StoredRow(msg.seq, msg.msg_id, "?", 0, "?", "?", bytes(msg.data), msg.hash, None)
    return StoredRow(
        msg.seq,
        env.event_id,
        env.stream,
        env.version,
        env.correlation_id,
        env.type,
        bytes(msg.data),
        msg.hash,
        None,
    )


def audit_messages(
    prefix: str,
    msgs: Iterable[Stored],
    state: StreamState,
    head: LogHead | None = None,
    partitions: int = DEFAULT_PARTITIONS,
) -> tuple[list[ChainProblem], LogHead]:
    """Every problem of the log's stored messages (in sequence order), and its head."""
    kept = [m for m in msgs if m.seq <= state.last_seq]
    problems: list[ChainProblem] = []
    for m in kept:
        problems.extend(_subject_problems(prefix, m, partitions))
    found, end = audit(map(_row, kept), head, log_chain=False)
    problems.extend(found)
    last = kept[-1].seq if kept else 0
    if state.last_seq > last:
        missing = f"{last + 1}" + (f"..{state.last_seq}" if state.last_seq > last + 1 else "")
        problems.append(
            ChainProblem(
                LOG_STREAM,
                last + 1,
                "?",
                0,
                f"positions {missing} missing at the end (deleted or purged): the stream's"
                f" last sequence is {state.last_seq}, its last stored event is at {last}",
            )
        )
    deleted = state.last_seq - len(kept)
    if state.num_deleted and deleted != state.num_deleted + max(0, state.first_seq - 1):
        # the server's count of deleted messages within first..last disagrees with the
        # gaps found: say so (the gaps themselves are named above)
        problems.append(
            ChainProblem(
                LOG_STREAM,
                0,
                "?",
                0,
                f"the stream counts {state.num_deleted} deleted message(s) from sequence"
                f" {state.first_seq}; {deleted} position(s) up to {state.last_seq} are missing",
            )
        )
    problems.sort(key=lambda p: p.position)
    return problems, end


class Audits(Reads):
    """The auditing part of ``NatsEventStore``."""

    async def stream_state(self) -> StreamState:
        """The stream's first and last sequence, message count and deleted count."""
        self._check_open()

        async def info() -> StreamState:
            with translated("cannot read stream info", error=transient, refused=transient):
                s = (await self._js.stream_info(self.stream_name)).state
            return StreamState(
                int(s.first_seq or 0),
                int(s.last_seq or 0),
                int(s.messages or 0),
                int(s.num_deleted or 0),
            )

        return await self._retry(info)

    async def audit(self, head: LogHead | None = None) -> tuple[list[ChainProblem], LogHead]:
        """Every problem of the whole log on JetStream; see the module docstring."""
        state = await self.stream_state()  # first: appends during the read come after it
        filt = all_filter(self.subject_prefix)
        msgs = await self._retry(lambda: self._read(filt))
        return audit_messages(self.subject_prefix, msgs, state, head, self.partitions)
