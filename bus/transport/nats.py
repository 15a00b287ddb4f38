"""NATS JetStream ``Bus``: agents in other processes and hosts, replicas sharing work.

Open it with ``await NatsBus.connect(NatsOptions(url=...))`` (options, connect
and error translation shared with the event store:
``cardbus.eventstore.nats.connection``) or on an existing connection with
``NatsBus(nc)`` + ``await bus.ensure_streams()``.

Subjects and streams
--------------------
* ``cardbus.agent.<agent>`` -- an agent's inbox, in the work-queue stream
  ``CARDBUS_INBOX``. Each agent id has one durable pull consumer
  ``agent-<agent>`` filtered on its inbox and shared by all its replicas
  (the ``consume`` calls for one agent on a bus share one pull loop, asking
  for as many cards as they have handlers idle), so each card goes to one
  replica. ``AckWait`` (``ack_wait``) bounds how long a replica may hold a
  card silently: while the handler works the replica sends in-progress acks
  (``+WPI``) every third of it, so a long task keeps its card and a crashed
  replica loses it to another after ``ack_wait``. Redelivery: a handler that
  raises naks the card with a growing delay (``redelivery_delay`` doubling);
  after ``max_deliver`` deliveries (JetStream ``MaxDeliver``) the card is
  terminated and reported. Redeliveries after a silent replica use the
  consumer's ``BackOff`` (``ack_wait`` doubling). The orchestrator's own task
  timeout still decides task retries of a lost attempt.
* ``cardbus.reply.<agent>.<task>`` (``Started``, ``ResultCard``) and
  ``cardbus.announce.<agent>`` (``Announce``) -- answers to the orchestrator,
  in the interest-retention stream ``CARDBUS_REPLIES``. Each orchestrator
  reads them with its own durable pull consumer (``reply_durable``; the
  default ``cardbus-orchestrator`` is created with the stream, so replies and
  announcements are kept while no orchestrator runs, and a restarted
  orchestrator with the same name gets what its predecessor had not taken).
  Every orchestrator on the same log sees every reply: one whose state lags
  cannot lose a result the others need; the log's optimistic concurrency
  makes sure each is recorded once. A reply is acked once the orchestrator
  has taken it from ``replies()`` (put it into its decide loop: the iterator
  was asked for the next one), so an orchestrator killed before that gets it
  again; a reply seen twice is harmless (it is recorded once; the same reply
  again writes nothing, ``bus.orchestrator.repeats``). The consumer acks with ``AckAll``: one ack at
  most every 20 ms for the last reply taken covers every one before it
  (``ReplyAcks``: replies are taken in delivery order; what a stopped
  predecessor left unacked is waited for first); a consumer created by an
  earlier version, with explicit acks, is acked reply by reply. A new consumer starts with
  the replies the stream still holds (not yet acked by every consumer); one
  with another name than the default is deleted by the server an hour after
  its last pull.
* ``cardbus.reply.<agent>.<task>.<partition>`` -- the replies of a card whose run's
  partition its header ``Cardbus-Partition`` named (sent by a partitioned member,
  ``reply_partitions``): read only by the member holding that partition, from the
  partition's own consumer, and acked once settled (``bus.transport.nats_replies``).
* ``cardbus.dead.<kind>`` -- dead letters, in the stream ``CARDBUS_DEAD``
  (limits retention, 7 days): every malformed, oversized or undeliverable
  message is republished there with headers ``Cardbus-Reason`` and
  ``Cardbus-Subject`` (and reported to ``on_bad_message`` and the log), so
  nothing bad is lost silently and nothing is redelivered forever.

* Sender identity. The subject names the agent that sent a reply, an
  announcement or a request, and the documented permissions
  (:func:`agent_permissions`) let agent X's user publish only under its own
  id (``cardbus.reply.X.>``, ``cardbus.announce.X``, ``cardbus.req.X``). So a
  message whose body names another agent (``ResultCard.agent_id``,
  ``Started.agent_id``, the announced card's id, ``AgentRequest.agent_id``)
  than its subject, an announcement on a reply subject or a reply on the
  announcement subject, a reply for another task than its subject names, or
  one on a subject without a sender (the layout before it, ``cardbus.reply.<task>``)
  is refused: dead-lettered with the reason, reported to ``on_refused``
  (claimed and actual sender), and never handed to the orchestrator; a refused
  request is answered ``access_denied``. Without per-agent permissions on the
  server the subject proves nothing: any client may publish anywhere.

* ``cardbus.cancel.<agent>`` -- cancel notices (``CancelNotice``): core NATS, not
  persisted, published by the orchestrator that folds a ``task.cancelled`` or
  ``task.halted`` of an attempt in flight, heard by every replica of the agent
  (``watch_cancels``); the one running the attempt cancels its handler. Only
  orchestrators may publish there, and agent X may subscribe only to its own
  (:func:`agent_permissions`), so no agent can stop another's work. A notice lost
  (a replica reconnecting) is made up by the worker's ``attempt.live`` check.

* ``cardbus.chunk.<agent>.<root>`` and ``cardbus.watching`` -- the text of model
  answers as it is written, to whoever watches the run: core NATS, never persisted,
  published only while someone says it watches (``bus.transport.nats_chunks``).

* ``cardbus.req.<agent>`` -- an agent's requests to the orchestrator
  (``Bus.request``): core NATS request/reply, not persisted, served by the
  queue group ``cardbus-orchestrators`` (one orchestrator answers each); a
  request nobody answers in time is a ``BusError`` for the agent, a handler
  that fails answers with the header ``Cardbus-Error``.

Ids are encoded into subject tokens with ``cardbus.eventstore.nats.encode_token``
(``A-Z a-z 0-9 -`` as is, anything else ``_hh``), the same scheme as the log.

Headers
-------
``Nats-Msg-Id`` is a digest of the message bytes, so a publish tried again after
a lost ack is stored once (the streams' duplicate window is 2 minutes); not on
an ``Announce``, which a worker repeats byte for byte to renew its lease.
Transient failures (a reconnect, a leader election, a server starting) are
tried again for ``transient_retry_timeout`` seconds, then are a ``BusError``.
``traceparent`` (W3C) travels in a header: ``send_task`` sets it from the
card; a consumer reads it case-insensitively and fills the card's field when
the body lacks it; replies sent while a handler works carry its card's
``traceparent``.

Sizes
-----
Messages above ``max_message_bytes`` (1 MiB) are refused when sent
(``PayloadTooLarge``) and dead-lettered when received. A ``ResultCard`` too
large to send is replaced by a ``failed`` one saying so, so the orchestrator
records a failure event instead of waiting for a timeout.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import contextvars
import functools
import hashlib
import inspect
import json
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from typing import Any, TypeVar

import msgspec
import nats.errors
import nats.js.errors
from nats.aio.client import Client as NatsClient
from nats.aio.msg import Msg
from nats.js import JetStreamContext
from nats.js import api as js_api
from nats.js.api import Header, StatusCode

from cardbus.agents import requests as rq
from cardbus.agents.cards import (
    Announce,
    CancelNotice,
    Reply,
    ResultCard,
    Started,
    TaskCard,
    decode_cancel_notice,
    decode_reply,
    decode_task_card,
    encode,
)
from cardbus.agents.streaming import Chunk
from cardbus.bus.transport.interface import (
    Bus,
    CancelHandler,
    CardHandler,
    ChunkHandler,
    Refusal,
    RequestHandler,
    StopWatching,
)
from cardbus.bus.transport.nats_chunks import (
    CHUNK_PREFIX,
    WATCHING_ASK,
    WATCHING_SUBJECT,
    NatsChunks,
)
from cardbus.bus.transport.nats_pulls import LeaseWatch, PullClock, next_within
from cardbus.bus.transport.nats_replies import (
    ANNOUNCE_PREFIX,
    ORCHESTRATOR_DURABLE,
    PARTITION_HEADER,
    REPLY_PREFIX,
    REPLY_STREAM,
    PartitionReplies,
    ReplyAcks,
    left_after,
)
from cardbus.eventstore.errors import BusError, ConfigError, DecodeError, PayloadTooLarge
from cardbus.eventstore.nats import decode_token, encode_token
from cardbus.eventstore.nats.connection import (
    TRANSPORT_ERRORS,
    NatsOptions,
    is_too_large,
    on_reconnected,
    retry_transient,
    translated,
)
from cardbus.eventstore.nats.subjects import partition_of
from cardbus.eventstore.nats.wire import RequestMux, decode_ack

__all__ = [
    "ANNOUNCE_PREFIX",
    "CANCEL_PREFIX",
    "DEAD_PREFIX",
    "DEAD_STREAM",
    "INBOX_PREFIX",
    "INBOX_STREAM",
    "NatsBus",
    "NatsOptions",
    "ORCHESTRATOR_DURABLE",
    "PARTITION_HEADER",
    "REPLY_PREFIX",
    "REPLY_STREAM",
    "REQUEST_PREFIX",
    "TRACE_HEADER",
    "agent_permissions",
    "cancel_subject",
    "consumer_name",
    "header",
    "inbox_subject",
    "orchestrator_permissions",
    "reply_subject",
    "sender_problem",
]

log = logging.getLogger(__name__)

INBOX_STREAM = "CARDBUS_INBOX"
DEAD_STREAM = "CARDBUS_DEAD"
INBOX_PREFIX = "cardbus.agent"
DEAD_PREFIX = "cardbus.dead"
REQUEST_PREFIX = "cardbus.req"
CANCEL_PREFIX = "cardbus.cancel"
REQUEST_QUEUE = "cardbus-orchestrators"
ERROR_HEADER = "Cardbus-Error"
MAX_DELIVERIES_ADVISORY = f"$JS.EVENT.ADVISORY.CONSUMER.MAX_DELIVERIES.{INBOX_STREAM}.*"
TRACE_HEADER = "traceparent"
REASON_HEADER = "Cardbus-Reason"
SUBJECT_HEADER = "Cardbus-Subject"
DEFAULT_MAX_MESSAGE_BYTES = 1024 * 1024

MSG_ID_HEADER = Header.MSG_ID.value
EXPECTED_STREAM_HEADER = Header.EXPECTED_STREAM.value
_STATUS = Header.STATUS.value
_HEARTBEAT = StatusCode.CONTROL_MESSAGE.value  # 100
_PULL_OVER = (StatusCode.NO_MESSAGES.value, StatusCode.REQUEST_TIMEOUT.value)  # 404, 408
_PENDING_MESSAGES = "Nats-Pending-Messages"  # (a pull's status message; not in nats-py)
_PULL_QUIET = (_HEARTBEAT, *_PULL_OVER)  # statuses that are no trouble: no back-off


def _pull_status(msg: Msg, pending: int) -> tuple[str | None, int]:
    """What a message a pull request brought says: its status (None: a message with
    data) and how many messages are still asked for after it. A heartbeat changes
    nothing; any other status ends its request, and says how many it had left."""
    status = (msg.headers or {}).get(_STATUS) if not msg.data else None
    if status is None or status == _HEARTBEAT:
        return status, pending
    left = (msg.headers or {}).get(_PENDING_MESSAGES)
    return status, max(0, pending - int(left)) if left and left.isdigit() else 0


_trace: contextvars.ContextVar[str | None] = contextvars.ContextVar("cardbus_trace", default=None)
T = TypeVar("T")


def inbox_subject(agent_id: str) -> str:
    return f"{INBOX_PREFIX}.{encode_token(agent_id)}"


def cancel_subject(agent_id: str) -> str:
    """Where agent X's replicas hear cancel notices (only orchestrators publish there)."""
    return f"{CANCEL_PREFIX}.{encode_token(agent_id)}"


