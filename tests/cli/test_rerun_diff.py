"""``cardbus rerun`` and ``cardbus diff`` (issue 23, items 4 and 5), on a real run.

A plan of two LLM agents (a researcher calling the ``doc_search`` tool, then a
writer) is recorded against the loopback OpenAI stub. ``rerun --offline``
reproduces it with no endpoint configured, sending nothing; with the writer's
instructions changed it fails naming the task and the changed prompt; ``rerun
--task write --model M`` re-runs the writer live, and ``diff`` names the first
divergent event.
"""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "agents"))
from openai_stub import OpenAIStub, Reply

from cardbus.eventstore import SqliteEventStore
from cardbus.eventstore import events as ev
from cardbus.tools.cli import cli

PLAN = {
    "goal": "A brief on tides",
    "agents": ["rerun_agents:Researcher", "rerun_agents:Writer"],
    "tasks": [
        {"id": "research", "capability": "rr_research", "inputs": {"topic": "tides"}},
        {
            "id": "write",
            "capability": "rr_write",
            "deps": ["research"],
            "inputs": {"notes": {"$dep": "research", "path": "notes"}},
        },
    ],
}


def _answer(body: Any) -> Reply | None:
    """A model that looks the topic up once, then answers with an instance of the schema."""
    messages = body.get("messages", []) if isinstance(body, dict) else []
    if body.get("tools") and not any(m.get("role") == "tool" for m in messages):
        return Reply(content=None, tool_calls=[("doc_search", {"query": "tides"})])
    return None


@pytest.fixture
def stub(monkeypatch: pytest.MonkeyPatch) -> Iterator[OpenAIStub]:
    for name in ("OPENAI_BASE_URL", "OPENAI_API_KEY", "CARDBUS_MODEL"):
        monkeypatch.delenv(name, raising=False)
    import rerun_agents  # noqa: F401  (the agents' module, named by import path)

    with OpenAIStub() as s:
        s.responder = _answer
        s.honour_schema = True
        yield s


def _cli(*args: str) -> Any:
    return CliRunner().invoke(cli, list(args))


@pytest.fixture
def recorded(tmp_path: Path, stub: OpenAIStub) -> tuple[str, str, dict[str, Any]]:
    """The db, the recorded run's root id and its result (recorded against the stub)."""
    db = str(tmp_path / "rerun.db")
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps(PLAN))
    r = _cli(
        "run", str(plan), "--json", "--llm-base-url", stub.url, "--model", "stub-m", "--db", db
    )
    assert r.exit_code == 0, r.output
    result = json.loads(r.stdout)
    assert result["status"] == "completed"
    # the researcher: a tool call, then its notes; the writer: its brief
    assert len(stub.requests) == 3
    return db, result["root_id"], result


async def _events(db: str, root: str) -> list[Any]:
    store = await SqliteEventStore.open(db, create=False)
    try:
        return await store.read_correlation(root)
    finally:
        await store.close()


def test_an_offline_rerun_reproduces_the_run_sending_nothing(
    recorded: tuple[str, str, dict[str, Any]], stub: OpenAIStub
) -> None:
    db, root, result = recorded
    sent = len(stub.requests)
    r = _cli("rerun", root, "--offline", "--db", db, "--json")
    assert r.exit_code == 0, r.output
    out = json.loads(r.stdout)
    assert (out["status"], out["rerun_of"], out["offline"]) == ("completed", root, True)
    assert out["outputs"] == result["outputs"] and out["reused"] == []
    assert len(stub.requests) == sent  # nothing went to the endpoint
    events = asyncio.run(_events(db, out["root_id"]))
    (started,) = [e.data for e in events if isinstance(e.data, ev.RunStarted)]
    assert (started.rerun_of, started.offline) == (root, True)
    assert "rerun_agents:Writer" in started.agent_paths
    answered = [e.data for e in events if isinstance(e.data, ev.ModelAnswered)]
    called = [e.data for e in events if isinstance(e.data, ev.ToolCalled)]
    assert len(answered) == 3 and len(called) == 1
    assert all(a.replayed_from and a.input_tokens == 0 for a in answered)
    assert called[0].replayed_from and called[0].tool == "doc_search"
    # the two runs did the same: diff finds no divergence
    d = _cli("diff", root, out["root_id"], "--db", db)
    assert d.exit_code == 0, d.output
    assert "first divergence: none" in d.stdout


def _calls(db: str, root: str) -> list[dict[str, Any]]:
    """The model and tool calls of ``cardbus replay ROOT --json``, task by task in order."""
    r = _cli("replay", root, "--db", db, "--json")
    assert r.exit_code == 0, r.output
    calls: list[dict[str, Any]] = []

    def walk(node: dict[str, Any]) -> None:
        for span in node["spans"]:
            calls.extend(span["calls"])
        for child in node["children"]:
            walk(child)

    for task in sorted(json.loads(r.stdout)["tasks"], key=lambda t: t["capability"]):
        walk(task)
    return calls


KEPT = ("model", "prompt", "answer", "arguments", "result", "tool")


