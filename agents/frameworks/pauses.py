"""A framework's pause for a person, as a cardbus review: what both adapters share.

pydantic-ai ends a tool call that requires approval in a deferred request
(``DeferredToolRequests``, answered with ``ToolApproved`` / ``ToolDenied``); the OpenAI
Agents SDK ends a run on a ``needs_approval`` tool in interruptions (answered with
``RunState.approve`` / ``reject``). Either way the framework would keep the pause in
its own memory, which a crash loses. The adapters keep it in the log instead:

* each proposed call takes its place in the task's journal (``tool.begin`` under
  review): the orchestrator writes ``tool.review_requested`` (the tool, the proposed
  arguments, the tool's input schema, the model's text) and the attempt ends with
  ``ToolUnderReview`` once every call of the batch was asked (the calls of one turn are
  reviewed together); the task waits in ``awaiting_approval``;
* a person answers (``cardbus review TASK approve | edit --args JSON | refuse --reason``,
  the console, the MCP server); the next attempt, in this process or another after a
  kill -9, replays the journal (the model's answers are recorded) up to the same
  proposal and meets the answer: approved, the framework runs the tool (with the
  edited arguments) in that step of the journal; refused, the framework hands the
  model the reason.

Without an orchestrator (``Agent.run`` called directly) there is no log to hold the
call and nobody to ask: the call is refused (``NOBODY``), never run unapproved.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from cardbus.agents.agent import TaskContext
from cardbus.agents.journal import BegunCall
from cardbus.agents.tools import ToolError
from cardbus.eventstore.errors import ToolUnderReview

__all__ = ["NOBODY", "Proposal", "Verdict", "review_proposals"]

#: the refusal of a call that needs approval when no orchestrator runs the task
NOBODY = "this call needs a person's approval, and this run has nobody to ask (no bus)"


@dataclass(slots=True, frozen=True)
class Proposal:
    """One proposed call the framework paused on: its id in the framework (tool call id),
    the tool, and its arguments as JSON builtins."""

    call_id: str
    tool: str
    arguments: dict[str, Any]


@dataclass(slots=True, frozen=True)
class Verdict:
    """The person's word on a proposal: ``begun`` (approved, its place in the journal
    taken: run it, or its recorded result when ``begun.replayed``), else ``refusal`` (the
    reason the model gets)."""

    begun: BegunCall | None = None
    refusal: str = ""


async def review_proposals(
    ctx: TaskContext,
    proposals: Iterable[Proposal],
    schemas: Mapping[str, dict[str, Any]],
    idempotent: frozenset[str] = frozenset(),
) -> dict[str, Verdict]:
    """The verdict on each proposal, by call id, read from the log.

    Every proposal is asked before any pause ends the attempt, so the calls of one turn
    are in the log together; then ``ToolUnderReview`` (the first) while any waits."""
    journal = ctx.journal
    verdicts: dict[str, Verdict] = {}
    held: list[ToolUnderReview] = []
    for p in proposals:
        if not journal.recording:
            verdicts[p.call_id] = Verdict(refusal=NOBODY)
            continue
        try:
            begun = await journal.tool_begin(
                p.tool,
                p.arguments,
                idempotent=p.tool in idempotent,
                review=True,
                schema=schemas.get(p.tool, {}),
            )
        except ToolUnderReview as e:
            held.append(e)
            continue
        except ToolError as e:  # refused: the reason is the model's to act on
            verdicts[p.call_id] = Verdict(refusal=str(e))
            continue
        verdicts[p.call_id] = Verdict(begun=begun)
    if held:
        raise held[0]
    return verdicts
