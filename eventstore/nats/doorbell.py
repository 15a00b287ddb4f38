"""An idle echo-free follower's wait on the server (``follow.py``), instead of polling.

The follower hears other writers' appends as core publishes (*hints*). A hint can be
lost without a reconnect (a route down in a cluster, a client-side slow consumer), so
a follower with nothing heard used to read the log after a heartbeat, then after 2, 4,
... up to 30 heartbeats: reads that find nothing, a round trip each, most of an idle
runtime's wake-ups just after work.

The doorbell asks the server instead. Armed after a heartbeat with nothing heard, it is
one ephemeral pull consumer on the log from the follower's next position (headers
only, AckNone, in memory, R1) and one pull request for one message with a long expiry:
the server answers as soon as anything is stored at or after that position, whoever
wrote it, and says nothing before. Creating it tells what is stored there already
(``num_pending``), so arming is also the look the first idle read was. Any activity
disarms it (the consumer is deleted, fire and forget: no answer to wait for); the
request's expiry (30 heartbeats, the old idle read's longest wait) or any answer that
is not a message re-arms it, so a ring lost in transit costs at most that, as a lost
hint did before. A request that expired (``408``, nothing stored) is only asked again
(``again``: one pull request on the same consumer, still at the same position, since it
delivered nothing), where re-arming was a delete, a creation's round trip and a request:
one wake-up of an idle process every 30 heartbeats instead of two. A reconnect wakes the
follower, which reads and re-arms later.

A partitioned orchestrator member (``bus.runtime.member_bell``) arms one over several
filters (its shared and held partitions: ``filter_subjects``); ``subject`` tells where
the message that rang it is stored.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Sequence
from typing import Any

import msgspec
import nats.js.errors
from nats.aio.msg import Msg

from cardbus.eventstore.nats.wire import StoreBase, status

__all__ = ["Doorbell"]


class _Created(msgspec.Struct):
    """What the arming reads of the server's answer to a consumer's creation."""

    name: str = ""
    num_pending: int = 0
    error: dict[str, Any] | None = None


_CREATED = msgspec.json.Decoder(_Created)

#: the status of a pull request that expired with nothing delivered
EXPIRED = "408"


class Doorbell:
    """One follower's doorbell: ``arm``, then ``wake`` is set when the server answers
    (``rang``: a message stored, ``ended``: the request is over without one)."""

    __slots__ = (
        "_inbox",
        "_sub",
        "_token",
        "armed_at",
        "consumer",
        "ended",
        "expired",
        "filt",
        "rang",
        "store",
        "subject",
        "wake",
    )

    def __init__(self, store: StoreBase, filt: str | Sequence[str], wake: asyncio.Event) -> None:
        self.store = store
        self.filt = filt  # (several: a member's partitions; set before an arming)
        self.wake = wake
        self.consumer: str | None = None
        self.armed_at = 0.0
        self.rang = False  # a message is stored at or after the armed position
        self.ended = False  # the request ended without one (expiry, consumer gone...)
        self.expired = False  # ...by its expiry alone (408): ``again`` asks once more
        self.subject = ""  # where the message that rang is stored
        self._sub: Any = None
        self._inbox = ""
        self._token = 0  # answers to an earlier arming are ignored

    @property
    def armed(self) -> bool:
        return self.consumer is not None

    async def listen(self) -> None:
        """Subscribe to the armings' answers, once: its owner does so as it starts, so
        that the first arming, as an idle spell begins, is no subscription (its message
        and task) but the creation and the request alone."""
        if self._sub is None:
            nc = self.store.nc
            inbox = nc.new_inbox()
            self._sub = await nc.subscribe(f"{inbox}.*", cb=self._on_answer)
            self._inbox = inbox

    async def arm(self, start: int, expires: float) -> int:
        """Ask for an answer when anything is stored at ``start`` or after; how many
        messages are there already (then no request is made: read them)."""
        store = self.store
        if self._sub is None:
            await self.listen()
        # (through the store's request mux, the answer decoded for the two fields used:
        # nats-py's add_consumer parses the whole consumer info, a third of the arming)
        config = {
            "deliver_policy": "by_start_sequence",
            "opt_start_seq": max(start, 1),
            "ack_policy": "none",
            **(
                {"filter_subject": self.filt}
                if isinstance(self.filt, str)
                else {"filter_subjects": list(self.filt)}
            ),
            "headers_only": True,
            "mem_storage": True,
            "num_replicas": 1,
            # (gone by itself some time after its request, should the delete be lost)
            "inactive_threshold": int((expires + max(10.0, 10 * store.heartbeat)) * 1e9),
            "max_waiting": 1,
        }
        msg = await store._mux.request(
            f"$JS.API.CONSUMER.CREATE.{store.stream_name}",
            msgspec.json.encode({"stream_name": store.stream_name, "config": config}),
        )
        info = _CREATED.decode(msg.data)
        if info.error is not None or not info.name:
            raise nats.js.errors.APIError.from_error(info.error or {"description": "no name"})
        self._token += 1
        self.consumer = info.name
        self.rang = self.ended = self.expired = False
        self.armed_at = asyncio.get_running_loop().time()
        pending = info.num_pending
        if pending:
            await self.disarm()
            return pending
        await self._ask(expires)
        return 0

    async def again(self, expires: float) -> None:
        """(Armed, ``expired``) Ask the same consumer again: it delivered nothing, so it
        still waits at the armed position; no new consumer, no round trip."""
        self._token += 1  # (a late answer to the expired request is not for this one)
        self.ended = self.expired = False
        self.armed_at = asyncio.get_running_loop().time()
        await self._ask(expires)

    async def _ask(self, expires: float) -> None:
        """The pull request for one message, answered to this arming's own inbox."""
        body = msgspec.json.encode({"batch": 1, "expires": int(expires * 1e9)})
        try:
            await self.store.nc.publish(
                f"$JS.API.CONSUMER.MSG.NEXT.{self.store.stream_name}.{self.consumer}",
                body,
                reply=f"{self._inbox}.{self._token}",
            )
        except BaseException:
            await self.disarm()  # not armed: no request waits on the server
            raise

    async def _on_answer(self, msg: Msg) -> None:
        consumer = self.consumer
        if consumer is None:
            return
        # (an answer to an arming disarmed since is not for us: a message names its
        # consumer in its ack subject, a status comes to the arming's own inbox)
        code = status(msg)
        if code is None:
            if f".{consumer}." not in (msg.reply or ""):
                return
            self.rang, self.subject = True, msg.subject
        else:
            if msg.subject != f"{self._inbox}.{self._token}":
                return
            self.ended = True  # 408 expired, 409 consumer deleted, ...: arm again
            self.expired = code == EXPIRED
        self.wake.set()

    async def disarm(self) -> None:
        """Stop waiting: the consumer is deleted (no answer asked for)."""
        consumer, self.consumer = self.consumer, None
        self._token += 1
        self.rang = self.ended = self.expired = False
        nc = self.store.nc
        if consumer is not None and not nc.is_closed:
            # (no reply: nothing to wait for; a delete lost, it expires by itself)
            with contextlib.suppress(Exception):
                await nc.publish(
                    f"$JS.API.CONSUMER.DELETE.{self.store.stream_name}.{consumer}", b""
                )

    async def close(self) -> None:
        await self.disarm()
        sub, self._sub = self._sub, None
        if sub is not None:
            with contextlib.suppress(Exception):
                await sub.unsubscribe()
