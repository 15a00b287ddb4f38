"""Which agents may read and write which scopes of long-term memory: a pure check.

An agent's memory request (``memory.get/list/search/put``) is made in a task,
so in a run, whose context (``run.started``'s ``user`` and ``tenant``) gives
the scope chain (``projections.scope``): the only scopes the request can
reach. The agent names at most a *level* of that chain (``"user"``,
``"tenant"``, ``"global"``), or one of the chain's own scope strings; any other
scope (another tenant's, another user's) is refused, never looked in.

Which levels an agent may read or write is the access policy's
``memory_read`` and ``memory_write``: lists of grants, each ``<who>`` or
``<who>@<level>``, where ``<who>`` is a glob over agent ids (``"summar*"``)
or ``capability:<glob>`` over the capability of the task the request is made
in, and no ``@<level>`` grants every level. The defaults, ``("*",)`` and
``()``: every agent reads its whole chain, none writes.

A refusal is a reason (``access_problem`` records it as ``access.refused``):

===============================  ==========================================
reason                           why
===============================  ==========================================
``memory_not_allowed``           the policy turns memory reads off
``memory_read_not_allowed``      no grant lets this agent read that level
``memory_write_not_allowed``     no grant lets this agent write that level
``memory_scope_not_visible``     a scope outside the run's chain
``memory_kind_reserved``         an agent writing a ``result`` or ``failure``
                                 record (reuse and selection trust those)
===============================  ==========================================
"""

from __future__ import annotations

import fnmatch
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from cardbus.eventstore import events as ev
from cardbus.eventstore.errors import ConfigError, InvalidScope
from cardbus.projections.scope import SCOPE_LEVELS, level_of, scope_chain

__all__ = ["RESERVED_KINDS", "MemoryGrant", "MemoryScopes", "memory_scopes", "parse_grants"]

#: record kinds only the orchestrator's policies write
RESERVED_KINDS = frozenset({"result", "failure"})


@dataclass(frozen=True)
class MemoryGrant:
    """One entry of ``memory_read`` / ``memory_write``: who, and at which levels."""

    who: str  # agent id glob, or "capability:<glob>"
    levels: frozenset[str]

    def covers(self, agent_id: str, capability: str, level: str) -> bool:
        if level not in self.levels:
            return False
        if self.who.startswith("capability:"):
            return fnmatch.fnmatchcase(capability, self.who[len("capability:") :])
        return fnmatch.fnmatchcase(agent_id, self.who)


def parse_grants(owner: str, name: str, entries: object) -> tuple[MemoryGrant, ...]:
    """``entries`` as grants, or ``ConfigError`` naming the entry that is not one."""
    if isinstance(entries, str) or not isinstance(entries, Iterable):
        raise ConfigError(f"{owner}.{name} must be a tuple of grants such as 'agent-*@user'")
    out = []
    for entry in entries:
        if not isinstance(entry, str) or not entry:
            raise ConfigError(f"{owner}.{name}: {entry!r} is not a grant (a non-empty string)")
        who, at, level = entry.rpartition("@") if "@" in entry else (entry, "", "")
        if at and level not in SCOPE_LEVELS:
            raise ConfigError(
                f"{owner}.{name}: {entry!r} names level {level!r}; levels are"
                f" {', '.join(SCOPE_LEVELS)}"
            )
        if not who:
            raise ConfigError(f"{owner}.{name}: {entry!r} names nobody before '@'")
        out.append(MemoryGrant(who, frozenset([level]) if at else frozenset(SCOPE_LEVELS)))
    return tuple(out)


def _allowed(grants: Sequence[MemoryGrant], agent_id: str, capability: str, scope: str) -> bool:
    level = level_of(scope)
    return any(g.covers(agent_id, capability, level) for g in grants)


@dataclass(frozen=True)
class MemoryScopes:
    """Where a memory request may look (``scopes``, most specific first) or write
    (``scopes[0]``), or why it is refused (``problem``)."""

    scopes: tuple[str, ...] = ()
    problem: str | None = None


def memory_scopes(
    started: ev.RunStarted | None,
    agent_id: str,
    capability: str,
    kind: str,
    asked: object,
    read: Sequence[MemoryGrant],
    write: Sequence[MemoryGrant],
) -> MemoryScopes:
    """The scopes of a ``memory.*`` request ``kind`` made by ``agent_id`` in a task of
    ``capability`` in the run ``started``; ``asked`` is the request's ``scope`` argument
    (None: the whole chain to read, the run's own scope to write)."""
    try:
        chain = scope_chain(started.user, started.tenant) if started is not None else ("global",)
    except InvalidScope:
        return MemoryScopes(problem="memory_scope_not_visible")
    if asked is None or asked == "":
        wanted = chain if kind != "memory.put" else chain[:1]
    elif isinstance(asked, str) and asked in SCOPE_LEVELS:
        wanted = tuple(s for s in chain if level_of(s) == asked)
        if not wanted:  # a run with no tenant has no tenant level
            return MemoryScopes(problem="memory_scope_not_visible")
    elif isinstance(asked, str) and asked in chain:
        wanted = (asked,)
    else:
        return MemoryScopes(problem="memory_scope_not_visible")
    if kind == "memory.put":
        if not _allowed(write, agent_id, capability, wanted[0]):
            return MemoryScopes(problem="memory_write_not_allowed")
        return MemoryScopes(scopes=wanted)
    readable = tuple(s for s in wanted if _allowed(read, agent_id, capability, s))
    if not readable or (asked not in (None, "") and len(readable) < len(wanted)):
        return MemoryScopes(problem="memory_read_not_allowed")
    return MemoryScopes(scopes=readable)
