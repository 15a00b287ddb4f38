"""The agent's side of the journal: each model call and tool call, in order, on the log.

A handler run (one delivery of one card) is an *execution*. Every model call
made through ``ctx.llm`` and every ``ctx.tool`` call gets the next ``seq`` of
that execution, so the calls of a run form one sequence. The journal never
writes the log itself (agents never do, DESIGN.md): it asks the orchestrator,
as ``ctx.tool`` does, with two requests per model call:

``model.request``  the request and its digest, before the call. The
                   orchestrator records ``model.requested`` and answers "go
                   live" (under a budget, with the ``max_tokens`` the call is
                   sent with: ``llm.current_max_tokens``), or, when an earlier
                   execution of the task asked exactly this at this place and
                   nothing before it differed, answers with the recorded
                   answer (``model.answered`` naming the one it replays): no
                   call goes out, nothing is spent.
``model.answer``   the answer (or the typed error), after a live call. The
                   orchestrator records ``model.answered``. The handler sees
                   the answer at once; the record is durable before anything
                   that depends on it leaves the process: every later request
                   of the task and its result wait for it
                   (``agents.journal_settle``).

Tool calls need no extra request: the orchestrator runs them, and records and
replays them itself (``bus.orchestrator.journal``).

Without an orchestrator to ask (``Agent.run`` called directly, no worker), model
calls go out unrecorded, as before.

``OfflineLLM`` is the model of an offline re-run (``cardbus rerun --offline``):
every call is answered from the log, and one that reaches it raises
``ReplayDiverged`` (there is no endpoint and no key).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import itertools
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import msgspec

from cardbus.agents.llm import CALL_MAX_TOKENS, Completion
from cardbus.agents.pacing import CALL_PACING, CALL_QUEUE_WATCH, CALL_QUEUED_S, QueueWatch
from cardbus.agents.requests import REQUESTER
from cardbus.eventstore.errors import LLMError, ReplayDiverged, ToolError
from cardbus.eventstore.ids import new_id

if TYPE_CHECKING:
    from cardbus.agents.requests import TaskServices

__all__ = ["BegunCall", "OfflineLLM", "TaskJournal", "request_digest"]

_encoder = msgspec.json.Encoder(order="sorted")


def request_digest(request: Any) -> str:
    """The digest that decides whether a retry asks the same thing: sha256 of the
    request's canonical JSON (keys sorted)."""
    try:
        data = _encoder.encode(request)
    except Exception:
        data = repr(request).encode()
    return hashlib.sha256(data).hexdigest()


class OfflineLLM:
    """The LLM of an offline re-run: no endpoint, no key. Every model call is meant to be
    answered from the recorded run's log; a call that reaches this model was not, and
    raises ``ReplayDiverged`` (the task fails with ``replay_diverged``).

    ``model`` is the name the recorded run's endpoint had (its requests name it), so
    the requests of the re-run are the recorded ones.
    """

    provider = "cardbus.offline"

    def __init__(self, model: str = "") -> None:
        self.model = model

    def _refuse(self, model: str | None) -> ReplayDiverged:
        return ReplayDiverged(
            f"offline re-run: a call to model {model or self.model or '(default)'} that the"
            " recorded run did not make; no endpoint is used offline"
        )

    async def complete(self, prompt: str, *, system: str = "") -> Completion:
        raise self._refuse(None)

    async def chat(
        self,
        messages: Sequence[Any],
        *,
        model: str | None = None,
        response_format: dict[str, Any] | None = None,
        tools: Sequence[dict[str, Any]] | None = None,
    ) -> Completion:
        raise self._refuse(model)


@dataclass(slots=True)
class BegunCall:
    """A tool call at its place in the journal, before it runs (``TaskJournal.tool_begin``):
    ``replayed`` with its recorded ``result``, else to run with ``arguments`` (a person's
    ``edited`` ones, when they changed them) under the idempotency ``key``."""

    name: str
    arguments: dict[str, Any]
    seq: int
    key: str = ""
    replayed: bool = False
    result: Any = None
    edited: dict[str, Any] | None = None


