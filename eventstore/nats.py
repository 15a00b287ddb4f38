"""NATS JetStream ``EventStore``: the distributed backend.

Same contract as the SQLite and in-memory backends (``store.py``); open it with
``await NatsEventStore.connect("nats://host:4222", ...)`` or
``open_store("nats://...")``.

Subjects
--------
Every event is one message in the JetStream stream ``CARDBUS_EVENTS`` (the
name and the ``cardbus.evt`` prefix are options), on the subject::

    cardbus.evt.<task>.<root>.<kind>

* ``<task>`` is the cardbus stream name (the task id),
* ``<root>`` is the event's ``correlation_id`` (its root task),
* ``<kind>`` is the event's type tag with ``.`` replaced by ``_``
  (``task.dispatched.v1`` -> ``task_dispatched_v1``), for humans and for
  subscribers that filter by kind; the type itself is read from the body.

Ids may contain characters that cannot appear in a subject token (``.``,
``*``, ``>``, spaces, anything non-ASCII), so ``<root>`` and ``<task>`` are
encoded reversibly by :func:`encode_token`: ``A-Z a-z 0-9 -`` stay as they
are, every other byte of the UTF-8 form becomes ``_`` + two lowercase hex
digits (``r1.a`` -> ``r1_2ea``, ``_`` -> ``_5f``), and the empty string is
the lone token ``_``. UUIDs and ids like ``agent-x`` therefore read as
themselves. A subject longer than ``MAX_SUBJECT_LEN`` (3500 chars, so the
publish line fits the server's 4 KiB control line) is refused with
``ValidationError``: ASCII ids of any allowed length fit, a 512-char stream
name made only of 4-byte characters does not (unlike on SQLite).

Reads are subject filters: one stream is ``cardbus.evt.<task>.>`` (so a
stream stays one stream even if its events carry different correlation ids,
e.g. ``agent-<id>`` or ``memory``), one root task's tree is
``cardbus.evt.*.<root>.>``, the whole log ``cardbus.evt.>``.

The task comes first because nats-server finds the messages of a filter
through its index of subjects (a tree of subject tokens): a filter whose
variable part starts with a literal token (``cardbus.evt.<task>.>``) walks
only that task's subjects, while one starting with ``*`` walks every subject
of the stream. The per-append concurrency check and ``read_stream`` are
therefore independent of how much history the log holds;
``read_correlation`` (``*`` first) is the one read that walks the index, in
time linear in the number of tasks in the log (``bench/nats_log_growth_bench.py``:
about 0.4 ms on an empty file store, 1.5 ms after 5,000 runs of 3 tasks); it
runs once per finished run in ``NatsRuntime.run`` (long-term memory).

Layout marker: the store creates the stream with the metadata
``cardbus.subject-layout: task.root.kind``. Before that marker existed the
layout was ``cardbus.evt.<root>.<task>.<kind>``; connecting to a stream
that holds events and has no marker (or another one) raises
:class:`SubjectLayoutError` and changes nothing, rather than misreading it
(there is no in-place migration: JetStream cannot rename stored subjects;
start on a new stream). An empty stream without the marker is marked and used.

What is stored
--------------
The message payload is exactly the envelope *body* (``envelope.seal`` via
``batch.seal_batch``: the envelope without position and hash, with
``prev_hash`` inside). The body's sha256 travels in the header
``Cardbus-Hash``; the position is the JetStream stream sequence. ``verify``
recomputes every hash and chain link from the stored bodies.

Appends
-------
* Per-task optimistic concurrency: the first message of an append carries
  ``Nats-Expected-Last-Subject-Sequence: <seq>`` with
  ``Nats-Expected-Last-Subject-Sequence-Subject: cardbus.evt.<task>.>``,
  where ``<seq>`` is the stream sequence of the task's last event (0 for a
  new task). The store keeps the (version, sequence, hash) of each task's
  last event it has seen in a small cache and looks it up from the stream
  leader (``STREAM.MSG.GET last_by_subj``) when the cache does not match the
  caller's expected version. The server is the judge: a stale cache only
  costs a rejected publish. A "wrong last sequence" (10071) from the server
  becomes ``ConcurrencyError(stream, expected, actual)`` with the actual
  version looked up.
* Atomic multi-event appends use JetStream atomic batch publish (nats-server
  2.12+, ADR-50; the stream is created with ``allow_atomic``): messages carry
  ``Nats-Batch-Id`` / ``Nats-Batch-Sequence`` and the last one
  ``Nats-Batch-Commit: 1``. Only the commit is a request; the other messages
  are published without waiting for anything (pipelined in one flush), and
  the server checks the expected sequence against the stream as it was
  before the batch, under its lock, and stores all or nothing. A batch holds
  at most ``max_batch`` (1000, the server's limit) events; longer appends are
  refused with ``ValidationError``. Group commit: the multi-event appends
  that wait while a batch is in flight go out together as the next batch
  (never two appends to one task in one batch, each with its own expected
  sequence on its first message; the server checks each against the stream
  as it was before the batch); if the server refuses such a shared batch,
  each append is sent again alone and gets its own answer. On a server without atomic batches
  (< 2.12) multi-event appends fall back to one publish per event, each
  expecting the sequence of the one before: every event is still checked,
  but an append interrupted half way leaves its first events stored (not
  atomic); ``atomic`` is then ``False`` on the store.
* Idempotency: ``Nats-Msg-Id`` = event id, and the stream's duplicate window
  (24 h by default). A duplicate single publish is acked with the original's
  sequence, which we read back; a batch containing a stored id is refused by
  the server (10201) and, like any version mismatch, sends us to read the
  task's events and return the originals (``batch.check_replay``). Beyond the
  duplicate window, a retry with a stale expected version is still caught by
  that read; only a re-append of old ids whose expected version happens to
  equal the stream's current version would be stored again.
* Transient failures (a timeout waiting for an ack, a reconnect, a stream
  leader election) are retried with backoff for ``retry_timeout`` seconds,
  appends included: a first try that was stored after all is found again by
  its event ids and returned, as for any retry. After that the call raises
  ``StoreUnavailable``, and the append may or may not have been stored;
  retrying it with the same events is still safe.

Reading and following
---------------------
``read_stream``, ``read_correlation``, ``read_all`` and ``verify`` read the
subject filter with JetStream *direct get* batches (``$JS.API.DIRECT.GET``,
nats-server 2.11+, the stream is created with ``allow_direct``): up to 1000
messages an answer, no consumer to create, no JetStream API request. On a
replicated stream the read first asks the stream leader for the sequence of
the last matching message and goes on until it has come (a replica may
answer a few ms behind the leader), so a read sees every append acknowledged
before it began, on one server or a cluster. Where direct get is not
available (an older server, a stream without ``allow_direct``, a user not
allowed to use it) a read creates an ephemeral pull consumer (AckNone,
memory, R1) on the filter instead, pulls it to that sequence and deletes it.
``subscribe`` is a consumer of that kind kept
open with long-poll pulls and idle heartbeats: catch-up then live, in stream
sequence order. It tracks the consumer sequence; on a gap, a missing
heartbeat, a deleted consumer or a reconnect it recreates the consumer from
the position after the last event it yielded, so there is no gap and no
duplicate.

Costs and limits
----------------
On a file-backed R1 stream the server syncs the disk on every atomic batch
commit (a few ms each, serialised per stream), so multi-event appends share
one fsync per batch (group commit) while a single-event append costs none
(JetStream's default ``sync_interval``). On a replicated stream (R3) the commit goes through Raft
instead. Each read is one direct get round trip per 1000 events (plus
one request to the leader on a replicated stream), so ``read_stream`` in a
hot loop costs more than on SQLite; use ``subscribe`` to follow the log.
``read_correlation`` also walks the server's subject index (see Subjects).
On a *memory* stream nats-server finds the messages of any filter with a
wildcard by a linear scan from the first sequence once the stream has more
than 256 subjects, so there every read grows with the log (both layouts).
An append to a new stream (expected version 0) publishes at once, expecting
no earlier message on the task's subject; an append the store has no cached
head for looks the head up first (one request). Dedup ids are held by the
server for the duplicate window: lower it for very high write rates.

Permissions
-----------
A connection that uses the store needs: publish to ``cardbus.evt.>`` (with
replies; to scope a writer to some tasks, ``cardbus.evt.<task>.>`` now is a
prefix); publish to ``$JS.API.STREAM.INFO.<stream>``,
``$JS.API.STREAM.MSG.GET.<stream>``, ``$JS.API.DIRECT.GET.<stream>`` (without it
reads fall back to consumers), ``$JS.API.CONSUMER.CREATE.<stream>``,
``$JS.API.CONSUMER.MSG.NEXT.<stream>.*`` and
``$JS.API.CONSUMER.DELETE.<stream>.*`` (plus ``$JS.API.STREAM.CREATE.<stream>``
and ``$JS.API.STREAM.UPDATE.<stream>`` where it creates the stream); and
subscribe to its own inbox prefix (``_INBOX.>`` or ``inbox_prefix``).

Errors from nats-py are translated here to ``eventstore.errors``
(``StoreUnavailable``, ``ConcurrencyError``, ``IdempotencyError``,
``PayloadTooLarge``, ``StoreError``) with ``raise ... from e``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import re
import ssl
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple, TypeVar

import msgspec
import nats
import nats.errors
import nats.js.errors
from nats.aio.client import Client as NatsClient
from nats.aio.msg import Msg
from nats.js import JetStreamContext
from nats.js import api as js_api

from cardbus.eventstore.batch import check_append_args, check_replay, seal_batch
from cardbus.eventstore.envelope import (
    DEFAULT_MAX_EVENT_BYTES,
    GENESIS_HASH,
    ChainProblem,
    Envelope,
    NewEvent,
    decode_body,
    verify_chain,
)
from cardbus.eventstore.errors import (
    CardbusError,
    ConcurrencyError,
    DecodeError,
    IdempotencyError,
    PayloadTooLarge,
    StoreError,
    StoreUnavailable,
    SubjectLayoutError,
    ValidationError,
)
from cardbus.eventstore.store import EventStore

__all__ = [
    "DEFAULT_STREAM",
    "DEFAULT_SUBJECT_PREFIX",
    "HASH_HEADER",
    "MAX_SUBJECT_LEN",
    "NatsEventStore",
    "SUBJECT_LAYOUT",
    "SUBJECT_LAYOUT_KEY",
    "SubjectLayoutError",
    "decode_token",
    "encode_token",
    "event_subject",
    "kind_token",
]

log = logging.getLogger(__name__)
_T = TypeVar("_T")

DEFAULT_STREAM = "CARDBUS_EVENTS"
DEFAULT_SUBJECT_PREFIX = "cardbus.evt"
HASH_HEADER = "Cardbus-Hash"
MAX_SUBJECT_LEN = 3500  # a publish line must fit nats-server's max_control_line (4 KiB)
# The stream's metadata names the order of the subject tokens its events were written with.
SUBJECT_LAYOUT_KEY = "cardbus.subject-layout"
SUBJECT_LAYOUT = "task.root.kind"
_OLD_LAYOUT = (
    "root.task.kind"  # the layout before the marker existed: <prefix>.<root>.<task>.<kind>
)

# JetStream API error codes we act on.
_ERR_WRONG_LAST_SEQUENCE = 10071
_ERR_NO_MESSAGE_FOUND = 10037
_ERR_STREAM_NOT_FOUND = 10059
_ERR_BATCH_DUPLICATE_MSG_ID = 10201
_ERR_BATCH_TOO_MANY_INFLIGHT = 10210

_H_MSG_ID = "Nats-Msg-Id"
_H_EXPECTED_SEQ = "Nats-Expected-Last-Subject-Sequence"
_H_EXPECTED_SUBJECT = "Nats-Expected-Last-Subject-Sequence-Subject"
_H_BATCH_ID = "Nats-Batch-Id"
_H_BATCH_SEQ = "Nats-Batch-Sequence"
_H_BATCH_COMMIT = "Nats-Batch-Commit"

_SAFE = re.compile(r"[A-Za-z0-9-]+")
_ESCAPED = re.compile(r"_([0-9a-f]{2})")
_KIND_UNSAFE = re.compile(r"[^A-Za-z0-9_-]")

_NATS_ERRORS: tuple[type[BaseException], ...] = (
    nats.errors.Error,
    nats.js.errors.Error,
    OSError,
    asyncio.TimeoutError,
)
_CONNECT_ERRORS: tuple[type[BaseException], ...] = (*_NATS_ERRORS, ssl.SSLError)


# -- subjects ------------------------------------------------------------------


def encode_token(value: str) -> str:
    """A reversible, subject-safe form of an id: one NATS subject token."""
    if not value:
        return "_"
    if _SAFE.fullmatch(value):
        return value
    out: list[str] = []
    for ch in value:
        if ch.isascii() and (ch.isalnum() or ch == "-"):
            out.append(ch)
        else:
            out.extend(f"_{b:02x}" for b in ch.encode("utf-8", "surrogatepass"))
    return "".join(out)


def decode_token(token: str) -> str:
    """Inverse of :func:`encode_token`."""
    if token == "_":
        return ""
    if "_" not in token:
        return token
    raw = bytearray()
    i = 0
    while i < len(token):
        m = _ESCAPED.match(token, i)
        if m:
            raw.append(int(m.group(1), 16))
            i = m.end()
        else:
            raw.extend(token[i].encode())
            i += 1
    return raw.decode("utf-8", "surrogatepass")


def kind_token(tag: str) -> str:
    """``task.dispatched.v1`` -> ``task_dispatched_v1`` (not reversible; the body has the tag)."""
    return _KIND_UNSAFE.sub("-", tag.replace(".", "_")) or "_"


def event_subject(prefix: str, root: str, stream: str, tag: str) -> str:
    """``<prefix>.<task>.<root>.<kind>`` for one event (the task first: see the module doc)."""
    return f"{prefix}.{encode_token(stream)}.{encode_token(root)}.{kind_token(tag)}"


def _checked(subject: str) -> str:
    if len(subject) > MAX_SUBJECT_LEN:
        raise ValidationError(
            f"subject of {len(subject)} chars is over {MAX_SUBJECT_LEN}: ids too long for NATS"
        )
    return subject


@dataclass(frozen=True)
class _Head:
    """A task's last event: its version, stream sequence and hash."""

    version: int
    seq: int
    hash: str