def consumer_name(agent_id: str) -> str:
    """The durable consumer shared by an agent's replicas."""
    return f"agent-{encode_token(agent_id)}"


def reply_subject(message: Reply, partition: str | None = None) -> str:
    """``cardbus.announce.<agent>``, or ``cardbus.reply.<agent>.<task>``: the sender first;
    ``.<partition>`` after it when the card said its run's partition (``PARTITION_HEADER``)."""
    if isinstance(message, Announce):
        return f"{ANNOUNCE_PREFIX}.{encode_token(message.card.agent_id)}"
    subject = f"{REPLY_PREFIX}.{encode_token(message.agent_id)}.{encode_token(message.task_id)}"
    return f"{subject}.{partition}" if partition else subject


def _kind(message: Reply) -> str:
    if isinstance(message, Announce):
        return "announce"
    return "started" if isinstance(message, Started) else "result"


def sender_problem(subject: str, message: Reply) -> Refusal | None:
    """Why ``message``, received on ``subject``, does not come from the agent it names.

    The subject's agent token is the sender (the server lets agent X publish
    only under X); None when the message speaks for its sender only.
    """
    kind = _kind(message)
    if isinstance(message, Announce):
        claimed, task_id, attempt = message.card.agent_id, "", 0
    else:
        claimed, task_id, attempt = message.agent_id, message.task_id, message.attempt
    tokens = subject.split(".")
    sender, reason = "", ""
    if subject.startswith(ANNOUNCE_PREFIX + ".") and len(tokens) == 3:
        sender = decode_token(tokens[2])
        if kind != "announce":
            reason = f"a {kind} reply on the announcement subject"
    elif subject.startswith(REPLY_PREFIX + ".") and (
        len(tokens) == 4 or (len(tokens) == 5 and tokens[4].isdigit())
    ):
        sender = decode_token(tokens[2])
        if kind == "announce":
            reason = "an announcement on a reply subject"
        elif (named := decode_token(tokens[3])) != task_id:
            reason = f"the subject is for task {named!r}, the reply for {task_id!r}"
    else:
        reason = "the subject names no sender (cardbus.reply.<agent>.<task>)"
    if not reason and claimed != sender:
        reason = f"sent by {sender!r} in the name of {claimed!r}"
    if not reason:
        return None
    return Refusal(kind, claimed, sender, reason, task_id, attempt, subject)