def test_the_replay_of_an_offline_rerun_shows_the_recorded_prompts_and_answers(
    recorded: tuple[str, str, dict[str, Any]],
) -> None:
    """A re-run's calls are answered from another run's streams: its timeline shows what
    they were answered with (from the origin's events), not "(not kept)"; so does a
    re-run of the re-run, two origins back."""
    db, root, _ = recorded
    first = json.loads(_cli("rerun", root, "--offline", "--db", db, "--json").stdout)
    second = json.loads(_cli("rerun", first["root_id"], "--offline", "--db", db, "--json").stdout)
    assert first["status"] == second["status"] == "completed"
    original = _calls(db, root)
    assert [c.get("status") for c in original] == ["answered", "ok", "answered", "answered"]
    for rerun in (first["root_id"], second["root_id"]):
        calls = _calls(db, rerun)
        assert [c.get("status") for c in calls] == ["replayed"] * len(original)
        for got, want in zip(calls, original, strict=True):
            shown = {k: got.get(k) for k in KEPT}
            assert shown == {k: want.get(k) for k in KEPT}
            assert got.get("prompt") is not None or got.get("result") is not None
    text = _cli("replay", second["root_id"], "--db", db).stdout
    assert "(not kept" not in text and "replayed from" in text
    assert 'doc_search({"query":"tides"})' in text
    # the console's task page, from the same log
    page = asyncio.run(_console_task(db, f"research-{second['root_id'][-12:]}"))
    assert [c.status for c in page] == ["replayed"] * 3  # the researcher's model, tool, model
    assert page[0].prompt == original[0]["prompt"] and page[0].answer == original[0]["answer"]
    assert page[1].result == original[1]["result"]


async def _console_task(db: str, task: str) -> list[Any]:
    from cardbus.tools.ui.app import Console

    store = await SqliteEventStore.open(db, create=False)
    try:
        console = Console(store)
        try:
            return (await console.task(task))["calls"]
        finally:
            console.runner.close()
    finally:
        await store.close()


def test_an_offline_rerun_with_changed_instructions_fails_naming_task_and_prompt(
    recorded: tuple[str, str, dict[str, Any]], stub: OpenAIStub
) -> None:
    db, root, _ = recorded
    sent = len(stub.requests)
    r = _cli("rerun", root, "--offline", "--agent", "rerun_agents:WriterFive", "--db", db)
    assert r.exit_code == 1, r.output
    assert len(stub.requests) == sent
    text = r.stdout
    assert "failed: replay_diverged" in text
    assert "task write (write-" in text
    assert "model call #0 (" in text and "the request differs from the recorded one" in text
    assert "-  Write a brief of exactly three points for a general audience." in text
    assert "+  Write a brief of exactly five points for experts." in text
    # the research before it was answered from the log, and its output reused as input
    events = asyncio.run(_events(db, text.split("as run ")[1].split()[0]))
    failed = [e for e in events if isinstance(e.data, ev.TaskFailed)]
    assert [f.data.reason for f in failed] == ["replay_diverged"]
    assert failed[0].data.attempts == 1  # not retried
    completed = {e.stream for e in events if isinstance(e.data, ev.TaskCompleted)}
    assert any(s.startswith("research-") for s in completed)


def test_a_live_rerun_with_another_model_and_diff_name_the_first_divergence(
    recorded: tuple[str, str, dict[str, Any]], stub: OpenAIStub
) -> None:
    db, root, _ = recorded
    sent = len(stub.requests)
    r = _cli(
        "rerun", root, "--task", "write", "--model", "stub-big", "--llm-base-url", stub.url,
        "--db", db,
    )  # fmt: skip
    assert r.exit_code == 0, r.output
    asked = [b["model"] for b in stub.bodies()[sent:]]
    assert asked == ["stub-big"]  # the writer, live; the research was reused
    assert "1 task(s) run again, 1 result(s) reused" in r.stdout
    assert "first divergence: task write: model call #0 (stub-m / stub-big)" in r.stdout
    new_root = r.stdout.split("as run ")[1].split()[0]

    d = _cli("diff", root, new_root, "--db", db, "--json")
    assert d.exit_code == 1, d.output  # they diverge
    doc = json.loads(d.stdout)
    first = doc["first_divergence"]
    assert (first["task"], first["what"], first["kind"], first["seq"]) == (
        "write",
        "request",
        "model",
        0,
    )
    events = asyncio.run(_events(db, root))
    write_asked = next(
        e for e in events if isinstance(e.data, ev.ModelRequested) and e.stream.startswith("write-")
    )
    assert first["event_a"] == write_asked.event_id
    assert any('-model: "stub-m"' in line for line in first["diff"])
    assert any('+model: "stub-big"' in line for line in first["diff"])
    pairs = {p["key"]: p for p in doc["tasks"]}
    assert pairs["research"]["differs"] == []
    assert pairs["research"]["b"]["reused_from"]
    assert "calls" in pairs["write"]["differs"]
    assert pairs["write"]["a"]["calls"][0]["name"] == "stub-m"
    assert pairs["write"]["b"]["calls"][0]["name"] == "stub-big"
    assert doc["b"]["rerun_of"] == root and doc["b"]["offline"] is False

    text = _cli("diff", root, new_root, "--db", db).stdout
    assert "first divergence: task write: model call #0 (stub-m / stub-big) asked something" in text
    assert f"event in A: {write_asked.event_id}" in text
    assert "task research: same" in text
