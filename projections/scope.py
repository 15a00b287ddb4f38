"""Scopes of long-term memory: whose a record is, and which records a run may see.

Every memory record belongs to one scope, written as a short string:

=============================  ==========================================================
scope                          whose
=============================  ==========================================================
``global``                     everyone's (and every record written before scopes existed)
``tenant:<tenant>``            one tenant's (an organisation, a customer)
``tenant:<tenant>/user:<u>``   one user of one tenant
``user:<u>``                   one user, in a deployment without tenants
=============================  ==========================================================

A user scope is qualified by its tenant when the run names one: two tenants
may each have a user ``ann``, and neither may ever see the other's. A run's
context (its ``user`` and ``tenant``) gives its *scope chain*, most specific
first: ``tenant:acme/user:ann``, ``tenant:acme``, ``global``. Reads in the
run see the records of the chain only (a key present in several scopes is
the most specific one's); writes go to the first scope of the chain unless
they name a broader one of the same chain.

Ids are 1 to 128 characters of letters, digits and ``. _ @ + -`` (no ``:``
or ``/``, which separate the parts, no space or control character); a key is
1 to 512 characters with no control character. Anything else is an
:class:`~cardbus.eventstore.errors.InvalidScope`, raised where a scope, user,
tenant or key enters (a plan, a request, the command line), never later.
This module is pure: parsing, formatting and chains, no I/O.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Literal

from cardbus.eventstore.errors import InvalidScope

__all__ = [
    "GLOBAL",
    "MAX_ID_CHARS",
    "MAX_KEY_CHARS",
    "SCOPE_LEVELS",
    "ScopeLevel",
    "check_id",
    "check_key",
    "level_of",
    "normalize_scope",
    "parse_scope",
    "pick_level",
    "scope_chain",
    "scope_of",
]

GLOBAL = "global"
MAX_ID_CHARS = 128
MAX_KEY_CHARS = 512

#: the levels of a chain, most specific first; what an agent names instead of a scope
ScopeLevel = Literal["user", "tenant", "global"]
SCOPE_LEVELS: tuple[str, ...] = ("user", "tenant", "global")

_ID = re.compile(rf"[A-Za-z0-9._@+\-]{{1,{MAX_ID_CHARS}}}")
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


def check_id(what: str, value: object) -> str:
    """``value`` as a user or tenant id, or :class:`InvalidScope` saying why not."""
    if not isinstance(value, str) or _ID.fullmatch(value) is None:
        shown = value[:40] if isinstance(value, str) else value
        raise InvalidScope(
            f"{what} id {shown!r} must be 1 to {MAX_ID_CHARS} letters, digits or . _ @ + -"
        )
    return value


def check_key(key: object) -> str:
    """``key`` as a memory key (1 to 512 characters, no control character)."""
    if (
        not isinstance(key, str)
        or not 0 < len(key) <= MAX_KEY_CHARS
        or _CONTROL.search(key) is not None
    ):
        shown = key[:40] if isinstance(key, str) else key
        raise InvalidScope(
            f"memory key {shown!r} must be 1 to {MAX_KEY_CHARS} characters, no control character"
        )
    return key


def scope_of(user: str = "", tenant: str = "") -> str:
    """The most specific scope of a context (``global`` when it names nobody)."""
    if tenant:
        check_id("tenant", tenant)
    if user:
        check_id("user", user)
        return f"tenant:{tenant}/user:{user}" if tenant else f"user:{user}"
    return f"tenant:{tenant}" if tenant else GLOBAL


def parse_scope(text: object) -> tuple[str, str]:
    """``(user, tenant)`` of a scope string ("" for a part it does not name).

    The inverse of :func:`scope_of`: ``scope_of(*reversed(parse_scope(s))) == s``.
    """
    if not isinstance(text, str):
        raise InvalidScope(f"a memory scope is a string, not {type(text).__name__}")
    if text == GLOBAL:
        return "", ""
    user = tenant = ""
    parts = text.split("/")
    try:
        if len(parts) == 1 and parts[0].startswith("user:"):
            user = check_id("user", parts[0][5:])
        elif len(parts) in (1, 2) and parts[0].startswith("tenant:"):
            tenant = check_id("tenant", parts[0][7:])
            if len(parts) == 2:
                if not parts[1].startswith("user:"):
                    raise InvalidScope("")
                user = check_id("user", parts[1][5:])
        else:
            raise InvalidScope("")
    except InvalidScope as e:
        detail = f" ({e})" if str(e) else ""
        raise InvalidScope(
            f"memory scope {text[:80]!r} is not global, tenant:<id>, user:<id> or"
            f" tenant:<id>/user:<id>{detail}"
        ) from None
    return user, tenant


def normalize_scope(text: object) -> str:
    """A well-formed scope string as it is; "" (a record from before scopes) is global."""
    if text == "":
        return GLOBAL
    parse_scope(text)
    return str(text)


def scope_chain(user: str = "", tenant: str = "") -> tuple[str, ...]:
    """The scopes a run of this context sees, most specific first (global last)."""
    chain = []
    if user:
        chain.append(scope_of(user, tenant))
    if tenant:
        chain.append(scope_of("", tenant))
    chain.append(GLOBAL)
    return tuple(chain)


def level_of(scope: str) -> str:
    """``user``, ``tenant`` or ``global``: which level of a chain ``scope`` is."""
    user, tenant = parse_scope(scope)
    return "user" if user else "tenant" if tenant else "global"


def pick_level(chain: Sequence[str], level: str) -> str | None:
    """The scope of ``chain`` at ``level`` (None if the chain has no such level)."""
    return next((s for s in chain if level_of(s) == level), None)
