"""Registration authority: which agents may exist, and with what, is the operator's to say.

An agent's announcement (``Announce`` on the bus) is a claim about itself,
not a grant. :class:`AgentGrants` decides what of it is registered:

* **Operator's grants** (``AgentGrants(cards)``, ``AgentGrants.load(path)``:
  an agents file, ``cardbus orchestrator --agents FILE``): only the agents
  it lists may register, each with at most the capabilities, tools and
  limits of its card there. An unlisted agent's announcement is refused.
* **Open** (``AgentGrants()``, the default): the first card registered for
  an agent id is its ceiling, from ``Orchestrator.register`` (the operator's
  code: the embedded runtime registers the agents it constructs, so
  in-process agents are trusted by construction) or else from the agent's
  first announcement (trust on first use).

Either way an announcement refreshes the descriptive fields (name,
description, version, provider, url) and can narrow what is registered
(fewer capabilities or tools, lower limits), but never widen it: whatever it
asks for beyond the ceiling is left out, and named (the orchestrator
records it as ``reply.refused``). The capability specs (schemas) and the
free-form ``limits`` are always the ceiling's. An announcement can speak
only for its sender: that is the transport's part (``Bus.on_refused``).
``Orchestrator.register(card)`` is the operator's path and is not checked.

An announcement in another wire format than this code's (``Announce.wire_version``
other than ``WIRE_VERSION``: ``cardbus.bus.wire``) registers nothing, whatever the
grants say: the agent would not understand the cards it is sent.

A capability whose input or output schema is not a JSON Schema (Draft 2020-12:
``{"type": "strin"}``, a pattern that is no regex) is refused at the door, named
with the reason (``cardbus.agents.schema.schema_problem``): in an announcement it
is left out, in an agents file or ``Orchestrator.register`` it is an error. Every
check of a value against it would otherwise fail, task after task, for a reason
that is the card's.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec

from cardbus.agents.cards import WIRE_VERSION, AgentCard, AgentConstraints
from cardbus.agents.schema import capability_schema_problems
from cardbus.bus.orchestrator.access import tool_allowed
from cardbus.eventstore.batch import MAX_ID_CHARS
from cardbus.eventstore.errors import ConfigError, ValidationError

__all__ = ["Admission", "AgentGrants", "check_registrable", "narrowed"]

#: what an announcement may change freely
DESCRIPTIVE = ("name", "description", "version", "provider", "url")


@dataclass(frozen=True)
class Admission:
    """What to register of an announcement (None: nothing), and what of it was refused."""

    card: AgentCard | None
    refused: list[str] = field(default_factory=list)


def check_registrable(card: AgentCard) -> None:
    """A ``ValidationError`` naming what makes ``card`` unfit for the log: an agent id
    that is not 1 to ``MAX_ID_CHARS`` chars, a capability schema that is not a JSON Schema."""
    if not isinstance(card.agent_id, str) or not 0 < len(card.agent_id) <= MAX_ID_CHARS:
        shown = card.agent_id[:40] if isinstance(card.agent_id, str) else card.agent_id
        raise ValidationError(
            f"agent id {shown!r} must be 1 to {MAX_ID_CHARS} chars (MAX_ID_CHARS)"
        )
    problems = capability_schema_problems(card.capabilities)
    if problems:
        said = "; ".join(f"capability {n!r}: {why}" for n, why in problems.items())
        raise ValidationError(f"agent {card.agent_id!r}: {said}")


def _usable(admission: Admission) -> Admission:
    """``admission`` without the capabilities whose schemas are not a JSON Schema, each
    refused with its reason."""
    card = admission.card
    problems = capability_schema_problems(card.capabilities) if card is not None else {}
    if card is None or not problems:
        return admission
    kept = [c for c in card.capabilities if c.name not in problems]
    refused = [f"capability {n!r}: {why}" for n, why in problems.items()]
    return Admission(msgspec.structs.replace(card, capabilities=kept), admission.refused + refused)


def _lower(name: str, granted: Any, asked: Any, refused: list[str]) -> Any:
    """The lower of two limits (None: no limit); asking above the grant is refused."""
    if granted is None:
        return asked
    if asked is None or asked > granted:
        refused.append(f"{name} {'unlimited' if asked is None else asked} (granted {granted})")
        return granted
    return asked


def _within(asked: str, granted: list[str]) -> bool:
    """An announced allow-list entry is within the grant when it is one of the granted
    entries, or a plain name (no glob) that a granted glob matches (``"time__now"`` under
    ``"time__*"``); a glob is never judged narrower than another glob."""
    if asked in granted:
        return True
    return not any(c in asked for c in "*?[") and tool_allowed(asked, granted)


def narrowed(ceiling: AgentCard, announced: AgentCard) -> Admission:
    """``announced`` cut down to ``ceiling``: its descriptive fields, the ceiling's powers."""
    refused: list[str] = []
    caps = []
    for c in announced.capabilities:
        granted = ceiling.capability(c.name)
        if granted is None:
            refused.append(f"capability {c.name!r}")
        else:
            caps.append(granted)
    g, a = ceiling.constraints, announced.constraints
    tools = [t for t in a.tools if _within(t, g.tools)]
    refused += [f"tool {t!r}" for t in a.tools if not _within(t, g.tools)]
    if a.limits != g.limits:
        refused.append("limits (the granted ones are kept)")
    constraints = AgentConstraints(
        max_timeout_s=_lower("max_timeout_s", g.max_timeout_s, a.max_timeout_s, refused),
        max_input_bytes=_lower("max_input_bytes", g.max_input_bytes, a.max_input_bytes, refused),
        max_concurrency=_lower("max_concurrency", g.max_concurrency, a.max_concurrency, refused),
        limits=g.limits,
        tools=tools,
    )
    card = msgspec.structs.replace(
        ceiling,
        **{f: getattr(announced, f) for f in DESCRIPTIVE},
        capabilities=caps,
        constraints=constraints,
    )
    return Admission(card, refused)


