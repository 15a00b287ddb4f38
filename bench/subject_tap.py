"""Where a bench's server messages come from: every message on the server, counted by
subject family (one ``>`` subscription on a connection of its own, in a thread).

The families say what each message is: the log's publishes (``cardbus.evt``), cards,
replies, announcements, pull requests, acks (by stream), consumer deliveries (an
``_INBOX`` message whose reply subject is a ``$JS.ACK`` of a stream), JetStream's answers
to publishes (``{"stream": ...}``), other API calls and answers, KV (leases), and agents'
requests. Its own deliveries are its connection's ``out`` (``bench-tap``): subtract them
from the server's total.
"""

from __future__ import annotations

import asyncio
import collections
import threading
from typing import Any

import nats

__all__ = ["SubjectTap", "family"]

TAP_NAME = "bench-tap"


def family(subject: str, reply: str, data: bytes, headers: dict[str, str] | None) -> str:
    """The subject family of one message as the server routes it (a consumer's delivery
    keeps its stored subject, and has a ``$JS.ACK`` reply subject: told apart first)."""
    if reply.startswith("$JS.ACK."):
        return f"deliveries ({reply.split('.')[2]})"
    for prefix, name in (
        ("cardbus.evt.", "log publishes (cardbus.evt)"),
        ("cardbus.agent.", "cards (cardbus.agent)"),
        ("cardbus.reply.", "replies (cardbus.reply)"),
        ("cardbus.announce.", "announcements"),
        ("cardbus.req.", "agent requests"),
        ("cardbus.orch.", "agent requests handed over"),
        ("cardbus.dead.", "dead letters"),
        ("$KV.", "KV (partition leases)"),
    ):
        if subject.startswith(prefix):
            return name
    tokens = subject.split(".")
    if subject.startswith("$JS.API.CONSUMER.MSG.NEXT.") and len(tokens) > 5:
        return f"pull requests ({tokens[5]})"
    if subject.startswith("$JS.ACK.") and len(tokens) > 2:
        kind = data[:4].decode("ascii", "replace") or "+ACK"
        return f"acks {kind} ({tokens[2]})"
    if subject.startswith("$JS.EVENT."):
        return "JetStream advisories"
    if subject.startswith("$JS."):
        return f"JetStream API ({'.'.join(tokens[2:4])})"
    if data.startswith(b'{"stream":'):
        stream = data.split(b'"', 4)[3].decode("ascii", "replace")
        return f"publish acks ({stream})"
    if headers and headers.get("Status"):
        return f"pull statuses {headers.get('Status')}"
    if data.startswith(b'{"type":"io.nats.jetstream.api'):
        return "JetStream API answers"
    return "other inbox messages (request answers)"


class SubjectTap:
    """Counts the messages of ``url``'s server by family while ``counting``."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.counts: collections.Counter[str] = collections.Counter()
        self.counting = False
        self._ready = threading.Event()
        self._stop: asyncio.Event | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread = threading.Thread(target=self._run, name="subject-tap", daemon=True)

    def start(self) -> SubjectTap:
        self._thread.start()
        if not self._ready.wait(15):
            raise RuntimeError("the subject tap did not connect")
        return self

    def _run(self) -> None:
        asyncio.run(self._main())

    async def _main(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._stop = asyncio.Event()
        nc = await nats.connect(self.url, name=TAP_NAME)

        async def on_msg(msg: Any) -> None:
            if self.counting:
                self.counts[family(msg.subject, msg.reply or "", msg.data, msg.headers)] += 1

        await nc.subscribe(">", cb=on_msg, pending_msgs_limit=-1, pending_bytes_limit=-1)
        await nc.flush()
        self._ready.set()
        await self._stop.wait()
        await nc.close()

    def stop(self) -> None:
        if self._loop is not None and self._stop is not None:
            self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(10)
