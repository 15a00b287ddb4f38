"""The SQLite writer's cache of stream heads, one 40-byte ``bytes`` per stream.

The writer plans a batch on each stream's head (version, hash) as its last commit left
it (``eventstore.sqlite``), so it keeps the head of every stream it wrote, up to
100,000 streams: five a waiting run. Kept as ``(version, 64-char hex hash)`` a head
was a tuple (56 B) and a str (120 B); packed here it is the version (8 bytes) and the
hash's 32-byte digest in one ``bytes`` (80 B), about 480 B less a waiting run.

What goes in comes out the same: a head whose hash is not the lowercase hex of 32
bytes (a file edited by hand) or whose version does not fit 64 bits is kept as given,
so the writer chains onto exactly what the file holds and ``verify`` finds the same.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable

from cardbus.eventstore.envelope import GENESIS_HASH

__all__ = ["Head", "StreamHeads"]

Head = tuple[int, str]  # (version, hash as hex)

_PACKED = struct.Struct("<Q32s")
_pack = _PACKED.pack
_unpack = _PACKED.unpack
_NEW_HEAD: Head = (0, GENESIS_HASH)
_NEW = _pack(0, bytes(32))  # shared by every stream taken as new: no bytes each


def _packed(head: Head) -> bytes | Head:
    version, h = head
    if version == 0 and h == GENESIS_HASH:
        return _NEW
    try:
        digest = bytes.fromhex(h)
        if len(digest) == 32 and digest.hex() == h:
            return _pack(version, digest)
    except (ValueError, TypeError, struct.error):
        pass
    return head  # not canonical: kept as it is


class StreamHeads:
    """stream -> (version, hash), as a dict of them would, in less memory."""

    __slots__ = ("_heads",)

    def __init__(self) -> None:
        self._heads: dict[str, bytes | Head] = {}

    def __len__(self) -> int:
        return len(self._heads)

    def __contains__(self, stream: object) -> bool:
        return stream in self._heads

    def __getitem__(self, stream: str) -> Head:
        v = self._heads[stream]
        if type(v) is bytes:
            if v is _NEW:
                return _NEW_HEAD
            version, digest = _unpack(v)
            return version, digest.hex()
        return v  # type: ignore[return-value]  # a head kept as given

    def __setitem__(self, stream: str, head: Head) -> None:
        self._heads[stream] = _packed(head)

    def update(self, heads: dict[str, Head] | Iterable[tuple[str, Head]]) -> None:
        items = heads.items() if isinstance(heads, dict) else heads
        for stream, head in items:
            self._heads[stream] = _packed(head)

    def clear(self) -> None:
        self._heads.clear()
