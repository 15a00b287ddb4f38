"""Agents written with other frameworks, as cardbus agents: one module per framework,
each needing its extra, imported only when one of its names is asked for.

==========================  ==========================  ==============================
name                        module                      extra
==========================  ==========================  ==============================
``pydantic_ai_agent``,      ``.pydantic_ai``            ``cardbus[pydantic-ai]``
``PydanticAIAgent``
``openai_agents_agent``,    ``.openai_agents``          ``cardbus[openai-agents]``
``OpenAIAgentsAgent``
==========================  ==========================  ==============================

``.common`` holds what they share (the card, the prompt, the output, the runtime's
tools); it needs neither framework.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from cardbus.agents.frameworks.openai_agents import OpenAIAgentsAgent, openai_agents_agent
    from cardbus.agents.frameworks.pydantic_ai import PydanticAIAgent, pydantic_ai_agent

__all__ = ["OpenAIAgentsAgent", "PydanticAIAgent", "openai_agents_agent", "pydantic_ai_agent"]

_WHERE = {
    "PydanticAIAgent": "pydantic_ai",
    "pydantic_ai_agent": "pydantic_ai",
    "OpenAIAgentsAgent": "openai_agents",
    "openai_agents_agent": "openai_agents",
}


def __getattr__(name: str) -> Any:
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{module}"), name)
