"""The event envelope, its codec and the per-stream hash chain.

The bytes a store keeps for an event (its *body*) are the envelope encoded
without ``position`` and ``hash``: the position is assigned by the store (on
NATS it is the stream sequence, known only after the publish), and the hash is
``sha256(body)``. Because the body contains ``prev_hash``, each event commits
to its predecessor in the same stream, so an edit, deletion, insertion or
reordering breaks the chain and ``verify`` names the event where it breaks.
"""

from __future__ import annotations

import contextlib
import gc
import hashlib
import time
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

import msgspec

from cardbus.eventstore.errors import DecodeError, PayloadTooLarge, UnknownEventType
from cardbus.eventstore.events import Event, tag_of
from cardbus.eventstore.ids import new_id

__all__ = [
    "DEFAULT_MAX_EVENT_BYTES",
    "GENESIS_HASH",
    "Envelope",
    "NewEvent",
    "ChainProblem",
    "collection_paused",
    "decode_body",
    "decode_stored",
    "encode_body",
    "event_hash",
    "seal",
    "verify_chain",
]

DEFAULT_MAX_EVENT_BYTES = 1024 * 1024
GENESIS_HASH = "0" * 64


class Envelope(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True, gc=False):
    """One stored event. ``type`` is the tag of ``data``.

    ``gc=False``: an envelope cannot be part of a reference cycle (its fields
    are strings, numbers and the event payload), so the garbage collector does
    not track it; this makes decoding a large scan about 15% faster.
    """

    event_id: str
    stream: str
    version: int
    recorded_at: float
    correlation_id: str
    causation_id: str | None = None
    actor: str = ""
    traceparent: str | None = None
    data: Event
    prev_hash: str = GENESIS_HASH
    # Not part of the body: set by the store when read back.
    position: int = 0
    hash: str = ""

    @property
    def type(self) -> str:
        return tag_of(self.data)


class NewEvent(msgspec.Struct, frozen=True, kw_only=True):
    """What a writer hands to ``EventStore.append``; the store adds the rest."""

    data: Event
    correlation_id: str
    causation_id: str | None = None
    actor: str = ""
    traceparent: str | None = None
    event_id: str = msgspec.field(default_factory=new_id)
    recorded_at: float = msgspec.field(default_factory=time.time)

    @property
    def type(self) -> str:
        return tag_of(self.data)


_encoder = msgspec.json.Encoder()
_decoder = msgspec.json.Decoder(Envelope)
_replace = msgspec.structs.replace
_GC_PAUSE_ROWS = 256
_sha256 = hashlib.sha256


def event_hash(body: bytes | bytearray | memoryview) -> str:
    """An event's hash: sha256 of its stored body. The one place it is computed: sealing
    an event, ``verify`` and the journal's check before a replay all use it."""
    return _sha256(body).hexdigest()


def seal(
    new: NewEvent, stream: str, version: int, prev_hash: str, position: int = 0
) -> tuple[Envelope, bytes]:
    """Give a new event its place in a stream: the envelope (hash set) and its body.

    ``position`` is set on the returned envelope when the caller already knows
    it (it is never part of the body).
    """
    env = Envelope(
        event_id=new.event_id,
        stream=stream,
        version=version,
        recorded_at=new.recorded_at,
        correlation_id=new.correlation_id,
        causation_id=new.causation_id,
        actor=new.actor,
        traceparent=new.traceparent,
        data=new.data,
        prev_hash=prev_hash,
    )
    body = _encoder.encode(env)
    return _replace(env, position=position, hash=event_hash(body)), body


def encode_body(env: Envelope) -> bytes:
    """The body bytes of an envelope (position and hash left out)."""
    return _encoder.encode(msgspec.structs.replace(env, position=0, hash=""))


