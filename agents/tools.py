"""The tool layer: a registry of tools an agent may ask the orchestrator to call.

A :class:`Tool` has a name, a description, input and output JSON Schemas,
a timeout and a maximum result size (:class:`ToolSpec`), and a function.
Agents never call tools themselves: they ask through ``ctx.tool(name,
**args)``; the orchestrator checks the agent's allow-list
(``AgentConstraints.tools``), calls :meth:`ToolRegistry.call` and records
the call as a ``tool.called`` event. A ``Tool`` an ``LLMAgent`` declares
itself is run by the worker serving the agent, through a registry of its own,
recorded the same way (``bus.runtime.tools_served``). The registry enforces the
rest:

* the arguments must fit the input schema (``ToolInputInvalid``);
* the call must finish within ``timeout_s`` (``ToolTimeout``; an ``async``
  tool is cancelled, a plain function runs in a worker thread that is
  abandoned, since Python cannot kill a thread);
* the result, encoded as JSON, must fit ``max_result_bytes``
  (``ToolResultTooLarge``) and the output schema (``ToolFailed``);
* anything the tool raises is a ``ToolFailed`` carrying the error, except
  ``AccessDenied`` (e.g. a host not on the fetch allow-list), which stays
  an ``AccessDenied``.

Errors (all ``CardbusError``; ``error_type`` is what events and responses carry)::

    ToolError
    ├── ToolNotFound         "not_found"          no tool of that name is registered
    ├── ToolInputInvalid     "invalid_input"      arguments break the input schema
    ├── ToolTimeout          "timeout"            no result within timeout_s
    ├── ToolResultTooLarge   "result_too_large"   result over max_result_bytes
    └── ToolFailed           "tool_error"         the tool raised, or broke its output schema

Built-ins for the demo: :func:`doc_search_tool` (local documents in one
folder, ranked by an ``Embedder``) and :func:`http_fetch_tool` (HTTP GET
restricted to an allow-list of hosts; needs ``httpx``).
"""

from __future__ import annotations

import asyncio
import contextvars
import inspect
import logging
import math
import os
import time
from collections.abc import Awaitable, Callable, Iterable, Sequence
from pathlib import Path
from typing import Any, Literal
from urllib.parse import urlsplit

import msgspec

from cardbus.agents.embedding import Embedder, HashingEmbedder
from cardbus.agents.schema import schema_errors
from cardbus.eventstore.errors import (
    AccessDenied,
    CardbusError,
    ConfigError,
    ToolError,
    ToolFailed,
    ToolInputInvalid,
    ToolNotFound,
    ToolResultTooLarge,
    ToolTimeout,
)

__all__ = [
    "DocHit",
    "DocSearchIn",
    "DocSearchOut",
    "FetchIn",
    "FetchOut",
    "TOOL_ERRORS",
    "Tool",
    "ToolError",
    "ToolFailed",
    "ToolInputInvalid",
    "ToolNotFound",
    "ToolOutcome",
    "ToolRegistry",
    "ToolResultTooLarge",
    "ReviewPolicy",
    "ToolSpec",
    "ToolTimeout",
    "current_idempotency_key",
    "held_for_review",
    "doc_search_tool",
    "http_fetch_tool",
]


#: error_type -> class, to turn an error that crossed the bus back into its type
TOOL_ERRORS: dict[str, type[CardbusError]] = {
    "not_found": ToolNotFound,
    "invalid_input": ToolInputInvalid,
    "timeout": ToolTimeout,
    "result_too_large": ToolResultTooLarge,
    "tool_error": ToolFailed,
}


class ToolSpec(msgspec.Struct, frozen=True, kw_only=True):
    """What an agent (and an A2A card) can know about a tool."""

    name: str
    description: str = ""
    input_schema: dict[str, Any] = {}
    output_schema: dict[str, Any] = {}
    timeout_s: float = 10.0
    max_result_bytes: int = 64 * 1024
    #: calling it twice with the same idempotency key does no more than calling it once:
    #: a call whose effect is unknown after a crash may then be made again (see ``journal``)
    idempotent: bool = False

    def __post_init__(self) -> None:
        # checked when made: a zero or NaN timeout would fail every call as a "timeout"
        t = self.timeout_s
        if isinstance(t, bool) or not isinstance(t, (int, float)) or not 0 < t < math.inf:
            raise ConfigError(f"ToolSpec.timeout_s must be a finite number > 0; got {t!r}")
        n = self.max_result_bytes
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise ConfigError(f"ToolSpec.max_result_bytes must be an integer >= 1; got {n!r}")


