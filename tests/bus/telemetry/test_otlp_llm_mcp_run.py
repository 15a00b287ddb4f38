"""An LLM + MCP run exported over OTLP, as a user gets it: ``cardbus run`` in a process of
its own (the SDK's global providers are set once per process) with
``OTEL_EXPORTER_OTLP_ENDPOINT`` at a real OTLP/HTTP receiver on loopback (conftest). The
plan's LLM agent (tests/mcpservers.py ``Adder``) talks to the OpenAI-compatible stub, whose
model calls the ``add`` tool of a real MCP server over stdio (the ``mcp`` SDK).

What the receiver got is decoded with opentelemetry-proto and checked against the
conventions: ``gen_ai.provider.name`` on every ``chat`` span, the ``mcp`` SDK's spans inside
the ``execute_tool`` span of their call, one trace for the run and no other; the GenAI
client metrics with their required attributes and cardbus's own metrics, with their units,
agreeing with the log the run wrote.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

from click.testing import CliRunner
from mcpservers import SCRIPT
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceRequest,
)
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from cardbus.eventstore import events as ev
from cardbus.eventstore.sqlite import SqliteEventStore
from cardbus.tools.cli import cli
from tests.agents.openai_stub import OpenAIStub, Reply

TESTS = Path(SCRIPT).parent
PRICE = {"input": 1000.0, "output": 2000.0}  # USD per million tokens: the stub's model


def _value(v: Any) -> Any:
    kind = v.WhichOneof("value")
    return getattr(v, kind) if kind else None


def _attrs(kvs: Any) -> dict[str, Any]:
    return {kv.key: _value(kv.value) for kv in kvs}


def _spans(bodies: list[bytes]) -> list[tuple[str, Any]]:
    """(instrumentation scope, span) for every span received."""
    out = []
    for body in bodies:
        for rs in ExportTraceServiceRequest.FromString(body).resource_spans:
            for ss in rs.scope_spans:
                out += [(ss.scope.name, s) for s in ss.spans]
    return out


def _metrics(bodies: list[bytes]) -> dict[str, tuple[str, str, list[tuple[dict[str, Any], Any]]]]:
    """metric name -> (unit, kind, [(attributes, data point)]) over every export."""
    out: dict[str, tuple[str, str, list[tuple[dict[str, Any], Any]]]] = {}
    for body in bodies:
        for rm in ExportMetricsServiceRequest.FromString(body).resource_metrics:
            for sm in rm.scope_metrics:
                assert sm.scope.name == "cardbus"
                for m in sm.metrics:
                    kind = m.WhichOneof("data")
                    points = [(_attrs(p.attributes), p) for p in getattr(m, kind).data_points]
                    unit, _, before = out.get(m.name, (m.unit, kind, []))
                    out[m.name] = (unit, kind, before + points)
    return out


async def _log(db: Path) -> list[Any]:
    async with await SqliteEventStore.open(db) as store:
        return await store.read_all(0, 100_000)


def test_an_llm_and_mcp_run_exports_one_trace_and_the_metrics(
    otlp_receiver: Any, tmp_path: Path
) -> None:
    plan = {
        "goal": "add two and three",
        "agents": ["mcpservers:Adder"],
        "tasks": [{"id": "sum", "capability": "calculate", "inputs": {"question": "2+3?"}}],
    }
    (tmp_path / "plan.json").write_text(json.dumps(plan))
    (tmp_path / "prices.json").write_text(json.dumps({"stub-model*": PRICE}))
    db = tmp_path / "run.db"
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    env.update(
        OTEL_EXPORTER_OTLP_ENDPOINT=otlp_receiver.url,
        # what is sent, not the short default deadline (test_collector_unreachable.py): on a
        # busy machine the receiver may answer after it
        OTEL_EXPORTER_OTLP_TIMEOUT="30",
        PYTHONPATH=str(TESTS),  # mcpservers:Adder, as a user's own module
        CARDBUS_PRICES=str(tmp_path / "prices.json"),
    )
    cardbus = Path(sys.executable).with_name("cardbus")
    with OpenAIStub() as stub:
        stub.script(
            Reply(tool_calls=[("calc__add", {"a": 2, "b": 3})]),
            Reply(content=json.dumps({"answer": "five", "total": 5})),
        )
        args = [str(cardbus), "run", str(tmp_path / "plan.json")]
        args += ["--db", str(db), "--mcp", f"calc={sys.executable} {SCRIPT}"]
        args += ["--llm-base-url", stub.url, "--model", "stub-model", "--json"]
        done = subprocess.run(
            args, env=env, capture_output=True, text=True, timeout=180, check=False
        )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout.strip().splitlines()[-1])["status"] == "completed"
    events = asyncio.run(_log(db))

    # -- the trace ------------------------------------------------------------------------
    spans = _spans([b for _, _, b in otlp_receiver.received.requests_to("/v1/traces")])
    ours = [s for scope, s in spans if scope == "cardbus"]
    chats = [s for s in ours if s.name.startswith("chat ")]
    answered = [e.data for e in events if isinstance(e.data, ev.ModelAnswered)]
    assert len(chats) == len(answered) == 2
    for s in chats:
        assert _attrs(s.attributes)["gen_ai.provider.name"] == "127.0.0.1", s.name  # the stub
        assert _attrs(s.attributes)["gen_ai.operation.name"] == "chat"
    execute = {s.span_id: s for s in ours if s.name.startswith("execute_tool ")}
    assert [s.name for s in execute.values()] == ["execute_tool calc__add"]
    sdk = [s for scope, s in spans if scope == "mcp-python-sdk"]
    assert sdk, [(scope, s.name) for scope, s in spans]
    for s in sdk:  # each of the SDK's spans sits inside the execute_tool span of its call
        assert "tools/call" in s.name and s.parent_span_id in execute, s.name
    # one trace, the run's: no span of any scope elsewhere (no one-span traces)
    assert {s.trace_id for _, s in spans} == {ours[0].trace_id}
    roots = [s for _, s in spans if not s.parent_span_id]
    assert [s.name for s in roots] == ["invoke_workflow"]
    # one invoke_agent per attempt (the worker's own span is "handle <agent>")
    attempts = [e for e in events if isinstance(e.data, ev.TaskDispatched)]
    invocations = [s for s in ours if s.name.startswith("invoke_agent ")]
    assert len(invocations) == len(attempts) == 1
    assert [s.name for s in ours if s.name.startswith("handle ")] == ["handle adder"]

    # the same run exported again from the log alone: the same trace, the provider again
    root = next(e.stream for e in events if isinstance(e.data, ev.RunStarted))
    before = len(otlp_receiver.received.requests_to("/v1/traces"))
    args = ["export", root, "--root", "--otlp", otlp_receiver.url, "--db", str(db)]
    exported = CliRunner().invoke(cli, args)
    assert exported.exit_code == 0, exported.output
    again = _spans([b for _, _, b in otlp_receiver.received.requests_to("/v1/traces")[before:]])
    again_chats = [s for _, s in again if s.name.startswith("chat ")]
    assert {s.span_id for s in again_chats} == {s.span_id for s in chats}
    for s in again_chats:
        assert _attrs(s.attributes)["gen_ai.provider.name"] == "127.0.0.1"
    assert {s.trace_id for _, s in again} == {ours[0].trace_id}

    # -- the metrics ----------------------------------------------------------------------
    got = _metrics([b for _, _, b in otlp_receiver.received.requests_to("/v1/metrics")])
    unit, kind, usage = got["gen_ai.client.token.usage"]
    assert (unit, kind) == ("{token}", "histogram")
    required = {
        "gen_ai.operation.name": "chat",  # required
        "gen_ai.provider.name": "127.0.0.1",  # required
        "gen_ai.request.model": "stub-model",  # conditionally required: known here
    }
    for attrs, _ in usage:
        assert {k: attrs.get(k) for k in required} == required
        assert attrs["gen_ai.response.model"] == "stub-model-2024"  # recommended
    by_type = {a["gen_ai.token.type"]: p for a, p in usage}  # required on the token usage
    assert by_type["input"].sum == sum(a.input_tokens for a in answered)
    assert by_type["output"].sum == sum(a.output_tokens for a in answered)
    assert by_type["input"].count == by_type["output"].count == 2
    unit, kind, durations = got["gen_ai.client.operation.duration"]
    assert (unit, kind) == ("s", "histogram")
    assert sum(p.count for _, p in durations) == 2
    for attrs, _ in durations:
        assert {k: attrs.get(k) for k in required} == required
        assert "error.type" not in attrs  # conditionally required: no call failed
    assert abs(sum(p.sum for _, p in durations) - sum(a.latency_s for a in answered)) < 1e-6

    assert got["cardbus.runs.finished"][:2] == ("{run}", "sum")
    [(attrs, point)] = got["cardbus.runs.finished"][2]
    assert attrs == {"cardbus.run.status": "completed", "cardbus.run.degraded": False}
    assert point.as_int == 1
    assert got["cardbus.run.duration"][:2] == ("s", "histogram")
    started = next(e for e in events if isinstance(e.data, ev.RunStarted))
    ended = next(e for e in events if isinstance(e.data, ev.RunCompleted))
    [(_, point)] = got["cardbus.run.duration"][2]
    assert abs(point.sum - (ended.recorded_at - started.recorded_at)) < 1e-6
    assert got["cardbus.tasks.finished"][:2] == ("{task}", "sum")
    tasks = Counter(
        (a["cardbus.task.status"], a["cardbus.task.capability"])
        for a, p in got["cardbus.tasks.finished"][2]
        for _ in range(p.as_int)
    )
    assert tasks == {("completed", "calculate"): 1}
    assert got["cardbus.task.queue_wait"][:2] == ("s", "histogram")
    [(attrs, point)] = got["cardbus.task.queue_wait"][2]
    assert attrs == {"gen_ai.agent.id": "adder", "cardbus.task.capability": "calculate"}
    dispatched = next(e for e in events if isinstance(e.data, ev.TaskDispatched))
    result = next(e for e in events if isinstance(e.data, ev.TaskResultSubmitted))
    wait = result.recorded_at - result.data.duration_s - dispatched.recorded_at
    assert point.count == 1 and abs(point.sum - max(0.0, wait)) < 1e-6
    assert got["cardbus.model.cost"][:2] == ("{USD}", "sum")
    [(attrs, point)] = got["cardbus.model.cost"][2]
    assert attrs["gen_ai.request.model"] == "stub-model"
    spent = sum(
        a.input_tokens * PRICE["input"] + a.output_tokens * PRICE["output"] for a in answered
    )
    assert point.as_double > 0 and abs(point.as_double - spent / 1e6) < 1e-9
    assert abs(point.as_double - sum(a.cost_usd or 0.0 for a in answered)) < 1e-9
    assert "cardbus.task.retries" not in got  # none was scheduled: no point made up