def decode_body(
    body: bytes | bytearray | memoryview,
    position: int = 0,
    hash: str = "",
    max_bytes: int = DEFAULT_MAX_EVENT_BYTES,
) -> Envelope:
    """Decode stored body bytes; every failure is a typed ``DecodeError``."""
    if len(body) > max_bytes:
        raise PayloadTooLarge(len(body), max_bytes)
    try:
        env = _decoder.decode(body)
    except msgspec.ValidationError as e:
        msg = str(e)
        if "`$.data.type`" in msg and "Invalid value" in msg:
            tag = _find_tag(body)
            raise UnknownEventType(tag) from e
        raise DecodeError(f"invalid event: {msg}") from e
    except msgspec.DecodeError as e:
        raise DecodeError(f"malformed event bytes: {e}") from e
    if position or hash:
        env = _replace(env, position=position, hash=hash)
    return env


@contextlib.contextmanager
def collection_paused(rows: int) -> Iterator[None]:
    """The cyclic collector paused while a page of ``rows`` events is decoded.

    Decoding a page allocates many payload structs the collector tracks; a collection
    every few hundred of them costs more than the decoding (and more the larger the
    heap). None of them can be garbage while the page is built, so collection is
    paused for the page and resumes at once."""
    pause = gc.isenabled() and rows >= _GC_PAUSE_ROWS
    if pause:
        gc.disable()
    try:
        yield
    finally:
        if pause:
            gc.enable()


def decode_stored(rows: Sequence[tuple[int, bytes, str]]) -> list[Envelope]:
    """Decode stored ``(position, body, hash)`` rows: the fast path of every read.

    Stored bodies were checked when they were appended, so no size limit
    applies here; a body that does not decode still raises ``DecodeError``.
    """
    dec = _decoder.decode
    try:
        with collection_paused(len(rows)):
            return [_replace(dec(body), position=position, hash=h) for position, body, h in rows]
    except msgspec.DecodeError:
        pass
    # Slow path, only to name the bad row with a typed error.
    return [decode_body(body, position, h, max_bytes=1 << 62) for position, body, h in rows]


def _find_tag(body: bytes | bytearray | memoryview) -> str:
    try:
        raw: Any = msgspec.json.decode(body)
        return str(raw["data"]["type"])
    except Exception:
        return "?"


class ChainProblem(msgspec.Struct, frozen=True):
    """One event where a stream's hash chain breaks, and why."""

    stream: str
    position: int
    event_id: str
    version: int
    problem: str


def verify_chain(rows: Iterable[tuple[int, bytes | str, str]], stream: str) -> list[ChainProblem]:
    """Check one stream's chain from its stored rows ``(position, body, hash)``.

    Rows must be given in store order. Finds edited bodies (hash mismatch),
    deleted or inserted events (version gaps, broken prev_hash links) and
    reordering (versions out of order).
    """
    problems: list[ChainProblem] = []
    expected_version = 1
    prev_hash = GENESIS_HASH
    for position, stored, stored_hash in rows:
        # A body edited by hand may come back as TEXT; hash the bytes it stands for.
        body = stored.encode("utf-8", "surrogatepass") if isinstance(stored, str) else stored
        try:
            env = decode_body(body, max_bytes=1 << 62)
        except DecodeError as e:
            problems.append(ChainProblem(stream, position, "?", 0, f"undecodable: {e}"))
            continue
        where = (stream, position, env.event_id, env.version)
        if event_hash(body) != stored_hash:
            problems.append(ChainProblem(*where, "content does not match its hash (edited)"))
        if env.stream != stream:
            problems.append(ChainProblem(*where, f"belongs to stream {env.stream!r}"))
        if env.version != expected_version:
            kind = (
                "missing predecessor (deleted?)"
                if env.version > expected_version
                else ("out of order or duplicated (reordered/inserted?)")
            )
            problems.append(
                ChainProblem(*where, f"version {env.version}, expected {expected_version}: {kind}")
            )
        if env.prev_hash != prev_hash:
            problems.append(ChainProblem(*where, "prev_hash does not link to the previous event"))
        expected_version = env.version + 1
        prev_hash = stored_hash
    return problems