class ToolOutcome(msgspec.Struct, frozen=True, kw_only=True):
    result: Any
    duration_s: float
    result_bytes: int


ToolFn = Callable[[Any], Awaitable[Any] | Any]

#: a tool's review policy: every call waits for a person (``always``), none does
#: (``never``), or those whose arguments the function says yes to (an amount over a limit)
ReviewPolicy = Literal["always", "never"] | Callable[[dict[str, Any]], bool]

log = logging.getLogger(__name__)

_IDEMPOTENCY_KEY: contextvars.ContextVar[str] = contextvars.ContextVar(
    "cardbus_tool_idempotency_key", default=""
)


def held_for_review(tool: Tool, arguments: dict[str, Any]) -> bool:
    """Whether ``tool``'s review policy holds a call with ``arguments`` for a person; a
    policy that raises holds it (a person decides, rather than nobody)."""
    try:
        return tool.needs_review(arguments)
    except Exception:  # the policy's bug: the call waits for a person, it does not run
        log.warning("the review policy of %s raised; the call is held", tool.name, exc_info=True)
        return True


def current_idempotency_key() -> str:
    """Inside a tool: the key of the call being made ("" outside a recorded call).

    It is the event id of the call's first ``tool.requested``, so a call made again
    after a crash (an idempotent tool) carries the key of the call it repeats: a tool
    with effects can use it to do them once (as a payment API's idempotency key).
    """
    return _IDEMPOTENCY_KEY.get()


class Tool:
    """A spec plus the function that does the work.

    ``fn`` takes one argument: the arguments converted to ``input_type``
    (a msgspec Struct) when one is given, else the arguments dict. It may be
    ``async`` or plain (a plain function runs in a worker thread).
    """

    def __init__(
        self,
        spec: ToolSpec,
        fn: ToolFn,
        input_type: type | None = None,
        review: ReviewPolicy = "never",
    ) -> None:
        if review not in ("always", "never") and not callable(review):
            raise ConfigError(
                f"a tool's review is 'always', 'never' or a function of the arguments; got"
                f" {review!r}"
            )
        self.spec = spec
        self.fn = fn
        self.input_type = input_type
        self.review = review

    def needs_review(self, arguments: dict[str, Any]) -> bool:
        """Whether a call with ``arguments`` waits for a person's review before it runs
        (``review``: ``always``, ``never``, or a function of the arguments)."""
        if self.review == "always":
            return True
        if self.review == "never" or isinstance(self.review, str):
            return False
        return bool(self.review(arguments))

    @classmethod
    def define(
        cls,
        name: str,
        fn: ToolFn,
        input_type: type | None = None,
        output_type: type | None = None,
        description: str = "",
        timeout_s: float = 10.0,
        max_result_bytes: int = 64 * 1024,
        idempotent: bool = False,
        review: ReviewPolicy = "never",
    ) -> Tool:
        spec = ToolSpec(
            name=name,
            description=description,
            input_schema=msgspec.json.schema(input_type) if input_type else {},
            output_schema=msgspec.json.schema(output_type) if output_type else {},
            timeout_s=timeout_s,
            max_result_bytes=max_result_bytes,
            idempotent=idempotent,
        )
        return cls(spec, fn, input_type, review=review)

    @property
    def name(self) -> str:
        return self.spec.name


