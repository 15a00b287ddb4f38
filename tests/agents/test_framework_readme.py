"""The framework agents of docs/tutorials/framework-agents.md (the README's "Agents you
already have" until it became a landing page) are what the page says they are."""

from __future__ import annotations

import re
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "tutorials" / "framework-agents.md"


def _example(marker: str) -> str:
    blocks = re.findall(r"```python[^\n]*\n(.*?)```", PAGE.read_text(), re.S)
    return next(b for b in blocks if marker in b)


def _run(code: str, name: str) -> dict[str, Any]:
    """Run a block as a reader's interpreter would: with the repository's root (which
    pytest may have put first on sys.path) last, where its folder agents/ does not
    shadow openai-agents' package `agents`."""
    namespace: dict[str, Any] = {"__name__": name}
    saved = list(sys.path)
    sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != ROOT] + [str(ROOT)]
    try:
        exec(compile(code, str(PAGE), "exec"), namespace)
    finally:
        sys.path[:] = saved
    return namespace


def test_the_tutorial_pydantic_ai_agent(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "k")  # the provider wants one; nothing is sent
    card = _run(_example("a pydantic-ai agent"), "readme_pydantic_ai")["Explainer"].card()
    assert (card.agent_id, card.constraints.tools) == ("explainer", ["glossary"])
    (cap,) = card.capabilities
    assert cap.name == "explain" and cap.description.startswith("Look the term up")
    assert set(cap.output_schema["properties"]) == {"term", "sentence"}


def test_the_tutorial_openai_agents_agent() -> None:
    agent = _run(_example("an OpenAI Agents SDK agent"), "readme_openai_agents")["Shortener"]
    card = agent.card()
    assert card.agent_id == "shortener" and agent.idempotent_tools == ("word_count",)
    (cap,) = card.capabilities
    assert cap.name == "shorten" and cap.output_schema == {"type": "string"}
    assert cap.input_schema["$defs"]["Prompt"]["required"] == ["prompt"]
