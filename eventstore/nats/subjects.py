"""Subjects of the log: ids as subject tokens, one event's subject, the read filters.

``<prefix>.<task>.<partition>.<root>.<kind>``, the task first so that a task's filter
(``<prefix>.<task>.>``) is a literal prefix nats-server finds without walking
every subject (README, "Running on NATS"); then the run's partition, so that one
partition is readable on its own (``<prefix>.*.<partition>.>``): an orchestrator
member follows only the partitions it holds. A run's partition is a stable CRC-32
of its root id modulo the stream's partition count (the stream's metadata
``cardbus.partitions``); what every member needs (agents' registrations,
orchestrator starts, long-term memory: the correlation ids of ``SHARED_PREFIXES``)
is in the shared partition ``s``. The task stays first (not the partition):
``read_stream`` and the per-append concurrency check know only the task, not its run.
These are pure functions: no network, no state.
"""

from __future__ import annotations

import functools
import re
import zlib
from collections.abc import Iterable
from typing import Any

from cardbus.eventstore.errors import ValidationError

__all__ = [
    "DEFAULT_STREAM",
    "DEFAULT_SUBJECT_PREFIX",
    "MAX_SUBJECT_LEN",
    "DEFAULT_PARTITIONS",
    "OLD_LAYOUT",
    "PARTITIONS_KEY",
    "PREVIOUS_LAYOUT",
    "SHARED",
    "SUBJECT_LAYOUT",
    "SUBJECT_LAYOUT_KEY",
    "all_filter",
    "checked",
    "correlation_filter",
    "decode_token",
    "encode_token",
    "event_subject",
    "event_subjects",
    "kind_token",
    "partition_filter",
    "partition_of",
    "partition_token",
    "stream_filter",
    "stream_of_subject",
]

DEFAULT_STREAM = "CARDBUS_EVENTS"
DEFAULT_SUBJECT_PREFIX = "cardbus.evt"
MAX_SUBJECT_LEN = 3500  # a publish line must fit nats-server's max_control_line (4 KiB)
# The stream's metadata names the order of the subject tokens its events were written with.
SUBJECT_LAYOUT_KEY = "cardbus.subject-layout"
SUBJECT_LAYOUT = "task.part.root.kind"
# The layout before partitions: <prefix>.<task>.<root>.<kind>
PREVIOUS_LAYOUT = "task.root.kind"
# The layout before the marker existed: <prefix>.<root>.<task>.<kind>
OLD_LAYOUT = "root.task.kind"
# The stream's metadata names its partition count (fixed when the stream is made).
PARTITIONS_KEY = "cardbus.partitions"
DEFAULT_PARTITIONS = 32
MAX_PARTITIONS = 4096
SHARED = "s"  # the partition token of what every member folds
# correlation ids that are no run's: their events are in the shared partition
SHARED_PREFIXES = ("agent-", "orchestrator-", "memory")

_SAFE = re.compile(r"[A-Za-z0-9-]+")
_ESCAPED = re.compile(r"_([0-9a-f]{2})")
_KIND_UNSAFE = re.compile(r"[^A-Za-z0-9_-]")


def encode_token(value: str) -> str:
    """A reversible, subject-safe form of an id: one NATS subject token.

    ``A-Z a-z 0-9 -`` stay as they are, every other byte of the UTF-8 form
    becomes ``_`` + two lowercase hex digits (``r1.a`` -> ``r1_2ea``), and
    the empty string is the lone token ``_``.
    """
    if not value:
        return "_"
    if _SAFE.fullmatch(value):
        return value
    out: list[str] = []
    for ch in value:
        if ch.isascii() and (ch.isalnum() or ch == "-"):
            out.append(ch)
        else:
            out.extend(f"_{b:02x}" for b in ch.encode("utf-8", "surrogatepass"))
    return "".join(out)


def decode_token(token: str) -> str:
    """Inverse of :func:`encode_token`."""
    if token == "_":
        return ""
    if "_" not in token:
        return token
    raw = bytearray()
    i = 0
    while i < len(token):
        m = _ESCAPED.match(token, i)
        if m:
            raw.append(int(m.group(1), 16))
            i = m.end()
        else:
            raw.extend(token[i].encode())
            i += 1
    return raw.decode("utf-8", "surrogatepass")


@functools.lru_cache(maxsize=512)  # a few dozen event tags: one regex substitution each
def kind_token(tag: str) -> str:
    """``task.dispatched.v1`` -> ``task_dispatched_v1`` (not reversible; the body has the tag)."""
    return _KIND_UNSAFE.sub("-", tag.replace(".", "_")) or "_"


def partition_of(root_id: str, partitions: int) -> int:
    """The partition of a run: stable across processes and restarts (not ``hash``)."""
    return zlib.crc32(root_id.encode()) % partitions


def partition_token(correlation_id: str, partitions: int) -> str:
    """The partition token of an event: ``s`` (shared) or the run's partition number."""
    if correlation_id.startswith(SHARED_PREFIXES):
        return SHARED
    return str(partition_of(correlation_id, partitions))


def event_subject(prefix: str, root: str, stream: str, tag: str, partitions: int) -> str:
    """``<prefix>.<task>.<partition>.<root>.<kind>`` for one event (see the module doc)."""
    part = partition_token(root, partitions)
    return f"{prefix}.{encode_token(stream)}.{part}.{encode_token(root)}.{kind_token(tag)}"


def event_subjects(prefix: str, stream: str, events: Iterable[Any], partitions: int) -> list[str]:
    """:func:`event_subject` of each of one append's events (``NewEvent`` each), checked
    (:func:`checked`): the task's token made once, each root's once."""
    task = f"{prefix}.{encode_token(stream)}."
    roots: dict[str, str] = {}
    out = []
    for e in events:
        root = e.correlation_id
        middle = roots.get(root)
        if middle is None:
            middle = roots[root] = f"{partition_token(root, partitions)}.{encode_token(root)}."
        out.append(checked(f"{task}{middle}{kind_token(e.type)}"))
    return out


def checked(subject: str) -> str:
    """``subject``, or ``ValidationError`` when it is too long for a publish line."""
    if len(subject) > MAX_SUBJECT_LEN:
        raise ValidationError(
            f"subject of {len(subject)} chars is over {MAX_SUBJECT_LEN}: ids too long for NATS"
        )
    return subject


def stream_filter(prefix: str, stream: str) -> str:
    """Every event of one task: a literal prefix, cheap however long the log."""
    return checked(f"{prefix}.{encode_token(stream)}.>")


def correlation_filter(prefix: str, root: str, partitions: int) -> str:
    """Every event of one root task's tree: ``*`` first, so the server walks its index."""
    return checked(f"{prefix}.*.{partition_token(root, partitions)}.{encode_token(root)}.>")


def partition_filter(prefix: str, token: int | str) -> str:
    """Every event of one partition (a number, or ``SHARED``)."""
    return f"{prefix}.*.{token}.>"


def all_filter(prefix: str) -> str:
    return f"{prefix}.>"


def stream_of_subject(prefix: str, subject: str) -> str:
    """The task (cardbus stream) an event's subject names."""
    tokens = subject[len(prefix) + 1 :].split(".")
    return decode_token(tokens[0]) if len(tokens) >= 2 else subject