def header(msg: Msg, name: str) -> str | None:
    """A header's value, the name matched case-insensitively."""
    headers = msg.headers or {}
    value = headers.get(name)
    if value is not None:
        return value
    lname = name.lower()
    return next((v for k, v in headers.items() if k.lower() == lname), None)


def agent_inbox_prefix(agent_id: str) -> str:
    """The reply-subject prefix of agent X's connections (``NatsOptions.inbox_prefix``)."""
    return f"_INBOX.{encode_token(agent_id)}"


def agent_permissions(agent_id: str) -> dict[str, list[str]]:
    """NATS subject permissions of agent X: consume its own inbox, publish replies.

    It may look up the bus streams, create/bind its own durable consumer (with
    its own filter), pull from it and ack its messages; publish replies under
    its own id (``cardbus.reply.X.>``: the orchestrator refuses a reply that
    names another agent than its subject), its own announcement and requests,
    and dead letters; and subscribe only to its own reply
    prefix (:func:`agent_inbox_prefix`), so it cannot see another agent's
    deliveries, and to its own cancel notices (:func:`cancel_subject`). It cannot
    publish events, send cards or cancel notices, or touch another inbox.
    """
    t = encode_token(agent_id)
    durable = consumer_name(agent_id)
    api = "$JS.API"
    return {
        "publish": [
            f"{REPLY_PREFIX}.{t}.>",
            f"{ANNOUNCE_PREFIX}.{t}",
            f"{REQUEST_PREFIX}.{t}",
            f"{CHUNK_PREFIX}.{t}.>",  # its model answers as they are written
            WATCHING_ASK,
            f"{DEAD_PREFIX}.>",
            *(f"{api}.STREAM.INFO.{s}" for s in (INBOX_STREAM, REPLY_STREAM, DEAD_STREAM)),
            f"{api}.CONSUMER.INFO.{INBOX_STREAM}.{durable}",
            f"{api}.CONSUMER.CREATE.{INBOX_STREAM}.{durable}.{inbox_subject(agent_id)}",
            f"{api}.CONSUMER.MSG.NEXT.{INBOX_STREAM}.{durable}",
            f"$JS.ACK.{INBOX_STREAM}.{durable}.>",
        ],
        "subscribe": [
            f"{agent_inbox_prefix(agent_id)}.>",
            cancel_subject(agent_id),
            WATCHING_SUBJECT,  # which runs are watched: chunks only for those
        ],
    }


def orchestrator_permissions() -> dict[str, list[str]]:
    """NATS subject permissions of the orchestrator (and of ``cardbus`` tools reading the log).

    It writes the log and sends cards, administers the cardbus streams and
    consumers through the JetStream API, reads and acks replies, hears other
    writers' appends to the log (``cardbus.evt.>``: see
    ``eventstore/nats/follow.py``), and answers agents' requests
    (``cardbus.req.>``; its user also needs ``allow_responses: true``).
    """
    return {
        "publish": [
            "cardbus.evt.>",
            f"{INBOX_PREFIX}.>",
            f"{DEAD_PREFIX}.>",
            "$JS.API.>",
            f"$JS.ACK.{REPLY_STREAM}.>",
            "$KV.cardbus-owners.>",  # run partitions' leases (bus.orchestrator.partition)
            "$KV.cardbus-limits.>",  # provider limits' shares (bus.runtime.pace_share)
            "cardbus.orch.>",  # an agent's request handed to its run's member (runtime.members)
            f"{CANCEL_PREFIX}.>",  # stop the handler of an attempt whose task ended
            WATCHING_SUBJECT,  # the console / gateway watch a run's chunks
        ],
        # and allow_responses (answers to agents' requests), see authorization_config;
        # cardbus.evt.>: the log's store hears other writers' appends (without it, it
        # follows the log through a consumer: every event sent back, its own too)
        "subscribe": [
            "_INBOX.>",
            f"{REQUEST_PREFIX}.>",
            MAX_DELIVERIES_ADVISORY,
            "cardbus.evt.>",
            "cardbus.orch.>",
            f"{CHUNK_PREFIX}.>",
            WATCHING_ASK,
            "$KV.cardbus-limits.>",  # the members' demands, heard as they are put
        ],
    }


def _msg_id(data: bytes) -> str:
    return hashlib.blake2b(data, digest_size=16).hexdigest()