class ToolRegistry:
    """Tools by name; :meth:`call` runs one with every check of the module docstring."""

    def __init__(self, tools: Iterable[Tool] = ()) -> None:
        self._tools: dict[str, Tool] = {}
        for t in tools:
            self.register(t)

    def register(self, tool: Tool) -> Tool:
        if not tool.name or tool.name in self._tools:
            raise ConfigError(f"tool name {tool.name!r} is empty or registered twice")
        self._tools[tool.name] = tool
        return tool

    def get(self, name: str) -> Tool | None:
        return self._tools.get(name)

    def specs(self) -> list[ToolSpec]:
        return [t.spec for t in self._tools.values()]

    def __contains__(self, name: object) -> bool:
        return name in self._tools

    async def call(
        self, name: str, arguments: dict[str, Any], *, idempotency_key: str = ""
    ) -> ToolOutcome:
        """Run tool ``name``; ``idempotency_key`` is the same on every replay of one recorded
        call, and the tool reads it with :func:`current_idempotency_key`."""
        tool = self._tools.get(name)
        if tool is None:
            raise ToolNotFound(f"no tool named {name!r}")
        spec = tool.spec
        if not isinstance(arguments, dict):
            raise ToolInputInvalid(f"{name}: arguments must be an object")
        problems = schema_errors(arguments, spec.input_schema) if spec.input_schema else []
        if problems:
            raise ToolInputInvalid(f"{name}: {'; '.join(problems[:5])}")
        arg: Any = arguments
        if tool.input_type is not None:
            try:
                arg = msgspec.convert(arguments, tool.input_type)
            except msgspec.ValidationError as e:
                raise ToolInputInvalid(f"{name}: {e}") from e
        start = time.monotonic()
        token = _IDEMPOTENCY_KEY.set(idempotency_key)  # copied into a plain tool's thread
        try:
            if inspect.iscoroutinefunction(tool.fn):
                result = await asyncio.wait_for(tool.fn(arg), spec.timeout_s)
            else:
                result = await asyncio.wait_for(asyncio.to_thread(tool.fn, arg), spec.timeout_s)
                if inspect.isawaitable(result):
                    result = await asyncio.wait_for(result, spec.timeout_s)
        except TimeoutError as e:
            raise ToolTimeout(f"{name}: no result within {spec.timeout_s:g}s") from e
        except (ToolError, AccessDenied):
            raise
        except Exception as e:  # the tool's bug is the caller's typed error, not a crash
            raise ToolFailed(f"{name}: {type(e).__name__}: {e}") from e
        finally:
            _IDEMPOTENCY_KEY.reset(token)
        duration = time.monotonic() - start
        try:
            payload = msgspec.to_builtins(result)
            size = len(msgspec.json.encode(payload))
        except Exception as e:
            raise ToolFailed(f"{name}: result is not JSON: {e}") from e
        if size > spec.max_result_bytes:
            raise ToolResultTooLarge(
                f"{name}: result of {size} bytes is over the limit of {spec.max_result_bytes}",
                size,
                spec.max_result_bytes,
            )
        if spec.output_schema:
            problems = schema_errors(payload, spec.output_schema)
            if problems:
                raise ToolFailed(f"{name}: output breaks its schema: {'; '.join(problems[:5])}")
        return ToolOutcome(result=payload, duration_s=duration, result_bytes=size)


# --- built-in: local document search -------------------------------------------


class DocSearchIn(msgspec.Struct, frozen=True, kw_only=True):
    query: str
    k: int = 3


class DocHit(msgspec.Struct, frozen=True, kw_only=True):
    path: str  # relative to the folder
    score: float
    snippet: str


class DocSearchOut(msgspec.Struct, frozen=True, kw_only=True):
    hits: list[DocHit]


_DOC_SUFFIXES = (".md", ".txt", ".rst")


