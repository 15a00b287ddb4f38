"""Many stored events read from SQLite in one step of a statement, not one step a row.

Python's ``sqlite3`` lets go of the GIL around each step of a statement, and a step is
a row; taking the GIL back, the reader thread waits for the event loop's thread to hand
it over (up to the switch interval, 5 ms) whenever the loop is busy: once a row. At
1,000 runs in flight a page of 2,000 events took 0.5-2.5 s instead of 10-20 ms, and a
log follower that had fallen behind its store's cache of its own commits read pages
slower than the log grew (its events handed on 1-3.5 s late, 18,000 positions behind
as the run ended; ``bench/busy_read_bench.py`` reads a page both ways beside a busy loop).

``packed`` asks for the rows of a ``SELECT position, body, hash`` as one row of three
JSON arrays, their positions, hashes and bodies (each body is a JSON object: the
bodies joined by commas are an array), made in one aggregate pass, so in one order;
``decoded`` decodes each array in one call. A body edited by hand so that it is not one
JSON object makes the decoding fail or the counts disagree, and rows out of position
order (SQLite does not promise the order of a concatenation) are not taken either:
``decoded`` says so (None), as when the arrays are too long for SQLite, and the caller
reads row by row, whose decoding names a bad row.
"""

from __future__ import annotations

from typing import Any

import msgspec

from cardbus.eventstore.envelope import Envelope, collection_paused

__all__ = ["decoded", "packed"]

_envelopes = msgspec.json.Decoder(list[Envelope])
_positions = msgspec.json.Decoder(list[int])
_hashes = msgspec.json.Decoder(list[str])
# the envelopes were just decoded here: nobody else holds them (as in ``seal_batch``)
_set = msgspec.structs.force_setattr


def packed(rows_sql: str) -> str:
    """One row for the rows of ``rows_sql`` (which selects ``position, body, hash``):
    their count and three JSON arrays, of positions, hashes and bodies."""
    return (
        "SELECT count(*),"
        " CAST('[' || group_concat(position) || ']' AS BLOB),"
        " CAST('[\"' || group_concat(hash, '\",\"') || '\"]' AS BLOB),"
        " CAST('[' || group_concat(body, ',') || ']' AS BLOB)"
        f" FROM ({rows_sql})"
    )


def decoded(row: tuple[Any, ...]) -> list[Envelope] | None:
    """The envelopes of a ``packed`` row, or None if its bodies are not one JSON object
    each or its positions do not ascend."""
    count, positions, hashes, bodies = row
    if not count:
        return []
    try:
        with collection_paused(count):
            envelopes = _envelopes.decode(bodies)
        position_list = _positions.decode(positions)
        hash_list = _hashes.decode(hashes)
    except msgspec.DecodeError:
        return None
    if not (len(envelopes) == len(position_list) == len(hash_list) == count):
        return None
    # SQLite concatenates in the order its subquery yields rows, the order asked for
    # (positions ascending, in every read here); its documentation does not promise it,
    # so it is checked, and the rows read one by one if it does not hold
    if position_list != sorted(position_list):  # (positions are unique: a primary key)
        return None
    for env, position, digest in zip(envelopes, position_list, hash_list, strict=True):
        _set(env, "position", position)
        _set(env, "hash", digest)
    return envelopes