_EMPTY_HEAD = _Head(0, 0, GENESIS_HASH)


class _Stored(NamedTuple):
    """One stored message as a read returns it."""

    seq: int
    subject: str
    data: bytes
    hash: str


def _stored_of(msg: Msg) -> _Stored:
    """A message a consumer delivered (its stream sequence is in the reply subject)."""
    return _Stored(
        msg.metadata.sequence.stream,
        msg.subject,
        msg.data,
        (msg.headers or {}).get(HASH_HEADER, ""),
    )


class _DirectCall:
    """One direct-get batch request in flight: the messages so far, then the end."""

    __slots__ = ("done", "msgs")

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.msgs: list[_Stored] = []
        self.done: asyncio.Future[int] = loop.create_future()  # -> messages still pending


class _PubAck(msgspec.Struct):
    """The fields of a JetStream publish ack we use (decoded in one go, unknown ones skipped)."""

    seq: int = 0
    duplicate: bool = False
    error: dict[str, Any] | None = None


_decode_ack = msgspec.json.Decoder(_PubAck).decode


class _Part:
    """A multi-event append waiting for a batch (group commit)."""

    __slots__ = ("done", "filt", "head", "sealed", "stream", "subjects")

    def __init__(
        self,
        stream: str,
        filt: str,
        head: _Head,
        sealed: list[tuple[Envelope, bytes]],
        subjects: list[str],
        loop: asyncio.AbstractEventLoop,
    ) -> None:
        self.stream = stream
        self.filt = filt
        self.head = head
        self.sealed = sealed
        self.subjects = subjects
        self.done: asyncio.Future[int] = loop.create_future()  # -> its first position


