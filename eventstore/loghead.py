"""The log's own chain and its head: what catches a deletion anywhere, the tail included.

Each stream's hash chain (``prev_hash`` inside every body) catches an edit,
insert or reorder within a stream, but not a stream's last events deleted,
a whole stream deleted, or the log cut short. So the store also keeps a
chain over *positions*: ``log_hash(p) = sha256(log_hash(p-1) ":" hash(p))``
from ``LOG_GENESIS``, stored beside each event (it is not part of the body,
whose hash is fixed before the event has a position). A deleted or moved
row breaks it at that position.

Anyone who can write the file can also recompute the chain, so the chain is
only as good as a copy of its end kept elsewhere: the *head* (position and
log hash of the last event), printed by ``cardbus head`` and optionally
signed with an HMAC key the user keeps. ``cardbus verify --head FILE`` then
names what is missing or changed up to that position: a log that ends
before it was truncated; a different log hash there means some event at or
before it was edited, deleted or reordered. Checkpoint events inside the
log would add nothing against such an attacker (they can be rewritten with
the rest), so there are none.
"""

from __future__ import annotations

import hashlib
import hmac

import msgspec

from cardbus.eventstore.errors import DecodeError

__all__ = ["LOG_GENESIS", "LogHead", "decode_head", "encode_head", "link", "sign", "signature_ok"]

#: the log hash "before" position 1
LOG_GENESIS = "0" * 64


def link(prev_log_hash: str, event_hash: str) -> str:
    """The log hash at a position, from the one before it and the event's own hash."""
    return hashlib.sha256(f"{prev_log_hash}:{event_hash}".encode()).hexdigest()


class LogHead(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """The end of a log as it was: keep it outside the log, check the log against it later."""

    position: int  # of the last event (0: an empty log)
    log_hash: str  # the log hash at that position (LOG_GENESIS for an empty log)
    event_id: str = ""
    recorded_at: float = 0.0
    signature: str = ""  # HMAC-SHA256 of the fields above, hex; "" when unsigned

    def unsigned(self) -> LogHead:
        return msgspec.structs.replace(self, signature="")


def _mac(head: LogHead, key: bytes) -> str:
    return hmac.new(key, msgspec.json.encode(head.unsigned()), hashlib.sha256).hexdigest()


def sign(head: LogHead, key: bytes) -> LogHead:
    """``head`` with its HMAC-SHA256 signature under ``key``."""
    return msgspec.structs.replace(head, signature=_mac(head, key))


def signature_ok(head: LogHead, key: bytes) -> bool:
    return bool(head.signature) and hmac.compare_digest(head.signature, _mac(head, key))


def encode_head(head: LogHead) -> bytes:
    return msgspec.json.format(msgspec.json.encode(head), indent=2) + b"\n"


def decode_head(data: bytes | str) -> LogHead:
    try:
        head = msgspec.json.decode(data, type=LogHead)
    except (msgspec.DecodeError, msgspec.ValidationError) as e:
        raise DecodeError(f"not a cardbus log head: {e}") from e
    if head.position < 0 or len(head.log_hash) != 64:
        raise DecodeError(f"not a cardbus log head: position {head.position}, {head.log_hash!r}")
    return head
