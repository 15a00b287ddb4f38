"""The demo, in one place: its agents (a report pipeline), its plans and its documents.

``cardbus demo`` runs :func:`report_plan` (or :func:`parallel_plan`) with
:data:`DEMO_AGENTS` over :data:`DEMO_DOCS`; the README's NATS walk-through
serves the same agents as ``cardbus.agents.demo:Researcher`` and so on.
"""

from __future__ import annotations

from .docs import DEMO_DOCS, demo_docs
from .payer import Amount, Payee, Payer, Payment
from .plans import parallel_plan, report_plan
from .roles import (
    DEMO_AGENTS,
    Draft,
    Facts,
    Merger,
    Outline,
    Planner,
    Researcher,
    Reviewer,
    Section,
    Writer,
    compose_draft,
    preferred_format,
)

__all__ = [
    "Amount",
    "Payee",
    "Payer",
    "Payment",
    "DEMO_AGENTS",
    "DEMO_DOCS",
    "Draft",
    "Facts",
    "Merger",
    "Outline",
    "Planner",
    "Researcher",
    "Reviewer",
    "Section",
    "Writer",
    "compose_draft",
    "demo_docs",
    "parallel_plan",
    "preferred_format",
    "report_plan",
]
