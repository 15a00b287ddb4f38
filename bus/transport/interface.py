"""The ``Bus`` interface: how cards move between the orchestrator and agents.

Backends are sibling modules (``inprocess`` = the embedded default, ``nats``)
and pass ``cardbus.testing.BusContract`` (``tests/contract/bus.py``). The contract:

* ``consume(agent_id, handler)`` subscribes one consumer (a replica) to an
  agent's inbox; all replicas of an agent id share the inbox, so each card
  goes to one of them. A handler that raises gets the card again (at least
  once, up to ``max_deliver`` times); handlers must be idempotent by
  ``(task_id, attempt)``. ``consume_many(agent_id, handler, n)`` is ``n`` such
  consumers sharing one handler (a worker's ``max_concurrency``): by default ``n``
  calls of ``consume``; a backend may keep them as one entry with ``n`` slots.
* ``send_task(agent_id, card)`` puts a card in an agent's inbox; it returns
  once the bus has accepted it (on NATS: persisted).
* ``reply(message)`` sends an agent's answer (``Started``, ``ResultCard``,
  ``Announce``) to the orchestrator; ``replies()`` yields them, in order of
  arrival, at least once. Replies are persisted where the backend can, so a
  result survives an orchestrator that is down.
* Everything crossing the bus is encoded bytes (``agents.cards.encode``), even
  in-process, so the in-process bus exercises the same codec; undecodable
  bytes are reported through ``on_bad_message`` and never crash the bus.
* Optional (the defaults raise ``BusError``): the agent -> orchestrator
  request path. ``request(req, timeout)`` sends an ``AgentRequest`` from an
  agent and returns the orchestrator's ``AgentResponse`` (``BusError`` when
  no answer comes within ``timeout`` or nobody serves requests);
  ``serve_requests(handler)`` makes ``handler`` answer every request (one
  server per bus; requests of many agents are served concurrently). On NATS:
  core request/reply on ``cardbus.req.<agent_id>``, served by a queue-group
  subscription on ``cardbus.req.>``; not persisted (a request nobody answers
  times out and the agent sees ``BusError``).
* Cancel notices (optional; the defaults do nothing): ``cancel_attempt(notice)``
  tells the agent running ``(task_id, attempt)`` to stop its handler (the task
  was cancelled or halted meanwhile); ``watch_cancels(agent_id, handler)`` has
  ``handler`` called with each notice for that agent. A notice is a hint, at
  most once: a worker also asks the orchestrator now and then whether a long
  handler's attempt is still live (``attempt.live``), so a lost notice delays the
  stop, never prevents it. On NATS: core publish on ``cardbus.cancel.<agent_id>``,
  which only orchestrators may publish and only that agent may subscribe to.
* Chunks (optional; the defaults carry none): the text of a model answer as it is
  written, an ephemeral view beside the log (``agents.streaming``). Agent side:
  ``chunks_watched(root_id)`` says, cheaply and without waiting, whether anyone
  watches that run now, and ``publish_chunk(chunk)`` sends one (best effort, at
  most once; a worker sends only what is watched); ``hear_watchers()`` starts
  learning who watches. Watcher side: ``watch_chunks(handler, root_id)`` calls
  ``handler`` with each chunk of that run (None: of every run) until the
  returned ``stop()`` is awaited. ``carries_chunks`` says whether the bus has
  such a channel. On NATS: core publish on ``cardbus.chunk.<agent>.<root>``
  (``bus.transport.nats_chunks``), never JetStream.
* Sender identity: a transport that knows who sent a message (NATS: the
  subject, which the server's permissions restrict to the agent's own user)
  refuses a reply or request that names another agent than its sender,
  and reports it to ``on_refused`` as a :class:`Refusal` (the orchestrator
  records it as ``reply.refused``); it never reaches ``replies()`` or the
  request handler. The in-process bus has no other senders than the agents
  its owner constructed: it refuses nothing.
"""

from __future__ import annotations

import abc
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from dataclasses import dataclass

from cardbus.agents.cards import CancelNotice, Reply, TaskCard
from cardbus.agents.requests import AgentRequest, AgentResponse
from cardbus.agents.streaming import Chunk
from cardbus.eventstore.errors import BusError

__all__ = [
    "BadMessage",
    "Bus",
    "CancelHandler",
    "CardHandler",
    "ChunkHandler",
    "StopWatching",
    "Refusal",
    "Refused",
    "RequestHandler",
]

