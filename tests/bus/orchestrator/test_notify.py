"""Webhook notices to a waiting person: signed, best effort, never in the run's way."""

from __future__ import annotations

import dataclasses
import hashlib
import hmac
import json
import socket
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from orchkit import FAST, ev, make_agent, plan, task, tid, wait_for

import cardbus.bus as bus
from cardbus.bus.orchestrator.notify import SECRET_ENV, SIGNATURE_HEADER
from cardbus.eventstore.events import WaitPolicy, WaitStep

SECRET = "s3cret"


class _Receiver(BaseHTTPRequestHandler):
    """Keeps each body whose signature checks out; answers 401 to the others."""

    got: list[dict] = []
    refused: list[bytes] = []

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers["Content-Length"]))
        want = "sha256=" + hmac.new(SECRET.encode(), body, hashlib.sha256).hexdigest()
        if hmac.compare_digest(self.headers.get(SIGNATURE_HEADER, ""), want):
            type(self).got.append(json.loads(body))
            self.send_response(204)
        else:
            type(self).refused.append(body)
            self.send_response(401)
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def receiver() -> Iterator[str]:
    _Receiver.got, _Receiver.refused = [], []
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Receiver)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/hook"
    finally:
        server.shutdown()
        server.server_close()


async def test_the_approver_and_the_escalation_are_notified_signed(
    make_runtime, store, receiver, monkeypatch
):
    monkeypatch.setenv(SECRET_ENV, SECRET)
    policy = dataclasses.replace(FAST, notify_url=receiver)
    rt = await make_runtime([make_agent("echo")], policy=policy)
    waits = {"approval": WaitPolicy(deadline_s=0.3, then=[WaitStep(action="escalate", to=["bea"])])}
    root = await rt.orch.submit(plan(task("gate", requires_approval=True), waits=waits))
    gate = tid(root, "gate")
    await wait_for(store, lambda e: isinstance(e.data, ev.WaitExpired))
    await rt.orch.notifier.drain(5)
    await bus.answer_approval(store, gate, True, by="bea")
    assert (await rt.orch.wait(root, 10)).status == "completed"
    await rt.orch.notifier.drain(5)
    kinds = sorted((n["type"], n["task"], n["reason"]) for n in _Receiver.got)
    assert kinds == [
        ("task.approval_requested.v1", gate, "requires_approval"),
        ("task.wait_expired.v1", gate, "escalated"),
    ]
    asked = next(n for n in _Receiver.got if n["reason"] == "requires_approval")
    assert asked["approvers"] == [] and asked["deadline"] > asked["recorded_at"]
    escalated = next(n for n in _Receiver.got if n["reason"] == "escalated")
    assert escalated["approvers"] == ["bea"] and escalated["run"] == root
    assert not _Receiver.refused


async def test_a_wrong_secret_is_refused_by_the_receiver_and_the_run_goes_on(
    make_runtime, store, receiver, monkeypatch
):
    monkeypatch.setenv(SECRET_ENV, "not-the-secret")
    rt = await make_runtime(
        [make_agent("echo")], policy=dataclasses.replace(FAST, notify_url=receiver)
    )
    root = await rt.orch.submit(plan(task("gate", requires_approval=True)))
    await wait_for(store, lambda e: isinstance(e.data, ev.ApprovalRequested))
    await rt.orch.notifier.drain(5)
    assert len(_Receiver.refused) == 1 and not _Receiver.got
    assert rt.orch.notifier.failed == 1  # a 401: a log line, not the run's problem
    await bus.answer_approval(store, tid(root, "gate"), True, by="ada")
    assert (await rt.orch.wait(root, 10)).status == "completed"


async def test_a_dead_webhook_never_holds_the_run(make_runtime, store, monkeypatch):
    monkeypatch.setenv(SECRET_ENV, SECRET)
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    url = f"http://127.0.0.1:{port}/hook"
    rt = await make_runtime([make_agent("echo")], policy=dataclasses.replace(FAST, notify_url=url))
    root = await rt.orch.submit(plan(task("gate", requires_approval=True)))
    await wait_for(store, lambda e: isinstance(e.data, ev.ApprovalRequested))
    await bus.answer_approval(store, tid(root, "gate"), True, by="ada")
    assert (await rt.orch.wait(root, 10)).status == "completed"
    await rt.orch.notifier.drain(5)
    assert rt.orch.notifier.failed == 1 and rt.orch.notifier.sent == 0
