"""The README's framework agents ("Agents you already have") are what it says they are."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

README = Path(__file__).resolve().parents[2] / "README.md"


def _example(marker: str) -> str:
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), re.S)
    return next(b for b in blocks if marker in b)


def _run(code: str, name: str) -> dict[str, Any]:
    namespace: dict[str, Any] = {"__name__": name}
    exec(compile(code, "README.md", "exec"), namespace)
    return namespace


def test_the_readme_pydantic_ai_agent(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "k")  # the provider wants one; nothing is sent
    card = _run(_example("a pydantic-ai agent"), "readme_pydantic_ai")["Explainer"].card()
    assert (card.agent_id, card.constraints.tools) == ("explainer", ["glossary"])
    (cap,) = card.capabilities
    assert cap.name == "explain" and cap.description.startswith("Look the term up")
    assert set(cap.output_schema["properties"]) == {"term", "sentence"}


def test_the_readme_openai_agents_agent() -> None:
    agent = _run(_example("an OpenAI Agents SDK agent"), "readme_openai_agents")["Shortener"]
    card = agent.card()
    assert card.agent_id == "shortener" and agent.idempotent_tools == ("word_count",)
    (cap,) = card.capabilities
    assert cap.name == "shorten" and cap.output_schema == {"type": "string"}
    assert cap.input_schema["$defs"]["Prompt"]["required"] == ["prompt"]
