"""A remote A2A agent as a cardbus agent: ``await remote_a2a_agent(url)``.

The agent's card is fetched from ``<url>/.well-known/agent-card.json`` and
imported (``import_a2a``: skills -> capabilities, schemas from the cardbus
extension or the skill's modes, an agent id fit for subjects), so selection
and the schema checks work as for any agent. The class it returns is served
by an ordinary ``AgentWorker``; each card dispatched to it becomes one A2A
message (a data part with the inputs, or a text part for a text-only skill;
``metadata.cardbus`` names the task and attempt; the W3C ``traceparent`` is
sent as the HTTP header and in the metadata), sent with a2a-sdk's client
(streaming when the card says so). The remote's answer maps to a result:

* ``TASK_STATE_COMPLETED`` (or a reply message): ``completed``, the output
  from the artifacts (a data part as it is; text parts as ``{"text": ...}``);
* ``TASK_STATE_INPUT_REQUIRED``: ``needs_input`` asking ``user_input`` for
  what the remote's status message says; the re-run sends the answer on
  the same remote task;
* ``TASK_STATE_REJECTED``: ``rejected``; ``FAILED``, ``CANCELED``,
  ``AUTH_REQUIRED``, a transport error or no answer within the card's
  ``timeout_s``: a ``failed`` attempt with the reason (retried as usual);
* the attempt stopped here (its task cancelled, or closed with a parent run: a
  remote department's run is a child run of the task): the remote task is
  cancelled (``CancelTask``) before the handler stops;
* a refusal of the request itself (a JSON-RPC error other than an internal
  one, such as -32602 or -32004, or HTTP 4xx such as a missing token): a
  ``failed`` attempt with reason ``remote_refused``, not retried (the same
  request would be refused again).

A remote that wants a token gets ``token`` (``remote_a2a_agent(url, token=...)``,
else ``CARDBUS_A2A_REMOTE_TOKEN``) as ``Authorization: Bearer``.

While the remote works the worker reports ``task.started`` as for any agent
(its ``started_after_s`` timer).

``"a2a+http://host:port"`` in a plan's ``agents`` (``cardbus run``,
``cardbus a2a serve --agent``) loads one with :func:`load_remote`.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import time
from typing import Any, ClassVar

import httpx
import msgspec
from a2a.client import A2ACardResolver, ClientConfig, ClientFactory
from a2a.types import (
    AgentCard as PbAgentCard,
)
from a2a.types import (
    CancelTaskRequest,
    Message,
    Part,
    Role,
    SendMessageRequest,
    TaskState,
)
from a2a.utils.errors import A2AError, InternalError
from google.protobuf.json_format import MessageToDict, ParseDict

from cardbus.agents.a2a_card import ImportedCard, import_a2a, ints_back
from cardbus.agents.agent import Agent
from cardbus.agents.cards import AgentCard, ResultCard, TaskCard
from cardbus.agents.llm import LLM
from cardbus.bus.a2a.fold import USER_CAPABILITY, data_part
from cardbus.eventstore.errors import ValidationError
from cardbus.eventstore.events import Usage

__all__ = ["SCHEME", "RemoteA2AAgent", "load_remote", "remote_a2a_agent"]

log = logging.getLogger(__name__)

SCHEME = "a2a+"
#: the token sent to remote A2A agents when none is given
TOKEN_ENV = "CARDBUS_A2A_REMOTE_TOKEN"


async def _cancel_remote(client: Any, task_id: str) -> None:
    """Ask the remote to cancel its task (A2A ``CancelTask``), for at most 5 s; a remote
    that cannot be reached or refuses is left to its own end (said in the log)."""
    if not task_id:
        return  # no task known yet (a non-streaming remote answers at the end)
    try:
        async with asyncio.timeout(5):
            await client.cancel_task(CancelTaskRequest(id=task_id))
    except Exception as e:
        log.warning("remote task %s not cancelled: %r", task_id, e)


def _refusal(e: BaseException) -> str | None:
    """What a refusal of the request says (not worth retrying), or None for a failure."""
    from a2a.client.errors import A2AClientError

    if isinstance(e, A2AClientError):
        cause = e.__cause__
        if isinstance(cause, httpx.HTTPStatusError) and 400 <= cause.response.status_code < 500:
            return f"HTTP {cause.response.status_code}: {cause.response.text[:300]}"
        return None
    if isinstance(e, A2AError) and not isinstance(e, InternalError):
        return f"{type(e).__name__}: {e}"
    return None


class RemoteA2AAgent(Agent):
    """Base of the classes :func:`remote_a2a_agent` makes, one per remote agent."""

    url: ClassVar[str] = ""
    token: ClassVar[str | None] = None
    remote: ClassVar[ImportedCard]
    a2a_card: ClassVar[PbAgentCard]
    # the remote task waiting for input, per cardbus task: (remote task id, context id)
    _waiting: ClassVar[dict[str, tuple[str, str]]]

    @classmethod
    def bind(cls, url: str, doc: dict[str, Any], token: str | None = None) -> type[RemoteA2AAgent]:
        """A subclass for the remote agent at ``url`` whose card JSON is ``doc``."""
        imported = import_a2a(doc)
        pb = ParseDict(doc, PbAgentCard(), ignore_unknown_fields=True)
        card = imported.card
        attrs = {
            "agent_id": card.agent_id,
            "name": card.name,
            "description": card.description,
            "version": card.version,
            "url": url,
            "token": token,
            "remote": imported,
            "a2a_card": pb,
            "_waiting": {},
        }
        return type(f"RemoteA2A[{card.agent_id}]", (cls,), attrs)

    @classmethod
    def card(cls) -> AgentCard:
        return cls.remote.card

    # -- one task card, one A2A message ---------------------------------------------

    @classmethod
    def _message(cls, task: TaskCard) -> Message:
        modes = cls.remote.skills.get(task.capability)
        waiting = cls._waiting.pop(task.task_id, None)
        parts: list[Part]
        if waiting is not None and task.supplement is not None:
            value = task.supplement
            text = value.get("text") if isinstance(value, dict) else None
            parts = [Part(text=text)] if isinstance(text, str) else [data_part(value)]
        elif modes is not None and modes.text_in:
            text = task.inputs.get("text")
            parts = [Part(text=text if isinstance(text, str) else json.dumps(task.inputs))]
        else:
            parts = [data_part(task.inputs)]
        meta: dict[str, Any] = {
            "cardbus": {
                "task_id": task.task_id,
                "attempt": task.attempt,
                "root_id": task.root_id,
                "capability": task.capability,
            }
        }
        if task.traceparent:
            meta["traceparent"] = task.traceparent
        msg = Message(
            role=Role.ROLE_USER,
            message_id=f"{task.task_id}-{task.attempt}-{int(time.time() * 1000)}",
            parts=parts,
            metadata=meta,
        )
        if waiting is not None:
            msg.task_id, msg.context_id = waiting
        return msg

    @classmethod
    def _output(cls, capability: str, parts: list[Part]) -> Any:
        data = [ints_back(MessageToDict(p.data)) for p in parts if p.HasField("data")]
        texts = [p.text for p in parts if p.HasField("text")]
        modes = cls.remote.skills.get(capability)
        if data and not (modes is not None and modes.text_out):
            return data[0] if len(data) == 1 else data
        return {"text": "\n".join(texts)}

    @classmethod
    async def run(cls, task: TaskCard, llm: LLM | None = None) -> ResultCard:
        start = time.monotonic()
        base: dict[str, Any] = {
            "task_id": task.task_id,
            "attempt": task.attempt,
            "agent_id": cls.agent_id,
        }
        if cls.remote.card.capability(task.capability) is None:
            return ResultCard(
                **base,
                status="rejected",
                reason="out_of_capability",
                notes=f"{cls.agent_id} does not offer {task.capability!r}",
            )
        headers = {"traceparent": task.traceparent} if task.traceparent else {}
        if cls.token:
            headers["authorization"] = f"Bearer {cls.token}"
        state: int = TaskState.TASK_STATE_UNSPECIFIED
        remote_task = ("", "")
        status_text = ""
        asked: dict[str, Any] = {}  # a typed question's schema, choices and default
        parts: list[Part] = []
        try:
            async with (
                asyncio.timeout(task.timeout_s),
                httpx.AsyncClient(headers=headers, timeout=task.timeout_s) as http,
            ):
                config = ClientConfig(streaming=cls.remote.streaming, httpx_client=http)
                client = ClientFactory(config).create(cls.a2a_card)
                request = SendMessageRequest(message=cls._message(task))
                try:
                    async for resp in client.send_message(request):
                        if resp.HasField("message"):
                            parts.extend(resp.message.parts)
                            state = TaskState.TASK_STATE_COMPLETED
                            break
                        if resp.HasField("task"):
                            t = resp.task
                            remote_task = (t.id, t.context_id)
                            state = t.status.state
                            status_text = _text_of(t.status.message.parts)
                            asked = _question_of(t.status.message.parts) or asked
                            parts = [p for a in t.artifacts for p in a.parts] or parts
                        elif resp.HasField("status_update"):
                            u = resp.status_update
                            remote_task = (u.task_id, u.context_id)
                            state = u.status.state
                            status_text = _text_of(u.status.message.parts) or status_text
                            asked = _question_of(u.status.message.parts) or asked
                        elif resp.HasField("artifact_update"):
                            a = resp.artifact_update
                            if a.append:
                                parts.extend(a.artifact.parts)
                            else:
                                parts = [*parts, *a.artifact.parts]
                except asyncio.CancelledError:
                    # this attempt was stopped (its task cancelled, or closed with its
                    # parent): the remote run it started is cancelled too, then we stop
                    await _cancel_remote(client, remote_task[0])
                    raise
        except TimeoutError:
            return ResultCard(
                **base,
                status="failed",
                error=f"TimeoutError: no answer from {cls.url} within {task.timeout_s:g}s",
                duration_s=time.monotonic() - start,
            )
        except Exception as e:  # transport, protocol, a broken remote: a failed attempt
            refused = _refusal(e)
            if refused is not None:
                return ResultCard(
                    **base,
                    status="failed",
                    reason="remote_refused",
                    error=f"{cls.url} refused the request: {refused}"[:1000],
                    duration_s=time.monotonic() - start,
                )
            return ResultCard(
                **base,
                status="failed",
                error=f"{type(e).__name__}: {e}"[:1000],
                duration_s=time.monotonic() - start,
            )
        extra: dict[str, Any]
        name = TaskState.Name(state)
        if state == TaskState.TASK_STATE_COMPLETED:
            if not parts and status_text:
                parts = [Part(text=status_text)]
            extra = {"status": "completed", "output": cls._output(task.capability, parts)}
        elif state == TaskState.TASK_STATE_INPUT_REQUIRED:
            cls._waiting[task.task_id] = remote_task
            extra = {
                "status": "needs_input",
                "missing": status_text or f"{cls.agent_id} needs input",
                "supplement_capability": USER_CAPABILITY,
                # a typed question (a cardbus gateway's data part) is asked here typed too
                "supplement_inputs": {
                    **asked,
                    "question": status_text,
                    "remote_task_id": remote_task[0],
                },
            }
        elif state == TaskState.TASK_STATE_REJECTED:
            extra = {"status": "rejected", "reason": "remote_rejected", "notes": status_text}
        else:
            extra = {
                "status": "failed",
                "error": f"remote task {remote_task[0] or '?'} ended {name}: {status_text}"[:1000],
            }
        result = ResultCard(**base, usage=Usage(), duration_s=time.monotonic() - start, **extra)
        try:
            msgspec.json.encode(result)
        except Exception as e:
            return ResultCard(**base, status="failed", error=f"unserializable result: {e}")
        return result


def _text_of(parts: Any) -> str:
    return "\n".join(p.text for p in parts if p.HasField("text"))


def _question_of(parts: Any) -> dict[str, Any]:
    """The schema, choices and default of the first typed question a status message
    carries (``{"question": {...}}``, as ``TaskFold`` writes it); {} when none."""
    for p in parts:
        if not p.HasField("data"):
            continue
        doc = ints_back(MessageToDict(p.data))
        q = doc.get("question") if isinstance(doc, dict) else None
        if isinstance(q, dict) and isinstance(q.get("schema"), dict):
            out = {"schema": q["schema"], "choices": q.get("choices")}
            return out | ({"default": q["default"]} if "default" in q else {})
    return {}


async def remote_a2a_agent(
    url: str, timeout_s: float = 10.0, token: str | None = None
) -> type[RemoteA2AAgent]:
    """Fetch and import the card of the A2A agent at ``url``; its cardbus agent class.

    ``token`` (default: ``$CARDBUS_A2A_REMOTE_TOKEN``) goes with every request to it."""
    url = url.removeprefix(SCHEME)
    token = token if token is not None else os.environ.get(TOKEN_ENV) or None
    headers = {"authorization": f"Bearer {token}"} if token else {}
    try:
        async with httpx.AsyncClient(timeout=timeout_s, headers=headers) as http:
            pb = await A2ACardResolver(http, url).get_agent_card()
    except Exception as e:
        raise ValidationError(f"cannot fetch the A2A card at {url}: {e}") from e
    return RemoteA2AAgent.bind(url, MessageToDict(pb), token)


def load_remote(path: str) -> type[RemoteA2AAgent]:
    """``"a2a+http://host:port"`` -> its agent class (outside an event loop: the CLI)."""
    return asyncio.run(remote_a2a_agent(path))
