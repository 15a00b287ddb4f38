"""MCP servers mounted as tools: real server processes (tests/mcpservers.py) over stdio and
streamable HTTP, started through the SDK by ``MCPToolset``.

Nothing is mocked: each test starts the servers it needs and the toolset stops them;
every wait is bounded (``asyncio.wait_for``) so a wedged session fails the test
rather than hanging it.
"""

from __future__ import annotations

import asyncio
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from mcpservers import http_server, stdio_server

from cardbus.agents.mcp import IDEMPOTENCY_META_KEY, MCPToolset, mcp_tool_name, mount_mcp
from cardbus.agents.mcp_config import (
    MCPServer,
    load_mcp_config,
    mcp_servers_of,
    parse_mcp_flag,
    split_plan_servers,
)
from cardbus.agents.tools import (
    ToolFailed,
    ToolInputInvalid,
    ToolRegistry,
    ToolResultTooLarge,
    ToolTimeout,
    doc_search_tool,
)
from cardbus.eventstore.errors import ConfigError

OPENAI_NAME = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")
BOUND = 60  # seconds: generous, only there so that a wedge fails instead of hanging


async def test_tools_are_listed_and_registered_with_the_servers_schemas(tmp_path: Path) -> None:
    registry = ToolRegistry([doc_search_tool(tmp_path)])
    server = stdio_server("t", timeout_s=5, max_result_bytes=2000)
    async with mount_mcp(registry, [server]) as toolset:
        names = toolset.tool_names
        assert names == [
            "t__echo",
            "t__add",
            "t__plain",
            "t__fail",
            "t__hang",
            "t__exit",
            "t__count",
            "t__big",
            "t__pid",
        ]
        assert all(OPENAI_NAME.match(n) for n in names)
        assert "doc_search" in registry  # what was registered before stays
        echo = registry.get("t__echo")
        assert echo is not None
        spec = echo.spec
        assert spec.description == "Say the text back."
        assert spec.input_schema["properties"]["text"]["type"] == "string"
        assert spec.input_schema["required"] == ["text"]
        assert spec.max_result_bytes == 2000
        assert spec.timeout_s == 6  # the server's 5 s, and the registry's backstop after it
        # idempotent from the annotations: readOnlyHint, idempotentHint; else not
        idempotent = {s.name: s.idempotent for s in registry.specs() if s.name in names}
        assert idempotent["t__echo"] and idempotent["t__add"]
        assert not idempotent["t__count"] and not idempotent["t__exit"]
        add = registry.get("t__add")
        assert add is not None and add.spec.output_schema["type"] == "object"
        assert registry.get("t__plain").spec.output_schema == {}  # type: ignore[union-attr]


async def test_a_call_returns_the_structured_result_or_the_text() -> None:
    registry = ToolRegistry()
    async with MCPToolset([stdio_server("t")], registry):
        out = await registry.call("t__add", {"a": 2, "b": 40})
        assert out.result == {"sum": 42}
        assert (await registry.call("t__echo", {"text": "hi"})).result == {"result": "hi"}
        assert (await registry.call("t__plain", {"n": 7})).result == "n=7"
        # the server's input schema is checked before the server is asked
        with pytest.raises(ToolInputInvalid, match="text"):
            await registry.call("t__echo", {})


async def test_an_error_result_is_tool_failed_with_its_text() -> None:
    registry = ToolRegistry()
    async with MCPToolset([stdio_server("t")], registry):
        with pytest.raises(ToolFailed, match=r"t__fail: .*the disk is full"):
            await registry.call("t__fail", {"why": "the disk is full"})
        assert (await registry.call("t__echo", {"text": "still"})).result == {"result": "still"}


async def test_a_result_over_the_servers_limit_is_too_large() -> None:
    registry = ToolRegistry()
    async with MCPToolset([stdio_server("t", max_result_bytes=1000)], registry):
        with pytest.raises(ToolResultTooLarge):
            await registry.call("t__big", {"n": 5000})
        assert (await registry.call("t__big", {"n": 10})).result == {"result": "x" * 10}


