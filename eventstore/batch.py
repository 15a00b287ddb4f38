"""Backend-neutral checks and sealing of one ``append`` call.

Every backend runs new events through ``seal_batch`` so the rules live in one
place: the expected version must match, each event must encode, decode back
(nothing unreadable is ever stored) and fit the size limit, and the hash chain
continues from the stream's last hash.
"""

from __future__ import annotations

from collections.abc import Sequence

import msgspec

from cardbus.eventstore.envelope import (
    DEFAULT_MAX_EVENT_BYTES,
    GENESIS_HASH,
    Envelope,
    NewEvent,
    decode_body,
    event_hash,
)
from cardbus.eventstore.errors import (
    ConcurrencyError,
    DecodeError,
    IdempotencyError,
    PayloadTooLarge,
    ValidationError,
)
from cardbus.eventstore.events import EVENT_TYPES, Event

__all__ = [
    "tokens_in_range",
    "MAX_DEPTH",
    "MAX_EVENT_ID_CHARS",
    "MAX_ID_CHARS",
    "MAX_STREAM_CHARS",
    "MAX_TOKENS",
    "check_append_args",
    "check_replay",
    "nesting_problem",
    "seal_batch",
]

_KNOWN = frozenset(EVENT_TYPES)

#: the longest stream name an append takes (every backend)
MAX_STREAM_CHARS = 512
#: the longest event id
MAX_EVENT_ID_CHARS = 200
#: the longest plan task id, capability name or agent id: the streams named after
#: them (``<task>-<root tail>``, ``~review<n>``, ``~plan<n>``, ``agent-<id>``) stay
#: well within MAX_STREAM_CHARS
MAX_ID_CHARS = 128
#: the deepest nesting of lists and objects in a plan's inputs or an agent's output
MAX_DEPTH = 64
#: the largest token count a result may report (an integer JSON numbers hold exactly)
MAX_TOKENS = 2**53


def tokens_in_range(n: object) -> int:
    """A token count as a fold should add it: in 0..MAX_TOKENS (a log written before the
    orchestrator checked the range may hold 2**64 or a negative count), 0 if not an int."""
    return min(max(n, 0), MAX_TOKENS) if type(n) is int else 0


_CONTAINERS = (dict, list, tuple)


def nesting_problem(value: object, limit: int = MAX_DEPTH, what: str = "value") -> str:
    """'' if ``value`` nests lists and dicts at most ``limit`` deep, else the problem
    naming the limit; iterative, so any depth is measured without recursion.

    Level by level: every result and every plan is checked, and a (value, depth)
    tuple per value, as a stack of them took, cost more than the walk itself."""
    level: list[object] = [value]
    depth = 0
    while level:
        below: list[object] = []
        for v in level:
            if isinstance(v, dict):
                below.extend(v.values())
            elif isinstance(v, _CONTAINERS):  # a constant: `list | tuple` is built per call
                below.extend(v)
            else:
                continue
            if depth >= limit:
                return f"{what} is nested deeper than {limit} levels (MAX_DEPTH)"
        level = below
        depth += 1
    return ""


