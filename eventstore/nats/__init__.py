"""The NATS JetStream ``EventStore``: the distributed backend.

Same contract as the SQLite and in-memory backends (``eventstore/store.py``);
open it with ``await NatsEventStore.connect("nats://host:4222", ...)`` or
``open_store("nats://...")``. Every event is one message of the stream
``CARDBUS_EVENTS`` on ``cardbus.evt.<task>.<root>.<kind>``; the payload is the
envelope body, its sha256 is the header ``Cardbus-Hash``, its position the
stream sequence. Subjects, appends, reads, costs and the permissions a user
needs are described in the README ("Running on NATS").

Parts: ``subjects`` (pure subject functions), ``wire`` (headers, status and
error codes), ``connection`` (options, connect, error translation, store
retries; shared with the bus), ``appends``, ``reads``, ``follow``, ``audits``
(``head`` and ``audit``: whole-log tamper evidence), ``store``.
"""

from __future__ import annotations

from cardbus.eventstore.errors import SubjectLayoutError
from cardbus.eventstore.nats.store import NatsEventStore
from cardbus.eventstore.nats.subjects import (
    DEFAULT_STREAM,
    DEFAULT_SUBJECT_PREFIX,
    MAX_SUBJECT_LEN,
    SUBJECT_LAYOUT,
    SUBJECT_LAYOUT_KEY,
    decode_token,
    encode_token,
    event_subject,
    kind_token,
    partition_of,
)
from cardbus.eventstore.nats.wire import HASH_HEADER

__all__ = [
    "DEFAULT_STREAM",
    "DEFAULT_SUBJECT_PREFIX",
    "HASH_HEADER",
    "MAX_SUBJECT_LEN",
    "NatsEventStore",
    "SUBJECT_LAYOUT",
    "SUBJECT_LAYOUT_KEY",
    "SubjectLayoutError",
    "decode_token",
    "encode_token",
    "event_subject",
    "kind_token",
    "partition_of",
]
