"""``NatsEventStore``: the event store on NATS JetStream -- opening, the stream's set-up
and closing; appends, reads and following are its parts (``appends.py``,
``together.py`` for ``append_many``, ``reads.py``, ``follow.py``)."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Sequence
from typing import Any

import nats.js.errors
from nats.aio.client import Client as NatsClient
from nats.js import api as js_api

from cardbus.eventstore.envelope import DEFAULT_MAX_EVENT_BYTES
from cardbus.eventstore.errors import (
    StoreError,
    StoreUnavailable,
    SubjectLayoutError,
    ValidationError,
)
from cardbus.eventstore.nats.audits import Audits
from cardbus.eventstore.nats.connection import (
    TRANSPORT_ERRORS,
    NatsOptions,
    connect,
    opened_with,
    translated,
    version_at_least,
)
from cardbus.eventstore.nats.follow import Follows, echoes
from cardbus.eventstore.nats.subjects import (
    DEFAULT_PARTITIONS,
    DEFAULT_STREAM,
    DEFAULT_SUBJECT_PREFIX,
    MAX_PARTITIONS,
    OLD_LAYOUT,
    PARTITIONS_KEY,
    SUBJECT_LAYOUT,
    SUBJECT_LAYOUT_KEY,
)
from cardbus.eventstore.nats.together import Together
from cardbus.eventstore.nats.wire import RequestMux
from cardbus.eventstore.store import EventStore

__all__ = ["NatsEventStore"]

log = logging.getLogger(__name__)


class NatsEventStore(Audits, Together, Follows, EventStore):
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
        store_retry_timeout: float = 15.0,
        follow: str = "auto",
        partitions: int = DEFAULT_PARTITIONS,
    ) -> None:
        if follow not in ("auto", "consumer"):
            raise ValidationError(f"follow must be 'auto' or 'consumer': {follow!r}")
        self.nc = nc
        #: how ``subscribe`` follows the log (follow.py): "auto" hands this connection's own
        #: appends over and reads the others' (when the connection does not echo); "consumer"
        #: has the server deliver every event (fewer messages once three or more processes
        #: write the log, each following all of it)
        self.follow = follow
        #: the stream's partition count (subjects.py), read from its metadata on connect
        self.partitions = partitions
        self.stream_name = stream_name
        self.subject_prefix = subject_prefix
        self.max_event_bytes = max_event_bytes
        self.request_timeout = request_timeout
        self.atomic = atomic
        self.max_batch = max_batch
        self.read_batch = read_batch
        self.heartbeat = heartbeat
        self.store_retry_timeout = store_retry_timeout
        self._js = nc.jetstream(timeout=request_timeout)
        self._mux = RequestMux(nc, request_timeout)
        self._owns_connection = owns_connection
        self._closed = False
        self._readers = set()
        self._init_reads()
        self._init_appends()

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
        partitions: int = DEFAULT_PARTITIONS,
        max_event_bytes: int = DEFAULT_MAX_EVENT_BYTES,
        request_timeout: float = 5.0,
        store_retry_timeout: float = 15.0,
        heartbeat: float = 1.0,
        follow: str = "auto",
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
        failures (a reconnect, a stream leader election) are tried again with
        backoff for ``store_retry_timeout`` seconds (store retries) before
        ``StoreUnavailable``. A subscription looks for what it may have missed
        (other writers' events unheard) after ``heartbeat`` seconds without news,
        and then has the server tell it when anything is stored (``doorbell.py``);
        ``follow="consumer"`` has it follow through a consumer instead
        (see ``follow.py``). The connection options are those of
        :class:`~cardbus.eventstore.nats.connection.NatsOptions`.
        ``atomic=None`` uses atomic batches when the server has them. ``partitions``:
        the partition count of a stream this creates (an existing stream's own count,
        in its metadata, is used whatever this says; see ``subjects.py``).
        Any other keyword goes to ``nats.connect``.
        """
        options = NatsOptions(
            url=url,
            token=token,
            user=user,
            password=password,
            nkeys_seed=nkeys_seed,
            user_credentials=user_credentials,
            tls_ca=tls_ca,
            tls_cert=tls_cert,
            tls_key=tls_key,
            tls_hostname=tls_hostname,
            connect_timeout=connect_timeout,
            max_reconnect_attempts=max_reconnect_attempts,
            reconnect_time_wait=reconnect_time_wait,
            reconnect_max_wait=reconnect_max_wait,
        )
        # no_echo: the server does not send this connection its own appends (follow.py)
        nc = await connect(
            options, name, error=StoreUnavailable, **{"no_echo": True, **nats_options}
        )
        try:
            store = cls(
                nc,
                stream_name=stream_name,
                subject_prefix=subject_prefix,
                max_event_bytes=max_event_bytes,
                request_timeout=request_timeout,
                store_retry_timeout=store_retry_timeout,
                heartbeat=heartbeat,
                follow=follow,
            )
            await store._ensure_stream(
                create=create_stream,
                replicas=replicas,
                storage=storage,
                duplicate_window=duplicate_window,
                deny_delete=deny_delete,
                atomic=atomic,
                partitions=partitions,
            )
        except BaseException:
            with contextlib.suppress(Exception):
                await nc.close()
            raise
        return store

    @classmethod
    async def from_connection(
        cls,
        nc: NatsClient,
        *,
        create_stream: bool = True,
        own_connection: bool | None = None,
        **options: Any,
    ) -> NatsEventStore:
        """A store beside an existing connection (shared with a bus); ``close`` leaves it open.

        A connection that hears its own publishes (a bus's: it may answer its own
        requests) would have the log's follower get every event this store appends
        back from the server. So when ``nc`` echoes and cardbus opened it
        (``NatsOptions.connect``), the store opens its own connection the same way
        with ``no_echo`` (named ``<name>-log``) and closes it on ``close``;
        ``own_connection=False`` keeps the store on ``nc`` (followed through a
        consumer), ``True`` asks for its own even if ``nc`` does not echo.
        """
        setup = {
            k: options.pop(k)
            for k in (
                "replicas",
                "storage",
                "duplicate_window",
                "deny_delete",
                "atomic",
                "partitions",
            )
            if k in options
        }
        made = opened_with(nc)
        if own_connection is None:
            own_connection = made is not None and echoes(nc)
        if own_connection and made is None:
            raise ValidationError(
                "own_connection=True needs a connection opened by NatsOptions.connect"
            )
        if own_connection and made is not None:
            opts, name, extra = made
            mine = await connect(
                opts, f"{name}-log", error=StoreUnavailable, **{**extra, "no_echo": True}
            )
            try:
                store = cls(mine, owns_connection=True, **options)
                await store._ensure_stream(create=create_stream, **setup)
            except BaseException:
                with contextlib.suppress(Exception):
                    await mine.close()
                raise
            return store
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
        partitions: int = DEFAULT_PARTITIONS,
    ) -> None:
        if isinstance(partitions, bool) or not isinstance(partitions, int):
            raise ValidationError(f"partitions must be an integer: {partitions!r}")
        if not 1 <= partitions <= MAX_PARTITIONS:
            raise ValidationError(f"partitions must be 1 to {MAX_PARTITIONS}: {partitions}")
        server_has_atomic = version_at_least(self.nc.connected_server_version, 2, 12)
        want_atomic = server_has_atomic if atomic is None else (atomic and server_has_atomic)
        if atomic and not server_has_atomic:
            log.warning("nats-server < 2.12 has no atomic batch publish: appends are not atomic")
        with translated(
            f"cannot set up stream {self.stream_name!r}",
            error=StoreUnavailable,
            refused=StoreUnavailable,
        ):

            async def get_or_create() -> js_api.StreamInfo:
                try:
                    return await self._js.stream_info(self.stream_name)
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
                        metadata={
                            SUBJECT_LAYOUT_KEY: SUBJECT_LAYOUT,
                            PARTITIONS_KEY: str(partitions),
                        },
                    )
                    try:
                        return await self._js.add_stream(config)
                    except nats.js.errors.BadRequestError:
                        # Created concurrently by another process? Then it is there now.
                        return await self._js.stream_info(self.stream_name)

            # store retries: a cluster still electing the stream's leader times out at first
            info = await self._retry(get_or_create)
            await self._check_layout(info, partitions)
            if want_atomic and not info.config.allow_atomic:
                try:
                    info.config.allow_atomic = True
                    info = await self._js.update_stream(info.config)
                except nats.js.errors.APIError as e:
                    log.warning("cannot enable atomic batches on %s: %s", self.stream_name, e)
            self.atomic = bool(info.config.allow_atomic)
            self._replicas = int(info.config.num_replicas or 1)
            if info.config.allow_direct and version_at_least(
                self.nc.connected_server_version, 2, 11
            ):
                await self._setup_direct_reads()
            subjects = info.config.subjects or []
            if f"{self.subject_prefix}.>" not in subjects and ">" not in subjects:
                raise StoreError(
                    f"stream {self.stream_name!r} does not capture {self.subject_prefix}.>"
                    f" (its subjects: {subjects})"
                )

    async def _check_layout(self, info: js_api.StreamInfo, partitions: int) -> None:
        """Refuse a stream written in another subject layout (README, "Running on NATS");
        take the stream's partition count."""
        metadata = info.config.metadata or {}
        layout = metadata.get(SUBJECT_LAYOUT_KEY)
        if layout == SUBJECT_LAYOUT:
            try:
                self.partitions = int(metadata.get(PARTITIONS_KEY, ""))
            except ValueError:
                raise SubjectLayoutError(
                    f"JetStream stream {self.stream_name!r} names no partition count"
                    f" ({PARTITIONS_KEY}={metadata.get(PARTITIONS_KEY)!r} in its metadata)"
                ) from None
            return
        events = int(info.state.messages or 0) if info.state else 0
        if layout is None and events == 0:
            # An empty stream made outside cardbus (or by a version before the marker):
            # nothing to misread. Mark it so the next connect knows; without the right
            # to update the stream, go on unmarked.
            self.partitions = partitions
            try:
                info.config.metadata = {
                    **metadata,
                    SUBJECT_LAYOUT_KEY: SUBJECT_LAYOUT,
                    PARTITIONS_KEY: str(partitions),
                }
                await self._js.update_stream(info.config)
            except TRANSPORT_ERRORS as e:
                log.warning("cannot mark %s with its subject layout: %r", self.stream_name, e)
            return
        found = layout or f"{OLD_LAYOUT} (no {SUBJECT_LAYOUT_KEY!r} in its metadata)"
        how = (
            "JetStream cannot rename stored subjects: use a new stream (another server or"
            " store directory, or stream_name=NEW) and keep this one for reading with the"
            " cardbus that wrote it"
        )
        raise SubjectLayoutError(
            f"JetStream stream {self.stream_name!r} holds {events} events in subject layout"
            f" {found}; this cardbus reads {self.subject_prefix}.<task>.<partition>.<root>.<kind>"
            f" (layout {SUBJECT_LAYOUT}): {how}."
        )

    # -- lifecycle -------------------------------------------------------------

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        for reader in list(self._readers):
            await reader.close()
        self._close_appends()
        self._close_reads()
        await self._mux.close()
        if self._direct_sub is not None:
            with contextlib.suppress(Exception):
                await self._direct_sub.unsubscribe()
        if self._owns_connection:
            with contextlib.suppress(Exception):
                await self.nc.close()
