"""A slow link on loopback: a TCP proxy that holds every byte for ``delay_s`` each way.

A client connected through it sees a server ``delay_s`` away (round trip twice that),
with nothing lost or reordered: what a NATS client on another continent, or behind a
congested link, sees. A pull request of a JetStream consumer reaches the server late,
and the card it is answered with reaches the client late, after the request's own
``expires`` when the delay is long enough: a client that forgets a pull once its
``expires`` has passed drops that card (it stays delivered and unacked, until its ack
wait brings it back).

    with SlowLink(server.port, delay_s=0.6) as link:
        connect(link.url)  # the same nats-server, 0.6 s away each way

The proxy runs its own event loop in a thread, so synchronous tests (subprocesses and
``cardbus`` commands) can use it as well as async ones.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from types import TracebackType

__all__ = ["SlowLink"]

_CHUNK = 65536


class SlowLink:
    """Listens on a free loopback port; each connection is piped to ``target_port`` on
    loopback, every chunk written out ``delay_s`` after it was read, in order."""

    def __init__(self, target_port: int, delay_s: float, host: str = "127.0.0.1") -> None:
        self.target = (host, target_port)
        self.host = host
        self.delay_s = delay_s
        self.port = 0
        self.connections = 0  # how many clients came through it
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, name="slowlink", daemon=True)
        self._failure: BaseException | None = None

    @property
    def url(self) -> str:
        return f"nats://{self.host}:{self.port}"

    def __enter__(self) -> SlowLink:
        self._thread.start()
        if not self._ready.wait(10) or self._failure is not None:
            raise RuntimeError(f"the slow link did not start: {self._failure!r}")
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._loop is not None and self._stop is not None:
            self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(10)

    def _run(self) -> None:
        try:
            asyncio.run(self._serve())
        except BaseException as e:  # seen by __enter__ when it never started
            self._failure = e
            self._ready.set()

    async def _serve(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._stop = asyncio.Event()
        pipes: set[asyncio.Task[None]] = set()

        async def accepted(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            self.connections += 1
            try:
                up_reader, up_writer = await asyncio.open_connection(*self.target)
            except OSError:
                writer.close()
                return
            for src, dst in ((reader, up_writer), (up_reader, writer)):
                task = asyncio.ensure_future(self._pipe(src, dst))
                pipes.add(task)
                task.add_done_callback(pipes.discard)

        server = await asyncio.start_server(accepted, self.host, 0)
        self.port = server.sockets[0].getsockname()[1]
        self._ready.set()
        async with server:
            await self._stop.wait()
            server.close()
            for task in list(pipes):
                task.cancel()
            await asyncio.gather(*pipes, return_exceptions=True)

    async def _pipe(self, src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
        """Bytes from ``src`` to ``dst``, each chunk ``delay_s`` after it came."""
        loop = asyncio.get_running_loop()
        held: asyncio.Queue[tuple[float, bytes]] = asyncio.Queue()

        async def deliver() -> None:
            while True:
                due, data = await held.get()
                if (wait := due - loop.time()) > 0:
                    await asyncio.sleep(wait)
                if not data:  # the other side closed: close this one, as late
                    break
                dst.write(data)
                await dst.drain()

        delivering = asyncio.ensure_future(deliver())
        try:
            while True:
                try:
                    data = await src.read(_CHUNK)
                except OSError:
                    data = b""
                held.put_nowait((loop.time() + self.delay_s, data))
                if not data:
                    break
            await delivering
        except OSError:  # either side gone: the link is down
            pass
        finally:
            delivering.cancel()
            with contextlib.suppress(Exception):
                dst.close()
