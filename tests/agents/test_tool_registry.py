"""The tool registry and the built-in tools: schemas, time-outs, size limits, allow-lists."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import msgspec
import pytest

from cardbus.agents.tools import (
    Tool,
    ToolFailed,
    ToolInputInvalid,
    ToolNotFound,
    ToolRegistry,
    ToolResultTooLarge,
    ToolTimeout,
    doc_search_tool,
    http_fetch_tool,
)
from cardbus.eventstore.errors import AccessDenied, CardbusError, ConfigError


class EchoIn(msgspec.Struct, frozen=True):
    text: str
    times: int = 1


class EchoOut(msgspec.Struct, frozen=True):
    text: str


async def _echo(args: EchoIn) -> EchoOut:
    return EchoOut(text=args.text * args.times)


def registry(**limits: float) -> ToolRegistry:
    async def hang(args: dict) -> dict:
        await asyncio.sleep(3600)
        return {}

    def blocking(args: dict) -> dict:
        time.sleep(0.5)
        return {}

    def broken(args: dict) -> dict:
        raise RuntimeError("disk on fire")

    def liar(args: dict) -> dict:
        return {"text": 42}

    return ToolRegistry(
        [
            Tool.define("echo", _echo, EchoIn, EchoOut, "repeat a text", max_result_bytes=200),
            Tool.define("hang", hang, timeout_s=0.05),
            Tool.define("blocking", blocking, timeout_s=0.05),
            Tool.define("broken", broken),
            Tool.define("liar", liar, output_type=EchoOut),
        ]
    )


async def test_call_validates_and_returns_builtins_with_size_and_duration() -> None:
    out = await registry().call("echo", {"text": "ab", "times": 2})
    assert out.result == {"text": "abab"}
    assert out.result_bytes == len(b'{"text":"abab"}')
    assert out.duration_s >= 0
    spec = registry().get("echo").spec  # type: ignore[union-attr]
    assert spec.input_schema["$ref"].endswith("EchoIn") and spec.timeout_s == 10.0


@pytest.mark.parametrize(
    ("name", "args", "error"),
    [
        ("nope", {}, ToolNotFound),
        ("echo", {"times": 2}, ToolInputInvalid),
        ("echo", {"text": 1}, ToolInputInvalid),
        ("echo", {"text": "x" * 300}, ToolResultTooLarge),
        ("hang", {}, ToolTimeout),
        ("blocking", {}, ToolTimeout),
        ("broken", {}, ToolFailed),
        ("liar", {}, ToolFailed),
    ],
)
async def test_each_failure_is_a_typed_error(name: str, args: dict, error: type) -> None:
    started = time.monotonic()
    with pytest.raises(error) as info:
        await registry().call(name, args)
    assert isinstance(info.value, CardbusError)
    assert time.monotonic() - started < 2  # a hanging tool times out cleanly


async def test_oversized_result_error_carries_sizes() -> None:
    with pytest.raises(ToolResultTooLarge) as info:
        await registry().call("echo", {"text": "y", "times": 500})
    assert info.value.limit == 200 and info.value.size > 200


def test_duplicate_tool_names_are_refused_as_a_config_error() -> None:
    with pytest.raises(ConfigError, match="'a' is empty or registered twice") as info:
        ToolRegistry([Tool.define("a", _echo), Tool.define("a", _echo)])
    assert isinstance(info.value, ValueError)  # misuse: also the builtin it resembles


# --- document search -------------------------------------------------------------


@pytest.fixture
def docs(tmp_path: Path) -> Path:
    root = tmp_path / "docs"
    (root / "sub").mkdir(parents=True)
    (root / "tides.md").write_text(
        "# Tides\n\nTides are caused by the gravity of the moon and the sun.\n\n"
        "Spring tides happen at new and full moon."
    )
    (root / "sub" / "bees.txt").write_text("Bees collect pollen and nectar from flowers.")
    (root / "image.png").write_bytes(b"\x89PNG tides moon")
    secret = tmp_path / "secret.md"
    secret.write_text("The moon tides secret that must never be read.")
    (root / "escape.md").symlink_to(secret)
    return root


async def test_doc_search_ranks_paragraphs_inside_the_folder_only(docs: Path) -> None:
    tools = ToolRegistry([doc_search_tool(docs)])
    out = await tools.call("doc_search", {"query": "moon gravity tides", "k": 5})
    hits = out.result["hits"]
    assert hits[0]["path"] == "tides.md"
    assert "gravity of the moon" in hits[0]["snippet"]
    assert all(h["path"] in ("tides.md", "sub/bees.txt") for h in hits)  # no png, no escape
    assert all("secret" not in h["snippet"] for h in hits)
    bees = await tools.call("doc_search", {"query": "pollen flowers", "k": 1})
    assert [h["path"] for h in bees.result["hits"]] == ["sub/bees.txt"]
    with pytest.raises(ToolInputInvalid):
        await tools.call("doc_search", {"k": 1})


# --- HTTP fetch on a loopback server ------------------------------------------------


class _Handler(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        if self.path == "/big":
            body = b"x" * 200_000
        elif self.path == "/slow":
            time.sleep(1.0)
            body = b"late"
        elif self.path == "/redirect":
            self.send_response(302)
            self.send_header("Location", "http://evil.example/")
            self.end_headers()
            return
        else:
            body = b"hello from loopback"
        self.send_response(200)
        self.send_header("Content-Type", "text/plain; charset=utf-8")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        try:
            self.wfile.write(body)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the client gave up (time-out, size limit): that is the point

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def http_server() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, args=(0.02,), daemon=True)
    thread.start()
    try:
        yield f"127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


async def test_http_fetch_allowed_host(http_server: str) -> None:
    tools = ToolRegistry([http_fetch_tool([http_server], max_result_bytes=4096)])
    out = await tools.call("http_fetch", {"url": f"http://{http_server}/hello"})
    assert out.result["status"] == 200
    assert out.result["text"] == "hello from loopback"
    assert out.result["content_type"].startswith("text/plain")


async def test_http_fetch_refuses_other_hosts_schemes_and_ports(http_server: str) -> None:
    tools = ToolRegistry([http_fetch_tool([http_server])])
    port = int(http_server.rsplit(":", 1)[1])
    for url in (
        "http://localhost:1/",  # not on the list
        f"http://127.0.0.1:{port + 1}/",  # same host, other port
        f"file:///{http_server}/etc/passwd",
        f"ftp://{http_server}/",
        "http:///nohost",
    ):
        with pytest.raises(AccessDenied):
            await tools.call("http_fetch", {"url": url})


async def test_http_fetch_does_not_follow_redirects(http_server: str) -> None:
    tools = ToolRegistry([http_fetch_tool([http_server])])
    out = await tools.call("http_fetch", {"url": f"http://{http_server}/redirect"})
    assert out.result["status"] == 302
    assert out.result["location"] == "http://evil.example/"


async def test_http_fetch_oversized_body_and_slow_server(http_server: str) -> None:
    tools = ToolRegistry(
        [
            http_fetch_tool([http_server], max_result_bytes=1000),
            http_fetch_tool([http_server], name="quick_fetch", timeout_s=0.2),
        ]
    )
    with pytest.raises(ToolResultTooLarge):
        await tools.call("http_fetch", {"url": f"http://{http_server}/big"})
    started = time.monotonic()
    with pytest.raises(ToolTimeout):
        await tools.call("quick_fetch", {"url": f"http://{http_server}/slow"})
    assert time.monotonic() - started < 0.9