async def test_a_hanging_tool_times_out_and_the_session_stays_usable() -> None:
    registry = ToolRegistry()
    async with MCPToolset([stdio_server("t", timeout_s=1)], registry):
        calls = [registry.call("t__hang", {}) for _ in range(3)]
        results = await asyncio.wait_for(asyncio.gather(*calls, return_exceptions=True), BOUND)
        assert all(isinstance(r, ToolTimeout) for r in results), results
        assert "no result within 1s" in str(results[0])
        out = await asyncio.wait_for(registry.call("t__add", {"a": 1, "b": 1}), BOUND)
        assert out.result == {"sum": 2}


async def test_a_server_that_exits_gives_typed_errors_and_no_wedge() -> None:
    registry = ToolRegistry()
    toolset = MCPToolset([stdio_server("t"), stdio_server("u")], registry)
    async with toolset:
        with pytest.raises(ToolFailed, match="connection closed"):
            await asyncio.wait_for(registry.call("t__exit", {}), BOUND)
        # every later call of that server fails at once; the other server serves on
        with pytest.raises(ToolFailed, match="not running"):
            await asyncio.wait_for(registry.call("t__echo", {"text": "x"}), BOUND)
        out = await asyncio.wait_for(registry.call("u__echo", {"text": "x"}), BOUND)
        assert out.result == {"result": "x"}
    # stopped: every call is a typed error, none hangs
    with pytest.raises(ToolFailed, match="not running"):
        await asyncio.wait_for(registry.call("u__echo", {"text": "x"}), BOUND)


async def test_the_idempotency_key_travels_in_meta_and_each_call_runs_once(
    tmp_path: Path,
) -> None:
    counted = tmp_path / "count.txt"
    registry = ToolRegistry()
    async with MCPToolset([stdio_server("t", count_file=counted)], registry):
        assert (await registry.call("t__count", {}, idempotency_key="key-1")).result == {
            "result": "key-1"
        }
        await registry.call("t__count", {})  # no key: no _meta entry
    assert counted.read_text().splitlines() == ["key-1", ""]
    assert IDEMPOTENCY_META_KEY == "cardbus/idempotency-key"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a zombie until reaped would still answer: the SDK waits for the exit, so none is left
    return True


async def test_stopping_ends_the_server_processes_and_a_restart_serves_the_same_names() -> None:
    registry = ToolRegistry()
    toolset = MCPToolset([stdio_server("t"), stdio_server("u")], registry)
    async with toolset:
        pids = [(await registry.call(f"{s}__pid", {})).result["result"] for s in "tu"]
        assert all(_alive(p) for p in pids)
    assert not any(_alive(p) for p in pids)
    async with toolset:  # started again: the registered tools find the new session
        assert (await registry.call("t__echo", {"text": "again"})).result == {"result": "again"}
        again = (await registry.call("t__pid", {})).result["result"]
    assert again not in pids and not _alive(again)


async def test_a_server_that_does_not_start_is_a_config_error_naming_it() -> None:
    registry = ToolRegistry()
    dead = MCPServer("dead", command=sys.executable, args=("-c", "raise SystemExit(1)"))
    with pytest.raises(ConfigError, match=r"'dead'.*did not start"):
        await asyncio.wait_for(MCPToolset([stdio_server("t"), dead], registry).start(), BOUND)
    missing = MCPServer("missing", command="/nonexistent/mcp-server")
    with pytest.raises(ConfigError, match=r"'missing'.*did not start.*No such file"):
        await asyncio.wait_for(MCPToolset([missing], registry).start(), BOUND)
    mute = MCPServer(
        "mute",
        command=sys.executable,
        args=("-c", "import time; time.sleep(600)"),
        start_timeout_s=0.25,  # it never answers: any bound is reached, a short one sooner
    )
    with pytest.raises(ConfigError, match=r"'mute'.*within 0.25s"):
        await asyncio.wait_for(MCPToolset([mute], registry).start(), BOUND)
    assert "t__echo" not in registry  # nothing was mounted by a start that failed


