"""Real servers the tests start and stop themselves: extra Redis instances, a Redis Cluster,
and a TCP proxy that can refuse or cut connections to a real server.

Everything listens on 127.0.0.1 only, on ports the operating system hands out.
"""

from __future__ import annotations

import atexit
import contextlib
import random
import shutil
import socket
import subprocess
import tempfile
import threading
import time
from pathlib import Path

__all__ = ["RedisCluster", "RedisServer", "TcpProxy", "free_port", "redis_cluster"]


def free_port(low: int = 20_000, high: int = 50_000, *, bus: bool = False) -> int:
    """A free port between ``low`` and ``high``; with ``bus``, one whose cluster bus port
    (10,000 higher, below 65,536) is free too: a cluster node that cannot listen on its bus
    port exits at start."""
    for _ in range(100):
        port = random.randint(low, high)
        if all(_bindable(p) for p in ((port, port + 10_000) if bus else (port,))):
            return port
    raise RuntimeError("no free port")


def _bindable(port: int) -> bool:
    with socket.socket() as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def _wait(predicate: object, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():  # type: ignore[operator]
            return
        time.sleep(0.05)
    raise RuntimeError(f"timed out waiting for {what}")


def _redis_cli(port: int, *args: str) -> str:
    return subprocess.run(
        ["redis-cli", "-h", "127.0.0.1", "-p", str(port), *args],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    ).stdout


class RedisServer:
    """One redis-server process on a free port, nothing persisted.

    Args:
        extra: More ``redis-server`` options, e.g. ``["--maxmemory", "2mb"]``.
    """

    def __init__(self, *extra: str, port: int | None = None) -> None:
        if shutil.which("redis-server") is None:
            raise RuntimeError("redis-server is not installed")
        self.bus = "--cluster-enabled" in extra
        self.port = port or free_port(bus=self.bus)
        self.extra = extra
        self.folder = Path(tempfile.mkdtemp(prefix="tk-redis-"))
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> RedisServer:
        """Start the server; on a port someone else took meanwhile, try another port."""
        for attempt in range(3):
            try:
                return self._start()
            except RuntimeError:
                self.stop()
                if attempt == 2:
                    raise
                self.port = free_port(bus=self.bus)
        return self

    def _start(self) -> RedisServer:
        log = self.folder / "redis.log"
        self.process = subprocess.Popen(
            [
                "redis-server",
                "--bind",
                "127.0.0.1",
                "--port",
                str(self.port),
                "--save",
                "",
                "--appendonly",
                "no",
                "--dir",
                str(self.folder),
                "--logfile",
                str(log),
                *self.extra,
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        try:
            _wait(lambda: "PONG" in _redis_cli(self.port, "ping"), 10, f"redis on port {self.port}")
        except RuntimeError as error:
            tail = log.read_text()[-500:] if log.exists() else "(no log)"
            raise RuntimeError(f"{error}; its log ends: {tail}") from None
        return self

    def stop(self) -> None:
        if self.process is not None:
            self.process.kill()
            self.process.wait(timeout=10)
            self.process = None

    def restart(self) -> None:
        """Stop the server and start it again, empty (nothing is persisted)."""
        self.stop()
        self.start()

    def cli(self, *args: str) -> str:
        return _redis_cli(self.port, *args)

    def close(self) -> None:
        self.stop()
        shutil.rmtree(self.folder, ignore_errors=True)


class RedisCluster:
    """A three-primary Redis Cluster on free ports (redis-cli --cluster create), with
    ``replicas`` replicas of each primary; a node that does not answer for
    ``node_timeout_ms`` counts as failed to the others (a replica of a failed primary then
    takes its place)."""

    def __init__(self, size: int = 3, node_timeout_ms: int = 2000, replicas: int = 0) -> None:
        self.replicas = replicas
        self.nodes = [
            RedisServer("--cluster-enabled", "yes", "--cluster-node-timeout", str(node_timeout_ms))
            for _ in range(size * (1 + replicas))
        ]

    @property
    def url(self) -> str:
        return self.nodes[0].url

    def start(self) -> RedisCluster:
        for node in self.nodes:
            node.extra = (*node.extra, "--cluster-config-file", str(node.folder / "nodes.conf"))
            node.start()
        addresses = [f"127.0.0.1:{node.port}" for node in self.nodes]
        subprocess.run(
            [
                "redis-cli",
                "--cluster",
                "create",
                *addresses,
                "--cluster-replicas",
                str(self.replicas),
                "--cluster-yes",
            ],
            capture_output=True,
            timeout=60,
            check=True,
        )
        _wait(
            lambda: all("cluster_state:ok" in node.cli("cluster", "info") for node in self.nodes),
            30,
            "the cluster to be ready",
        )
        # A replica that has not synced with its primary yet cannot take its place.
        _wait(
            lambda: all(
                "master_link_status:up" in info
                for info in (node.cli("info", "replication") for node in self.nodes)
                if "role:slave" in info
            ),
            60,
            "the replicas to sync",
        )
        return self

    def close(self) -> None:
        for node in self.nodes:
            node.close()


_clusters: list[RedisCluster] = []
_cluster_lock = threading.Lock()


def redis_cluster() -> RedisCluster:
    """The session's Redis Cluster, started on first use and stopped at exit."""
    with _cluster_lock:
        if not _clusters:
            cluster = RedisCluster().start()
            atexit.register(cluster.close)
            _clusters.append(cluster)
        return _clusters[0]


class TcpProxy:
    """Forwards 127.0.0.1:<port> to a real server; can cut every connection and refuse more.

    ``refuse()`` closes the listening socket and every open connection: clients see their
    connection die and new connections refused, as when the server goes down. ``accept()``
    listens again on the same port. ``hold()`` keeps each new connection waiting, accepted
    but not yet forwarded (a server slow to answer), until ``release()``; ``holding`` is set
    once one waits. ``stall()`` makes every open connection mute, open but forwarding
    nothing either way, as a load balancer or NAT that dropped it without a word; new
    connections are forwarded. ``mute_replies()`` forwards what clients send and drops what
    the server answers, on every connection: requests run, their replies are lost.
    """

    def __init__(self, target_port: int, target_host: str = "127.0.0.1") -> None:
        self.target = (target_host, target_port)
        self.port = free_port()
        self._listener: socket.socket | None = None
        self._sockets: set[socket.socket] = set()
        self._guard = threading.Lock()
        self._forwarding = threading.Event()
        self._forwarding.set()
        self.holding = threading.Event()
        self._generation = 0  # connections of an older generation are mute (stall)
        self._answering = True  # the server's replies are forwarded (mute_replies)

    def accept(self) -> TcpProxy:
        listener = socket.socket()
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", self.port))
        listener.listen(64)
        self._listener = listener
        threading.Thread(target=self._serve, args=(listener,), daemon=True).start()
        return self

    def hold(self) -> None:
        """Keep connections accepted from now on waiting until :meth:`release`."""
        self._forwarding.clear()

    def release(self) -> None:
        self._forwarding.set()

    def stall(self) -> None:
        """Make every open connection mute: what either side sends is dropped."""
        self._generation += 1

    def mute_replies(self) -> None:
        """Drop what the server sends, on every connection: each request runs, and its
        reply is lost on the way."""
        self._answering = False

    def _serve(self, listener: socket.socket) -> None:
        while True:
            try:
                client, _ = listener.accept()
            except OSError:
                return
            with self._guard:
                self._sockets.add(client)
            threading.Thread(target=self._forward, args=(client,), daemon=True).start()

    def _forward(self, client: socket.socket) -> None:
        if not self._forwarding.is_set():
            self.holding.set()
        self._forwarding.wait()
        try:
            upstream = socket.create_connection(self.target)
        except OSError:
            client.close()
            return
        with self._guard:
            self._sockets.add(upstream)
        generation = self._generation
        for source, sink, replies in ((client, upstream, False), (upstream, client, True)):
            threading.Thread(target=self._pump, args=(source, sink, generation, replies), daemon=True).start()

    def _pump(self, source: socket.socket, sink: socket.socket, generation: int, replies: bool) -> None:
        try:
            while data := source.recv(65536):
                if generation == self._generation and (self._answering or not replies):
                    sink.sendall(data)
        except OSError:
            pass
        finally:
            for sock in (source, sink):
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)
                sock.close()

    def cut(self) -> None:
        """Kill every open connection (new ones are still accepted)."""
        with self._guard:
            sockets, self._sockets = self._sockets, set()
        for sock in sockets:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            sock.close()

    def refuse(self) -> None:
        """Stop listening and kill every open connection."""
        if self._listener is not None:
            # shutdown() wakes the thread blocked in accept(); close() alone would not, and the
            # kernel would go on accepting connections.
            with contextlib.suppress(OSError):
                self._listener.shutdown(socket.SHUT_RDWR)
            self._listener.close()
            self._listener = None
        self.cut()

    def close(self) -> None:
        self.refuse()
        self.release()
