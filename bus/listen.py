"""The listening socket of a network door (the console, the A2A gateway), bound before serving.

uvicorn binds its own socket inside ``Server.serve`` and, when the port is
taken, logs the error and exits the process (``SystemExit(3)``, a traceback
when it runs in a task). Binding here first turns that into
:class:`~cardbus.eventstore.errors.PortInUse` (one line: ``port 8765 is in
use on 127.0.0.1: pass --port with another port``) before anything else
starts, and tells the port actually bound when 0 asked for any free one.
The socket is handed to uvicorn (``Server.serve(sockets=[sock])``).
"""

from __future__ import annotations

import errno
import socket

from cardbus.eventstore.errors import ConfigError, PortInUse

__all__ = ["listen_socket"]


def listen_socket(host: str, port: int, option: str = "--port") -> socket.socket:
    """A TCP socket bound to ``host``:``port`` (as uvicorn binds one: ``SO_REUSEADDR``,
    IPv6 when ``host`` has a colon); ``PortInUse`` naming ``option`` when it is taken,
    ``ConfigError`` for another bind error (an address this machine does not have)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        # what uvicorn does: a restart binds while the old connections are in TIME_WAIT;
        # a port another process listens on is still refused (EADDRINUSE)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host.strip("[]"), port))
        sock.listen(2048)
    except OSError as e:
        sock.close()
        if e.errno == errno.EADDRINUSE:
            raise PortInUse(host, port, option) from e
        raise ConfigError(f"cannot listen on {host}:{port}: {e.strerror or e}") from e
    sock.set_inheritable(True)
    return sock
