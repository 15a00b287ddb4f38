"""Each request the A2A spec (and a2a-sdk's default handler) refuses, sent raw to a real
`cardbus a2a serve`, gets the spec's answer; and one cardbus calls another over A2A."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from a2a_support import ServeProcess, plan
from test_a2a_lock import runs_in

from cardbus.bus.a2a import remote_a2a_agent
from cardbus.bus.runtime.embedded import EmbeddedRuntime
from cardbus.eventstore import SqliteEventStore
from cardbus.eventstore import events as ev

INVALID_PARAMS, UNSUPPORTED = -32602, -32004
SHOUT = plan([{"id": "s", "capability": "shout", "inputs": {"text": "hi"}}])
V1 = {"A2A-Version": "1.0"}


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServeProcess]:
    db = Path(tmp_path_factory.mktemp("a2a-conf")) / "log.db"
    proc = ServeProcess(db, ["a2a_support:Slow"]).start()
    try:
        yield proc
    finally:
        proc.stop()


def call(server: ServeProcess, method: str, params: dict[str, Any]) -> dict[str, Any]:
    body = {"jsonrpc": "2.0", "id": 7, "method": method, "params": params}
    r = httpx.post(server.url, json=body, headers=V1, timeout=60)
    assert r.status_code == 200, r.text
    return dict(r.json())


def error(server: ServeProcess, method: str, params: dict[str, Any]) -> dict[str, Any]:
    answer = call(server, method, params)
    assert "error" in answer, answer
    e = answer["error"]
    assert len(e["message"]) < 300 and "Error(" not in e["message"], e  # short, not a repr
    return dict(e)


def message(**fields: Any) -> dict[str, Any]:
    return {
        "messageId": uuid.uuid4().hex,
        "role": "ROLE_USER",
        "parts": [{"data": SHOUT}],
        **fields,
    }


def send(server: ServeProcess, msg: dict[str, Any], **config: Any) -> dict[str, Any]:
    params: dict[str, Any] = {"message": msg}
    if config:
        params["configuration"] = config
    answer = call(server, "SendMessage", params)
    assert "result" in answer, answer
    return dict(answer["result"]["task"])


async def test_send_message_checks_its_required_fields(server: ServeProcess) -> None:
    before = len(await runs_in(server.db))
    no_id = {k: v for k, v in message().items() if k != "messageId"}
    no_role = {k: v for k, v in message().items() if k != "role"}
    no_parts = {k: v for k, v in message().items() if k != "parts"}
    for params, field in [
        ({}, "message"),
        ({"message": no_id}, "message_id"),
        ({"message": no_role}, "role"),
        ({"message": no_parts}, "parts"),
        ({"message": message(parts=[])}, "parts"),
        ({"message": message(parts=[{}])}, "parts[0]"),
        ({"message": message(), "configuration": {"historyLength": -1}}, "history"),
    ]:
        for method in ("SendMessage", "SendStreamingMessage"):
            e = error(server, method, params)
            assert e["code"] == INVALID_PARAMS and field in e["message"], (method, field, e)
    # two messages without a messageId never share a task: neither is one
    assert len(await runs_in(server.db)) == before


async def test_a_resent_message_is_the_task_it_created(server: ServeProcess) -> None:
    msg = message(contextId="ctx-resend")
    first = send(server, msg)
    again = send(server, msg)
    other_context = send(server, {**msg, "contextId": "ctx-other"})
    assert again["id"] == first["id"] and again["status"]["state"] == "TASK_STATE_COMPLETED"
    assert other_context["id"] != first["id"]
    got = call(server, "GetTask", {"id": first["id"]})["result"]
    assert got["id"] == first["id"]


async def test_get_subscribe_and_messages_on_a_finished_task(server: ServeProcess) -> None:
    done = send(server, message())
    e = error(server, "GetTask", {"id": done["id"], "historyLength": -1})
    assert e["code"] == INVALID_PARAMS
    assert error(server, "GetTask", {})["code"] == INVALID_PARAMS
    # SubscribeToTask on a finished task: UnsupportedOperationError (spec 3.1.6)
    body = {"jsonrpc": "2.0", "id": 1, "method": "SubscribeToTask", "params": {"id": done["id"]}}
    r = httpx.post(server.url, json=body, headers=V1, timeout=60)
    assert '"code":-32004' in r.text.replace(" ", ""), r.text
    # a message to a finished task: UnsupportedOperationError (spec 3.1.1)
    e = error(server, "SendMessage", {"message": message(taskId=done["id"], parts=[{"text": "y"}])})
    assert e["code"] == UNSUPPORTED and "TASK_STATE_COMPLETED" in e["message"]
    e = error(server, "SendMessage", {"message": message(taskId="nope")})
    assert e["code"] == -32001  # TaskNotFoundError


async def test_list_tasks_checks_and_orders_by_status_time(server: ServeProcess) -> None:
    for params in [
        {"pageSize": 0},
        {"pageSize": -1},
        {"pageSize": 101},
        {"historyLength": -1},
        {"pageToken": "garbage"},
    ]:
        assert error(server, "ListTasks", params)["code"] == INVALID_PARAMS, params
    ctx = "ctx-order"
    waiting = plan(
        [{"id": "a", "capability": "shout", "inputs": {"text": "a"}, "requires_approval": True}]
    )
    first = send(server, message(contextId=ctx, parts=[{"data": waiting}]))
    assert first["status"]["state"] == "TASK_STATE_INPUT_REQUIRED"
    second = send(server, message(contextId=ctx))
    answered = send(server, message(contextId=ctx, taskId=first["id"], parts=[{"text": "yes"}]))
    assert answered["status"]["state"] == "TASK_STATE_COMPLETED"
    listed = call(server, "ListTasks", {"contextId": ctx})["result"]
    # the first run started first, but its status changed last: it is listed first
    assert [t["id"] for t in listed["tasks"]] == [first["id"], second["id"]]
    assert listed["totalSize"] == 2
    page = call(server, "ListTasks", {"contextId": ctx, "pageSize": 1})["result"]
    assert [t["id"] for t in page["tasks"]] == [first["id"]] and page["nextPageToken"]
    rest = call(
        server, "ListTasks", {"contextId": ctx, "pageSize": 1, "pageToken": page["nextPageToken"]}
    )["result"]
    assert [t["id"] for t in rest["tasks"]] == [second["id"]] and not rest.get("nextPageToken")
    after = listed["tasks"][0]["status"]["timestamp"]
    newer = call(server, "ListTasks", {"contextId": ctx, "statusTimestampAfter": after})
    assert [t["id"] for t in newer["result"]["tasks"]] == [first["id"]]
    future = call(server, "ListTasks", {"statusTimestampAfter": "2999-01-01T00:00:00Z"})
    assert future["result"].get("tasks", []) == []


async def test_one_cardbus_runs_goals_and_plans_for_another(
    server: ServeProcess, tmp_path: Path
) -> None:
    Remote = await remote_a2a_agent("a2a+" + server.url)  # what a plan's a2a+http:// agent loads
    assert Remote.remote.skills["run_goal"].text_in  # a goal goes as a text part
    local = {
        "goal": "ask another cardbus",
        "tasks": [
            {
                "id": "goal",
                "capability": "run_goal",
                "inputs": {"text": "Upper-case a text: high tide"},
            },
            {"id": "plan", "capability": "run_plan", "inputs": SHOUT},
            {
                "id": "bad",
                "capability": "run_plan",
                "max_attempts": 3,
                "inputs": plan([{"id": "f", "capability": "fly", "inputs": {}}]),
            },
        ],
    }
    store = await SqliteEventStore.open(tmp_path / "local.db")
    try:
        async with EmbeddedRuntime(store, [Remote]) as rt:
            result = await rt.run(local, timeout=120)
        events = await store.read_correlation(result.root_id)
    finally:
        await store.close()
    assert result.outputs["goal"] == {"text": "UPPER-CASE A TEXT: HIGH TIDE"}, result
    assert result.outputs["plan"] == {"text": "HI"}
    # the refused plan was sent once: a protocol refusal is not retried
    bad = [e.data for e in events if e.stream.startswith("bad-")]
    results = [d for d in bad if isinstance(d, ev.TaskResultSubmitted)]
    (failed,) = [d for d in bad if isinstance(d, ev.TaskFailed)]
    assert len(results) == 1 and "fly" in (results[0].error or "")
    assert failed.reason == "remote_refused"