class NatsBus(Bus):
    """The ``Bus`` on JetStream; see the module docstring for subjects and semantics."""

    def __init__(
        self,
        nc: NatsClient,
        *,
        owns_connection: bool = False,
        ack_wait: float = 30.0,
        max_deliver: int = 5,
        redelivery_delay: float = 0.5,
        max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
        request_timeout: float = 5.0,
        transient_retry_timeout: float = 30.0,
        replicas: int = 1,
        fetch_wait: float = 30.0,
        pull_heartbeat: float = 10.0,
        reply_batch: int = 256,
        reply_ack_wait: float = 30.0,
        reply_durable: str = ORCHESTRATOR_DURABLE,
        delete_reply_consumer: bool = False,
        reply_partitions: int | None = None,
    ) -> None:
        if max_deliver < 2:
            raise ConfigError(f"max_deliver must be at least 2: {max_deliver}")
        self.nc = nc
        self.ack_wait = ack_wait
        self.max_deliver = max_deliver
        self.redelivery_delay = redelivery_delay
        self.max_message_bytes = max_message_bytes
        self.request_timeout = request_timeout
        self.transient_retry_timeout = transient_retry_timeout
        self.replicas = replicas
        #: how long a pull request lives, and the idle heartbeats it asks for
        #: (``bus.transport.nats_pulls``: how a lost request is noticed)
        self.fetch_wait = fetch_wait
        self.pull_heartbeat = pull_heartbeat
        #: the leases announced on the reply consumer: its requests are given up as lost
        #: before one of them could lapse for want of its renewals
        self._leases = LeaseWatch()
        self.reply_batch = reply_batch
        self.reply_ack_wait = reply_ack_wait
        self.reply_durable = reply_durable
        #: delete the reply consumer on close (a short-lived orchestrator, e.g. the demo's),
        #: so the stream does not keep replies for it
        self.delete_reply_consumer = delete_reply_consumer and reply_durable != ORCHESTRATOR_DURABLE
        self._reading_replies = False
        self._reply_acks: ReplyAcks | None = None
        #: a partitioned member (``reply_partitions``: the log's partition count): its cards
        #: name their run's partition, and it reads the replies of the partitions it holds
        #: (``hold_replies``; ``bus.transport.nats_replies``)
        self.reply_partitions = reply_partitions
        self._partition_replies = (
            PartitionReplies(self, reply_partitions) if reply_partitions else None
        )
        # (agent side) the partition each card running here named: its replies carry it
        self._card_partition: collections.OrderedDict[tuple[str, int], str] = (
            collections.OrderedDict()
        )
        self._js: JetStreamContext = nc.jetstream(timeout=request_timeout)
        self._mux = RequestMux(nc, request_timeout)  # publishes to the streams, their acks
        self._owns = owns_connection
        self._tasks: set[asyncio.Task[None]] = set()
        self._subs: list[Any] = []
        self._unhook: list[Callable[[], None]] = []  # reconnect listeners to remove
        self._slots: dict[str, _Slots] = {}  # agent -> the handlers of its consume calls
        self._closed = False
        self._chunks = NatsChunks(nc)

    @classmethod
    async def connect(
        cls,
        options: NatsOptions | str = "nats://127.0.0.1:4222",
        *,
        name: str = "cardbus-bus",
        create_streams: bool = True,
        **bus_options: Any,
    ) -> NatsBus:
        """Connect with ``options`` (a ``NatsOptions`` or a URL) and check the streams."""
        opts = NatsOptions(url=options) if isinstance(options, str) else options
        nc = await opts.connect(name)
        bus = cls(nc, owns_connection=True, **bus_options)
        try:
            await bus.ensure_streams(create=create_streams)
        except BaseException:
            await bus.close()
            raise
        return bus

    # -- set-up ----------------------------------------------------------------

    async def ensure_streams(self, create: bool = True) -> None:
        """Look up (and unless ``create=False`` create) the inbox, reply and dead streams."""
        specs = [
            (INBOX_STREAM, [f"{INBOX_PREFIX}.>"], js_api.RetentionPolicy.WORK_QUEUE, None),
            (
                REPLY_STREAM,
                [f"{REPLY_PREFIX}.>", f"{ANNOUNCE_PREFIX}.>"],
                js_api.RetentionPolicy.INTEREST,
                7 * 86400.0,
            ),
            (DEAD_STREAM, [f"{DEAD_PREFIX}.>"], js_api.RetentionPolicy.LIMITS, 7 * 86400.0),
        ]
        for name, subjects, retention, max_age in specs:
            config = js_api.StreamConfig(
                name=name,
                subjects=subjects,
                retention=retention,
                storage=js_api.StorageType.FILE,
                num_replicas=self.replicas,
                duplicate_window=120.0,
                max_age=max_age,
                max_msg_size=-1,
            )
            created = await self._transient(
                functools.partial(self._ensure_stream, config, create), f"set up stream {name!r}"
            )
            if created and name == REPLY_STREAM:
                # the default orchestrator's consumer exists from the start, so replies
                # (and agents' announcements) are kept until an orchestrator takes them
                await self._transient(
                    lambda: self._bind_config(
                        REPLY_STREAM, self._reply_config(ORCHESTRATOR_DURABLE)
                    ),
                    "create the orchestrator's reply consumer",
                )

    async def _ensure_stream(self, config: js_api.StreamConfig, create: bool) -> bool:
        """True if this call created the stream."""
        name = config.name or ""
        try:
            await self._js.stream_info(name)
            return False
        except nats.js.errors.NotFoundError:
            if not create:
                raise BusError(f"JetStream stream {name!r} does not exist") from None
        try:
            await self._js.add_stream(config)
            return True
        except nats.js.errors.BadRequestError:
            await self._js.stream_info(name)  # created meanwhile by another process
            return False

    async def _bind_config(self, stream: str, config: js_api.ConsumerConfig) -> None:
        try:
            await self._js.consumer_info(stream, config.durable_name or "")
        except nats.js.errors.NotFoundError:
            with contextlib.suppress(nats.js.errors.BadRequestError):
                await self._js.add_consumer(stream, config)

    async def _transient(self, make: Callable[[], Awaitable[T]], what: str) -> T:
        """``make()``, tried again for ``transient_retry_timeout`` seconds while JetStream is
        unavailable (a server starting, a cluster electing leaders, a reconnect); then, or
        when JetStream refuses, ``BusError``."""
        with translated(f"cannot {what}", error=BusError, refused=BusError):
            return await retry_transient(
                make,
                within=self.transient_retry_timeout,
                stopped=lambda: self._closed,
                pause=0.1,
                max_pause=2.0,
            )

    def _redelivery_backoff(self) -> list[float]:
        """JetStream ``BackOff``: the waits before redelivering a card nobody acked."""
        return [self.ack_wait * 2**i for i in range(min(self.max_deliver - 1, 6))]

    async def _bind(
        self, stream: str, durable: str, config: js_api.ConsumerConfig
    ) -> JetStreamContext.PullSubscription:
        """Bind to a durable consumer, creating it when it does not exist yet."""
        try:
            await self._js.consumer_info(stream, durable)
        except nats.js.errors.NotFoundError:
            try:
                await self._js.add_consumer(stream, config)
            except nats.js.errors.BadRequestError as e:
                # created meanwhile by another replica, possibly with other settings
                log.debug("consumer %s exists: %s", durable, e)
        return await self._js.pull_subscribe_bind(durable=durable, stream=stream)

    async def _until_done(self, make: Callable[[], Awaitable[T]], what: str) -> T:
        """``make()``, tried again after any NATS failure until the bus is closed."""
        with translated(f"cannot {what} (the bus is closed)", error=BusError, refused=BusError):
            return await retry_transient(
                make,
                stopped=lambda: self._closed,
                retry_on=lambda e: isinstance(e, TRANSPORT_ERRORS),
                max_pause=2.0,
            )

    # -- agents' side ----------------------------------------------------------

    async def consume(self, agent_id: str, handler: CardHandler) -> None:
        if self._closed:
            raise BusError("the bus is closed")
        durable = consumer_name(agent_id)
        config = js_api.ConsumerConfig(
            name=durable,
            durable_name=durable,
            filter_subject=inbox_subject(agent_id),
            deliver_policy=js_api.DeliverPolicy.ALL,
            ack_policy=js_api.AckPolicy.EXPLICIT,
            ack_wait=self.ack_wait,
            max_deliver=self.max_deliver,
            backoff=self._redelivery_backoff(),
            max_ack_pending=10_000,
            max_waiting=4096,
        )
        slots = self._slots.get(agent_id)
        if slots is not None:  # one more card at once on the agent's pull loop
            slots.add(handler)
            return
        await self._transient(
            lambda: self._bind_config(INBOX_STREAM, config), f"consume the inbox of {agent_id!r}"
        )
        slots = self._slots[agent_id] = _Slots(handler)
        self._spawn(self._serve(slots, durable, inbox_subject(agent_id)), f"inbox-{agent_id}")

    def _spawn(self, coro: Awaitable[None], name: str) -> None:
        task = asyncio.ensure_future(coro)
        task.set_name(name)
        self._tasks.add(task)
        task.add_done_callback(self._ended)

    def _ended(self, task: asyncio.Task[None]) -> None:
        """A spawned task's end: one that failed says so now, by name (unread, its
        exception was said only when the task was collected, if ever: an agent's pull
        loop that died left the agent deaf without a word)."""
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.error("%s failed", task.get_name(), exc_info=task.exception())

    async def _serve(self, slots: _Slots, durable: str, subject: str) -> None:
        """One pull loop for all of an agent's ``consume`` calls on this bus: it asks for as
        many cards as handlers are idle (a request for several when at least half are, so
        a card costs less than one pull request; for each one freed while cards wait in
        the inbox), and each card goes to an idle handler.

        Never more cards asked for than handlers idle, so no card waits here while another
        replica could take it. A request lives ``fetch_wait`` with idle heartbeats; one
        lost is made again at once after a reconnect, or when two heartbeats (or its
        expiry) did not come (``bus.transport.nats_pulls``).
        """
        queue: asyncio.Queue[Msg | None] = asyncio.Queue()  # None: a handler is free
        slots.freed = queue.put_nowait

        async def on_msg(msg: Msg) -> None:
            queue.put_nowait(msg)

        loop = asyncio.get_running_loop()
        request_subject = f"$JS.API.CONSUMER.MSG.NEXT.{INBOX_STREAM}.{durable}"
        clock = PullClock(self.fetch_wait, self.pull_heartbeat)
        inbox = self.nc.new_inbox()
        sub = await self._until_done(
            lambda: self.nc.subscribe(inbox, cb=on_msg), f"subscribe to {inbox}"
        )
        self._subs.append(sub)
        self._ask_again_on_reconnect(clock, lambda: queue.put_nowait(None))
        pending = 0  # cards asked for and not yet delivered or expired
        pause = 0.05
        backlog: list[Msg] = []  # (only if the server delivers more than was asked for)
        waiting = False  # the last card came with more in the inbox: ask for each handler
        while not self._closed:
            now = loop.time()
            if clock.gone(now):
                pending = 0  # the requests are gone (expired unseen, or a reconnect)
            idle = len(slots.idle)
            want = idle - pending
            if want > 0 and (pending == 0 or waiting or 2 * want >= slots.total):
                if not await self._ask_for(request_subject, inbox, clock.request(want)):
                    await asyncio.sleep(pause)
                    pause = min(pause * 2, 2.0)
                    continue
                pending += want
                clock.asked = now
            try:
                msg = await next_within(queue, clock.lost_after)
            except TimeoutError:
                pending = 0
                continue
            if msg is None:  # a handler is free: a card waiting here, else ask for more
                if backlog and slots.idle:
                    card = backlog.pop(0)
                    self._spawn(self._run_slot(slots, card, slots.idle.pop()), "card")
                continue
            clock.heard = loop.time()
            status, pending = _pull_status(msg, pending)
            if status is not None:
                if status not in _PULL_QUIET:  # 409: leader change, consumer deleted...
                    log.debug("pull on %s: %s %s", subject, status, msg.headers)
                    await asyncio.sleep(pause)
                    pause = min(pause * 2, 2.0)
                continue
            pause = 0.05
            pending = max(0, pending - 1)
            waiting = left_after(msg.reply or "") > 0
            if slots.idle:
                self._spawn(self._run_slot(slots, msg, slots.idle.pop()), "card")
            else:
                backlog.append(msg)

    def _ask_again_on_reconnect(self, clock: PullClock, wake: Callable[[], None]) -> None:
        """After a reconnect, ``clock``'s requests are taken as gone and its loop woken
        (``bus.transport.nats_pulls``)."""

        def reconnected() -> None:
            clock.forget()
            wake()

        stop = on_reconnected(self.nc, reconnected)
        if stop is not None:
            self._unhook.append(stop)

    async def _ask_for(self, subject: str, inbox: str, request: bytes) -> bool:
        """One pull request (``PullClock.request``) of the consumer behind ``subject``,
        delivered to ``inbox``; False if it could not be sent (the caller backs off and
        asks again)."""
        try:
            await self.nc.publish(subject, request, reply=inbox)
        except TRANSPORT_ERRORS as e:
            log.debug("pull request on %s failed: %r", subject, e)
            return False
        return True

    async def _run_slot(self, slots: _Slots, msg: Msg, handler: CardHandler) -> None:
        try:
            await self._deliver(msg, handler)
        finally:
            slots.idle.append(handler)
            slots.freed(None)

    async def _deliver(self, msg: Msg, handler: CardHandler) -> None:
        if len(msg.data) > self.max_message_bytes:
            await self._reject(msg, f"card too large: {len(msg.data)} bytes")
            return
        try:
            card = decode_task_card(msg.data)
        except DecodeError as e:
            await self._reject(msg, str(e))
            return
        trace = header(msg, TRACE_HEADER)
        if card.traceparent is None and trace:
            card = msgspec.structs.replace(card, traceparent=trace)
        delivered = _delivered(msg)
        if delivered != card.delivery:  # who ran it: the worker reports the delivery count
            card = msgspec.structs.replace(card, delivery=delivered)
        partition = header(msg, PARTITION_HEADER)
        if partition is not None and partition.isdigit() and len(partition) <= 4:
            remembered = self._card_partition
            remembered[(card.task_id, card.attempt)] = partition
            if len(remembered) > 65_536:  # (long finished ones)
                remembered.popitem(last=False)
        beat = asyncio.ensure_future(self._keep_alive(msg))
        token = _trace.set(card.traceparent)
        try:
            await handler(card)
        except asyncio.CancelledError:
            with contextlib.suppress(*TRANSPORT_ERRORS):
                await msg.nak()  # let another replica have it now
            raise
        except Exception as e:
            delivered = _delivered(msg)
            if delivered >= self.max_deliver:
                await self._reject(msg, f"handler failed {delivered} times: {e!r}")
            else:
                log.info("handler failed on %s (delivery %d): %r", msg.subject, delivered, e)
                with contextlib.suppress(*TRANSPORT_ERRORS):
                    await msg.nak(delay=self.redelivery_delay * 2 ** (delivered - 1))
        else:
            with contextlib.suppress(*TRANSPORT_ERRORS):
                await msg.ack()
        finally:
            _trace.reset(token)
            beat.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await beat

    async def _keep_alive(self, msg: Msg) -> None:
        """In-progress acks while the handler works, so ``ack_wait`` does not expire."""
        while True:
            await asyncio.sleep(self.ack_wait / 3)
            with contextlib.suppress(*TRANSPORT_ERRORS):
                await msg.in_progress()

    async def send_task(self, agent_id: str, card: TaskCard) -> None:
        data = encode(card)
        if len(data) > self.max_message_bytes:
            raise PayloadTooLarge(len(data), self.max_message_bytes)
        headers = {MSG_ID_HEADER: _msg_id(data)}
        if card.traceparent:
            headers[TRACE_HEADER] = card.traceparent
        if self.reply_partitions:  # the replies go to the run's partition (its owner)
            headers[PARTITION_HEADER] = str(partition_of(card.root_id, self.reply_partitions))
        await self._publish(inbox_subject(agent_id), data, headers, INBOX_STREAM)

    async def send_raw(self, agent_id: str, data: bytes) -> None:
        """Put raw bytes in an inbox (for tests of malformed messages)."""
        await self._publish(inbox_subject(agent_id), data, {}, INBOX_STREAM)

    async def reply(self, message: Reply) -> None:
        data = encode(message)
        if len(data) > self.max_message_bytes and isinstance(message, ResultCard):
            size = len(data)
            log.warning("result of %s is %d bytes: sent as failed", message.task_id, size)
            message = msgspec.structs.replace(
                message,
                status="failed",
                output=None,
                supplement_inputs={},
                notes="",
                error=f"result too large for the bus: {size} bytes > {self.max_message_bytes}",
            )
            data = encode(message)
        if len(data) > self.max_message_bytes:
            raise PayloadTooLarge(len(data), self.max_message_bytes)
        # An announcement is sent again, byte for byte, to renew the agent's lease: a
        # digest id would have JetStream drop every renewal within the duplicate window
        # as a repeat (and the lease lapse). Announcements are idempotent: no id.
        headers = {} if isinstance(message, Announce) else {MSG_ID_HEADER: _msg_id(data)}
        trace = _trace.get()
        if trace:
            headers[TRACE_HEADER] = trace
        partition = None
        if not isinstance(message, Announce):
            partition = self._card_partition.get((message.task_id, message.attempt))
        elif message.online and message.renewal > 1:
            await self._renew(reply_subject(message, None), data, headers)
            return
        await self._publish(reply_subject(message, partition), data, headers, REPLY_STREAM)

    async def _renew(self, subject: str, data: bytes, headers: dict[str, str]) -> None:
        """A lease renewal (an announcement after the first): stored by the stream like
        any announcement, but published without asking for JetStream's ack. The worker
        goes on renewing whatever one renewal's fate (it renews every third of the
        lease, so one lost leaves the lease two more chances); its ack was a message and
        a wakeup each way every few seconds per agent, for nothing it would act on.
        The first announcement, which registers the agent, and the last (offline) are
        acked as before."""
        if self._closed:
            raise BusError("the bus is closed")
        with translated(f"cannot publish to {subject}", error=BusError, refused=BusError):
            await self.nc.publish(subject, data, headers=headers or None)

    async def reply_raw(self, data: bytes, subject: str = f"{REPLY_PREFIX}.raw") -> None:
        """Publish raw bytes as a reply (for tests of malformed messages)."""
        await self._publish(subject, data, {}, REPLY_STREAM)

    async def _js_publish(
        self, subject: str, data: bytes, headers: dict[str, str], stream: str
    ) -> None:
        """``js.publish`` on the request mux (lighter than ``nc.request``) with the same
        errors: no stream captures the subject, or the stream refused the message."""
        headers[EXPECTED_STREAM_HEADER] = stream
        try:
            msg = await self._mux.request(subject, data, headers)
        except nats.errors.NoRespondersError:
            raise nats.js.errors.NoStreamResponseError from None
        try:
            ack = decode_ack(msg.data)
        except msgspec.DecodeError as e:
            raise nats.errors.Error(f"not a JetStream ack: {msg.data[:100]!r}") from e
        if ack.error is not None:
            raise nats.js.errors.APIError.from_error(ack.error)

    async def _publish(
        self, subject: str, data: bytes, headers: dict[str, str], stream: str
    ) -> None:
        """Publish to JetStream and wait for the ack, tried again through reconnects."""
        if self._closed:
            raise BusError("the bus is closed")
        with translated(
            f"cannot publish to {subject}",
            error=BusError,
            refused=BusError,
            too_large=functools.partial(PayloadTooLarge, len(data), self.nc.max_payload),
        ):
            await retry_transient(
                lambda: self._js_publish(subject, data, headers, stream),
                within=self.transient_retry_timeout,
                stopped=lambda: self._closed,
                # any failure but a message too large (a stream may be recovering)
                retry_on=lambda e: isinstance(e, TRANSPORT_ERRORS) and not is_too_large(e),
            )

    # -- orchestrator's side ---------------------------------------------------

    def _reply_config(self, durable: str) -> js_api.ConsumerConfig:
        return js_api.ConsumerConfig(
            name=durable,
            durable_name=durable,
            # a new consumer starts with every reply the stream still holds, i.e. those
            # some other consumer has not acked yet (announcements included)
            deliver_policy=js_api.DeliverPolicy.ALL,
            # one ack for every reply taken so far (see ReplyAcks); a consumer made by an
            # earlier version (explicit acks) keeps one ack a reply
            ack_policy=js_api.AckPolicy.ALL,
            ack_wait=self.reply_ack_wait,
            max_deliver=-1,
            max_ack_pending=20_000,
            max_waiting=4096,
            # other orchestrators' consumers go away an hour after their last pull
            inactive_threshold=None if durable == ORCHESTRATOR_DURABLE else 3600.0,
        )

    async def _reply_sub(self) -> JetStreamContext.PullSubscription:
        durable = self.reply_durable
        return await self._bind(REPLY_STREAM, durable, self._reply_config(durable))

    async def replies(self) -> AsyncIterator[Reply]:
        await self._until_done(self._reply_sub, "bind the reply consumer")  # it exists now
        info = await self._until_done(
            lambda: self._js.consumer_info(REPLY_STREAM, self.reply_durable),
            "look up the reply consumer",
        )
        self._reading_replies = True
        await self._watch_max_deliveries()
        acks = ReplyAcks(self, info) if info.config.ack_policy == js_api.AckPolicy.ALL else None
        self._reply_acks = acks
        try:
            if self._partition_replies is not None:
                async for reply in self._partition_replies.replies(acks):
                    yield reply
                return
            async for msg in self._pull(REPLY_STREAM, self.reply_durable, self.reply_batch):
                checked = await self._checked_reply(msg, acks)
                if checked is None:
                    continue
                yield checked
                # taken by the orchestrator: do not redeliver
                if acks is None:
                    with contextlib.suppress(*TRANSPORT_ERRORS):
                        await msg.ack()
                else:
                    acks.taken(msg)
        finally:
            if acks is not None:
                acks.flush()

    async def _checked_reply(self, msg: Msg, acks: ReplyAcks | None) -> Reply | None:
        """The reply ``msg`` carries; None for a bad or refused one (dead-lettered, reported
        and acked: terminated, or taken with the replies around it)."""
        problem = ""
        refusal = None
        reply: Reply | None = None
        if len(msg.data) > self.max_message_bytes:
            problem = f"reply too large: {len(msg.data)} bytes"
        else:
            try:
                reply = decode_reply(msg.data)
            except DecodeError as e:
                problem = str(e)
            else:
                refusal = sender_problem(msg.subject, reply)
                if refusal is not None:
                    problem = f"{refusal.kind} refused: {refusal.reason}"
        if not problem:
            if isinstance(reply, Announce):
                now = asyncio.get_running_loop().time()
                self._leases.announced(reply.card.agent_id, reply.lease_s, reply.online, now)
            return reply
        if acks is None:
            await self._reject(msg, problem)
        else:  # dead-lettered, and acked with the replies around it
            await self._bad(msg.subject, msg.data, problem)
            acks.taken(msg)
        if refusal is not None:
            await self._refused(refusal)
        return None

    async def prepare_replies(self) -> None:
        """(A partitioned member) Make every partition's reply consumer before any card is
        sent, so no reply finds no consumer (``nats_replies.PartitionReplies.prepare``)."""
        if self._partition_replies is not None:
            await self._partition_replies.prepare()

    def hold_replies(self, partitions: Iterable[int]) -> None:
        """(A partitioned member) Read the replies of ``partitions`` from now on."""
        if self._partition_replies is not None:
            self._partition_replies.hold(partitions)

    def settle(self, replies: Iterable[Reply]) -> None:
        if self._partition_replies is not None:
            self._partition_replies.settle(replies)

    async def _watch_max_deliveries(self) -> None:
        """Cards no replica acked within ``max_deliver`` deliveries (replicas that crash or
        hang on them) are dead-lettered, reported and removed from the inbox stream."""

        async def on_advisory(msg: Msg) -> None:
            self._spawn(self._undeliverable(msg.data), "max-deliveries")

        with contextlib.suppress(*TRANSPORT_ERRORS):
            self._subs.append(
                await self.nc.subscribe(
                    MAX_DELIVERIES_ADVISORY, queue=REQUEST_QUEUE, cb=on_advisory
                )
            )

    async def _undeliverable(self, advisory: bytes) -> None:
        try:
            info = json.loads(advisory)
            seq = int(info["stream_seq"])
        except (ValueError, KeyError, TypeError):
            return
        try:
            raw = await self._js.get_msg(INBOX_STREAM, seq)
        except nats.js.errors.NotFoundError:
            return  # acked or terminated meanwhile
        except TRANSPORT_ERRORS as e:
            log.warning("cannot look up undeliverable card %d: %r", seq, e)
            return
        reason = (
            f"delivered {info.get('deliveries', '?')} times to {info.get('consumer', '?')} "
            "without an ack (its replicas crashed or hung on it); removed from the inbox"
        )
        await self._bad(raw.subject or INBOX_PREFIX, raw.data or b"", reason)
        with contextlib.suppress(*TRANSPORT_ERRORS):
            await self._js.delete_msg(INBOX_STREAM, seq)

    async def _pull(self, stream: str, durable: str, batch: int) -> AsyncIterator[Msg]:
        """Messages of a durable pull consumer as they arrive (a continuous pull).

        Pull requests of ``batch`` messages expiring after ``fetch_wait`` are
        kept outstanding, topped up when half is used: each message is handed
        on the moment it arrives (nats-py's ``fetch`` would wait for a whole
        batch). A request lost is made again at once after a reconnect, or when
        two of its idle heartbeats (or its expiry) did not come; on the consumer the
        agents' renewals come on, also when three quarters of the shortest lease
        announced passed without a word (``bus.transport.nats_pulls``).
        """
        queue: asyncio.Queue[Msg | None] = asyncio.Queue()  # None: a reconnect

        async def on_msg(msg: Msg) -> None:
            queue.put_nowait(msg)

        loop = asyncio.get_running_loop()
        subject = f"$JS.API.CONSUMER.MSG.NEXT.{stream}.{durable}"
        # (the consumer the agents' renewals come on: bounded by their leases)
        carries_renewals = stream == REPLY_STREAM and durable == self.reply_durable
        clock = PullClock(
            self.fetch_wait, self.pull_heartbeat, self._leases if carries_renewals else None
        )
        inbox = self.nc.new_inbox()
        sub = await self._until_done(
            lambda: self.nc.subscribe(inbox, cb=on_msg), f"subscribe to {inbox}"
        )
        self._ask_again_on_reconnect(clock, lambda: queue.put_nowait(None))
        pending = 0  # messages asked for and not yet delivered or expired
        pause = 0.05
        try:
            while not self._closed:
                now = loop.time()
                if clock.gone(now):
                    pending = 0  # the requests are gone (expired unseen, or a reconnect)
                if pending <= batch // 2:
                    want = batch - pending
                    if not await self._ask_for(subject, inbox, clock.request(want)):
                        await asyncio.sleep(pause)
                        pause = min(pause * 2, 2.0)
                        continue
                    pending += want
                    clock.asked = now
                    pause = 0.05
                try:
                    msg = await next_within(queue, clock.wait(loop.time()))
                except TimeoutError:
                    pending = 0
                    continue
                if msg is None:  # a reconnect: the loop's top asks again
                    continue
                clock.heard = loop.time()
                status, pending = _pull_status(msg, pending)
                if status is not None:
                    if status not in _PULL_QUIET:  # 409: leader change, consumer deleted...
                        log.debug("pull on %s: %s %s", subject, status, msg.headers)
                        await asyncio.sleep(pause)
                        pause = min(pause * 2, 2.0)
                    continue
                pending = max(0, pending - 1)
                yield msg
        finally:
            with contextlib.suppress(Exception):
                await sub.unsubscribe()
            # delivered to this pull and never handed on: back to the consumer now, not
            # after its ack wait (status messages have no ack subject)
            while not queue.empty():
                left = queue.get_nowait()
                if left is not None and left.reply and left.reply.startswith("$JS.ACK."):
                    with contextlib.suppress(Exception):
                        await left.nak()

    # -- cancel notices (core NATS, at most once: see the module doc) ---------------

    async def cancel_attempt(self, notice: CancelNotice) -> None:
        if self._closed:
            return
        with translated("cannot send a cancel notice", error=BusError, refused=BusError):
            await self.nc.publish(cancel_subject(notice.agent_id), encode(notice))

    async def watch_cancels(self, agent_id: str, handler: CancelHandler) -> None:
        if self._closed:
            raise BusError("the bus is closed")

        async def on_notice(msg: Msg) -> None:
            try:
                notice = decode_cancel_notice(msg.data)
            except DecodeError as e:
                await self._bad(msg.subject, msg.data, str(e))
                return
            if notice.agent_id != agent_id:  # the subject is the agent's: the body must agree
                await self._bad(msg.subject, msg.data, f"a notice for {notice.agent_id!r}")
                return
            try:
                handler(notice)
            except Exception:
                log.exception("cancel notice handler failed on %s", msg.subject)

        with translated("cannot watch cancel notices", error=BusError, refused=BusError):
            sub = await self.nc.subscribe(cancel_subject(agent_id), cb=on_notice)
            await self.nc.flush()  # the server knows of it: notices sent from now on arrive
        self._subs.append(sub)

    # -- chunks of model answers (core NATS, only while watched: nats_chunks) ---------

    carries_chunks = True

    def chunks_watched(self, root_id: str) -> bool:
        return self._chunks.watched(root_id)

    async def publish_chunk(self, chunk: Chunk) -> None:
        if not self._closed:
            await self._chunks.publish(chunk)

    async def hear_watchers(self) -> None:
        if self._closed:
            raise BusError("the bus is closed")
        with translated("cannot hear chunk watchers", error=BusError, refused=BusError):
            await self._chunks.hear()

    async def watch_chunks(self, handler: ChunkHandler, root_id: str | None = None) -> StopWatching:
        if self._closed:
            raise BusError("the bus is closed")
        with translated("cannot watch chunks", error=BusError, refused=BusError):
            return await self._chunks.watch(handler, root_id)

    # -- agent -> orchestrator requests (core request/reply, not persisted) ----------

    async def serve_requests(self, handler: RequestHandler) -> None:
        """Answer every agent's request with ``handler`` (a queue group: one server each)."""
        if self._closed:
            raise BusError("the bus is closed")

        async def on_request(msg: Msg) -> None:
            self._spawn(self._answer(msg, handler), "request")

        with translated("cannot serve requests", error=BusError, refused=BusError):
            sub = await self.nc.subscribe(f"{REQUEST_PREFIX}.>", queue=REQUEST_QUEUE, cb=on_request)
            await self.nc.flush()  # the server knows of it: requests sent from now on are served
        self._subs.append(sub)

    async def _answer(self, msg: Msg, handler: RequestHandler) -> None:
        if not msg.reply:
            await self._bad(msg.subject, msg.data, "request without a reply subject")
            return
        headers: dict[str, str] | None = None
        try:
            if len(msg.data) > self.max_message_bytes:
                raise DecodeError(f"request too large: {len(msg.data)} bytes")
            request = rq.decode_request(msg.data)
        except DecodeError as e:
            await self._bad(msg.subject, msg.data, str(e))
            data = rq.encode(
                rq.AgentResponse(request_id="", ok=False, error=str(e), error_type="bad_request")
            )
        else:
            sender = msg.subject[len(REQUEST_PREFIX) + 1 :]
            sender = decode_token(sender) if "." not in sender else ""
            if request.agent_id != sender:
                why = f"sent by {sender!r} in the name of {request.agent_id!r}"
                await self._refused(
                    Refusal(
                        "request",
                        request.agent_id,
                        sender,
                        why,
                        request.task_id,
                        request.attempt,
                        msg.subject,
                    )
                )
                refused = rq.AgentResponse(
                    request_id=request.request_id,
                    ok=False,
                    error=f"request refused: {why}",
                    error_type="access_denied",
                )
                with contextlib.suppress(*TRANSPORT_ERRORS):
                    await self.nc.publish(msg.reply, rq.encode(refused))
                return
            token = _trace.set(request.traceparent or header(msg, TRACE_HEADER))
            try:
                data = rq.encode(await handler(request))
            except asyncio.CancelledError:
                raise
            except Exception as e:  # the server's bug reaches the agent as a bus error
                data, headers = b"", {ERROR_HEADER: repr(e)[:1000]}
            finally:
                _trace.reset(token)
        with contextlib.suppress(*TRANSPORT_ERRORS):
            await self.nc.publish(msg.reply, data, headers=headers)

    async def request(self, request: rq.AgentRequest, timeout: float = 30.0) -> rq.AgentResponse:
        """Ask the orchestrator (``cardbus.req.<agent>``) and wait for its answer."""
        if self._closed:
            raise BusError("the bus is closed")
        data = rq.encode(request)
        if len(data) > self.max_message_bytes:
            raise BusError(f"request {request.request_id} is too large: {len(data)} bytes")
        headers = {TRACE_HEADER: request.traceparent} if request.traceparent else None
        subject = f"{REQUEST_PREFIX}.{encode_token(request.agent_id)}"
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        pause = 0.05
        with translated(f"request {request.request_id} failed", error=BusError, refused=BusError):
            while True:
                try:
                    left = max(0.001, deadline - loop.time())
                    msg = await self.nc.request(subject, data, timeout=left, headers=headers)
                    break
                except nats.errors.NoRespondersError as e:  # what it means on this subject
                    # an orchestrator (re)starting has no subscription for a moment: ask
                    # again until the request's own time is up (no responder means nobody
                    # got it, so asking again cannot do anything twice)
                    if loop.time() + pause >= deadline:
                        raise BusError("no orchestrator serves agent requests on this bus") from e
                    await asyncio.sleep(pause)
                    pause = min(pause * 2, 1.0)
                except TimeoutError as e:
                    raise BusError(
                        f"no answer to request {request.request_id} in {timeout:g}s"
                    ) from e
        failure = header(msg, ERROR_HEADER)
        if failure is not None:
            raise BusError(f"request {request.request_id} failed on the server: {failure}")
        try:
            return rq.decode_response(msg.data)
        except DecodeError as e:
            raise BusError(f"bad answer to request {request.request_id}: {e}") from e

    # -- bad messages ------------------------------------------------------------

    async def _refused(self, refusal: Refusal) -> None:
        """Report a message refused for its sender (``on_refused``); never raises."""
        log.warning("refused %s on %s: %s", refusal.kind, refusal.subject, refusal.reason)
        if self.on_refused is not None:
            try:
                result = self.on_refused(refusal)
                if inspect.isawaitable(result):
                    await result
            except Exception:
                log.exception("on_refused failed")

    async def _reject(self, msg: Msg, reason: str) -> None:
        """Dead-letter ``msg``, report it, and stop its redelivery."""
        await self._bad(msg.subject, msg.data, reason)
        with contextlib.suppress(*TRANSPORT_ERRORS):
            await msg.term()

    async def _bad(self, subject: str, data: bytes, reason: str) -> None:
        log.warning("bad message on %s: %s", subject, reason)
        kind = subject.split(".")[1] if subject.count(".") >= 1 else "other"
        headers = {REASON_HEADER: reason[:1000], SUBJECT_HEADER: subject}
        try:
            await self._publish(
                f"{DEAD_PREFIX}.{encode_token(kind)}",
                data[: self.max_message_bytes],
                headers,
                DEAD_STREAM,
            )
        except Exception as e:  # never let a report crash the bus
            log.error("cannot dead-letter a bad message from %s: %r", subject, e)
        if self.on_bad_message is not None:
            try:
                result = self.on_bad_message(subject, data, reason)
                if inspect.isawaitable(result):
                    await result
            except Exception:
                log.exception("on_bad_message failed")

    # -- closing -------------------------------------------------------------------

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self._reply_acks is not None:  # the replies taken are acked before we go
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._reply_acks.drain(), 2.0)
        if self._partition_replies is not None:  # settled ones acked, the rest handed back
            await self._partition_replies.close()
        await self._chunks.close()
        for task in list(self._tasks):
            task.cancel()
        for task in list(self._tasks):
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        for sub in self._subs:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(sub.unsubscribe(), 2.0)
        self._subs.clear()
        for unhook in self._unhook:
            unhook()
        self._unhook.clear()
        await self._mux.close()
        if self.delete_reply_consumer and self._reading_replies:
            with contextlib.suppress(Exception):
                await self._js.delete_consumer(REPLY_STREAM, self.reply_durable)
        if self._owns:  # every publish was acked already: nothing to drain
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self.nc.close(), 5.0)


class _Slots:
    """The handlers of one agent's ``consume`` calls on a bus: each takes one card at a
    time."""

    __slots__ = ("freed", "idle", "total")

    def __init__(self, handler: CardHandler) -> None:
        self.idle: list[CardHandler] = [handler]
        self.total = 1
        self.freed: Callable[[None], None] = lambda _: None  # wakes the pull loop

    def add(self, handler: CardHandler) -> None:
        self.idle.append(handler)
        self.total += 1
        self.freed(None)


def _delivered(msg: Msg) -> int:
    try:
        return int(msg.metadata.num_delivered)
    except Exception:
        return 1
