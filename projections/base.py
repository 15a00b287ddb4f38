"""The projection contract.

A projection is a pure fold: ``apply(model, envelope)`` reads and writes rows
of its own tables (declared in ``tables``) through a :class:`~projections.model.Model`
and does nothing else - no I/O, no clock, no randomness - so folding the same
events always gives the same model, which is what makes a rebuild from
position zero equal to the incrementally built model.

``handles`` lists the event payload types the projection reads; the runner
skips the others without calling ``apply``. The runner folds a batch with
``apply_many``, which a projection may override with a faster loop that must
give the same model as ``apply`` one event at a time. ``version`` is bumped when the
fold or the tables change: a read model stored under another version is
dropped and rebuilt the next time a runner opens it.
"""

from __future__ import annotations

import abc
import sqlite3
from collections.abc import Sequence
from typing import Any, ClassVar

from cardbus.eventstore.envelope import Envelope
from cardbus.projections.model import Model, TableSpec

__all__ = ["Projection"]


class Projection(abc.ABC):
    name: ClassVar[str]
    version: ClassVar[int] = 1
    tables: ClassVar[tuple[TableSpec, ...]]
    handles: ClassVar[frozenset[type]]

    @abc.abstractmethod
    def apply(self, model: Model, env: Envelope) -> None:
        """Fold one event into ``model``; must not raise on any stored event."""

    def apply_many(
        self, model: Model, events: Sequence[Envelope]
    ) -> list[tuple[Envelope, Exception]]:
        """Fold events in order, skipping types not in ``handles``; return the ones that raised.

        The runner calls this; it must equal ``apply`` on each handled event in
        turn. A projection may override it with a faster loop.
        """
        errors: list[tuple[Envelope, Exception]] = []
        apply, handles = self.apply, self.handles
        for env in events:
            if type(env.data) in handles:
                try:
                    apply(model, env)
                except Exception as e:
                    errors.append((env, e))
        return errors

    # -- helpers shared by the query methods ---------------------------------

    @staticmethod
    def query(conn: sqlite3.Connection, sql: str, args: tuple[Any, ...] = ()) -> list[Row]:
        cur = conn.execute(sql, args)
        names = [d[0] for d in cur.description]
        return [dict(zip(names, r, strict=True)) for r in cur.fetchall()]


Row = dict[str, Any]