class _Regroup(Exception):
    """The batch this append was part of was refused as a whole: send it alone."""


class _Transient(StoreUnavailable):
    """A timeout, a missing responder or a leader election: worth retrying for a while."""


class _ReaderBroken(Exception):
    """The consumer behind a reader is gone or lost messages: recreate it."""


_FOLLOW_ERRORS: tuple[type[BaseException], ...] = (_ReaderBroken, *_NATS_ERRORS)


# -- the store -----------------------------------------------------------------


class NatsEventStore(EventStore):
    """Open with ``await NatsEventStore.connect(url, ...)``; close with ``await store.close()``."""

    def __init__(
        self,
        nc: NatsClient,
        *,
        stream_name: str = DEFAULT_STREAM,
        subject_prefix: str = DEFAULT_SUBJECT_PREFIX,
        max_event_bytes: int = DEFAULT_MAX_EVENT_BYTES,
        request_timeout: float = 5.0,
        atomic: bool = True,
        max_batch: int = 1000,
        owns_connection: bool = True,
        read_batch: int = 256,
        heartbeat: float = 1.0,
        retry_timeout: float = 15.0,
    ) -> None:
        self.nc = nc
        self.stream_name = stream_name
        self.subject_prefix = subject_prefix
        self.max_event_bytes = max_event_bytes
        self.request_timeout = request_timeout
        self.atomic = atomic
        self.max_batch = max_batch
        self.read_batch = read_batch
        self.heartbeat = heartbeat
        self.retry_timeout = retry_timeout
        self._js: JetStreamContext = nc.jetstream(timeout=request_timeout)
        self._owns_connection = owns_connection
        self._heads: dict[str, _Head] = {}
        self._closed = False
        self._readers: set[_Reader] = set()
        # Bounded reads go through the stream's direct get (batch, nats-server 2.11+) when
        # the stream allows it (see _setup_direct_reads); else through a short-lived consumer.
        self._direct_reads = False
        self._waiting: list[_Part] = []  # multi-event appends waiting for the next batch
        self._committer: asyncio.Future[None] | None = None
        self._replicas = 1
        self._direct_sub: Any = None
        self._direct_prefix = ""
        self._direct_calls: dict[str, _DirectCall] = {}
        self._direct_next = 0

    # -- opening ---------------------------------------------------------------

    @classmethod
    async def connect(
        cls,
        url: str | Sequence[str] = "nats://127.0.0.1:4222",
        *,
        stream_name: str = DEFAULT_STREAM,
        subject_prefix: str = DEFAULT_SUBJECT_PREFIX,
        create_stream: bool = True,
        replicas: int = 1,
        storage: str = "file",
        duplicate_window: float = 24 * 3600.0,
        deny_delete: bool = True,
        atomic: bool | None = None,
        max_event_bytes: int = DEFAULT_MAX_EVENT_BYTES,
        request_timeout: float = 5.0,
        retry_timeout: float = 15.0,
        token: str | None = None,
        user: str | None = None,
        password: str | None = None,
        nkeys_seed: str | None = None,
        user_credentials: str | None = None,
        tls_ca: str | None = None,
        tls_cert: str | None = None,
        tls_key: str | None = None,
        tls_hostname: str | None = None,
        connect_timeout: float = 5.0,
        max_reconnect_attempts: int = -1,
        reconnect_time_wait: float = 0.25,
        reconnect_max_wait: float = 5.0,
        name: str = "cardbus-eventstore",
        **nats_options: Any,
    ) -> NatsEventStore:
        """Connect, make sure the JetStream stream exists, and return the store.

        ``url`` is one URL, a comma-separated list or a sequence of URLs (a
        cluster). Authentication: ``token``, ``user``/``password``,
        ``nkeys_seed`` (path of an nkey seed file) or ``user_credentials``
        (a ``.creds`` file). TLS: ``tls_ca`` (CA bundle), ``tls_cert`` and
        ``tls_key`` (client certificate), or a ``tls://`` URL for the system
        CAs. Reconnects retry forever by default with exponential backoff from
        ``reconnect_time_wait`` up to ``reconnect_max_wait`` seconds, with
        jitter. The stream is created when missing (``create_stream``) with
        ``replicas``, ``storage`` (``file``/``memory``), ``duplicate_window``
        (seconds) and, unless ``deny_delete=False``, with deletes and purges
        denied. Each request waits ``request_timeout`` seconds; transient
        failures (a reconnect, a stream leader election) are retried with
        backoff for ``retry_timeout`` seconds before ``StoreUnavailable``.
        ``atomic=None`` uses atomic batches when the server has them.
        Any other keyword goes to ``nats.connect``.
        """
        servers = _server_list(url)
        options: dict[str, Any] = {
            "servers": servers,
            "name": name,
            "connect_timeout": connect_timeout,
            "max_reconnect_attempts": max_reconnect_attempts,
            "reconnect_time_wait": reconnect_time_wait,
            "reconnect_to_server_handler": _backoff_handler(
                reconnect_time_wait, reconnect_max_wait
            ),
            "error_cb": _log_error,
        }
        if token is not None:
            options["token"] = token
        if user is not None:
            options["user"] = user
        if password is not None:
            options["password"] = password
        if nkeys_seed is not None:
            options["nkeys_seed"] = nkeys_seed
        if user_credentials is not None:
            options["user_credentials"] = user_credentials
        tls = _tls_context(tls_ca, tls_cert, tls_key)
        if tls is not None:
            options["tls"] = tls
        if tls_hostname is not None:
            options["tls_hostname"] = tls_hostname
        options.update(nats_options)
        # nats-py retries a failing first connect forever; we give it ``connect_timeout``
        # in all, and report the last error it saw (refused, authorization, TLS...).
        last_error: list[Exception] = []

        connecting = True

        async def on_error(e: Exception) -> None:
            last_error[:] = [e]
            await _log_error(e)
            if connecting and _is_permanent(e):
                raise e  # a wrong credential or certificate does not get better: fail now

        options["error_cb"] = on_error
        options["connect_timeout"] = min(connect_timeout, 2.0)
        nc = NatsClient()
        try:
            await asyncio.wait_for(nc.connect(**options), connect_timeout)
        except ImportError as e:  # nats-py imports nkeys only for nkey seeds and .creds files
            raise StoreUnavailable(
                f"nkeys_seed/user_credentials need the 'nkeys' package (pip install nkeys): {e}"
            ) from e
        except _CONNECT_ERRORS as e:
            with contextlib.suppress(Exception):  # (close can hang on a failed TLS handshake)
                await asyncio.wait_for(nc.close(), 1.0)
            why = repr(last_error[0]) if last_error else repr(e)
            raise StoreUnavailable(f"cannot connect to NATS at {', '.join(servers)}: {why}") from e
        connecting = False
        try:
            store = cls(
                nc,
                stream_name=stream_name,
                subject_prefix=subject_prefix,
                max_event_bytes=max_event_bytes,
                request_timeout=request_timeout,
                retry_timeout=retry_timeout,
            )
            await store._ensure_stream(
                create=create_stream,
                replicas=replicas,
                storage=storage,
                duplicate_window=duplicate_window,
                deny_delete=deny_delete,
                atomic=atomic,
            )
        except BaseException:
            with contextlib.suppress(Exception):
                await nc.close()
            raise
        return store

    @classmethod
    async def from_connection(
        cls, nc: NatsClient, *, create_stream: bool = True, **options: Any
    ) -> NatsEventStore:
        """A store on an existing connection (shared with a bus); ``close`` leaves it open."""
        setup = {
            k: options.pop(k)
            for k in ("replicas", "storage", "duplicate_window", "deny_delete", "atomic")
            if k in options
        }
        store = cls(nc, owns_connection=False, **options)
        await store._ensure_stream(create=create_stream, **setup)
        return store

    async def _ensure_stream(
        self,
        *,
        create: bool = True,
        replicas: int = 1,
        storage: str = "file",
        duplicate_window: float = 24 * 3600.0,
        deny_delete: bool = True,
        atomic: bool | None = None,
    ) -> None:
        server_has_atomic = _version_at_least(self.nc.connected_server_version, 2, 12)
        want_atomic = server_has_atomic if atomic is None else (atomic and server_has_atomic)
        if atomic and not server_has_atomic:
            log.warning("nats-server < 2.12 has no atomic batch publish: appends are not atomic")
        try:
            try:
                info = await self._js.stream_info(self.stream_name)
            except nats.js.errors.NotFoundError:
                if not create:
                    raise StoreUnavailable(
                        f"JetStream stream {self.stream_name!r} does not exist"
                    ) from None
                config = js_api.StreamConfig(
                    name=self.stream_name,
                    description="cardbus event log",
                    subjects=[f"{self.subject_prefix}.>"],
                    retention=js_api.RetentionPolicy.LIMITS,
                    storage=js_api.StorageType(storage),
                    num_replicas=replicas,
                    duplicate_window=duplicate_window,
                    allow_direct=True,
                    deny_delete=deny_delete,
                    deny_purge=deny_delete,
                    allow_atomic=want_atomic or None,
                    metadata={SUBJECT_LAYOUT_KEY: SUBJECT_LAYOUT},
                )
                try:
                    info = await self._js.add_stream(config)
                except nats.js.errors.BadRequestError:
                    # Created concurrently by another process? Then it is there now.
                    info = await self._js.stream_info(self.stream_name)
            await self._check_layout(info)
            if want_atomic and not info.config.allow_atomic:
                try:
                    info.config.allow_atomic = True
                    info = await self._js.update_stream(info.config)
                except nats.js.errors.APIError as e:
                    log.warning("cannot enable atomic batches on %s: %s", self.stream_name, e)
            self.atomic = bool(info.config.allow_atomic)
            self._replicas = int(info.config.num_replicas or 1)
            if info.config.allow_direct and _version_at_least(
                self.nc.connected_server_version, 2, 11
            ):
                await self._setup_direct_reads()
            subjects = info.config.subjects or []
            if f"{self.subject_prefix}.>" not in subjects and ">" not in subjects:
                raise StoreError(
                    f"stream {self.stream_name!r} does not capture {self.subject_prefix}.>"
                    f" (its subjects: {subjects})"
                )
        except CardbusError:
            raise
        except nats.js.errors.ServiceUnavailableError as e:
            raise StoreUnavailable(f"JetStream is not available: {e!r}") from e
        except _NATS_ERRORS as e:
            raise StoreUnavailable(f"cannot set up stream {self.stream_name!r}: {e!r}") from e

    async def _check_layout(self, info: js_api.StreamInfo) -> None:
        """Refuse a stream written in another subject layout (see the module doc)."""
        layout = (info.config.metadata or {}).get(SUBJECT_LAYOUT_KEY)
        if layout == SUBJECT_LAYOUT:
            return
        events = int(info.state.messages or 0) if info.state else 0
        if layout is None and events == 0:
            # An empty stream made outside cardbus (or by a version before the marker):
            # nothing to misread. Mark it so the next connect knows; without the right
            # to update the stream, go on unmarked.
            try:
                info.config.metadata = {
                    **(info.config.metadata or {}),
                    SUBJECT_LAYOUT_KEY: SUBJECT_LAYOUT,
                }
                await self._js.update_stream(info.config)
            except _NATS_ERRORS as e:
                log.warning("cannot mark %s with its subject layout: %r", self.stream_name, e)
            return
        found = layout or f"{_OLD_LAYOUT} (no {SUBJECT_LAYOUT_KEY!r} in its metadata)"
        raise SubjectLayoutError(
            f"JetStream stream {self.stream_name!r} holds {events} events in subject layout"
            f" {found}; this cardbus writes and reads {self.subject_prefix}.<task>.<root>.<kind>"
            f" (layout {SUBJECT_LAYOUT}) and would misread it. Use a new stream (another"
            f" server or store directory, or stream_name=) or, if its events really are in"
            f" layout {SUBJECT_LAYOUT}, set the stream's metadata"
            f" {SUBJECT_LAYOUT_KEY}={SUBJECT_LAYOUT}."
        )

    # -- subjects --------------------------------------------------------------

    def _stream_filter(self, stream: str) -> str:
        return _checked(f"{self.subject_prefix}.{encode_token(stream)}.>")

    def _correlation_filter(self, root: str) -> str:
        return _checked(f"{self.subject_prefix}.*.{encode_token(root)}.>")

    @property
    def _all_filter(self) -> str:
        return f"{self.subject_prefix}.>"

    def _stream_of_subject(self, subject: str) -> str:
        tokens = subject[len(self.subject_prefix) + 1 :].split(".")
        return decode_token(tokens[0]) if len(tokens) >= 2 else subject

    # -- writing ---------------------------------------------------------------

    async def _retry(self, op: Callable[[], Awaitable[_T]]) -> _T:
        """Run ``op``, retrying transient failures (reconnects, leader elections) with backoff
        for up to ``retry_timeout`` seconds; then they are ``StoreUnavailable``.

        Appends are safe to retry whole: a first try that was stored after all is found
        again by its event ids and returned, as for any retry.
        """
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.retry_timeout
        delay = 0.05
        while True:
            try:
                return await op()
            except _Transient as e:
                if self._closed or self.nc.is_closed or loop.time() + delay > deadline:
                    raise StoreUnavailable(str(e)) from (e.__cause__ or e)
                log.debug("retrying after %s", e)
                await asyncio.sleep(delay * (0.8 + random.random() * 0.4))
                delay = min(delay * 2, 1.0)

    async def append(
        self, stream: str, events: Sequence[NewEvent], expected_version: int
    ) -> list[Envelope]:
        check_append_args(stream, events, expected_version)
        return await self._retry(lambda: self._append(stream, events, expected_version))

    async def _append(
        self, stream: str, events: Sequence[NewEvent], expected_version: int
    ) -> list[Envelope]:
        self._check_open()
        events = list(events)
        if len(events) > self.max_batch:
            raise ValidationError(
                f"{len(events)} events in one append: at most {self.max_batch} on NATS"
            )
        filt = self._stream_filter(stream)
        subjects = [
            _checked(event_subject(self.subject_prefix, e.correlation_id, stream, e.type))
            for e in events
        ]
        for attempt in range(8):
            head = self._heads.get(stream)
            if head is None and expected_version == 0 and attempt == 0:
                # A new stream (the caller says so): no lookup, the server checks it.
                head = _EMPTY_HEAD
            elif head is None or head.version != expected_version:
                head = await self._lookup_head(stream)
            if head.version != expected_version:
                return await self._replay_or_conflict(stream, events, expected_version, head)
            sealed = seal_batch(
                stream, events, expected_version, head.version, head.hash, self.max_event_bytes
            )
            try:
                if len(sealed) == 1:
                    return await self._publish_one(
                        stream, events, sealed[0], subjects[0], filt, head
                    )
                if self.atomic:
                    return await self._publish_batch(stream, sealed, subjects, filt, head)
                return await self._publish_sequential(stream, sealed, subjects, filt, head)
            except nats.js.errors.APIError as e:
                code = e.err_code
                if code == _ERR_WRONG_LAST_SEQUENCE:
                    self._heads.pop(stream, None)
                    actual = await self._lookup_head(stream)
                    if actual.version == expected_version and attempt < 7:
                        continue  # our cached head was stale, not the caller: try again
                    return await self._replay_or_conflict(
                        stream, events, expected_version, actual, cause=e
                    )
                if code == _ERR_BATCH_DUPLICATE_MSG_ID:
                    stored = await self._stored_copies(stream, events)
                    if not stored:
                        raise IdempotencyError(
                            "an event id of this append is already stored in another stream"
                        ) from e
                    check_replay(stored, events, stream)
                    return stored
                if code == _ERR_BATCH_TOO_MANY_INFLIGHT and attempt < 7:
                    await asyncio.sleep(0.01 * 2**attempt * (1 + random.random()))
                    continue
                if isinstance(e, nats.js.errors.ServiceUnavailableError) or (e.code or 0) >= 500:
                    raise _Transient(f"JetStream unavailable: {e!r}") from e
                raise StoreError(f"append to {stream!r} refused by JetStream: {e!r}") from e
            except nats.errors.MaxPayloadError as e:
                size = max(len(body) for _, body in sealed)
                raise PayloadTooLarge(size, self.nc.max_payload) from e
            except _NATS_ERRORS as e:
                raise _Transient(
                    f"append to {stream!r} not confirmed (it may or may not be stored;"
                    f" retrying it is safe): {e!r}"
                ) from e
        raise _Transient(f"append to {stream!r}: JetStream kept refusing, try again")

    def _headers(self, env: Envelope, first: bool, filt: str, head: _Head) -> dict[str, str]:
        h = {_H_MSG_ID: env.event_id, HASH_HEADER: env.hash}
        if first:
            h[_H_EXPECTED_SEQ] = str(head.seq)
            h[_H_EXPECTED_SUBJECT] = filt
        return h

    def _check_size(self, body: bytes, headers: dict[str, str], subject: str) -> None:
        overhead = 12 + sum(len(k) + len(v) + 4 for k, v in headers.items())
        limit = self.nc.max_payload
        if len(body) + overhead > limit:
            raise PayloadTooLarge(len(body), max(limit - overhead, 0))

    async def _request(self, subject: str, body: bytes, headers: dict[str, str]) -> _PubAck:
        try:
            msg = await self.nc.request(
                subject, body, timeout=self.request_timeout, headers=headers
            )
        except nats.errors.NoRespondersError as e:
            raise _Transient(f"no JetStream stream answers on {subject!r}") from e
        try:
            ack = _decode_ack(msg.data)
        except msgspec.DecodeError as e:
            raise _Transient(f"not a JetStream ack on {subject!r}: {msg.data[:100]!r}") from e
        if ack.error is not None:
            raise nats.js.errors.APIError.from_error(ack.error)
        return ack

    async def _publish_one(
        self,
        stream: str,
        events: list[NewEvent],
        sealed: tuple[Envelope, bytes],
        subject: str,
        filt: str,
        head: _Head,
    ) -> list[Envelope]:
        env, body = sealed
        headers = self._headers(env, True, filt, head)
        self._check_size(body, headers, subject)
        ack = await self._request(subject, body, headers)
        if ack.duplicate:  # stored before (a retry): hand back the original
            original = await self._get_by_seq(ack.seq)
            check_replay([original], events, stream)
            return [original]
        placed = msgspec.structs.replace(env, position=ack.seq)
        self._remember(stream, _Head(env.version, ack.seq, env.hash))
        return [placed]

    async def _publish_batch(
        self,
        stream: str,
        sealed: list[tuple[Envelope, bytes]],
        subjects: list[str],
        filt: str,
        head: _Head,
    ) -> list[Envelope]:
        """A multi-event append as (part of) one atomic batch: see :meth:`_commit_groups`."""
        part = _Part(stream, filt, head, sealed, subjects, asyncio.get_running_loop())
        for (_, body), subject, h in zip(
            sealed, subjects, self._batch_headers([part]), strict=True
        ):
            self._check_size(body, h, subject)
        self._waiting.append(part)
        if self._committer is None:
            self._committer = asyncio.ensure_future(self._commit_groups())
        try:
            first = await part.done
        except _Regroup:  # the group it was in was refused: this part alone says why
            ack = await self._send_group([part])
            first = ack.seq - len(sealed) + 1
        out = [
            msgspec.structs.replace(env, position=first + i) for i, (env, _) in enumerate(sealed)
        ]
        last = out[-1]
        self._remember(stream, _Head(last.version, last.position, last.hash))
        return out

    async def _commit_groups(self) -> None:
        """Group commit: the multi-event appends waiting while a batch is in flight go out
        together as the next atomic batch, at most one part per task stream and at most
        ``max_batch`` messages.

        Each part keeps its own expected-sequence check on its task's subjects, and
        the batch is stored whole or not at all, so each append still is. A file-backed
        stream syncs the disk once per batch, so this is one sync for many appends.
        If the server refuses a group of several parts (one part's check or duplicate
        id), each part is sent again alone and gets its own answer.
        """
        try:
            while self._waiting:
                group: list[_Part] = []
                rest: list[_Part] = []
                streams: set[str] = set()
                size = 0
                for part in self._waiting:
                    if part.done.done():
                        continue  # its caller gave up (cancelled) before it was sent
                    if part.stream in streams or (
                        group and size + len(part.sealed) > self.max_batch
                    ):
                        rest.append(part)  # two appends to one task never share a batch
                        continue
                    group.append(part)
                    streams.add(part.stream)
                    size += len(part.sealed)
                self._waiting = rest
                if not group:
                    continue
                try:
                    ack = await self._send_group(group)
                except BaseException as e:
                    refused = isinstance(e, nats.js.errors.APIError | nats.errors.MaxPayloadError)
                    for part in group:
                        if part.done.done():
                            continue
                        if len(group) > 1 and refused:
                            part.done.set_exception(_Regroup())
                        elif isinstance(e, Exception):
                            part.done.set_exception(e)
                        else:  # this task is cancelled (the loop is ending)
                            part.done.set_exception(StoreUnavailable("append interrupted"))
                    if not isinstance(e, Exception):
                        raise
                    continue
                first = ack.seq - size + 1
                for part in group:
                    if not part.done.done():
                        part.done.set_result(first)
                    first += len(part.sealed)
        finally:
            self._committer = None
            if self._closed:
                for part in self._waiting:
                    if not part.done.done():
                        part.done.set_exception(StoreUnavailable("the event store is closed"))
                self._waiting = []

    def _batch_headers(self, group: list[_Part]) -> list[dict[str, str]]:
        batch_id = uuid.uuid4().hex
        out: list[dict[str, str]] = []
        for part in group:
            for i, (env, _) in enumerate(part.sealed):
                h = self._headers(env, i == 0, part.filt, part.head)
                h[_H_BATCH_ID] = batch_id
                h[_H_BATCH_SEQ] = str(len(out) + 1)
                out.append(h)
        out[-1][_H_BATCH_COMMIT] = "1"
        return out

    async def _send_group(self, group: list[_Part]) -> _PubAck:
        """Publish the parts as one atomic batch; the commit's ack."""
        headers = self._batch_headers(group)
        messages = [
            (subject, body)
            for part in group
            for (_, body), subject in zip(part.sealed, part.subjects, strict=True)
        ]
        # Pipelined: nothing is awaited but the commit's ack; one flush sends them all.
        for (subject, body), h in zip(messages[:-1], headers, strict=False):
            await self.nc.publish(subject, body, headers=h)
        subject, body = messages[-1]
        return await self._request(subject, body, headers[-1])

    async def _publish_sequential(
        self,
        stream: str,
        sealed: list[tuple[Envelope, bytes]],
        subjects: list[str],
        filt: str,
        head: _Head,
    ) -> list[Envelope]:
        """Fallback without atomic batches: each event expects the one before (not atomic)."""
        out: list[Envelope] = []
        seq = head.seq
        for (env, body), subject in zip(sealed, subjects, strict=True):
            h = self._headers(env, True, filt, _Head(0, seq, ""))
            self._check_size(body, h, subject)
            ack = await self._request(subject, body, h)
            if ack.duplicate:
                raise IdempotencyError(f"event id {env.event_id} is already stored")
            seq = ack.seq
            out.append(msgspec.structs.replace(env, position=seq))
            self._remember(stream, _Head(env.version, seq, env.hash))
        return out

    async def _replay_or_conflict(
        self,
        stream: str,
        events: list[NewEvent],
        expected_version: int,
        actual: _Head,
        cause: BaseException | None = None,
    ) -> list[Envelope]:
        """A version mismatch: a retry of stored events returns them, anything else conflicts."""
        if actual.version > 0:
            stored = await self._stored_copies(stream, events)
            if stored:
                check_replay(stored, events, stream)
                return stored
        raise ConcurrencyError(stream, expected_version, actual.version) from cause

    async def _stored_copies(self, stream: str, events: list[NewEvent]) -> list[Envelope]:
        """The stored envelopes of this stream carrying any of the events' ids, in order."""
        ids = {e.event_id for e in events}
        envs = map(self._envelope, await self._read(self._stream_filter(stream)))
        found = {env.event_id: env for env in envs if env.event_id in ids}
        return [found[e.event_id] for e in events if e.event_id in found]

    def _remember(self, stream: str, head: _Head) -> None:
        old = self._heads.get(stream)
        if old is None or head.version >= old.version:
            if len(self._heads) >= 100_000:
                self._heads.clear()
            self._heads[stream] = head

    async def _lookup_head(self, stream: str) -> _Head:
        """The task's last event, read from the stream leader."""
        try:
            raw = await self._js.get_msg(self.stream_name, subject=self._stream_filter(stream))
        except nats.js.errors.NotFoundError as e:
            if e.err_code == _ERR_STREAM_NOT_FOUND:
                raise StoreUnavailable(f"stream {self.stream_name!r} is gone") from e
            self._heads.pop(stream, None)
            return _EMPTY_HEAD
        except _NATS_ERRORS as e:
            raise _Transient(f"cannot read the head of {stream!r}: {e!r}") from e
        body = raw.data or b""
        env = decode_body(body, max_bytes=1 << 62)
        stored_hash = (raw.headers or {}).get(HASH_HEADER, "")
        head = _Head(env.version, raw.seq or 0, stored_hash)
        self._remember(stream, head)
        return head

    async def _get_by_seq(self, seq: int) -> Envelope:
        try:
            raw = await self._js.get_msg(self.stream_name, seq=seq)
        except _NATS_ERRORS as e:
            raise _Transient(f"cannot read position {seq}: {e!r}") from e
        return decode_body(
            raw.data or b"",
            position=seq,
            hash=(raw.headers or {}).get(HASH_HEADER, ""),
            max_bytes=1 << 62,
        )

    # -- reading ---------------------------------------------------------------

    def _envelope(self, msg: _Stored) -> Envelope:
        seq = msg.seq
        try:
            return decode_body(msg.data, position=seq, hash=msg.hash, max_bytes=1 << 62)
        except DecodeError as e:
            # Name the message: a poison message on the log is found, never skipped silently.
            where = f"position {seq} ({msg.subject})"
            if type(e) is DecodeError:
                raise DecodeError(f"event at {where}: {e}") from e
            e.add_note(f"at {where}")
            raise

    async def _read(self, filt: str, start: int = 1, limit: int | None = None) -> list[_Stored]:
        """Messages matching ``filt`` from stream sequence ``start``: a consistent bounded read.

        On a replicated stream the leader first tells the sequence of the last
        matching message (``target``); the read, which may be served by a
        replica a few ms behind, goes on until it has that one, so every
        append acknowledged before the read began is in it (read-your-writes
        in a cluster too). An R1 stream has only its leader to answer.
        """
        self._check_open()
        if limit is not None and limit <= 0:
            return []
        if self._direct_reads and self._replicas == 1:
            target = 0  # the leader answers itself: nothing to wait for
        else:
            target = await self._last_seq(filt)
            if target < start:
                return []
        if self._direct_reads:
            return await self._read_direct(filt, start, limit, target)
        reader = _Reader(self, filt, start)
        try:
            await reader.open()
            out: list[_Stored] = []
            loop = asyncio.get_running_loop()
            deadline = loop.time() + self.request_timeout
            while limit is None or len(out) < limit:
                if out and out[-1].seq >= target:
                    break
                want = 1000 if limit is None else min(limit - len(out), 1000)
                got = await reader.pull_now(want)
                if got:
                    out.extend(map(_stored_of, got))
                    continue
                if loop.time() > deadline:  # the replica never caught up with the leader
                    raise _Transient(f"read of {filt!r}: consumer stuck before {target}")
                await asyncio.sleep(0.002)  # a replica behind the leader: it will catch up
            return out
        except _ReaderBroken as e:
            raise _Transient(f"read of {filt!r} interrupted: {e}") from e
        except _NATS_ERRORS as e:
            raise _Transient(f"cannot read {filt!r}: {e!r}") from e
        finally:
            await reader.close()

    async def _read_direct(
        self, filt: str, start: int, limit: int | None, target: int
    ) -> list[_Stored]:
        """The read through direct get batches of up to 1000 messages (no consumer).

        ``target`` (0: none) is the last sequence the leader had; without one
        the read ends when the server says nothing more matches.
        """
        out: list[_Stored] = []
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.request_timeout
        seq = start
        while limit is None or len(out) < limit:
            want = 1000 if limit is None else min(limit - len(out), 1000)
            request: dict[str, Any] = {"seq": seq, "next_by_subj": filt, "batch": want}
            if target:
                request["up_to_seq"] = target
            got, pending = await self._direct_batch(request)
            out.extend(got)
            if got:
                seq = got[-1].seq + 1
            if target:
                if seq > target:
                    break
                if not got:
                    if loop.time() > deadline:  # the replica never caught up with the leader
                        raise _Transient(f"read of {filt!r}: stuck before {target}")
                    await asyncio.sleep(0.002)  # a replica behind the leader: it will catch up
            elif not got or not pending:
                break
        return out

    async def _setup_direct_reads(self) -> None:
        """Use direct get for reads if this connection may (a probe read of one message)."""
        nc = self.nc
        if self._direct_sub is None:
            self._direct_prefix = nc.new_inbox()
            try:
                self._direct_sub = await nc.subscribe(
                    f"{self._direct_prefix}.*",
                    cb=self._on_direct,
                    pending_msgs_limit=1_000_000,
                    pending_bytes_limit=1 << 30,
                )
            except _NATS_ERRORS as e:
                log.debug("no direct reads: %r", e)
                return
        probe = {"seq": 1, "next_by_subj": self._all_filter, "batch": 1}
        try:
            await self._direct_batch(probe, timeout=min(self.request_timeout, 2.0))
        except _Transient as e:
            # e.g. a user whose permissions lack $JS.API.DIRECT.GET: consumers still work
            log.info("reading %s through consumers (no direct get: %s)", self.stream_name, e)
            return
        self._direct_reads = True

    async def _direct_batch(
        self, request: dict[str, Any], timeout: float | None = None
    ) -> tuple[list[_Stored], int]:
        """One direct get batch: the messages, and how many more match after them."""
        self._direct_next += 1
        token = str(self._direct_next)
        call = _DirectCall(asyncio.get_running_loop())
        self._direct_calls[token] = call
        try:
            await self.nc.publish(
                f"$JS.API.DIRECT.GET.{self.stream_name}",
                msgspec.json.encode(request),
                reply=f"{self._direct_prefix}.{token}",
            )
            pending = await asyncio.wait_for(call.done, timeout or self.request_timeout)
        except TimeoutError as e:
            raise _Transient(f"no answer to a direct read of {request.get('next_by_subj')}") from e
        except _NATS_ERRORS as e:
            raise _Transient(f"cannot read {request.get('next_by_subj')!r}: {e!r}") from e
        finally:
            del self._direct_calls[token]
        return call.msgs, pending

    async def _on_direct(self, msg: Msg) -> None:
        call = self._direct_calls.get(msg.subject[len(self._direct_prefix) + 1 :])
        if call is None or call.done.done():
            return  # a late answer to a read that gave up
        headers = msg.headers or {}
        status = headers.get("Status") if not msg.data else None
        if status is None:
            try:
                seq = int(headers["Nats-Sequence"])
            except (KeyError, ValueError):
                call.done.set_exception(_Transient(f"direct get without a sequence: {headers}"))
                return
            call.msgs.append(
                _Stored(
                    seq, headers.get("Nats-Subject", ""), msg.data, headers.get(HASH_HEADER, "")
                )
            )
        elif status == "204":  # end of the batch
            left = headers.get("Nats-Num-Pending", "0")
            call.done.set_result(int(left) if left.isdigit() else 0)
        elif status == "404":  # nothing (more) matches
            call.done.set_result(0)
        else:
            why = f"{status} {_description(msg)}"
            call.done.set_exception(_Transient(f"direct get refused: {why}"))

    async def _last_seq(self, filt: str) -> int:
        """Stream sequence of the last message matching ``filt`` (0 if none), from the leader."""
        try:
            raw = await self._js.get_msg(self.stream_name, subject=filt)
        except nats.js.errors.NotFoundError as e:
            if e.err_code == _ERR_STREAM_NOT_FOUND:
                raise StoreUnavailable(f"stream {self.stream_name!r} is gone") from e
            return 0
        except _NATS_ERRORS as e:
            raise _Transient(f"cannot read the end of {filt!r}: {e!r}") from e
        return int(raw.seq or 0)

    async def read_stream(self, stream: str, from_version: int = 1) -> list[Envelope]:
        if not isinstance(stream, str) or not stream:
            return []
        filt = self._stream_filter(stream)
        envs = [self._envelope(m) for m in await self._retry(lambda: self._read(filt))]
        return [e for e in envs if e.version >= from_version]

    async def read_all(self, from_position: int = 0, limit: int = 1000) -> list[Envelope]:
        msgs = await self._retry(lambda: self._read(self._all_filter, max(from_position, 1), limit))
        return [self._envelope(m) for m in msgs]

    async def read_correlation(self, correlation_id: str) -> list[Envelope]:
        if not isinstance(correlation_id, str):
            return []
        filt = self._correlation_filter(correlation_id)
        msgs = await self._retry(lambda: self._read(filt))
        return [e for e in map(self._envelope, msgs) if e.correlation_id == correlation_id]

    async def stream_version(self, stream: str) -> int:
        self._check_open()
        return (await self._retry(lambda: self._lookup_head(stream))).version

    async def last_position(self) -> int:
        self._check_open()
        return await self._retry(self._last_position)

    async def _last_position(self) -> int:
        try:
            info = await self._js.stream_info(self.stream_name)
        except _NATS_ERRORS as e:
            raise _Transient(f"cannot read stream info: {e!r}") from e
        return int(info.state.last_seq or 0) if info.state.messages else 0

    async def subscribe(self, from_position: int = 0) -> AsyncIterator[Envelope]:
        next_position = max(from_position, 1)
        failures = 0
        while True:
            self._check_open()
            reader = _Reader(self, self._all_filter, next_position)
            try:
                await reader.open()
                async for msg in reader.follow(self.read_batch, self.heartbeat):
                    failures = 0
                    stored = _stored_of(msg)
                    seq = stored.seq
                    if seq < next_position:
                        continue  # already yielded (defensive: consumers restart at next)
                    env = self._envelope(stored)
                    next_position = seq + 1
                    yield env
            except _FOLLOW_ERRORS as e:
                failures += 1
                log.debug("subscription consumer lost (%r); recreating at %d", e, next_position)
            finally:
                await reader.close()
            self._check_open()
            await asyncio.sleep(min(0.02 * 2 ** min(failures, 7), 2.0) * (1 + random.random() / 4))

    async def verify(self, stream: str | None = None) -> list[ChainProblem]:
        filt = self._all_filter if stream is None else self._stream_filter(stream)
        by_stream: dict[str, list[tuple[int, bytes, str]]] = {}
        for m in await self._retry(lambda: self._read(filt)):
            key = stream if stream is not None else self._stream_of_subject(m.subject)
            row = (m.seq, bytes(m.data), m.hash)
            by_stream.setdefault(key, []).append(row)
        problems: list[ChainProblem] = []
        for s, rows in by_stream.items():
            problems.extend(verify_chain(rows, s))
        return sorted(problems, key=lambda p: p.position)

    # -- lifecycle -------------------------------------------------------------

    def _check_open(self) -> None:
        if self._closed:
            raise StoreUnavailable("the event store is closed")
        if self.nc.is_closed:
            raise StoreUnavailable("the NATS connection is closed")

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        for reader in list(self._readers):
            await reader.close()
        for part in self._waiting:
            if not part.done.done():
                part.done.set_exception(StoreUnavailable("the event store is closed"))
        self._waiting = []
        for call in list(self._direct_calls.values()):
            if not call.done.done():
                call.done.set_exception(StoreUnavailable("the event store is closed"))
        if self._direct_sub is not None:
            with contextlib.suppress(Exception):
                await self._direct_sub.unsubscribe()
        if self._owns_connection:
            with contextlib.suppress(Exception):
                await self.nc.close()


