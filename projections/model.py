"""Read-model tables: the one storage interface every projection folds into.

A projection's ``apply(model, envelope)`` only reads and writes rows through a
:class:`Model`, a namespace of tables described by :class:`TableSpec`. The same
fold then runs against two kinds of tables:

* :class:`SqliteTable` - a write-behind row cache over one SQLite table. Rows
  are loaded on first touch, changed in memory, and written by ``flush()``
  inside the runner's transaction, together with the checkpoint. So one
  transaction covers a whole batch of events, which is what makes a rebuild
  fast, and a crash loses the whole batch or none of it.
* :class:`MemoryTable` - plain dicts, for folds that need no SQLite at all
  (the orchestrator's agent statistics and loop counts).

Keyed tables hold dict rows (column -> value); append-only tables (samples)
hold tuples. Columns of type ``JSON`` are encoded on the way into SQLite and
decoded on the way out, so folds see Python values either way.
"""

from __future__ import annotations

import operator
import sqlite3
from collections.abc import Iterator, Sequence
from typing import Any, NamedTuple

import msgspec

__all__ = ["MemoryTable", "Model", "SqliteTable", "TableSpec", "Row", "Key"]

Row = dict[str, Any]
Key = tuple[Any, ...]

_json_encode = msgspec.json.Encoder().encode
_INT64 = (-(2**63), 2**63 - 1)


def _executemany(conn: sqlite3.Connection, sql: str, rows: Sequence[Sequence[Any]]) -> None:
    """``executemany``; an integer past SQLite's 64 bits (an odd value in the log) is
    stored at the nearest bound instead of failing the fold (checked only on failure)."""
    conn.execute("SAVEPOINT cardbus_rows")
    try:
        conn.executemany(sql, rows)
        conn.execute("RELEASE cardbus_rows")
    except OverflowError:  # the rows before the odd one are taken back, then all go again
        conn.execute("ROLLBACK TO cardbus_rows")
        conn.execute("RELEASE cardbus_rows")
        lo, hi = _INT64
        conn.executemany(
            sql,
            [[min(max(v, lo), hi) if type(v) is int else v for v in row] for row in rows],
        )


_json_decode = msgspec.json.decode


class TableSpec(NamedTuple):
    """One read-model table: ``columns`` are ``(name, sql_type)``; ``key`` names the primary key.

    An empty ``key`` makes the table append-only (rows are tuples in column order).
    """

    name: str
    columns: tuple[tuple[str, str], ...]
    key: tuple[str, ...] = ()
    indexes: tuple[tuple[str, ...], ...] = ()

    @property
    def column_names(self) -> tuple[str, ...]:
        return tuple(c for c, _ in self.columns)

    def ddl(self, indexes: bool = True) -> list[str]:
        cols = [f"{c} {'TEXT' if t == 'JSON' else t}" for c, t in self.columns]
        if self.key:
            cols.append(f"PRIMARY KEY ({', '.join(self.key)})")
        out = [f"CREATE TABLE IF NOT EXISTS {self.name} ({', '.join(cols)})"]
        return out + self.index_ddl() if indexes else out

    def index_ddl(self) -> list[str]:
        """The secondary indexes (a rebuild adds them at the end: one sort, not n inserts)."""
        return [
            f"CREATE INDEX IF NOT EXISTS {self.name}_ix{i} ON {self.name} ({', '.join(idx)})"
            for i, idx in enumerate(self.indexes)
        ]


class MemoryTable:
    """A table kept in dicts (keyed) or a list (append-only)."""

    def __init__(self, spec: TableSpec) -> None:
        self.spec = spec
        self.data: dict[Key, Row] = {}
        self.samples: list[tuple[Any, ...]] = []

    def get(self, key: Key) -> Row | None:
        return self.data.get(key)

    def put(self, key: Key, row: Row) -> None:
        self.data[key] = row

    def delete(self, key: Key) -> None:
        self.data.pop(key, None)

    def add(self, row: tuple[Any, ...]) -> None:
        self.samples.append(row)

    def rows(self) -> Iterator[Row]:
        return iter(self.data.values())

    def flush(self) -> None:
        pass

    def discard(self) -> None:
        pass

    def evict(self) -> None:
        pass

    def mark_empty(self) -> None:
        pass


