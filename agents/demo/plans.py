"""The demo's plans, in the plan format (the JSON that ``cardbus run PLAN.json`` reads).

They are plain data: the orchestrator and the runtimes accept this form as
they accept a ``Plan`` (``cardbus.Plan``), so the demo depends on nothing but
the format.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

__all__ = ["parallel_plan", "report_plan"]


def _dep(task: str, path: str) -> dict[str, str]:
    return {"$dep": task, "path": path}


def report_plan(
    topic: str,
    plan_id: str | None = None,
    user: str = "demo",
    preferences: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """research -> outline (asks for figures once, passes them on) -> draft (reviewed).

    The session (what the user asked) holds the user's ``preferences``, by
    default ``{"report_format": "markdown"}``; the writer never sees it: it
    gets only ``user`` and looks the format up in long-term memory, where the
    memory policy puts it once a run has completed.
    """
    prefs = {"report_format": "markdown"} if preferences is None else preferences
    return {
        "goal": f"Write a short report on {topic}",
        "plan_id": plan_id,
        "session": {"request": f"a short report on {topic}", "user": user, "preferences": prefs},
        "tasks": [
            {
                "id": "research",
                "capability": "research",
                "goal": f"Find facts about {topic}",
                "inputs": {"topic": topic},
            },
            {
                "id": "outline",
                "capability": "outline",
                "goal": f"Outline a report on {topic}",
                "deps": ["research"],
                "inputs": {"topic": topic, "facts": _dep("research", "facts")},
            },
            {
                "id": "draft",
                "capability": "write",
                "goal": f"Write the report on {topic}",
                "deps": ["outline", "research"],
                "review_by": "review",
                "inputs": {
                    "topic": topic,
                    "outline": _dep("outline", "sections"),
                    "facts": _dep("research", "facts"),
                    "figures": _dep("outline", "figures"),
                    "user": user,
                },
            },
        ],
    }


def parallel_plan(
    topic: str, subtopics: Sequence[str] = ("history", "economy", "culture")
) -> dict[str, Any]:
    """Three research tasks in parallel, merged, then outlined and written."""
    research: list[dict[str, Any]] = [
        {
            "id": f"research_{s}",
            "capability": "research",
            "goal": f"Research the {s} of {topic}",
            "inputs": {"topic": topic, "focus": s},
        }
        for s in subtopics
    ]
    base = report_plan(topic)
    outline, draft = base["tasks"][1], base["tasks"][2]
    merge = {
        "id": "merge",
        "capability": "merge",
        "goal": "Merge the research",
        "deps": [r["id"] for r in research],
        "inputs": {"parts": [_dep(r["id"], "facts") for r in research]},
    }
    outline = {
        **outline,
        "deps": ["merge"],
        "inputs": {**outline["inputs"], "facts": _dep("merge", "facts")},
    }
    draft = {
        **draft,
        "deps": ["outline", "merge"],
        "inputs": {**draft["inputs"], "facts": _dep("merge", "facts"), "user": "demo"},
    }
    return {
        "goal": f"Write a report on {topic} from parallel research",
        "session": base["session"],
        "tasks": [*research, merge, outline, draft],
    }