async def test_a_streamable_http_server_on_loopback() -> None:
    with http_server("h", timeout_s=1) as server:
        registry = ToolRegistry()
        async with MCPToolset([server], registry):
            assert (await registry.call("h__add", {"a": 1, "b": 2})).result == {"sum": 3}
            with pytest.raises(ToolFailed, match="nope"):
                await registry.call("h__fail", {"why": "nope"})
            with pytest.raises(ToolTimeout):
                await asyncio.wait_for(registry.call("h__hang", {}), BOUND)
            assert (await registry.call("h__echo", {"text": "ok"})).result == {"result": "ok"}


def test_tool_names_fit_the_model_apis_rule_and_stay_distinct() -> None:
    assert mcp_tool_name("time", "get_current_time") == "time__get_current_time"
    dotted, underscored = mcp_tool_name("fs", "read.file"), mcp_tool_name("fs", "read_file")
    assert dotted != underscored and dotted.startswith("fs__read_file_")
    long = mcp_tool_name("srv", "x" * 100)
    assert len(long) == 64 and long != mcp_tool_name("srv", "x" * 99)
    for n in (dotted, long, mcp_tool_name("a", "é/ü"), mcp_tool_name("a", "")):
        assert OPENAI_NAME.match(n), n


def test_the_mcp_servers_config_format(tmp_path: Path) -> None:
    path = tmp_path / "mcp.json"
    path.write_text(
        '{"mcpServers": {'
        ' "time": {"command": "uvx", "args": ["mcp-server-time"], "env": {"TZ": "${ZONE}"}},'
        ' "docs": {"type": "http", "url": "https://example.org/mcp",'
        '          "headers": {"Authorization": "Bearer ${TOKEN:-none}"}, "timeout_s": 5},'
        ' "off": {"command": "x", "disabled": true}}}'
    )
    time_, docs = load_mcp_config(path, {"ZONE": "UTC"})
    assert (time_.name, time_.command, time_.args, dict(time_.env)) == (
        "time",
        "uvx",
        ("mcp-server-time",),
        {"TZ": "UTC"},
    )
    assert time_.transport == "stdio" and docs.transport == "http"
    assert dict(docs.headers) == {"Authorization": "Bearer none"} and docs.timeout_s == 5
    with pytest.raises(ConfigError, match=r"\$\{ZONE\} is not set"):
        load_mcp_config(path, {})
    bad = {
        "a": {"type": "sse", "url": "http://x"},
        "b": {"command": "x", "url": "http://x"},
        "c": {},
        "d__e": {"command": "x"},
        "f": {"command": "x", "args": "not a list"},
        "g": {"command": "x", "timeout_s": 0},
        "h": {"command": "x", "review": "sometimes"},
        "i": {"command": "x", "review": {"add": "maybe"}},
    }
    for name, entry in bad.items():
        with pytest.raises(ConfigError):
            mcp_servers_of({name: entry})


def test_the_mcp_flag_and_the_plan_key() -> None:
    s = parse_mcp_flag("time=python -m my_server --tz 'Europe/Paris'")
    assert (s.name, s.command, s.args) == (
        "time",
        "python",
        ("-m", "my_server", "--tz", "Europe/Paris"),
    )
    assert parse_mcp_flag("docs=http://127.0.0.1:8000/mcp").url == "http://127.0.0.1:8000/mcp"
    for bad in ("time", "time=", "=x", "a b=x"):
        with pytest.raises(ConfigError):
            parse_mcp_flag(bad)
    data, servers = split_plan_servers(
        b'{"goal": "g", "mcp_servers": {"t": {"command": "x"}}, "tasks": []}'
    )
    assert [s.name for s in servers] == ["t"]
    assert b"mcp_servers" not in data and b'"goal":"g"' in data
    assert split_plan_servers(b'{"goal": "g"}') == (b'{"goal": "g"}', [])
    assert split_plan_servers(b"not json") == (b"not json", [])


def test_importing_without_the_extra_names_it() -> None:
    code = "import sys; sys.modules['mcp'] = None; import cardbus.agents.mcp"
    proc = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=BOUND,
        env={**os.environ},
    )
    assert proc.returncode != 0
    # MissingExtra: a CardbusError that is also an ImportError, naming the extra
    assert "MissingExtra" in proc.stderr and "pip install 'cardbus[mcp]'" in proc.stderr