class AgentGrants:
    """The operator's word on which agents may register with what (None: open)."""

    def __init__(self, cards: Iterable[AgentCard] | None = None) -> None:
        self.cards: dict[str, AgentCard] | None = None
        if cards is not None:
            self.cards = {}
            for c in cards:
                if c.agent_id in self.cards:
                    raise ConfigError(f"agent {c.agent_id!r} is granted twice")
                problems = capability_schema_problems(c.capabilities)
                if problems:  # the first is enough to say
                    name, why = next(iter(problems.items()))
                    raise ConfigError(f"agent {c.agent_id!r}, capability {name!r}: {why}")
                self.cards[c.agent_id] = c

    @property
    def closed(self) -> bool:
        """Only the listed agents may register."""
        return self.cards is not None

    @classmethod
    def load(cls, path: str | Path) -> AgentGrants:
        """An agents file: a JSON list of AgentCards, or ``{"agents": [...]}``."""
        try:
            raw = msgspec.json.decode(Path(path).read_bytes())
            if isinstance(raw, dict):
                raw = raw.get("agents")
            if not isinstance(raw, list):
                raise TypeError("expected a list of agent cards (or {'agents': [...]})")
            cards = msgspec.convert(raw, list[AgentCard])
        except (OSError, TypeError, msgspec.DecodeError, msgspec.ValidationError) as e:
            raise ConfigError(f"agents file {str(path)!r}: {e}") from e
        return cls(cards)

    def admit(
        self, announced: AgentCard, registered: AgentCard | None, wire_version: int = WIRE_VERSION
    ) -> Admission:
        """What of ``announced`` to register, given what is registered for its id now and
        the wire version it was announced in."""
        if wire_version != WIRE_VERSION:
            why = f"wire version {wire_version!r} (this orchestrator speaks {WIRE_VERSION})"
            return Admission(None, [why])
        if self.cards is not None:
            grant = self.cards.get(announced.agent_id)
            if grant is None:
                return Admission(None, [f"agent {announced.agent_id!r} is not granted"])
            # narrower than the grant already (an earlier announcement): stays so
            return narrowed(grant, announced)
        if registered is None:
            return _usable(Admission(announced))  # open: the first card is the ceiling
        # a ceiling from a log older than the check at the door may hold a broken schema
        return _usable(narrowed(registered, announced))
