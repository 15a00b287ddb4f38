"""The LLM tutorial's agent (docs/tutorials/llm-agents.md) runs as written (on the mock model)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from cardbus.agents import MockLLM, TaskCard

PAGE = Path(__file__).resolve().parents[2] / "docs" / "tutorials" / "llm-agents.md"


def example() -> str:
    blocks = re.findall(r"```python[^\n]*\n(.*?)```", PAGE.read_text(), re.S)
    return next(b for b in blocks if "(LLMAgent):" in b)


async def test_the_tutorial_llm_agent_runs() -> None:
    code = example()
    assert len(code.strip().splitlines()) <= 25  # "LLMAgent in about twenty lines"
    namespace: dict[str, Any] = {"__name__": "readme_llm_agent"}
    exec(compile(code, str(PAGE), "exec"), namespace)
    agent = namespace["Briefer"]
    card = agent.card()
    assert card.constraints.limits["model"] == ["gpt-4o-mini", "gpt-4o"]
    task = TaskCard(task_id="t", root_id="r", capability="brief", inputs={"topic": "tides"})
    result = await agent.run(task, MockLLM())
    assert result.status == "completed", result
    assert set(result.output) == {"title", "points"}
    assert result.notes == "model: gpt-4o-mini" and result.usage.input_tokens > 0
