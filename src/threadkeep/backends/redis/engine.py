"""Runs Redis programs on redis-py clients, sync and async, plain or Cluster.

A program yields :class:`Script` (an atomic Lua script on one thread's keys),
:class:`Command` (one single-key command), :class:`Pipeline` (several of them in one round
trip) or :class:`Scan` (every key matching a pattern, on every node). Scripts are loaded
once per client and called with EVALSHA; a script is loaded again when the server answers
NOSCRIPT (after a restart). A dropped connection
retries the whole program as the retry policy says (SPEC W4): every script is atomic, and
a step replayed after its reply was lost finds its checkpoint stored and passes. What the
server refuses (a login, a command the ACL user may not run, an error reply: :func:`refusal`)
is raised at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import inspect
import threading
import time
import weakref
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cache, partial
from importlib import resources
from typing import Any, Final, TypeVar
from urllib.parse import urlsplit

import redis
import redis.asyncio
import redis.asyncio.cluster
import redis.asyncio.retry
import redis.cluster
from redis.backoff import NoBackoff
from redis.exceptions import (
    AuthenticationError,
    AuthenticationWrongNumberOfArgsError,
    BusyLoadingError,
    ClusterDownError,
    MaxConnectionsError,
    NoPermissionError,
    NoScriptError,
    ReadOnlyError,
    RedisClusterException,
    RedisError,
    ResponseError,
    SlotNotCoveredError,
    TryAgainError,
)
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError
from redis.retry import Retry

from threadkeep.backends.closing import PerLoop, close_elsewhere
from threadkeep.core.program import Program, ProgramFactory, drive, drive_async
from threadkeep.core.retry import Refusal, RetryPolicy, Tries
from threadkeep.errors import StorageError

__all__ = [
    "Command",
    "Pipeline",
    "RedisEngine",
    "Scan",
    "Script",
    "is_connection_error",
    "refusal",
    "script_source",
]

T = TypeVar("T")


# Connections an event loop's client opens at most (redis-py's default); calls past them wait.
_ASYNC_CONNECTIONS: Final = 100


@dataclass(frozen=True, slots=True)
class Script:
    """Run the Lua script ``name`` (a file in ``lua/``) on ``keys`` with ``args``."""

    name: str
    keys: Sequence[str]
    args: Sequence[object]


@dataclass(frozen=True, slots=True)
class Command:
    """Run one single-key Redis command, e.g. ``("SET", key, value, "NX")``."""

    args: tuple[object, ...]


@dataclass(frozen=True, slots=True)
class Pipeline:
    """Run ``requests`` in one round trip (a pipeline: each request is atomic on its own,
    not all of them together); the program receives the list of their results.

    One server runs them in order. A Cluster client sends each to its slot's node, one
    round trip per node, all nodes at once; requests on different nodes run in no set order.
    Every request runs even if one fails; the first failure is then raised in the program
    (a dropped connection retries the whole program, as for one request)."""

    requests: tuple[Script | Command, ...]


@dataclass(frozen=True, slots=True)
class Scan:
    """Every key matching ``pattern``, on every primary of a cluster."""

    pattern: str


@dataclass(frozen=True, slots=True)
class _ScanPage:
    """One SCAN call of a :class:`Scan`: from ``cursor`` on the primary named ``node`` of a
    cluster (``None``: the one server, or every primary of a cluster from cursor 0). The
    reply: the next cursor by node name (``None`` for the one server), and the keys."""

    pattern: str
    cursor: int
    node: str | None


# Keys a SCAN call looks at (a hint to the server; the keys matching are fewer).
_SCAN_COUNT: Final = 1000


def _scan(pattern: str) -> Program[list[bytes]]:
    """Every key matching ``pattern``, sorted, one SCAN page at a time. The engine answers
    each page as a request of its own, so a page is not asked for once the engine is closed
    (redis-py's ``scan_iter`` would go on paging, and a closed client connects again)."""
    found: set[bytes] = set()
    cursors, keys = yield _ScanPage(pattern, 0, None)
    found.update(keys)
    while cursors := {node: cursor for node, cursor in cursors.items() if cursor != 0}:
        for node, cursor in cursors.items():
            reply, keys = yield _ScanPage(pattern, cursor, node)
            found.update(keys)
            cursors[node] = reply[node]
    return sorted(found)


def _scan_arguments(client: Any, page: _ScanPage) -> dict[str, Any]:
    """The arguments of ``client.scan`` for ``page``."""
    arguments: dict[str, Any] = {"match": page.pattern, "count": _SCAN_COUNT}
    if not isinstance(client, (redis.cluster.RedisCluster, redis.asyncio.cluster.RedisCluster)):
        arguments["cursor"] = page.cursor
    elif page.node is not None:  # else cursor 0 on every primary
        arguments.update(cursor=page.cursor, target_nodes=client.get_node(node_name=page.node))
    return arguments


def _scan_reply(reply: tuple[Any, list[bytes]]) -> tuple[dict[str | None, int], list[bytes]]:
    """A SCAN reply as :class:`_ScanPage` says: a cluster's cursors come by node name."""
    cursor, keys = reply
    return (cursor if isinstance(cursor, dict) else {None: int(cursor)}), keys


def is_connection_error(error: BaseException) -> bool:
    """Whether ``error`` means the server went away or is not serving yet: worth a retry.
    On a cluster, so does a slot no node serves for now, or no node of the layout
    answering (a failover under way)."""
    if isinstance(error, SlotNotCoveredError):
        return True
    if isinstance(error, RedisClusterException):  # "cannot be connected", from its cause
        return isinstance(error.__cause__, (RedisConnectionError, RedisTimeoutError))
    return isinstance(
        error, (RedisConnectionError, RedisTimeoutError, BusyLoadingError, ClusterDownError, TryAgainError)
    )


_AUTH: Final = Refusal(
    "STORAGE_AUTH_001",
    "refused the login",
    "Check the user and password of the Redis URL (redis://user:password@host:port/db) against the"
    " server's requirepass or ACL users",
)
_PERMISSION: Final = Refusal(
    "STORAGE_PERMISSION_001",
    "refused a command to the ACL user threadkeep connects as",
    "Grant the user the commands threadkeep runs (EVALSHA, SCRIPT LOAD, GET, SET, DEL, SCAN, ...) on its"
    " key prefix's keys (ACL SETUSER ... ~<prefix>:* ...), or connect as a user that has them",
)
_COMMAND: Final = Refusal(
    "STORAGE_REFUSED_001",
    "refused a command",
    "Fix what the server names (a script error, a key of another type, maxmemory reached)",
)


def refusal(error: BaseException) -> Refusal | None:
    """What ``error`` is, if the server refused: a login (WRONGPASS, NOAUTH: redis-py
    raises them as connection errors), a command the ACL user may not run (NOPERM), or a
    command or script (an error reply). None for a dropped connection, a server loading or
    a cluster moving slots (:func:`is_connection_error`), a replica that became read-only
    in a failover, and what is not the server's."""
    if isinstance(error, (AuthenticationError, AuthenticationWrongNumberOfArgsError)):
        return _AUTH
    if isinstance(error, NoPermissionError):
        return _PERMISSION
    if (
        isinstance(error, ResponseError)
        and not isinstance(error, ReadOnlyError)
        and not is_connection_error(error)
    ):
        return _COMMAND
    return None


# What a call on a client with no gate (see RedisEngine._async) waits in: nothing.
_UNGATED: Final = contextlib.nullcontext()


def _read_layout(client: Any, failed: BaseException) -> None:
    """Read a cluster's layout again before a sync retry, asking the node the last try
    failed on (``failed``'s) last (redis-py 8.0 and later; earlier versions ask the nodes in
    the order they found them). redis-py's sync client read it when that try failed,
    maybe before a failover promoted a replica; its async client reads it again at its next
    command. If no node answers now, the try goes by the old layout and fails as the last
    one did."""
    if not isinstance(client, redis.cluster.RedisCluster):
        return
    where: Any = getattr(failed, "connection", None)  # redis-py's: the node's connection, or the node
    host, port = getattr(where, "host", None), getattr(where, "port", None)
    last = None if host is None or port is None else f"{host}:{port}"
    manager = client.nodes_manager
    with contextlib.suppress(RedisError, RedisClusterException):
        if "last_failed_node_name" in inspect.signature(manager.initialize).parameters:
            manager.initialize(last_failed_node_name=last)
        else:
            manager.initialize()


def _may_have_run(error: BaseException) -> bool:
    """Whether a call that failed with ``error`` may have run its script on the server: its
    reply was lost (a timeout, a connection closed while the reply was awaited). A
    connection that never opened (redis-py says "... connecting to ..."), none free to
    take, and the server's refusals ran nothing. A timeout while a new connection says
    hello cannot be told from a lost reply, and counts as one."""
    if isinstance(error, (MaxConnectionsError, BusyLoadingError)):
        return False
    return isinstance(error, (RedisTimeoutError, RedisConnectionError)) and "connecting" not in str(error)


@cache
def script_source(name: str) -> str:
    """The Lua source of script ``name``: the shared prelude, then the script."""
    folder = resources.files("threadkeep.backends.redis") / "lua"
    return (folder / "_prelude.lua").read_text() + "\n" + (folder / f"{name}.lua").read_text()


@cache
def _script_sha(name: str) -> str:
    """The SHA1 digest of script ``name``'s source: its name in the server's script cache."""
    return hashlib.sha1(script_source(name).encode()).hexdigest()


def _call(request: Script | Command) -> tuple[object, ...]:
    """The command that runs ``request`` in a pipeline. A script is called with EVALSHA
    through ``execute_command``: redis-py up to 8.1 refuses ``ClusterPipeline.evalsha``
    though it routes EVALSHA by its keys like any keyed command (redis-py issue #2914,
    lifted by its pull request #4206); the script is loaded where the server answers
    NOSCRIPT (:func:`_unloaded`)."""
    if isinstance(request, Command):
        return request.args
    return ("EVALSHA", _script_sha(request.name), len(request.keys), *request.keys, *request.args)


def _unloaded(requests: Sequence[Script | Command], replies: Sequence[Any]) -> list[int]:
    """The positions of the scripts the server did not know (NOSCRIPT: they did not run)."""
    return [
        position
        for position, reply in enumerate(replies)
        if isinstance(reply, NoScriptError) and isinstance(requests[position], Script)
    ]


def _results(replies: Sequence[Any]) -> list[Any]:
    """A pipeline's replies, or its first failure raised."""
    for reply in replies:
        if isinstance(reply, BaseException):
            raise reply
    return list(replies)


@dataclass(frozen=True, slots=True)
class _Send:
    """One pipelined round trip of a :class:`Pipeline`; the reply: each request's reply, or
    its error."""

    requests: tuple[Script | Command, ...]


@dataclass(frozen=True, slots=True)
class _Load:
    """Load scripts into the server's script cache (every primary of a cluster)."""

    names: frozenset[str]


def _pipelined(requests: Sequence[Script | Command]) -> Program[list[Any]]:
    """A :class:`Pipeline` run: its requests in one round trip, then, where the server did
    not know a script (a restart emptied its cache), that script loaded and only those
    requests sent again."""
    replies = list((yield _Send(tuple(requests))))
    unloaded = _unloaded(requests, replies)
    if unloaded:
        yield _Load(frozenset(requests[position].name for position in unloaded))  # type: ignore[union-attr]
        again = yield _Send(tuple(requests[position] for position in unloaded))
        for position, reply in zip(unloaded, again, strict=True):
            replies[position] = reply
    return _results(replies)


class RedisEngine:
    """Clients and script calls for one Redis deployment.

    Args:
        url: The server's URL (``redis://``, ``rediss://``, ``unix://``).
        retry: When a failed program runs again.
        cluster: Whether the server is a Redis Cluster (``None``: ask it).
        client: A sync client the application owns; used as given, never closed here.
        async_client: An async client the application owns; used as given, never closed here.
        connect_timeout: Seconds opening a connection may take.
        socket_timeout: Seconds a command may take (``None``: no limit); a cache sets one so
            that a Redis that hangs costs a bounded wait.
    """

    def __init__(
        self,
        url: str,
        *,
        retry: RetryPolicy,
        cluster: bool | None = None,
        client: Any = None,
        async_client: Any = None,
        connect_timeout: float = 10.0,
        socket_timeout: float | None = None,
    ) -> None:
        self.url = url
        self.retry = retry
        self._given = client
        self._given_async = async_client
        self._timeout = connect_timeout
        self._socket_timeout = socket_timeout
        self._client: Any = None
        # One client per event loop, closed at the loop's end if not before.
        self._async_clients: PerLoop[Any] = PerLoop(self._close_async, "threadkeep-redis-client-closer")
        # Waits for a connection of a loop's cluster client (see _async).
        self._gates: weakref.WeakKeyDictionary[Any, asyncio.Semaphore] = weakref.WeakKeyDictionary()
        # The cluster nodes the clients this engine opened have found, kept past their close.
        self._nodes: set[tuple[str, int]] = set()
        self._nodes_lock = threading.Lock()
        self._scripts: dict[tuple[int, str], Any] = {}
        self._cluster = cluster
        self._closed = False
        self._opening = threading.Lock()  # orders the sync client's creation and close()

    @property
    def location(self) -> str:
        """The URL without its password."""
        parsed = urlsplit(self.url)
        netloc = parsed.hostname or ""
        if parsed.port:
            netloc += f":{parsed.port}"
        return f"{parsed.scheme}://{netloc}{parsed.path}"

    @property
    def cluster(self) -> bool:
        """Whether the server is a Redis Cluster: as given, else asked on first use (so an
        engine can be built while its server is down)."""
        if self._cluster is None:
            self._cluster = self._is_cluster()
        return self._cluster

    def _is_cluster(self) -> bool:
        client = self._given or redis.Redis.from_url(self.url, socket_connect_timeout=self._timeout)
        try:
            info = client.info("cluster")
            return bool(info.get("cluster_enabled"))
        except redis.ResponseError:
            return False
        finally:
            if client is not self._given:
                client.close()

    def _refuse_if_closed(self) -> None:
        if self._closed:
            raise StorageError(f"the redis store at {self.location} is closed: open a new saver")

    def _sync(self) -> Any:
        self._refuse_if_closed()
        if self._given is not None:
            return self._given
        client = self._client
        if client is None:
            with self._opening:
                self._refuse_if_closed()
                if self._client is None:
                    options: dict[str, Any] = {
                        "socket_connect_timeout": self._timeout,
                        "socket_timeout": self._socket_timeout,
                        "health_check_interval": 30,
                    }
                    if self.cluster:  # as in _async
                        self._client = redis.cluster.RedisCluster.from_url(
                            self.url,
                            startup_nodes=self._seeds(redis.cluster.ClusterNode),
                            retry=Retry(NoBackoff(), 0),
                            **options,
                        )
                    else:
                        self._client = redis.Redis.from_url(self.url, **options)
                client = self._client
        return client

    def _async(self) -> Any:
        self._refuse_if_closed()
        if self._given_async is not None:
            return self._given_async
        loop = asyncio.get_running_loop()
        client = self._async_clients.get(loop)
        if client is None:
            if self.cluster:
                # redis-py's cluster client would try a command that failed on a dropped or
                # silent connection again itself, up to 10 times (each up to the command
                # timeout), inside each of threadkeep's tries, which the settings bound. The
                # layout is read again after such a failure all the same (and before a sync
                # retry: _read_layout), so threadkeep's next try finds a primary that failed
                # over. It starts from every node found so far (_seeds).
                client = redis.asyncio.cluster.RedisCluster.from_url(
                    self.url,
                    startup_nodes=self._seeds(redis.asyncio.cluster.ClusterNode),
                    max_connections=_ASYNC_CONNECTIONS,
                    socket_connect_timeout=self._timeout,
                    socket_timeout=self._socket_timeout,
                    retry=redis.asyncio.retry.Retry(NoBackoff(), 0),
                )
                # It refuses a call past a node's connections (MaxConnectionsError) and has
                # no pool to wait in: calls wait here instead, as many at once as one node
                # may serve (a call uses one connection at a time).
                self._gates[client] = asyncio.Semaphore(_ASYNC_CONNECTIONS)
            else:
                # redis-py's own pool refuses a call past its 100 connections ("Too many
                # connections"); this one makes it wait for a connection, as long as a
                # connection may take to open.
                pool = redis.asyncio.BlockingConnectionPool.from_url(
                    self.url,
                    max_connections=_ASYNC_CONNECTIONS,
                    timeout=self._timeout,
                    socket_connect_timeout=self._timeout,
                    socket_timeout=self._socket_timeout,
                )
                client = redis.asyncio.Redis.from_pool(pool)
            # Published, then the flag read: a close() from another thread meanwhile either
            # finds this client or leaves it here, where it has opened no connection yet.
            self._async_clients.publish(loop, client)
            if self._closed:
                self._async_clients.take(loop, client)
                self._refuse_if_closed()
        return client

    def _seeds(self, node: Any) -> list[Any]:
        """``node(host, port)`` (a ``ClusterNode`` class) of every cluster node the clients
        this engine opened have found (those open now and those closed, each loop's), for a
        new client to start from beside the URL's node: that node may be down while the
        cluster serves (a primary that failed over). An application's own clients are not
        asked: they may serve another deployment."""
        for client in [self._client, *self._async_clients.values()]:
            self._remember(client)
        with self._nodes_lock:
            found = sorted(self._nodes)
        return [node(host, port) for host, port in found]

    def _remember(self, client: Any) -> None:
        """Keep the nodes a cluster client has found (:meth:`_seeds`)."""
        if isinstance(client, (redis.cluster.RedisCluster, redis.asyncio.cluster.RedisCluster)):
            nodes: Any = client.nodes_manager.nodes_cache
            with self._nodes_lock:
                # a copy first: the client's own thread may change it meanwhile
                self._nodes.update((known.host, known.port) for known in list(nodes.values()))

    async def _close_async(self, client: Any) -> None:
        """Close a loop's client, keeping the nodes it found."""
        self._remember(client)
        await _close_client(client)

    def _script(self, client: Any, name: str) -> Any:
        key = (id(client), name)
        script = self._scripts.get(key)
        if script is None:
            script = self._scripts[key] = client.register_script(script_source(name))
        return script

    def run(self, make: ProgramFactory[T], *, write: bool = False, atomic: bool = True) -> T:
        """Run one program, retrying it whole after a dropped connection. A script whose
        reply was lost (:func:`_may_have_run`) may have run: a step then failed for good
        is not said to be unstored."""
        tries = Tries(self.retry, write, _may_have_run)
        failed: Exception | None = None
        while True:
            try:
                client = self._sync()
                if failed is not None:
                    _read_layout(client, failed)
                return drive(make(), partial(self._execute, client))
            except Exception as error:
                self._refuse_if_closed()  # closed meanwhile: say so, not what the closing broke
                time.sleep(tries.failed(error))
                failed = error

    async def arun(self, make: ProgramFactory[T], *, write: bool = False, atomic: bool = True) -> T:
        """The same as :meth:`run`, on the event loop's own client."""
        tries = Tries(self.retry, write, _may_have_run)
        while True:
            try:
                client = self._async()
                async with self._gates.get(client, _UNGATED):
                    return await drive_async(make(), partial(self._execute_async, client))
            except Exception as error:
                self._refuse_if_closed()
                await asyncio.sleep(tries.failed(error))

    def setup(self, make: ProgramFactory[T]) -> T:
        """Run a format-gate program (Redis has no schema to migrate)."""
        return self.run(make)

    def _execute(self, client: Any, request: Any) -> Any:
        self._refuse_if_closed()  # a closed client would connect again: not after close()
        if isinstance(request, Script):
            return self._script(client, request.name)(
                keys=list(request.keys), args=list(request.args), client=client
            )
        if isinstance(request, Command):
            return client.execute_command(*request.args)
        if isinstance(request, Pipeline):
            return drive(_pipelined(request.requests), partial(self._pipeline_step, client))
        if isinstance(request, _ScanPage):
            return _scan_reply(client.scan(**_scan_arguments(client, request)))
        if isinstance(request, Scan):
            return drive(_scan(request.pattern), partial(self._execute, client))
        raise TypeError(f"the redis engine cannot run {request!r}")

    async def _execute_async(self, client: Any, request: Any) -> Any:
        self._refuse_if_closed()  # a closed client would connect again: not after close()
        if isinstance(request, Script):
            script = self._script(client, request.name)
            return await script(keys=list(request.keys), args=list(request.args), client=client)
        if isinstance(request, Command):
            return await client.execute_command(*request.args)
        if isinstance(request, Pipeline):
            return await drive_async(_pipelined(request.requests), partial(self._pipeline_step_async, client))
        if isinstance(request, _ScanPage):
            return _scan_reply(await client.scan(**_scan_arguments(client, request)))
        if isinstance(request, Scan):
            return await drive_async(_scan(request.pattern), partial(self._execute_async, client))
        raise TypeError(f"the redis engine cannot run {request!r}")

    def _pipeline_step(self, client: Any, step: _Send | _Load) -> Any:
        """One step of :func:`_pipelined`: a round trip, or scripts loaded."""
        if isinstance(step, _Load):
            for name in step.names:
                client.script_load(script_source(name))
            return None
        return self._send(client, step.requests)

    def _send(self, client: Any, requests: Sequence[Script | Command]) -> list[Any]:
        if not requests:
            return []
        self._refuse_if_closed()
        pipe = client.pipeline(transaction=False)
        for request in requests:
            pipe.execute_command(*_call(request))
        return list(pipe.execute(raise_on_error=False))

    async def _pipeline_step_async(self, client: Any, step: _Send | _Load) -> Any:
        if isinstance(step, _Load):
            for name in step.names:
                await client.script_load(script_source(name))
            return None
        return await self._send_async(client, step.requests)

    async def _send_async(self, client: Any, requests: Sequence[Script | Command]) -> list[Any]:
        if not requests:
            return []
        self._refuse_if_closed()
        pipe = client.pipeline(transaction=False)
        for request in requests:
            pipe.execute_command(*_call(request))
        return list(await pipe.execute(raise_on_error=False))

    def close(self) -> None:
        """Close the clients this engine opened; clients it was given stay open. The engine
        refuses work afterwards (``StorageError``)."""
        with self._opening:
            self._closed = True
            client, self._client = self._client, None
        if client is not None:
            client.close()
        self._async_clients.close_all()

    async def aclose(self) -> None:
        """Close the clients this engine opened, from inside an event loop."""
        self._closed = True  # first: no call on this loop makes a new client meanwhile
        await self._async_clients.close_here()
        await close_elsewhere(self.close)  # the rest: the sync client, other loops' clients


async def _close_client(client: Any) -> None:
    await client.aclose()
