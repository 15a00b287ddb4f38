"""An agent on the cardbus bus written against the published wire format only.

It imports nothing from cardbus: raw ``nats-py`` and the standard library, as an agent
in another language would use its own NATS client. Everything it does is in
``docs/reference/wire.md`` and the schemas ``cardbus schema`` prints:

* it binds the durable pull consumer ``agent-<agent>`` of the stream ``CARDBUS_INBOX``
  (filter ``cardbus.agent.<agent>``) and pulls task cards from it;
* it answers each with a result card on ``cardbus.reply.<agent>.<task>`` (and
  ``.<partition>`` when the card's ``Cardbus-Partition`` header names one), then acks;
* a card it saw before (same ``task_id`` and ``attempt``: a redelivery) gets the same
  answer again, without running twice;
* a card for a capability it does not offer is answered ``rejected``;
* it announces itself on ``cardbus.announce.<agent>`` and renews that every third of
  its lease; on stop it announces ``online: false``.

Capability ``text.upper``: ``{"text": str}`` -> ``{"text": the same, upper case}``.
With ``--llm URL`` (an OpenAI-compatible endpoint) also ``text.ask``: ``{"question":
str}`` -> ``{"answer": str}``, one model call journaled as the wire says: a
``model.request`` on ``cardbus.req.<agent>`` before it (the answer may be a recorded one
to reuse: then no call is made), a ``model.answer`` after it, and the answer used only
once that is answered (durable in the log).

Run it: ``python agent.py --nats nats://127.0.0.1:4222 --agent upper``. The flags
``--wire-version``, ``--answer-as``, ``--reply-as`` and ``--no-journal`` make it
misbehave, for the tests that show what the bus does with an agent that does.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import hashlib
import json
import os
import signal
import socket
import sys
import time
import urllib.request
import uuid
from typing import Any

import nats
import nats.errors
import nats.js.errors
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy

WIRE_VERSION = 1
INBOX_STREAM = "CARDBUS_INBOX"
REPLY_STREAM = "CARDBUS_REPLIES"
TEXT = {"type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]}
CAPABILITIES = [
    {
        "name": "text.upper",
        "description": "the text in upper case",
        "input_schema": TEXT,
        "output_schema": TEXT,
    }
]


def token(value: str) -> str:
    """An id as one subject token (the wire's rule): A-Z a-z 0-9 - as they are, every
    other byte of its UTF-8 form ``_`` and two hex digits; empty: ``_``."""
    if not value:
        return "_"
    out = []
    for byte in value.encode():
        ch = chr(byte)
        safe = byte < 128 and (ch.isalnum() or ch == "-")
        out.append(ch if safe else f"_{byte:02x}")
    return "".join(out)


ASK = {
    "name": "text.ask",
    "description": "a question answered by a model",
    "input_schema": {
        "type": "object",
        "properties": {"question": {"type": "string"}},
        "required": ["question"],
    },
    "output_schema": {"type": "object", "properties": {"answer": {"type": "string"}}},
}


class RequestRefused(Exception):
    """The orchestrator answered a request ``ok: false``."""


class ForeignAgent:
    def __init__(self, args: argparse.Namespace) -> None:
        self.agent_id: str = args.agent
        self.url: str = args.nats
        self.user: str | None = args.user
        self.password: str | None = args.password
        self.lease_s: float = args.lease
        self.wire_version: int = args.wire_version
        self.answer_as: str = args.answer_as or self.agent_id  # the agent its results name
        self.reply_as: str = args.reply_as or self.agent_id  # the agent its subjects name
        self.host = socket.gethostname()
        self.pid = os.getpid()
        self.replica_id = f"{self.host}-{self.pid}-{uuid.uuid4().hex[:6]}"
        self.renewal = 0
        self.answers: dict[tuple[str, int], dict[str, Any]] = {}
        self.t = token(self.agent_id)
        self.llm: str | None = args.llm
        self.model: str = args.model
        self.journal: bool = not args.no_journal  # (misbehave) call the model unrecorded
        self.nc: Any = None

    def announcement(self, online: bool = True) -> bytes:
        self.renewal += 1
        card = {
            "agent_id": self.agent_id,
            "name": "Upper (raw nats-py)",
            "description": "a foreign agent: no cardbus inside",
            "version": "1.0.0",
            "capabilities": CAPABILITIES + ([ASK] if self.llm else []),
            "provider": "examples/foreign_agent",
        }
        message = {
            "type": "announce",
            "card": card,
            "online": online,
            "lease_s": self.lease_s,
            "replica_id": self.replica_id,
            "renewal": self.renewal,
            "wire_version": self.wire_version,
        }
        return json.dumps(message).encode()

    async def answer(self, card: dict[str, Any]) -> dict[str, Any]:
        result: dict[str, Any] = {
            "type": "result_card",
            "task_id": card["task_id"],
            "attempt": card.get("attempt", 1),
            "agent_id": self.answer_as,
            "replica_id": self.replica_id,
            "host": self.host,
            "pid": self.pid,
        }
        if card.get("capability") == "text.ask" and self.llm:
            question = (card.get("inputs") or {}).get("question")
            if not isinstance(question, str):
                return result | {"status": "rejected", "reason": "input_schema_mismatch"}
            try:
                said = await self.ask_model(card, question)
            except Exception as e:  # the model or the journal failed: a failed result
                return result | {"status": "failed", "error": f"{type(e).__name__}: {e}"}
            usage = {
                "input_tokens": said.get("input_tokens", 0),
                "output_tokens": said.get("output_tokens", 0),
                "model": said.get("model", ""),
            }
            return result | {
                "status": "completed",
                "output": {"answer": said["text"]},
                "usage": usage,
            }
        if card.get("capability") != "text.upper":
            detail = f"{self.agent_id} does not offer {card.get('capability')!r}"
            return result | {"status": "rejected", "reason": "out_of_capability", "notes": detail}
        text = (card.get("inputs") or {}).get("text")
        if not isinstance(text, str):
            return result | {
                "status": "rejected",
                "reason": "input_schema_mismatch",
                "notes": "inputs.text must be a string",
            }
        return result | {"status": "completed", "output": {"text": text.upper()}}

    async def request(
        self,
        card: dict[str, Any],
        kind: str,
        target: str,
        args: dict[str, Any],
        *,
        execution: str,
        seq: int,
    ) -> Any:
        """One ``agent_request`` on ``cardbus.req.<agent>``; its result (``ok: false``:
        ``RequestRefused``)."""
        message = {
            "type": "agent_request",
            "request_id": uuid.uuid4().hex,
            "task_id": card["task_id"],
            "root_id": card.get("root_id", ""),
            "attempt": card.get("attempt", 1),
            "agent_id": self.agent_id,
            "kind": kind,
            "target": target,
            "args": args,
            "traceparent": card.get("traceparent"),
            "execution": execution,
            "seq": seq,
        }
        msg = await self.nc.request(
            f"cardbus.req.{self.t}", json.dumps(message).encode(), timeout=10
        )
        failure = (msg.headers or {}).get("Cardbus-Error")
        if failure:
            raise RequestRefused(f"{kind}: the orchestrator failed: {failure}")
        answer = json.loads(msg.data)
        if not answer.get("ok"):
            raise RequestRefused(f"{kind}: {answer.get('error_type')}: {answer.get('error')}")
        return answer.get("result")

    async def ask_model(self, card: dict[str, Any], question: str) -> dict[str, Any]:
        """One model call, journaled: the recorded answer when the orchestrator has one for
        this place, else a live call whose answer is recorded before it is used."""
        execution, seq = uuid.uuid4().hex, 0  # a new execution at every delivery
        request = {"model": self.model, "messages": [{"role": "user", "content": question}]}
        if not self.journal:
            return await asyncio.to_thread(self.chat, request)
        digest = hashlib.sha256(json.dumps(request, sort_keys=True).encode()).hexdigest()
        args = {"request": request, "digest": digest, "replay": True}
        asked = await self.request(
            card, "model.request", self.model, args, execution=execution, seq=seq
        )
        if isinstance(asked, dict) and isinstance(asked.get("replay"), dict):
            return dict(asked["replay"])  # asked before, at this place: no call
        call = asked.get("call", "") if isinstance(asked, dict) else ""
        start = time.monotonic()
        try:
            said = await asyncio.to_thread(self.chat, request)
        except Exception as e:
            failed = {"call": call, "error": f"{type(e).__name__}: {e}", "error_type": "llm_error"}
            await self.request(
                card, "model.answer", self.model, failed, execution=execution, seq=seq
            )
            raise
        answered = {"call": call, "answer": said, "latency_s": round(time.monotonic() - start, 6)}
        await self.request(card, "model.answer", self.model, answered, execution=execution, seq=seq)
        return said

    def chat(self, request: dict[str, Any]) -> dict[str, Any]:
        """The OpenAI-compatible call; the answer as the journal records it."""
        assert self.llm is not None
        http = urllib.request.Request(
            self.llm.rstrip("/") + "/chat/completions",
            data=json.dumps(request).encode(),
            headers={"Content-Type": "application/json", "Authorization": "Bearer none"},
        )
        with urllib.request.urlopen(http, timeout=30) as response:
            body = json.loads(response.read())
        usage = body.get("usage") or {}
        return {
            "text": body["choices"][0]["message"].get("content") or "",
            "model": body.get("model", self.model),
            "input_tokens": usage.get("prompt_tokens", 0),
            "output_tokens": usage.get("completion_tokens", 0),
        }

    async def run(self, stop: asyncio.Event) -> None:
        async def on_error(e: Exception) -> None:  # e.g. the server refusing a publish
            print(f"nats error: {e}", flush=True)

        nc = await nats.connect(
            self.url,
            user=self.user,
            password=self.password,
            inbox_prefix=f"_INBOX.{self.t}",  # the only replies its user may subscribe to
            name=f"foreign-{self.agent_id}",
            max_reconnect_attempts=-1,
            error_cb=on_error,
        )
        self.nc = nc
        js = nc.jetstream()
        # the orchestrator creates the streams: wait for them
        print(f"connected to {self.url}; waiting for the cardbus streams", flush=True)
        while not stop.is_set():
            try:
                await js.stream_info(INBOX_STREAM)
                await js.stream_info(REPLY_STREAM)
                break
            except (nats.js.errors.NotFoundError, nats.errors.TimeoutError):
                await asyncio.sleep(0.2)
        durable = f"agent-{self.t}"
        config = ConsumerConfig(
            name=durable,
            durable_name=durable,
            filter_subject=f"cardbus.agent.{self.t}",
            deliver_policy=DeliverPolicy.ALL,
            ack_policy=AckPolicy.EXPLICIT,
            ack_wait=30.0,
            max_deliver=5,
            backoff=[30.0, 60.0, 120.0, 240.0],
            max_ack_pending=10_000,
            max_waiting=4096,
        )
        try:
            await js.consumer_info(INBOX_STREAM, durable)
        except nats.js.errors.NotFoundError:
            with contextlib.suppress(nats.js.errors.BadRequestError):  # made meanwhile
                await js.add_consumer(INBOX_STREAM, config)
        inbox = await js.pull_subscribe_bind(durable=durable, stream=INBOX_STREAM)
        await js.publish(f"cardbus.announce.{self.t}", self.announcement())
        print(f"foreign agent {self.agent_id} serving on {self.url}", flush=True)
        renewing = asyncio.ensure_future(self.renew(js, stop))
        try:
            while not stop.is_set():
                try:
                    msgs = await inbox.fetch(1, timeout=0.5)
                except nats.errors.TimeoutError:
                    continue
                for msg in msgs:
                    await self.handle(js, msg)
        finally:
            renewing.cancel()
            with contextlib.suppress(Exception):
                await js.publish(f"cardbus.announce.{self.t}", self.announcement(online=False))
            await nc.close()

    async def renew(self, js: Any, stop: asyncio.Event) -> None:
        while not stop.is_set():
            await asyncio.sleep(self.lease_s / 3)
            with contextlib.suppress(Exception):  # the next renewal may pass
                await js.publish(f"cardbus.announce.{self.t}", self.announcement())

    async def handle(self, js: Any, msg: Any) -> None:
        try:
            card = json.loads(msg.data)
            key = (str(card["task_id"]), int(card.get("attempt", 1)))
        except (ValueError, KeyError, TypeError) as e:  # not a card: dead-letter it, never again
            headers = {"Cardbus-Reason": f"not a task card: {e}", "Cardbus-Subject": msg.subject}
            await js.publish("cardbus.dead.agent", msg.data, headers=headers)
            await msg.term()
            return
        answer = self.answers.get(key)
        if answer is None:  # a redelivery of a card answered before gets the same answer
            answer = self.answers[key] = await self.answer(card)
        answer = answer | {"delivery": msg.metadata.num_delivered}
        subject = f"cardbus.reply.{token(self.reply_as)}.{token(key[0])}"
        partition = (msg.headers or {}).get("Cardbus-Partition")
        if partition and partition.isdigit():
            subject += f".{partition}"
        data = json.dumps(answer).encode()
        digest = hashlib.blake2b(data, digest_size=16).hexdigest()
        try:
            await js.publish(subject, data, headers={"Nats-Msg-Id": digest})
        except Exception as e:  # e.g. a subject outside its permissions: give the card back
            print(f"cannot answer {key[0]} on {subject}: {e!r}", flush=True)
            await msg.nak(delay=1.0)
            return
        await msg.ack()  # answered: the card is done


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nats", default="nats://127.0.0.1:4222")
    parser.add_argument("--agent", default="upper")
    parser.add_argument("--user", default=None)
    parser.add_argument("--password", default=None)
    parser.add_argument("--lease", type=float, default=3.0, help="lease seconds (renewed / 3)")
    parser.add_argument("--llm", default=None, help="an OpenAI-compatible URL: text.ask too")
    parser.add_argument("--model", default="stub-model")
    parser.add_argument("--wire-version", type=int, default=WIRE_VERSION)
    parser.add_argument("--answer-as", default=None, help="(misbehave) results name this agent")
    parser.add_argument("--reply-as", default=None, help="(misbehave) reply on its subjects")
    parser.add_argument(
        "--no-journal", action="store_true", help="(misbehave) model calls not journaled"
    )
    agent = ForeignAgent(parser.parse_args(argv))

    async def go() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        await agent.run(stop)

    asyncio.run(go())
    sys.exit(0)


if __name__ == "__main__":
    main()
