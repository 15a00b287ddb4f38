"""How a live SQLite subscription notices another process's commits, cheaply.

The store's own commits wake its subscribers at once; a commit by another process
(``cardbus approve`` on the same file, a second runtime) is seen only by looking at the
files. A follower that looked 20 times a second, and read the log through the reader
thread every second whatever it saw, was most of an idle runtime's CPU. Two changes:

* the mark is exact: SQLite's wal-index header (the first 48 bytes of the ``-shm``
  file, https://www.sqlite.org/walformat.html §2.5.1) holds ``iChange``, incremented by
  every write transaction, and ``mxFrame``, the last valid frame; one ``pread`` of it
  says whether anyone committed since the mark, where the WAL file's (size, mtime) could
  miss a commit within one clock tick of the filesystem's coarse mtime;
* the look backs off: it starts at ``poll_interval`` after an event and doubles while
  nothing changes, up to 20 poll intervals (1 s at the default 0.05 s), so an idle
  follower looks about once a second and a busy one as often as before.

A page served from the store's cache of its own commits reads nothing of the file, so
the mark taken before it says nothing: the next look reads the file whatever the mark
(a commit by another process just before the mark would hide behind it;
``tests/bus/orchestrator/test_interleavings.py`` found it).

A commit by another process is therefore seen within a second when the log has been
idle a while, within ``poll_interval`` while events flow; nothing is missed, only seen
later. Without a readable
``-shm`` file (not yet created, a platform without it) every look reads the log, as
before.
"""

from __future__ import annotations

import os

__all__ = ["WalMark", "backoff", "max_poll_s"]

_HEADER = 48  # the wal-index header's first copy (WalIndexHdr)


class WalMark:
    """The commit mark of the database at ``path``: its ``-shm`` header, one ``pread``."""

    def __init__(self, path: str) -> None:
        self.shm_path = f"{path}-shm"
        self._fd: int | None = None

    def mark(self) -> bytes | None:
        """What changes with every commit by any process (None: unknown, so read)."""
        if self._fd is None:
            try:
                self._fd = os.open(self.shm_path, os.O_RDONLY)
            except OSError:
                return None
        try:
            header = os.pread(self._fd, _HEADER, 0)
            deleted = os.fstat(self._fd).st_nlink == 0
        except OSError:
            header, deleted = b"", True
        if deleted or len(header) < _HEADER:
            # every connection closed once and the file went: open the new one next time
            self.close()
            return None
        return header

    def close(self) -> None:
        fd, self._fd = self._fd, None
        if fd is not None:
            os.close(fd)


def backoff(wait: float, poll_interval: float) -> float:
    """The next wait of an idle follower: twice ``wait``, up to ``max_poll_s(poll_interval)``."""
    return min(wait * 2, max_poll_s(poll_interval))


def max_poll_s(poll_interval: float) -> float:
    """The longest an idle follower waits between looks: 20 poll intervals (1 s by default),
    at least ``poll_interval``."""
    return 20 * poll_interval
