"""Allow-lists name tools exactly or by glob (``"time__*"``: every tool of MCP server time)."""

from __future__ import annotations

from cardbus.agents.cards import AgentCard, AgentConstraints
from cardbus.bus.orchestrator.access import tool_allowed
from cardbus.bus.orchestrator.registry import narrowed


def test_an_allow_list_entry_is_a_name_or_a_glob() -> None:
    allowed = ["doc_search", "time__*", "fs__read_?"]
    for name in ("doc_search", "time__now", "time__convert_time", "fs__read_a"):
        assert tool_allowed(name, allowed), name
    for name in ("doc_searchx", "timer__now", "fs__read_ab", "fs__write_a", "TIME__now"):
        assert not tool_allowed(name, allowed), name
    assert not tool_allowed("anything", [])


def _card(tools: list[str]) -> AgentCard:
    return AgentCard(agent_id="a", name="A", constraints=AgentConstraints(tools=tools))


def test_an_announcement_narrows_a_granted_glob_but_never_widens_it() -> None:
    ceiling = _card(["time__*", "doc_search"])
    asked = _card(["time__*", "time__now", "doc_search", "fs__read", "*", "time__[a-z]*"])
    admission = narrowed(ceiling, asked)
    assert admission.card is not None
    assert admission.card.constraints.tools == ["time__*", "time__now", "doc_search"]
    assert admission.refused == ["tool 'fs__read'", "tool '*'", "tool 'time__[a-z]*'"]