class TaskJournal:
    """One execution's journal: its id and the next call's ``seq``."""

    def __init__(self, services: TaskServices, replay: bool = True) -> None:
        """``replay``: False asks the orchestrator never to answer from the journal
        (fresh calls every attempt; they are still recorded)."""
        self.services = services
        self.execution = new_id()
        self.replay = replay
        self._seq = itertools.count()
        self.replayed = 0  # calls answered from the journal in this execution

    def next_seq(self) -> int:
        return next(self._seq)

    @property
    def recording(self) -> bool:
        """Whether an orchestrator takes the records (a worker runs the task)."""
        return (self.services.requester or REQUESTER.get()) is not None

    async def model_call(
        self,
        request: dict[str, Any],
        live: Callable[[], Awaitable[Completion]],
        provider: str = "",
    ) -> Completion:
        """Answer ``request`` from the journal, or make it ``live`` and record the answer."""
        if not self.recording:
            return await live()

        async def asked() -> dict[str, Any]:
            return msgspec.to_builtins(await live())

        return msgspec.convert(await self.call(request, asked, provider), Completion)

    async def call(
        self,
        request: dict[str, Any],
        live: Callable[[], Awaitable[dict[str, Any]]],
        provider: str = "",
    ) -> dict[str, Any]:
        """The journal's one model-call step, for any client (a framework's model too).

        ``request`` is what is asked, as JSON builtins (its ``model`` names the model);
        ``live()`` makes the call and returns the answer as a JSON object, with
        ``input_tokens``, ``output_tokens`` and ``model`` keys where it knows them (the
        log's usage figures). Returns the recorded answer on a replay, else the live one
        once it is durable. Without an orchestrator to ask, ``live()`` as it is.
        """
        if not self.recording:
            return await live()
        seq = self.next_seq()
        services = self.services
        model = str(request.get("model") or "")
        asked = await services.request(
            "model.request",
            model,
            # the provider rides beside the request, not in it: the digest is the ask's alone
            {
                "request": request,
                "digest": request_digest(request),
                "replay": self.replay,
                "provider": provider,
            },
            seq=seq,
            execution=self.execution,
        )
        replayed = asked.get("replay") if isinstance(asked, dict) else None
        if isinstance(replayed, dict):
            self.replayed += 1
            return replayed
        call = asked.get("call", "") if isinstance(asked, dict) else ""
        # the output bound the orchestrator's budget check reserved: the call is sent with it
        # (``current_max_tokens``), so no cap is crossed by an answer it priced
        bound = asked.get("max_tokens") if isinstance(asked, dict) else None
        ok = isinstance(bound, int) and not isinstance(bound, bool) and bound > 0
        token = CALL_MAX_TOKENS.set(bound if ok else None)
        task = getattr(services, "task", None)
        # the pacer serves by priority, then runs round-robin: it knows the call's run by
        # its root id, and the run's priority from the card
        CALL_QUEUED_S.set(0.0)
        priority = getattr(task, "priority", 0)
        pacing = CALL_PACING.set(
            (str(getattr(task, "root_id", "") or ""), priority if isinstance(priority, int) else 0)
        )

        async def queued(limit: str, max_wait_s: float) -> object:
            args = {"call": call, "phase": "queued", "limit": limit, "max_wait_s": max_wait_s}
            return await services.request(
                "model.queue", model, args, seq=seq, execution=self.execution
            )

        async def granted(waited_s: float) -> object:
            args = {"call": call, "phase": "granted", "waited_s": round(waited_s, 6)}
            return await services.request(
                "model.queue", model, args, seq=seq, execution=self.execution
            )

        # a wait for the provider's limit is recorded: queued, not the task's run time
        watching = CALL_QUEUE_WATCH.set(QueueWatch(queued, granted))
        start = time.monotonic()
        try:
            answer = await live()
        except asyncio.CancelledError:
            # the handler was stopped during the call: recorded as cut off (no answer used)
            with contextlib.suppress(Exception):
                await services.request(
                    "model.answer",
                    model,
                    {
                        "call": call,
                        "error": "cancelled during the call",
                        "error_type": "cancelled",
                        "latency_s": round(time.monotonic() - start, 6),
                    },
                    seq=seq,
                    execution=self.execution,
                )
            raise
        except Exception as e:
            reason = e.error_type if isinstance(e, LLMError) else type(e).__name__
            await services.request(
                "model.answer",
                model,
                {
                    "call": call,
                    "error": f"{type(e).__name__}: {e}",
                    "error_type": reason,
                    "latency_s": round(time.monotonic() - start, 6),
                },
                seq=seq,
                execution=self.execution,
            )
            raise
        finally:
            CALL_MAX_TOKENS.reset(token)
            CALL_PACING.reset(pacing)
            CALL_QUEUE_WATCH.reset(watching)
        record = services.request(
            "model.answer",
            model,
            {
                "call": call,
                "answer": answer,
                "latency_s": round(time.monotonic() - start, 6),
                # waited for the provider's limit (part of latency_s, not of the model's)
                "queued_s": round(CALL_QUEUED_S.get(), 6),
            },
            seq=seq,
            execution=self.execution,
        )
        # The handler gets the answer now; its record becomes durable meanwhile, and
        # anything that depends on it waits for that before it leaves the process (the
        # next request, the result: ``agents.journal_settle``). Where the record cannot
        # be left to the background (another loop, a services object without it), it is
        # awaited here, as before.
        defer = getattr(services, "defer_record", None)
        if defer is None or not defer(record):
            await record
        return answer

    async def tool_call(
        self,
        name: str,
        arguments: dict[str, Any],
        run: Callable[[str], Awaitable[Any]],
        *,
        idempotent: bool = False,
        review: bool = False,
        schema: dict[str, Any] | None = None,
        edited: Callable[[str, dict[str, Any]], Awaitable[Any]] | None = None,
    ) -> Any:
        """A tool the agent runs itself (a framework's function tool), journaled.

        ``run(idempotency_key)`` is awaited only when the journal has no result for this
        call: its ``tool.requested`` is durable before it runs (invariant 8), its result
        (JSON builtins) or error is recorded after. A retry that calls it again with the
        same arguments at the same place gets the recorded result; a call whose effect is
        unknown (the process died during it) runs again only if ``idempotent``, else
        ``EffectUnknown`` is raised and the task waits for an operator (who may record it
        as done: the recorded result is then returned). After a first difference, a call
        an earlier attempt recorded gets that call's key, under the same rule.

        ``review``: the tool's policy holds this call for a person (``schema``: its input
        schema, an edit is checked against it). ``ToolUnderReview`` is raised until the
        person's word; refused, the refusal is raised as a ``ToolError`` (the model's to
        act on); approved with other arguments, ``edited(key, arguments)`` runs instead.
        """
        begun = await self.tool_begin(
            name, arguments, idempotent=idempotent, review=review, schema=schema
        )
        if begun.replayed:
            return begun.result
        if begun.edited is not None and edited is not None:
            changed = begun.edited  # a person's edit: the call runs with these

            async def run(key: str) -> Any:
                return await edited(key, changed)

        return await self.tool_run(begun, run)

    async def tool_begin(
        self,
        name: str,
        arguments: dict[str, Any],
        *,
        idempotent: bool = False,
        review: bool = False,
        schema: dict[str, Any] | None = None,
    ) -> BegunCall:
        """The first half of ``tool_call``, for a framework that decides whether a call
        runs before it runs it (a deferred call, an interruption): the call's place in the
        journal and the orchestrator's word on it. Raises ``ToolUnderReview`` while a
        person's review is open, a ``ToolError`` naming the refusal once refused (and
        ``EffectUnknown`` as ``tool_call`` does); else a ``BegunCall``: replayed (its
        recorded ``result``), or to run (``tool_run``), with ``edited`` arguments when a
        person changed them. Without an orchestrator to ask: to run, unrecorded."""
        if not self.recording:
            return BegunCall(name=name, arguments=arguments, seq=-1)
        seq = self.next_seq()
        begun = await self.services.request(
            "tool.begin",
            name,
            {"arguments": arguments, "idempotent": idempotent}
            | ({"review": True, "schema": schema or {}} if review else {}),
            seq=seq,
            execution=self.execution,
        )
        if isinstance(begun, dict) and "replay" in begun:
            self.replayed += 1
            return BegunCall(name, arguments, seq, replayed=True, result=begun["replay"])
        key = str(begun.get("key", "")) if isinstance(begun, dict) else ""
        changed = begun.get("arguments") if isinstance(begun, dict) else None
        if isinstance(changed, dict):
            return BegunCall(name, changed, seq, key=key, edited=changed)
        return BegunCall(name, arguments, seq, key=key)

    async def tool_run(self, begun: BegunCall, run: Callable[[str], Awaitable[Any]]) -> Any:
        """The second half of ``tool_call``: ``run(key)`` for a begun call, its result or
        error recorded after (``tool.end``); the result as JSON builtins."""
        if begun.seq < 0:
            return await run("")
        name, arguments, key, seq = begun.name, begun.arguments, begun.key, begun.seq
        services = self.services
        start = time.monotonic()
        ended: dict[str, Any] = {"arguments": arguments, "key": key}
        try:
            result = await run(key)
        except asyncio.CancelledError:
            # the handler was stopped during the call (its task cancelled, its deadline
            # past): the call is recorded as cut off, its effect perhaps partial
            ended |= {"error": "cancelled during the call", "error_type": "cancelled"}
            ended["duration_s"] = round(time.monotonic() - start, 6)
            with contextlib.suppress(Exception):
                await services.request("tool.end", name, ended, seq=seq, execution=self.execution)
            raise
        except Exception as e:
            # a registry's typed error keeps its type (invalid_input, timeout, ...)
            kind = e.error_type if isinstance(e, ToolError) else "tool_error"
            ended |= {"error": f"{type(e).__name__}: {e}", "error_type": kind}
            ended["duration_s"] = round(time.monotonic() - start, 6)
            await services.request("tool.end", name, ended, seq=seq, execution=self.execution)
            raise
        ended |= {"result": msgspec.to_builtins(result)}
        ended["duration_s"] = round(time.monotonic() - start, 6)
        await services.request("tool.end", name, ended, seq=seq, execution=self.execution)
        return ended["result"]
