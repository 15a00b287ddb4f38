"""Agents for tests/cli/test_one_line.py: one that always fails, one that never answers,
a planner that never answers, and two that offer the same capability."""

from __future__ import annotations

import asyncio
from typing import Any

import msgspec

from cardbus import Agent, Capability
from cardbus.agents.planning import PLAN_CAPABILITY, PlanProposal, PlanRequest


class N(msgspec.Struct):
    n: int


class Broken(Agent):
    agent_id = "broken"
    capabilities = [Capability("fix", N, N, "never works")]

    async def handle(self, task: Any, inputs: Any, ctx: Any) -> Any:
        raise RuntimeError("always broken")


class Stuck(Agent):
    """Never answers: it waits on an event nobody sets, until its task is cancelled."""

    agent_id = "stuck"
    capabilities = [Capability("wait", N, N, "waits forever")]

    async def handle(self, task: Any, inputs: Any, ctx: Any) -> Any:
        await asyncio.Event().wait()


class StuckPlanner(Agent):
    agent_id = "stuck-planner"
    capabilities = [Capability(PLAN_CAPABILITY, PlanRequest, PlanProposal, "never plans")]

    async def handle(self, task: Any, inputs: Any, ctx: Any) -> Any:
        await asyncio.Event().wait()


class Inc(Agent):
    agent_id = "inc"
    capabilities = [Capability("inc", N, N, "adds one")]

    async def handle(self, task: Any, inputs: Any, ctx: Any) -> Any:
        return N(inputs.n + 1)


class IncToo(Agent):
    agent_id = "inc-too"
    capabilities = [Capability("inc", N, N, "adds one as well")]

    async def handle(self, task: Any, inputs: Any, ctx: Any) -> Any:
        return N(inputs.n + 1)


class Canceller(Agent):
    """Cancels its own run (as an operator would, on the log named by $CARDBUS_TEST_DB, as
    ``ops``), then waits: the cancel stops it."""

    agent_id = "canceller"
    capabilities = [Capability("cancel", N, N, "cancels its run")]

    async def handle(self, task: Any, inputs: Any, ctx: Any) -> Any:
        import os

        from cardbus import SqliteEventStore
        from cardbus.bus.orchestrator.cancel import cancel_run

        store = await SqliteEventStore.open(os.environ["CARDBUS_TEST_DB"])
        try:
            await cancel_run(store, task.root_id, by="ops", reason="cancelled_by_user: wrong")
        finally:
            await store.close()
        await asyncio.Event().wait()
