"""Time-ordered identifiers (UUIDv7, RFC 9562) without a third-party package.

Event ids sort by creation time, so a log listing by id reads in order, and a
replay can show when an id was made without a second clock.
"""

from __future__ import annotations

import os
import random
import threading
import time
import uuid

__all__ = ["new_id", "id_time"]

_lock = threading.Lock()
# Seeded from os.urandom, reseeded in a forked child so two processes never share
# a sequence; a call does no syscall (os.urandom per id releases the GIL, and
# taking it back under load cost more than the rest of new_id).
_random = random.Random(os.urandom(32))
os.register_at_fork(after_in_child=lambda: _random.seed(os.urandom(32)))
_last_ms = 0
_counter = 0
_head = ""  # the first 15 characters of an id of millisecond _last_ms: "tttttttt-tttt-7"
_VARIANT = 0b10 << 62


def new_id() -> str:
    """A new UUIDv7 string; monotonic within this process even inside one millisecond.

    The millisecond's part of the string is formatted once per millisecond, not per id
    (every event appended takes one: formatting was most of its cost)."""
    global _last_ms, _counter, _head
    with _lock:
        ms = time.time_ns() // 1_000_000
        if ms > _last_ms:
            _last_ms, _counter = ms, 0
            _head = _head_of(ms)
        else:  # the same millisecond (or the clock stepped back): count on
            _counter += 1
            if _counter > 0xFFF:  # 12-bit counter spent: borrow the next millisecond
                _last_ms += 1
                _counter = 0
                _head = _head_of(_last_ms)
        head = f"{_head}{_counter:03x}-"
    tail = f"{_VARIANT | _random.getrandbits(62):016x}"
    return f"{head}{tail[:4]}-{tail[4:]}"


def _head_of(ms: int) -> str:
    h = f"{ms & 0xFFFF_FFFF_FFFF:012x}"
    return f"{h[:8]}-{h[8:]}-7"


def id_time(event_id: str) -> float:
    """The creation time (unix seconds) embedded in a UUIDv7 string."""
    return (uuid.UUID(event_id).int >> 80) / 1000.0
