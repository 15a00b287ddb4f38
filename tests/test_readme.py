"""The first-agent tutorial's agent and plan (docs/tutorials/first-agent.md, the README's
example until the README became a landing page) run as written, in a plain test too."""

from __future__ import annotations

import json
import re
from pathlib import Path

from cardbus.bus.orchestrator.plan import decode_plan
from cardbus.bus.runtime.embedded import EmbeddedRuntime
from cardbus.eventstore import SqliteEventStore
from cardbus.tools.loading import load_agent

PAGE = Path(__file__).resolve().parents[1] / "docs" / "tutorials" / "first-agent.md"


def _blocks(lang: str) -> list[str]:
    return re.findall(rf"```{lang}[^\n]*\n(.*?)```", PAGE.read_text(), re.S)


async def test_the_tutorial_agent_and_plan_run(tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    agent_code = next(b for b in _blocks("python") if "class Summarizer" in b)
    assert len(agent_code.strip().splitlines()) <= 25  # "an agent in about twenty lines"
    (tmp_path / "my_agents.py").write_text(agent_code)
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    plan = decode_plan(next(b for b in _blocks("json") if '"plan_id"' in b).encode())
    agents = [load_agent(p) for p in plan.agents]
    store = await SqliteEventStore.open(tmp_path / "readme.db")
    try:
        async with EmbeddedRuntime(store, agents) as rt:
            result = await rt.run(plan, timeout=30)
    finally:
        await store.close()
    assert result.status == "completed", result
    summary = result.outputs["sum"]
    assert summary["summary"].startswith("tides: overview fact 1")
    assert summary["words"] == len(summary["summary"].rstrip(".").split())
    json.dumps(result.outputs)  # outputs are plain JSON
