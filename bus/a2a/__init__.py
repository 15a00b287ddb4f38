"""The A2A gateway: cardbus runs served as A2A tasks, remote A2A agents as cardbus agents.

Needs the ``a2a`` extra (a2a-sdk and its HTTP server): ``pip install 'cardbus[a2a]'``.
The card mapping itself (no network, no a2a-sdk) is ``cardbus.agents.a2a_card``.
"""

from __future__ import annotations

from cardbus.bus.a2a import _sdk  # noqa: F401  (names the extra when a2a-sdk is missing)
from cardbus.bus.a2a.fold import CANCEL_REASON, USER_AGENT_ID, USER_CAPABILITY, TaskFold
from cardbus.bus.a2a.remote import RemoteA2AAgent, load_remote, remote_a2a_agent
from cardbus.bus.a2a.serve import serve
from cardbus.bus.a2a.server import (
    A2AGateway,
    GoalPlanning,
    LogTaskStore,
    Planner,
    build_app,
    gateway_card,
    user_agent_card,
)

__all__ = [
    "CANCEL_REASON",
    "USER_AGENT_ID",
    "USER_CAPABILITY",
    "A2AGateway",
    "GoalPlanning",
    "LogTaskStore",
    "Planner",
    "RemoteA2AAgent",
    "TaskFold",
    "build_app",
    "gateway_card",
    "load_remote",
    "remote_a2a_agent",
    "serve",
    "user_agent_card",
]