class SqliteTable:
    """A write-behind cache over one SQLite table; see the module docstring."""

    _MISSING: Row = {}

    def __init__(self, conn: sqlite3.Connection, spec: TableSpec) -> None:
        self.conn = conn
        self.spec = spec
        names = spec.column_names
        self._names = names
        # row -> tuple in column order (itemgetter of one name would give a bare value)
        self._values: Any = (
            operator.itemgetter(*names) if len(names) > 1 else (lambda row: (row[names[0]],))
        )
        self._json = [i for i, (_, t) in enumerate(spec.columns) if t == "JSON"]
        self._cache: dict[Key, Row | None] = {}
        self._dirty: set[Key] = set()
        # Every key the table holds, when known exactly (a table folded from empty by
        # this object): a cache miss on an unknown key is then a new row, no SELECT.
        self._known: set[Key] | None = None
        self._added: list[tuple[Any, ...]] = []
        where = " AND ".join(f"{k} = ?" for k in spec.key)
        self._select = f"SELECT {', '.join(names)} FROM {spec.name} WHERE {where}"
        self._upsert = (
            f"INSERT OR REPLACE INTO {spec.name} ({', '.join(names)})"
            f" VALUES ({', '.join('?' * len(names))})"
        )
        self._delete = f"DELETE FROM {spec.name} WHERE {where}"

    def get(self, key: Key) -> Row | None:
        try:
            return self._cache[key]
        except KeyError:
            pass
        if self._known is not None and key not in self._known:
            self._cache[key] = None
            return None
        found = self.conn.execute(self._select, key).fetchone()
        row: Row | None = None
        if found is not None:
            values = list(found)
            for i in self._json:
                if values[i] is not None:
                    values[i] = _json_decode(values[i])
            row = dict(zip(self._names, values, strict=True))
        self._cache[key] = row
        return row

    def put(self, key: Key, row: Row) -> None:
        self._cache[key] = row
        self._dirty.add(key)
        if self._known is not None:
            self._known.add(key)

    def delete(self, key: Key) -> None:
        self._cache[key] = None
        self._dirty.add(key)

    def add(self, row: tuple[Any, ...]) -> None:
        self._added.append(row)

    def mark_empty(self) -> None:
        """The table is empty now: remember every key written from here on."""
        if (
            self.spec.key
            and self.conn.execute(f"SELECT 1 FROM {self.spec.name} LIMIT 1").fetchone() is None
        ):
            self._known = set()

    def evict(self) -> None:
        """Drop cached rows to bound memory (after a flush); keep knowing which keys exist."""
        if not self._dirty and not self._added:
            self._cache.clear()
            if self._known is not None and len(self._known) > 5_000_000:
                self._known = None

    def flush(self) -> None:
        """Write changed rows; the caller owns the transaction."""
        if self._dirty:
            upserts: list[Sequence[Any]] = []
            deletes: list[Key] = []
            values_of, json_cols, cache = self._values, self._json, self._cache
            for key in self._dirty:
                row = cache[key]
                if row is None:
                    deletes.append(key)
                    continue
                if json_cols:
                    values = list(values_of(row))
                    for i in json_cols:
                        if values[i] is not None:
                            values[i] = _json_encode(values[i]).decode()
                    upserts.append(values)
                else:
                    upserts.append(values_of(row))
            if deletes:
                self.conn.executemany(self._delete, deletes)
            if upserts:
                _executemany(self.conn, self._upsert, upserts)
            self._dirty.clear()
        if self._added:
            cols = self._names
            _executemany(
                self.conn,
                f"INSERT INTO {self.spec.name} ({', '.join(cols)})"
                f" VALUES ({', '.join('?' * len(cols))})",
                self._added,
            )
            self._added.clear()

    def discard(self) -> None:
        """Forget cached rows (after a rollback, or when another writer moved on)."""
        self._cache.clear()
        self._dirty.clear()
        self._added.clear()
        self._known = None

    def cached(self) -> int:
        return len(self._cache)


class Model:
    """A projection's tables by name: ``model["proj_tasks"].get((task_id,))``."""

    def __init__(self, tables: dict[str, MemoryTable | SqliteTable]) -> None:
        self.tables = tables

    def __getitem__(self, name: str) -> Any:
        return self.tables[name]

    @classmethod
    def in_memory(cls, specs: Sequence[TableSpec]) -> Model:
        return cls({s.name: MemoryTable(s) for s in specs})

    @classmethod
    def in_sqlite(cls, conn: sqlite3.Connection, specs: Sequence[TableSpec]) -> Model:
        return cls({s.name: SqliteTable(conn, s) for s in specs})

    def flush(self) -> None:
        for t in self.tables.values():
            t.flush()

    def discard(self) -> None:
        for t in self.tables.values():
            t.discard()

    def evict(self) -> None:
        for t in self.tables.values():
            t.evict()

    def mark_empty(self) -> None:
        for t in self.tables.values():
            t.mark_empty()

    def cached(self) -> int:
        return sum(t.cached() for t in self.tables.values() if isinstance(t, SqliteTable))
