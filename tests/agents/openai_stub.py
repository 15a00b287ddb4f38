"""A stub OpenAI-compatible chat-completions server on loopback, for tests.

It behaves like the real ones where cardbus cares: it answers
``POST /v1/chat/completions`` with a chat completion (usage included),
honours or refuses structured output (``refuse_structured``: HTTP 400 for a
``response_format``, as servers without JSON-schema support do), and plays
scripted replies in order: any content (JSON, fenced JSON, prose), a status
with headers (429 with Retry-After, 500), a delay past the client's timeout.
With ``honour_schema`` set, an unscripted request for structured output is
answered with an instance of its schema, as a real server constrained to it
would (any schema: a run of LLM agents completes on the stub); ``responder``
(request body -> Reply, content or None) answers unscripted requests first.
``Reply(tool_calls=[(name, arguments), ...])`` answers with those function
calls (several: parallel calls; arguments a dict, or text sent as is), no
content and ``finish_reason: "tool_calls"``, as a model calling tools does.
Every request is recorded (path, headers, JSON body). A request's ``max_tokens`` (or
``max_completion_tokens``) is honoured as a real server does: an answer whose usage says
more completion tokens is cut to that many (its text to that many words, the stub's
tokens) with ``finish_reason: "length"``; ``ignore_max_tokens`` answers in full anyway,
as an endpoint that ignores the field would.

A request with ``"stream": true`` is answered as server-sent events, as a streaming
endpoint does: the same answer in ``chat.completion.chunk`` deltas (the content in
``Reply.chunks`` pieces, else word by word; each tool call's arguments in two
pieces), ``finish_reason`` on the last, then the usage when
``stream_options.include_usage`` asks for it, then ``[DONE]``. ``chunk_delay_s``
paces the pieces; ``gate`` (a ``threading.Event``) holds the stream after
``gate_after`` pieces until it is set, so a test can look while a call streams
(``gates``: several, piece number -> event).

    with OpenAIStub() as stub:
        stub.script(Reply(status=429, headers={"Retry-After": "1"}), Reply(content='{"a": 1}'))
        llm = OpenAIChatLLM(stub.url, "stub-model")
"""

from __future__ import annotations

import json
import sys
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from cardbus.agents.llm import schema_instance

__all__ = ["OpenAIStub", "Reply"]


def _schema_of(body: Any) -> Any:
    fmt = body.get("response_format") if isinstance(body, dict) else None
    inner = fmt.get("json_schema") if isinstance(fmt, dict) else None
    return inner.get("schema") if isinstance(inner, dict) else None


def _max_tokens(body: Any) -> int | None:
    """The output limit a request asks for (None: none)."""
    if not isinstance(body, dict):
        return None
    for key in ("max_tokens", "max_completion_tokens"):
        value = body.get(key)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    return None


@dataclass
class Reply:
    """One scripted answer; ``content`` becomes a chat completion, ``body`` is sent as is."""

    content: str | None = "stub answer"
    status: int = 200
    headers: dict[str, str] = field(default_factory=dict)
    delay_s: float = 0.0
    body: bytes | None = None
    usage: dict[str, int] | None = None
    model: str = "stub-model-2024"
    tool_calls: list[tuple[str, dict[str, Any] | str]] | None = None
    chunks: list[str] | None = None  # streamed: these pieces (their join is the content)
    chunk_delay_s: float = 0.0
    gate: threading.Event | None = None
    gate_after: int = 1
    gates: dict[int, threading.Event] = field(default_factory=dict)  # piece -> hold before it


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    block_on_close = False
    request_queue_size = 256  # a bench's hundreds of clients connect at once

    def handle_error(self, request: Any, client_address: Any) -> None:
        # a client that died mid-request (a crash test kills it) is not the stub's error
        if not isinstance(sys.exc_info()[1], ConnectionError):
            super().handle_error(request, client_address)


