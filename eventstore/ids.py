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


def new_id() -> str:
    """A new UUIDv7 string; monotonic within this process even inside one millisecond."""
    global _last_ms, _counter
    with _lock:
        ms = time.time_ns() // 1_000_000
        if ms <= _last_ms:
            ms = _last_ms
            _counter += 1
            if _counter > 0xFFF:  # 12-bit counter spent: borrow the next millisecond
                ms += 1
                _counter = 0
        else:
            _counter = 0
        _last_ms = ms
        counter = _counter
    rand = _random.getrandbits(62)
    value = (ms & 0xFFFF_FFFF_FFFF) << 80 | 0x7 << 76 | counter << 64 | 0b10 << 62 | rand
    h = f"{value:032x}"  # formatting by hand: uuid.UUID(...) costs twice as much
    return f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"


def id_time(event_id: str) -> float:
    """The creation time (unix seconds) embedded in a UUIDv7 string."""
    return (uuid.UUID(event_id).int >> 80) / 1000.0
