"""Backend-neutral checks and sealing of one ``append`` call.

Every backend runs new events through ``seal_batch`` so the rules live in one
place: the expected version must match, each event must encode, decode back
(nothing unreadable is ever stored) and fit the size limit, and the hash chain
continues from the stream's last hash.
"""

from __future__ import annotations

from collections.abc import Sequence

import msgspec

from .envelope import (
    DEFAULT_MAX_EVENT_BYTES,
    GENESIS_HASH,
    Envelope,
    NewEvent,
    decode_body,
    seal,
)
from .errors import (
    ConcurrencyError,
    DecodeError,
    IdempotencyError,
    PayloadTooLarge,
    ValidationError,
)
from .events import EVENT_TYPES, Event

__all__ = ["check_append_args", "check_replay", "seal_batch"]

_KNOWN = frozenset(EVENT_TYPES)


def check_append_args(stream: object, events: object, expected_version: object) -> None:
    if type(stream) is not str or not stream or len(stream) > 512:
        raise ValidationError(f"stream must be a non-empty string of at most 512 chars: {stream!r}")
    if not stream.isascii():
        _check_utf8("stream", stream)
    if type(expected_version) is not int:
        raise ValidationError(f"expected_version must be an int: {expected_version!r}")
    if expected_version < 0:
        raise ValidationError(f"expected_version must be >= 0: {expected_version}")
    if not isinstance(events, Sequence) or isinstance(events, str | bytes) or not events:
        raise ValidationError("append needs a non-empty sequence of NewEvent")
    for ev in events:
        if type(ev) is not NewEvent and not isinstance(ev, NewEvent):
            raise ValidationError(f"append takes NewEvent, got {type(ev).__name__}")
        if type(ev.data) not in _KNOWN:
            raise ValidationError(f"not a cardbus event type: {type(ev.data).__name__}")
        _check_metadata(ev)
    if len(events) > 1 and len({ev.event_id for ev in events}) != len(events):
        raise IdempotencyError("the same event id appears twice in one append")


def _check_metadata(ev: NewEvent) -> None:
    """The envelope fields a writer sets must have their declared types (cheap checks)."""
    event_id = ev.event_id
    if type(event_id) is not str or not 0 < len(event_id) <= 200:
        raise ValidationError(
            f"event_id must be a non-empty string of at most 200 chars: {event_id!r}"
        )
    if not event_id.isascii():
        _check_utf8("event_id", event_id)
    if type(ev.correlation_id) is not str:
        raise ValidationError(f"correlation_id must be a string: {ev.correlation_id!r}")
    if type(ev.actor) is not str:
        raise ValidationError(f"actor must be a string: {ev.actor!r}")
    causation, traceparent = ev.causation_id, ev.traceparent
    if causation is not None and type(causation) is not str:
        raise ValidationError(f"causation_id must be a string or None: {causation!r}")
    if traceparent is not None and type(traceparent) is not str:
        raise ValidationError(f"traceparent must be a string or None: {traceparent!r}")
    t = ev.recorded_at
    if type(t) is float:
        if t - t != 0.0:  # NaN or infinity
            raise ValidationError(f"recorded_at must be a finite number: {t!r}")
    elif type(t) is not int:
        raise ValidationError(f"recorded_at must be a finite number: {t!r}")


def _check_utf8(name: str, value: str) -> None:
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as e:
        raise ValidationError(f"{name} is not valid unicode (lone surrogate?): {value!r}") from e


_data_decoder = msgspec.json.Decoder(Event)
_DATA_KEY = b',"data":'
_PREV_HASH_SUFFIX = len(',"prev_hash":"') + 64 + len('"}')


def _decode_data(body: bytes, has_prev_hash: bool) -> Event:
    """Decode back only the ``data`` of a freshly sealed body (the rest is ours).

    The body is ``{...metadata...,"data":{...}[,"prev_hash":"<64 hex>"]}``: the
    metadata are type-checked strings and numbers, so the first ``,"data":``
    is the payload's key. Decoding just the payload halves the cost of the
    check; anything unexpected falls back to decoding the whole body.
    """
    start = body.find(_DATA_KEY)
    end = len(body) - (_PREV_HASH_SUFFIX if has_prev_hash else 1)
    if start > 0:
        try:
            return _data_decoder.decode(memoryview(body)[start + len(_DATA_KEY) : end])
        except msgspec.DecodeError:
            pass
    return decode_body(body, max_bytes=1 << 62).data


def seal_batch(
    stream: str,
    events: Sequence[NewEvent],
    expected_version: int,
    actual_version: int,
    last_hash: str,
    max_bytes: int = DEFAULT_MAX_EVENT_BYTES,
    first_position: int = 0,
) -> list[tuple[Envelope, bytes]]:
    """Seal events for the end of ``stream`` or raise; nothing is stored here.

    With ``first_position`` the envelopes carry the positions the caller will
    store them at (``first_position``, ``first_position + 1``, ...).
    """
    if expected_version != actual_version:
        raise ConcurrencyError(stream, expected_version, actual_version)
    sealed: list[tuple[Envelope, bytes]] = []
    prev = last_hash
    for i, new in enumerate(events):
        try:
            env, body = seal(
                new,
                stream,
                expected_version + 1 + i,
                prev,
                first_position + i if first_position else 0,
            )
        except (msgspec.EncodeError, TypeError, ValueError, OverflowError) as e:
            raise ValidationError(f"event {new.event_id} cannot be encoded: {e}") from e
        if len(body) > max_bytes:
            raise PayloadTooLarge(len(body), max_bytes)
        try:
            back = _decode_data(body, prev != GENESIS_HASH)
        except DecodeError as e:
            raise ValidationError(f"event {new.event_id} would not decode back: {e}") from e
        if back != new.data:
            raise ValidationError(
                f"event {new.event_id} does not survive encoding (NaN or a non-JSON value?)"
            )
        sealed.append((env, body))
        prev = env.hash
    return sealed


def check_replay(stored: Sequence[Envelope], events: Sequence[NewEvent], stream: str) -> None:
    """An append of already-stored ids must be the same events (a retry), or it is refused."""
    if len(stored) != len(events):
        raise IdempotencyError(
            f"{len(stored)} of {len(events)} event ids are already stored: partial re-append"
        )
    for old, new in zip(stored, events, strict=True):
        if old.event_id != new.event_id or old.stream != stream or old.data != new.data:
            raise IdempotencyError(f"event id {new.event_id} is already stored with other content")
