"""What the SQLite store keeps in memory between commits: each connection's page cache.

The store opens two connections on its file: the writer (a plain ``sqlite3`` connection
in the writer thread) and the reader (``aiosqlite``, every read). SQLite gives each a
page cache of 2,000 KiB by default, and keeps what it read or wrote there until the cap.

* The writer's cache outlives its transactions (no one else writes the file, so SQLite
  keeps it valid), so it fills with every page the appends wrote: the table's leaves
  and the event-id index's, written once and never wanted again, beside the few it
  does want again (the B-trees' inner pages, the right-hand leaves, the index leaves
  of the streams and runs being written). With 100 runs parked it held 1,019 KiB, 9 KiB
  of the 22 KiB a waiting run cost (``bench/sqlite_cache_probe.py``); what it reads
  again fitted in 256 KiB (1 miss), at 1,000 runs in 512 KiB (53 misses in 1,000 runs).
  A miss is a ``pread`` of a page from the OS's file cache, not a disk read. But 64
  appenders writing 64 streams far apart in the indexes read again more than that:
  the writer missed 10k pages in 120k events at 2,000 KiB, 37k at 1,024, 63k at 768,
  88k at 512, and its thread's CPU per event (``bench/sqlite_cache_cost.py``, rounds
  alternated) was higher than at 2,000 KiB in 7 of 8 rounds at 768 (+2.6%) and in 13
  of 17 at 512 (+3%, median of the pairs), in 3 of 8 (and 6 of 12) at 1,024: 1,024 KiB
  is the smallest that costs that bench nothing measurable. (At 1,000 in flight no
  size from 512 up cost the orchestrator's workload anything measurable.) So the cap
  is 1,024 KiB: with 1,000 runs parked the writer holds 1,048 KiB instead of 2,050;
  with 100 it held 1,019 anyway.
* The reader's cache is thrown away whenever the writer committed since its last read
  (SQLite's check of the wal-index header), so in a working process it helps within
  one query only; after a scan (``verify``, a page of ``read_all``) it kept up to 2,000
  KiB until the next read.

A transaction's dirty pages are not bounded by ``cache_size`` here: ``cache_spill``
keeps SQLite's default threshold, so a batch spills to the WAL before its commit
exactly when it did before (a smaller cache would spill big batches early, writing
pages twice).
"""

from __future__ import annotations

__all__ = ["READER_CACHE_KIB", "SPILL_KIB", "WRITER_CACHE_KIB", "cache_pragmas"]

#: the writer's page cache (KiB): what its next commits read again, not what it wrote;
#: 512 holds half as much with 100 runs parked (17.0 KiB a waiting run instead of 22.2)
#: but costs 64 appenders about 3% of the writer thread's CPU (see above)
WRITER_CACHE_KIB = 1024
#: the reader's page cache (KiB): one query's pages; dropped at the writer's next commit
READER_CACHE_KIB = 512
#: dirty pages a transaction may hold before it spills (KiB): SQLite's default cache size
SPILL_KIB = 2000


def cache_pragmas(cache_kib: int) -> tuple[str, str]:
    """The statements that bound a connection's page cache to ``cache_kib``, the spill
    threshold left where SQLite's default cache put it."""
    return f"PRAGMA cache_size=-{cache_kib}", f"PRAGMA cache_spill=-{SPILL_KIB}"