def doc_search_tool(
    folder: str | os.PathLike[str],
    embedder: Embedder | None = None,
    name: str = "doc_search",
    timeout_s: float = 5.0,
    max_result_bytes: int = 16 * 1024,
    max_file_bytes: int = 256 * 1024,
) -> Tool:
    """Search the text files (``.md``, ``.txt``, ``.rst``) under ``folder``.

    Paragraphs are ranked by cosine similarity to the query under
    ``embedder`` (default: the offline hashing embedder). Only files inside
    ``folder`` are read: symlinks that lead out of it are skipped.
    """
    root = Path(folder).resolve()
    emb = embedder or HashingEmbedder()

    def paragraphs() -> list[tuple[str, str]]:
        out = []
        for dirpath, _dirs, files in os.walk(root):
            for f in sorted(files):
                path = Path(dirpath, f)
                if path.suffix.lower() not in _DOC_SUFFIXES:
                    continue
                real = path.resolve()
                if not real.is_relative_to(root) or not real.is_file():
                    continue
                with open(real, "rb") as fh:
                    text = fh.read(max_file_bytes).decode("utf-8", "replace")
                rel = str(path.relative_to(root))
                heading = ""
                for block in text.split("\n\n"):
                    para = " ".join(block.split())
                    if para.startswith("#") and len(para) < 120:
                        heading = para.lstrip("# ")  # a heading goes with what follows it
                    elif para:
                        out.append((rel, f"{heading}: {para}" if heading else para))
                if heading and not any(r == rel for r, _ in out):
                    out.append((rel, heading))
        return out

    def search(args: DocSearchIn) -> DocSearchOut:
        paras = paragraphs()
        if not paras or not args.query.strip():
            return DocSearchOut(hits=[])
        q, *vecs = emb.embed([args.query] + [p for _, p in paras])
        scored = []
        for (rel, para), v in zip(paras, vecs, strict=True):
            score = sum(a * b for a, b in zip(q, v, strict=False))
            if score > 0:
                scored.append(DocHit(path=rel, score=round(score, 6), snippet=para[:400]))
        scored.sort(key=lambda h: (-h.score, h.path))
        return DocSearchOut(hits=scored[: max(0, min(args.k, 20))])

    return Tool.define(
        name,
        search,
        DocSearchIn,
        DocSearchOut,
        description=f"Search the local documents in {root.name or root} by meaning.",
        timeout_s=timeout_s,
        max_result_bytes=max_result_bytes,
    )


# --- built-in: HTTP fetch restricted to an allow-list --------------------------


class FetchIn(msgspec.Struct, frozen=True, kw_only=True):
    url: str


class FetchOut(msgspec.Struct, frozen=True, kw_only=True):
    url: str
    status: int
    content_type: str = ""
    text: str = ""
    location: str = ""  # a redirect's target; redirects are never followed


def http_fetch_tool(
    allow_hosts: Sequence[str],
    name: str = "http_fetch",
    timeout_s: float = 10.0,
    max_result_bytes: int = 64 * 1024,
) -> Tool:
    """GET a URL whose host is on ``allow_hosts`` (``"example.org"`` or ``"127.0.0.1:8080"``).

    Any other host, or a scheme other than http/https, is ``AccessDenied``.
    Redirects are returned, not followed (the target may not be allowed).
    A body longer than ``max_result_bytes`` is not even read to the end:
    ``ToolResultTooLarge``. Proxy settings from the environment are ignored.
    """
    allowed = {h.lower() for h in allow_hosts}

    async def fetch(args: FetchIn) -> FetchOut:
        import httpx  # optional dependency: only this tool needs it

        parts = urlsplit(args.url)
        host = (parts.hostname or "").lower()
        try:
            port = parts.port
        except ValueError as e:
            raise ToolInputInvalid(f"{name}: bad port in {args.url!r}") from e
        if parts.scheme not in ("http", "https") or not host:
            raise AccessDenied(f"{name}: only http(s) URLs with a host are allowed: {args.url!r}")
        if host not in allowed and f"{host}:{port}" not in allowed:
            raise AccessDenied(f"{name}: host {host!r} is not on the allow-list")
        async with (
            httpx.AsyncClient(follow_redirects=False, trust_env=False, timeout=timeout_s) as client,
            client.stream("GET", args.url) as resp,
        ):
            body = bytearray()
            async for chunk in resp.aiter_bytes():
                body += chunk
                if len(body) > max_result_bytes:
                    raise ToolResultTooLarge(
                        f"{name}: body over the limit of {max_result_bytes} bytes",
                        len(body),
                        max_result_bytes,
                    )
            return FetchOut(
                url=args.url,
                status=resp.status_code,
                content_type=resp.headers.get("content-type", ""),
                text=body.decode(resp.encoding or "utf-8", "replace"),
                location=resp.headers.get("location", ""),
            )

    return Tool.define(
        name,
        fetch,
        FetchIn,
        FetchOut,
        description="HTTP GET of a URL on the allow-list: " + ", ".join(sorted(allowed)),
        timeout_s=timeout_s,
        max_result_bytes=max_result_bytes + 1024,  # the body limit plus the envelope fields
    )