class _Reader:
    """One ephemeral pull consumer (AckNone, memory, R1) on a subject filter."""

    def __init__(self, store: NatsEventStore, filt: str, start: int) -> None:
        self.store = store
        self.filt = filt
        self.start = max(start, 1)
        self.consumer: str | None = None
        self.sub: Any = None
        self.inbox = ""
        self.last_dseq = 0
        self.closed = False

    async def open(self) -> int:
        """Create the consumer; the number of messages it has to deliver now."""
        store = self.store
        nc = store.nc
        self.inbox = nc.new_inbox()
        store._readers.add(self)
        self.sub = await nc.subscribe(
            self.inbox, pending_msgs_limit=1_000_000, pending_bytes_limit=1 << 30
        )
        config = js_api.ConsumerConfig(
            deliver_policy=js_api.DeliverPolicy.BY_START_SEQUENCE,
            opt_start_seq=self.start,
            ack_policy=js_api.AckPolicy.NONE,
            filter_subject=self.filt,
            mem_storage=True,
            num_replicas=1,
            inactive_threshold=max(10.0, store.heartbeat * 10),
            max_waiting=4,
        )
        info = await store._js.add_consumer(store.stream_name, config)
        self.consumer = info.name
        return int(info.num_pending or 0)

    async def _next_request(self, batch: int, **extra: Any) -> None:
        if self.consumer is None:
            raise _ReaderBroken("no consumer")
        subject = f"$JS.API.CONSUMER.MSG.NEXT.{self.store.stream_name}.{self.consumer}"
        await self.store.nc.publish(
            subject, msgspec.json.encode({"batch": batch, **extra}), reply=self.inbox
        )

    async def _next(self, timeout: float) -> Msg:
        try:
            return await _next_msg(self.sub, timeout)
        except asyncio.CancelledError:
            if self.closed:  # the store closed this reader under us: not our task's cancel
                raise _ReaderBroken("reader closed") from None
            raise
        except nats.errors.ConnectionClosedError as e:
            raise _ReaderBroken("connection closed") from e

    def _check_data(self, msg: Msg) -> None:
        dseq = msg.metadata.sequence.consumer
        if self.last_dseq and dseq != self.last_dseq + 1:
            raise _ReaderBroken(f"consumer sequence gap: {self.last_dseq} -> {dseq}")
        self.last_dseq = dseq

    async def pull_now(self, batch: int) -> list[Msg]:
        """Whatever is available now, up to ``batch`` messages."""
        await self._next_request(batch, no_wait=True)
        out: list[Msg] = []
        timeout = self.store.request_timeout
        while len(out) < batch:
            try:
                msg = await self._next(timeout)
            except nats.errors.TimeoutError as e:
                raise _ReaderBroken("no answer to a pull request") from e
            status = _status(msg)
            if status is None:
                self._check_data(msg)
                out.append(msg)
            elif status == "100":
                continue
            elif status in ("404", "408"):
                break
            else:
                raise _ReaderBroken(f"pull refused: {status} {_description(msg)}")
        return out

    async def follow(self, batch: int, heartbeat: float) -> AsyncIterator[Msg]:
        """Every message, forever: long-poll pulls with idle heartbeats."""
        expires = max(heartbeat * 5, 1.0)
        while True:
            await self._next_request(
                batch,
                expires=int(expires * 1e9),
                idle_heartbeat=int(heartbeat * 1e9),
            )
            remaining = batch
            while remaining > 0:
                try:
                    msg = await self._next(heartbeat * 3)
                except nats.errors.TimeoutError as e:
                    raise _ReaderBroken("missed heartbeats") from e
                status = _status(msg)
                if status is None:
                    self._check_data(msg)
                    remaining -= 1
                    yield msg
                elif status == "100":
                    continue
                elif status in ("404", "408") or "Exceeded" in _description(msg):
                    break  # this pull request is over; the next one follows
                else:
                    raise _ReaderBroken(f"pull ended: {status} {_description(msg)}")

    async def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        self.store._readers.discard(self)
        nc = self.store.nc
        if self.sub is not None:
            # Wake a reader waiting in another task (store.close): it sees ``closed``.
            waiting = getattr(self.sub, "_pending_next_msgs_calls", None) or {}
            for call in list(waiting.values()):
                call.cancel()
            with contextlib.suppress(Exception):
                await self.sub.unsubscribe()
        if self.consumer is not None and not nc.is_closed:
            # Fire and forget: the consumer also expires by itself when inactive.
            with contextlib.suppress(Exception):
                await nc.publish(
                    f"$JS.API.CONSUMER.DELETE.{self.store.stream_name}.{self.consumer}", b""
                )


