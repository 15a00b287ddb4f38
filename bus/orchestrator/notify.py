"""A webhook notice to the person whose word a run waits for (``Policy.notify_url``).

Told of: a task that begins to wait for approval or review (``task.approval_requested``),
a wait escalated to others (``task.wait_expired``, ``escalate``), and a run paused on a
loop (``run.paused``). The body is JSON (:func:`notice`); with ``CARDBUS_NOTIFY_SECRET``
set, the header ``X-Cardbus-Signature: sha256=<hex>`` is the HMAC-SHA256 of the body's
bytes under that secret, so the receiver can tell the notice came from whoever holds it.

Best effort, never in the run's way: an observer of the orchestrator's fold (events
folded while it runs, not the replay on start, so a restart does not notify again) that
posts in a worker thread with a timeout; a failure (refused, timeout, an HTTP error) is
a log line, never raised; at most :data:`MAX_PENDING` notices are in flight, the others
are dropped with a log line. The log, not the notice, is the record of the wait.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import logging
import os
import urllib.request
from typing import TYPE_CHECKING, Any

import msgspec

from cardbus.bus.orchestrator.waits import kind_of
from cardbus.eventstore import Envelope
from cardbus.eventstore import events as ev

if TYPE_CHECKING:
    from cardbus.bus.orchestrator.runstate import RunState

__all__ = ["MAX_PENDING", "SECRET_ENV", "SIGNATURE_HEADER", "Notifier", "notice", "sign"]

log = logging.getLogger(__name__)

SECRET_ENV = "CARDBUS_NOTIFY_SECRET"
SIGNATURE_HEADER = "X-Cardbus-Signature"
MAX_PENDING = 64


def sign(body: bytes, secret: str) -> str:
    """The signature header's value for ``body``: ``sha256=`` and the hex HMAC-SHA256."""
    return "sha256=" + hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()


def notice(env: Envelope, state: RunState | None = None) -> dict[str, Any] | None:
    """The notice for an event a person should hear of, or None. With ``state`` (folded
    through ``env``), a wait's notice names who may answer and by when (``waits``)."""
    data = env.data
    base: dict[str, Any] = {
        "type": ev.tag_of(data),
        "event_id": env.event_id,
        "run": env.correlation_id,
        "recorded_at": env.recorded_at,
    }
    match data:
        case ev.ApprovalRequested():
            kind = kind_of(data.reason)
            task = state.tasks.get(env.stream) if state is not None else None
            wait = task.wait if task is not None else None
            return base | {
                "task": env.stream,
                "kind": kind,
                "reason": data.reason,
                "approvers": wait.approvers if wait is not None else [],
                "deadline": (wait.due or None) if wait is not None else None,
                "detail": data.detail[:2000],
            }
        case ev.WaitExpired(action="escalate"):
            return base | {
                "task": env.stream,
                "kind": data.kind,
                "reason": "escalated",
                "approvers": data.approvers,
                "group": data.group,
                "deadline": data.next_deadline,
                "detail": data.note,
            }
        case ev.RunPaused():
            return base | {
                "task": data.task_id,
                "kind": "pause",
                "reason": data.reason,
                "detail": data.detail,
                "capability": data.capability,
            }
        case _:
            return None


class Notifier:
    """Posts a notice for each event that asks a person for their word (an observer)."""

    def __init__(
        self,
        url: str,
        timeout_s: float = 5.0,
        secret: str | None = None,
        state: RunState | None = None,
    ) -> None:
        self.url = url
        self.state = state
        self.timeout_s = timeout_s
        self.secret = os.environ.get(SECRET_ENV, "") if secret is None else secret
        self._pending: set[asyncio.Task[None]] = set()
        self.sent = 0
        self.failed = 0
        if not self.secret:
            log.warning("%s is not set: webhook notices go unsigned", SECRET_ENV)

    def observe(self, env: Envelope) -> None:
        body = notice(env, self.state)
        if body is None:
            return
        if len(self._pending) >= MAX_PENDING:
            self.failed += 1
            log.warning("notice for %s dropped: %d still in flight", env.event_id, MAX_PENDING)
            return
        try:
            task = asyncio.get_running_loop().create_task(self._post(msgspec.json.encode(body)))
        except RuntimeError:  # no loop (a fold outside the orchestrator): nothing to tell
            return
        self._pending.add(task)
        task.add_done_callback(self._pending.discard)

    async def _post(self, body: bytes) -> None:
        try:
            await asyncio.to_thread(self._send, body)
            self.sent += 1
        except Exception as e:  # best effort: a log line, never the run's problem
            self.failed += 1
            log.warning("webhook notice to %s failed: %s", self.url, e)

    def _send(self, body: bytes) -> None:
        headers = {"Content-Type": "application/json", "User-Agent": "cardbus-notify"}
        if self.secret:
            headers[SIGNATURE_HEADER] = sign(body, self.secret)
        request = urllib.request.Request(self.url, data=body, headers=headers, method="POST")
        with urllib.request.urlopen(request, timeout=self.timeout_s) as response:
            response.read(1024)

    async def drain(self, timeout: float | None = None) -> None:
        """Wait for the notices in flight (tests; a stopping process that wants them out)."""
        if self._pending:
            await asyncio.wait(set(self._pending), timeout=timeout)