CardHandler = Callable[[TaskCard], Awaitable[None]]
CancelHandler = Callable[[CancelNotice], None]
RequestHandler = Callable[[AgentRequest], Awaitable[AgentResponse]]
ChunkHandler = Callable[[Chunk], None]
StopWatching = Callable[[], Awaitable[None]]
BadMessage = Callable[[str, bytes, str], Awaitable[None] | None]  # (subject, data, reason)


@dataclass(frozen=True)
class Refusal:
    """A reply or request refused because it speaks for another agent than its sender."""

    kind: str  # "result" | "started" | "announce" | "request"
    claimed: str  # the agent id the message names
    sender: str  # the agent the transport knows sent it ("" when it cannot tell)
    reason: str
    task_id: str = ""
    attempt: int = 0
    subject: str = ""


Refused = Callable[[Refusal], Awaitable[None] | None]


class Bus(abc.ABC):
    #: called with (subject, raw bytes, reason) for every undecodable message
    on_bad_message: BadMessage | None = None
    #: called with every reply or request refused for its sender (see the module doc)
    on_refused: Refused | None = None

    @abc.abstractmethod
    async def consume(self, agent_id: str, handler: CardHandler) -> None:
        """Start one consumer of ``agent_id``'s inbox (one replica)."""

    async def consume_many(self, agent_id: str, handler: CardHandler, n: int) -> None:
        """``n`` consumers of ``agent_id``'s inbox with one handler: up to ``n`` of its
        cards handled at once (the default: ``consume`` ``n`` times)."""
        for _ in range(n):
            await self.consume(agent_id, handler)

    @abc.abstractmethod
    async def send_task(self, agent_id: str, card: TaskCard) -> None:
        """Deliver ``card`` to one replica of ``agent_id``, at least once."""

    @abc.abstractmethod
    async def reply(self, message: Reply) -> None:
        """Send an agent's answer to the orchestrator."""

    @abc.abstractmethod
    def replies(self) -> AsyncIterator[Reply]:
        """Every reply, in arrival order, at least once."""

    def settle(self, replies: Iterable[Reply]) -> None:  # noqa: B027 (optional, no-op here)
        """Orchestrator side: done with ``replies`` (what they decided is recorded, or there
        was nothing to record). A transport that acks a reply only then (a partitioned
        NATS member's) gives an unsettled one to whoever reads its partition next."""

    async def request(self, request: AgentRequest, timeout: float = 30.0) -> AgentResponse:
        """Agent side: ask the orchestrator and wait for its answer (optional)."""
        raise BusError(f"{type(self).__name__} does not carry agent requests")

    async def serve_requests(self, handler: RequestHandler) -> None:
        """Orchestrator side: answer every agent request with ``handler`` (optional)."""
        raise BusError(f"{type(self).__name__} does not carry agent requests")

    async def cancel_attempt(self, notice: CancelNotice) -> None:  # noqa: B027 (optional)
        """Orchestrator side: ask the agent running ``notice``'s attempt to stop it (a hint,
        at most once; the worker's ``attempt.live`` check is the backstop)."""

    async def watch_cancels(self, agent_id: str, handler: CancelHandler) -> None:  # noqa: B027
        """Agent side: call ``handler`` with every cancel notice for ``agent_id``."""

    #: whether this bus has a chunk channel (``watch_chunks`` works)
    carries_chunks: bool = False

    #: whether a card sent goes to a consumer of this process at once, the send taking no
    #: time of its own (the in-process bus): the orchestrator then sends a decision's cards
    #: before folding what it stored (``bus.orchestrator.sending``); over a network the
    #: send waits on the server, and the fold does not wait for it
    local_delivery: bool = False

    def chunks_watched(self, root_id: str) -> bool:
        """Agent side: whether anyone watches run ``root_id``'s chunks now (no I/O)."""
        return False

    async def publish_chunk(self, chunk: Chunk) -> None:  # noqa: B027 (optional, no-op here)
        """Agent side: send one chunk to its watchers (best effort, at most once)."""

    async def hear_watchers(self) -> None:  # noqa: B027 (optional, no-op here)
        """Agent side: start learning which runs are watched (before the first card)."""

    async def watch_chunks(self, handler: ChunkHandler, root_id: str | None = None) -> StopWatching:
        """Watcher side: ``handler`` gets each chunk of run ``root_id`` (None: every run);
        await the answer to stop."""
        raise BusError(f"{type(self).__name__} carries no chunks")

    @abc.abstractmethod
    async def close(self) -> None:
        """Stop consumers and release the transport."""

    async def __aenter__(self) -> Bus:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()