# -- helpers -------------------------------------------------------------------


async def _next_msg(sub: Any, timeout: float) -> Msg:
    """``sub.next_msg`` without its per-call task when a message is already queued."""
    queue = getattr(sub, "_pending_queue", None)
    if queue is not None and not sub._conn.is_closed:
        try:
            msg: Msg = queue.get_nowait()
        except asyncio.QueueEmpty:
            pass
        else:
            sub._pending_size -= len(msg.data)
            queue.task_done()
            return msg
    return await sub.next_msg(timeout=timeout)


def _status(msg: Msg) -> str | None:
    if msg.headers and not msg.data:
        return msg.headers.get("Status")
    return None


def _description(msg: Msg) -> str:
    return (msg.headers or {}).get("Description", "")


def _server_list(url: str | Sequence[str]) -> list[str]:
    urls = [u.strip() for u in url.split(",")] if isinstance(url, str) else list(url)
    urls = [u for u in urls if u]
    if not urls:
        raise ValidationError("no NATS server URL given")
    return urls


def _tls_context(ca: str | None, cert: str | None, key: str | None) -> ssl.SSLContext | None:
    if ca is None and cert is None:
        return None
    try:
        ctx = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cafile=ca)
        if cert is not None:
            ctx.load_cert_chain(cert, key)
    except (OSError, ssl.SSLError) as e:
        raise StoreUnavailable(f"cannot load TLS files: {e}") from e
    return ctx


def _backoff_handler(base: float, cap: float) -> Any:
    """nats-py reconnect hook: round-robin over servers, exponential backoff with jitter."""

    def choose(servers: list[Any], info: dict[str, Any]) -> tuple[Any, float]:
        server = min(servers, key=lambda s: s.reconnects)
        attempts = server.reconnects
        if attempts == 0:
            return server, 0.0
        delay = min(cap, base * 2 ** min(attempts - 1, 16))
        return server, delay * (0.8 + random.random() * 0.4)

    return choose


def _is_permanent(e: Exception) -> bool:
    """Authorization and certificate errors: retrying the first connect cannot help."""
    if isinstance(e, nats.errors.AuthorizationError | ssl.SSLCertVerificationError):
        return True
    return "authorization" in str(e).lower()


async def _log_error(e: Exception) -> None:
    log.debug("nats: %r", e)


def _version_at_least(version: Any, major: int, minor: int) -> bool:
    try:
        return (int(version.major), int(version.minor)) >= (major, minor)
    except (AttributeError, TypeError, ValueError):
        return False