class OpenAIStub:
    def __init__(self) -> None:
        self.requests: list[dict[str, Any]] = []
        self.replies: deque[Reply] = deque()
        self.default = Reply()
        self.refuse_structured = False
        self.honour_schema = False
        self.ignore_max_tokens = False  # answer past a request's max_tokens (a careless endpoint)
        self.refuse_stream = False  # HTTP 400 for a streamed request (an endpoint that cannot)
        self.ignore_stream = False  # a streamed request answered whole, as JSON (a stand-in)
        self.responder: Callable[[Any], Reply | str | None] | None = None
        self.usage = {"prompt_tokens": 11, "completion_tokens": 7, "total_tokens": 18}
        self._lock = threading.Lock()
        self._calls = 0  # tool calls answered: their ids are call_1, call_2, ...
        self._server: _Server | None = None
        self._thread: threading.Thread | None = None
        self.url = ""
        #: a provider's limit, enforced over a sliding window of ``limit_window_s``
        #: (429 beyond it), with OpenAI's rate-limit headers on every answer; None: no limit
        self.limit_requests: int | None = None
        self.limit_tokens: int | None = None
        self.limit_window_s = 60.0
        self.rate_limited = 0  # answers 429 for the limit
        self.served: list[tuple[float, int]] = []  # (time, tokens) of each call let through
        self.streamed = 0  # requests answered as a stream
        self.pieces_sent = 0  # streamed content pieces written to clients
        self.piece_times: list[float] = []  # time.time() as each piece was written

    # -- scripting -------------------------------------------------------------

    def script(self, *replies: Reply | str) -> None:
        """Answer these next, in order (a str is the content of a 200 reply)."""
        for r in replies:
            self.replies.append(Reply(content=r) if isinstance(r, str) else r)

    def bodies(self) -> list[dict[str, Any]]:
        return [r["body"] for r in self.requests]

    def _next(self, body: Any) -> Reply:
        with self._lock:
            if self.refuse_stream and isinstance(body, dict) and body.get("stream"):
                return Reply(
                    status=400,
                    body=json.dumps(
                        {"error": {"message": "stream_options is not supported", "code": None}}
                    ).encode(),
                )
            if self.refuse_structured and isinstance(body, dict) and "response_format" in body:
                return Reply(
                    status=400,
                    body=json.dumps(
                        {
                            "error": {
                                "message": "response_format json_schema is not supported",
                                "type": "invalid_request_error",
                                "param": "response_format",
                                "code": None,
                            }
                        }
                    ).encode(),
                )
            if self.replies:
                return self.replies.popleft()
            answer = self.responder(body) if self.responder is not None else None
            if answer is not None:
                return Reply(content=answer) if isinstance(answer, str) else answer
            schema = _schema_of(body) if self.honour_schema else None
            if schema is not None:
                return Reply(content=json.dumps(schema_instance(schema, "stub")))
            return self.default

    def _limit(self, body: Any) -> tuple[Reply | None, dict[str, str]]:
        """Enforce the limit (a 429 past it) and say where the caller stands."""
        if self.limit_requests is None and self.limit_tokens is None:
            return None, {}
        tokens = int(self.usage.get("total_tokens", 0))
        with self._lock:
            now = time.monotonic()
            window = [(t, n) for t, n in self.served if t > now - self.limit_window_s]
            used_r, used_t = len(window), sum(n for _, n in window)
            over = (self.limit_requests is not None and used_r + 1 > self.limit_requests) or (
                self.limit_tokens is not None and used_t + tokens > self.limit_tokens
            )
            if not over:
                self.served.append((now, tokens))
                used_r, used_t = used_r + 1, used_t + tokens
            else:
                self.rate_limited += 1
            reset = (window[0][0] + self.limit_window_s - now) if window else 0.0
        headers: dict[str, str] = {}
        for kind, limit, used in (
            ("requests", self.limit_requests, used_r),
            ("tokens", self.limit_tokens, used_t),
        ):
            if limit is not None:
                headers[f"x-ratelimit-limit-{kind}"] = str(limit)
                headers[f"x-ratelimit-remaining-{kind}"] = str(max(0, limit - used))
                headers[f"x-ratelimit-reset-{kind}"] = f"{max(0.0, reset):.3f}s"
        if over:
            headers["retry-after-ms"] = str(max(1, int(reset * 1000)))
            return Reply(status=429, headers=headers), headers
        return None, headers

    def _render(self, reply: Reply, body: Any = None) -> bytes:
        if reply.body is not None:
            return reply.body
        if reply.status != 200:
            return json.dumps({"error": {"message": f"stub status {reply.status}"}}).encode()
        message: dict[str, Any] = {"role": "assistant", "content": reply.content}
        finish = "stop"
        usage = dict(self.usage if reply.usage is None else reply.usage)
        limit = _max_tokens(body)
        out = usage.get("completion_tokens", 0)
        if limit is not None and out > limit and not self.ignore_max_tokens:
            words = (reply.content or "").split(" ")
            message["content"] = " ".join(words[:limit])
            usage["completion_tokens"] = limit
            usage["total_tokens"] = usage.get("prompt_tokens", 0) + limit
            finish = "length"
        if reply.tool_calls:
            calls = []
            for name, args in reply.tool_calls:
                with self._lock:
                    self._calls += 1
                    call_id = f"call_{self._calls}"
                text = args if isinstance(args, str) else json.dumps(args)
                calls.append(
                    {
                        "id": call_id,
                        "type": "function",
                        "function": {"name": name, "arguments": text},
                    }
                )
            # the model's words beside its calls, when the script gives some (not the default)
            said = reply.content if reply.content != "stub answer" else None
            message = {"role": "assistant", "content": said, "tool_calls": calls}
            finish = "tool_calls"
        doc = {
            "id": "chatcmpl-stub",
            "object": "chat.completion",
            "created": 1700000000,
            "model": reply.model,
            "choices": [{"index": 0, "message": message, "finish_reason": finish}],
            "usage": usage,
        }
        return json.dumps(doc).encode()

    def _stream(
        self, handler: Any, reply: Reply, body: dict[str, Any], doc: dict[str, Any]
    ) -> None:
        """Answer ``doc`` (a rendered chat completion) as server-sent events."""
        with self._lock:
            self.streamed += 1
        choice = doc["choices"][0]
        message = choice["message"]
        content = message.get("content") or ""
        if reply.chunks is not None and "".join(reply.chunks) == content:
            pieces = list(reply.chunks)
        else:  # word by word, each keeping the space before it
            words = content.split(" ")
            pieces = [w if i == 0 else " " + w for i, w in enumerate(words)] if content else []
        base = {"id": doc["id"], "object": "chat.completion.chunk", "created": doc["created"]}
        base["model"] = doc["model"]

        def event(delta: dict[str, Any], finish: str | None = None, **more: Any) -> bytes:
            choices = [{"index": 0, "delta": delta, "finish_reason": finish}]
            return b"data: " + json.dumps({**base, "choices": choices, **more}).encode() + b"\n\n"

        try:
            handler.send_response(200)
            handler.send_header("Content-Type", "text/event-stream")
            handler.send_header("Cache-Control", "no-cache")
            handler.send_header("Connection", "close")
            for k, v in reply.headers.items():
                handler.send_header(k, v)
            handler.end_headers()
            out = handler.wfile
            out.write(event({"role": "assistant", "content": ""}))
            out.flush()
            gates = dict(reply.gates)
            if reply.gate is not None:
                gates[reply.gate_after] = reply.gate
            for i, piece in enumerate(pieces):
                if i in gates:
                    gates[i].wait(60)
                if reply.chunk_delay_s and i:
                    time.sleep(reply.chunk_delay_s)
                out.write(event({"content": piece}))
                out.flush()
                with self._lock:
                    self.pieces_sent += 1
                    self.piece_times.append(time.time())
            for index, call in enumerate(message.get("tool_calls") or ()):
                args = call["function"]["arguments"]
                half = len(args) // 2
                first = {"index": index, "id": call["id"], "type": "function"}
                first["function"] = {"name": call["function"]["name"], "arguments": args[:half]}
                out.write(event({"tool_calls": [first]}))
                rest = {"index": index, "function": {"arguments": args[half:]}}
                out.write(event({"tool_calls": [rest]}))
            out.write(event({}, choice["finish_reason"]))
            options = body.get("stream_options")
            if isinstance(options, dict) and options.get("include_usage"):
                usage = {**base, "choices": [], "usage": doc["usage"]}
                out.write(b"data: " + json.dumps(usage).encode() + b"\n\n")
            out.write(b"data: [DONE]\n\n")
            out.flush()
            handler.close_connection = True
        except OSError:  # the client gave up (a crash test kills it)
            pass

    # -- serving ---------------------------------------------------------------

    def start(self) -> OpenAIStub:
        stub = self

        class Handler(BaseHTTPRequestHandler):
            disable_nagle_algorithm = True  # headers and body in one segment: no 40 ms ACK stall
            protocol_version = "HTTP/1.1"

            def do_POST(self) -> None:
                raw = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                try:
                    body: Any = json.loads(raw)
                except ValueError:
                    body = raw.decode(errors="replace")
                with stub._lock:
                    stub.requests.append(
                        {
                            "path": self.path,
                            "headers": {k.lower(): v for k, v in self.headers.items()},
                            "body": body,
                        }
                    )
                refused, limit_headers = stub._limit(body)
                reply = refused or stub._next(body)
                if limit_headers and not refused:
                    reply = Reply(
                        **{**reply.__dict__, "headers": {**reply.headers, **limit_headers}}
                    )
                if reply.delay_s:
                    time.sleep(reply.delay_s)
                data = stub._render(reply, body)
                wants_stream = isinstance(body, dict) and body.get("stream") is True
                wants_stream = wants_stream and not stub.ignore_stream
                if wants_stream and reply.status == 200 and reply.body is None:
                    stub._stream(self, reply, body, json.loads(data))
                    return
                try:
                    self.send_response(reply.status)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(data)))
                    for k, v in reply.headers.items():
                        self.send_header(k, v)
                    self.end_headers()
                    self.wfile.write(data)
                except OSError:  # the client gave up (a timeout test)
                    pass

            def log_message(self, *args: Any) -> None:  # keep the test output quiet
                pass

        self._server = _Server(("127.0.0.1", 0), Handler)  # a free port
        self._thread = threading.Thread(
            target=self._server.serve_forever, args=(0.01,), daemon=True
        )
        self._thread.start()
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}/v1"
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
        if self._thread is not None:
            self._thread.join(5)

    def __enter__(self) -> OpenAIStub:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