def check_append_args(stream: object, events: object, expected_version: object) -> None:
    if type(stream) is not str or not stream or len(stream) > MAX_STREAM_CHARS:
        shown = repr(stream)
        if isinstance(stream, str) and len(stream) > 80:
            shown = f"{stream[:80]!r}... ({len(stream)} chars)"
        raise ValidationError(
            f"stream must be a non-empty string of at most {MAX_STREAM_CHARS} chars: {shown}"
        )
    if not stream.isascii():
        _check_utf8("stream", stream)
    if type(expected_version) is not int:
        raise ValidationError(f"expected_version must be an int: {expected_version!r}")
    if expected_version < 0:
        raise ValidationError(f"expected_version must be >= 0: {expected_version}")
    if type(events) is not list and (  # a list is the common case: no ABC check for it
        not isinstance(events, Sequence) or isinstance(events, str | bytes)
    ):
        raise ValidationError("append needs a non-empty sequence of NewEvent")
    if not events:
        raise ValidationError("append needs a non-empty sequence of NewEvent")
    for ev in events:
        if type(ev) is not NewEvent and not isinstance(ev, NewEvent):
            raise ValidationError(f"append takes NewEvent, got {type(ev).__name__}")
        if type(ev.data) not in _KNOWN:
            raise ValidationError(f"not a cardbus event type: {type(ev.data).__name__}")
        # The common case in one expression; anything else takes the slow path,
        # which accepts what is fine (an int time, a non-ASCII id) and names the rest.
        event_id, t, causation, traceparent = (
            ev.event_id,
            ev.recorded_at,
            ev.causation_id,
            ev.traceparent,
        )
        if not (
            type(event_id) is str
            and 0 < len(event_id) <= MAX_EVENT_ID_CHARS
            and event_id.isascii()
            and type(ev.correlation_id) is str
            and type(ev.actor) is str
            and (causation is None or type(causation) is str)
            and (traceparent is None or type(traceparent) is str)
            and type(t) is float
            and t - t == 0.0
        ):
            _check_metadata(ev)
    if len(events) > 1 and len({ev.event_id for ev in events}) != len(events):
        raise IdempotencyError("the same event id appears twice in one append")


def _check_metadata(ev: NewEvent) -> None:
    """The envelope fields a writer sets must have their declared types (cheap checks)."""
    event_id = ev.event_id
    if type(event_id) is not str or not 0 < len(event_id) <= MAX_EVENT_ID_CHARS:
        raise ValidationError(
            f"event_id must be a non-empty string of at most {MAX_EVENT_ID_CHARS} chars:"
            f" {event_id!r}"
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
_encoder = msgspec.json.Encoder()
# Position and hash go on the envelope just built (no one else holds it yet) in
# place, not on a copy: one Envelope less per event appended.
_set = msgspec.structs.force_setattr
_DATA_KEY = b',"data":'
assert len(_DATA_KEY) == 8
_PREV_HASH_SUFFIX = len(',"prev_hash":"') + 64 + len('"}')


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
    # This is ``seal`` and ``_decode_data`` inlined: it runs for every event
    # appended, and function calls are a good part of its cost.
    sealed: list[tuple[Envelope, bytes]] = []
    prev = last_hash
    version = expected_version
    position = first_position
    encode = _encoder.encode
    decode_data = _data_decoder.decode
    for new in events:
        version += 1
        data = new.data
        env = Envelope(
            event_id=new.event_id,
            stream=stream,
            version=version,
            recorded_at=new.recorded_at,
            correlation_id=new.correlation_id,
            causation_id=new.causation_id,
            actor=new.actor,
            traceparent=new.traceparent,
            data=data,
            prev_hash=prev,
        )
        try:
            body = encode(env)
        except (msgspec.EncodeError, TypeError, ValueError, OverflowError) as e:
            raise ValidationError(f"event {new.event_id} cannot be encoded: {e}") from e
        except RecursionError as e:  # nested too deep for the encoder
            raise ValidationError(
                f"event {new.event_id} cannot be encoded: nested too deep ({e})"
            ) from e
        size = len(body)
        if size > max_bytes:
            raise PayloadTooLarge(size, max_bytes)
        # Decode the payload back: what does not come back equal (NaN, sets,
        # bytes, non-string keys, wrongly typed fields) is refused. (A slice of the
        # bytes: a memoryview and its slice cost more than copying a few hundred bytes.)
        start = body.find(_DATA_KEY)
        end = size - (1 if prev == GENESIS_HASH else _PREV_HASH_SUFFIX)
        try:
            back = decode_data(body[start + 8 : end]) if start > 0 else None
        except msgspec.DecodeError:
            back = None
        if back is None:
            try:
                back = decode_body(body, max_bytes=1 << 62).data
            except DecodeError as e:
                raise ValidationError(f"event {new.event_id} would not decode back: {e}") from e
        if back != data:
            raise ValidationError(
                f"event {new.event_id} does not survive encoding (NaN or a non-JSON value?)"
            )
        digest = event_hash(body)
        _set(env, "position", position)
        _set(env, "hash", digest)
        sealed.append((env, body))
        prev = digest
        if position:
            position += 1
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
