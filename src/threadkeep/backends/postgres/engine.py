"""Runs SQL programs on Postgres through psycopg 3 connection pools, sync and async.

Each program runs on one pooled connection, a write in one transaction. Its requests go out
as few round trips as its reads allow (:func:`_round_trips`): a :class:`~threadkeep.core.
program.Batch` in pipeline mode, BEGIN with the first round trip, and statements whose
results nobody reads held back to travel with the next round trip or the COMMIT. A dropped
connection (the server restarted, ``pg_terminate_backend``, a network cut), or one that did
not answer within the command timeout (:mod:`.deadline`: a stopped backend, a connection a
network device dropped without a word), retries the whole program on a fresh connection as
the retry policy says (SPEC W4); what the server refuses (a login, a database, a privilege,
a statement: :func:`refusal`) is raised at once, and a try that failed leaves its connection
to the pool only if nothing on it changed (:func:`_reusable`). The pools check a
connection before lending it without a round trip (a backend the server already closed is
replaced rather than used), and at the first dead one, and after a failure, every idle
connection is tested with one, so a server restart costs no retry, not one per pooled
connection. A step's waits for a connection and its retries end at the policy's deadline
(``STEP_DEADLINE_SECONDS``), and an owned pool gives up a connection it cannot open at once
(:data:`_RECONNECT_SECONDS`): the first step after an outage is served as soon as the server
answers, not after a reconnection backoff.

There is no lock around the engine: concurrent calls run on separate connections, and two
writers of one thread queue on that thread's row lock inside Postgres. On an async pool the
engine opened, concurrent calls also share round trips: a call's first round trip, when it
opens no transaction or holds a whole one (a put, a ``put_writes``, the state read), is sent
with those of the other calls waiting, in one pipeline with a Sync after each
(:class:`_Coalescer`).
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import logging
import math
import re
import threading
import time
import weakref
from collections.abc import Awaitable, Callable, Generator, Mapping
from contextlib import AbstractContextManager
from dataclasses import dataclass, field, replace
from functools import partial
from typing import Any, Final, TypeVar

import psycopg
from psycopg_pool import AsyncConnectionPool, ConnectionPool, PoolTimeout

from threadkeep.backends.closing import PerLoop, close_elsewhere
from threadkeep.backends.postgres import wire
from threadkeep.backends.postgres.deadline import checks_bounded, timed_classes
from threadkeep.backends.postgres.queries import FLUSH_WAL
from threadkeep.core.program import Batch, Program, ProgramFactory, Sql, SqlMany, drive, drive_async
from threadkeep.core.retry import Refusal, RetryPolicy, Tries
from threadkeep.errors import StorageError, ThreadkeepError

__all__ = ["PlannedOnce", "PoolOptions", "PostgresEngine", "is_connection_error", "refusal"]

logger = logging.getLogger(__name__)
T = TypeVar("T")


def check_alive(conn: psycopg.Connection[Any]) -> None:
    """Refuse a pooled connection the server dropped while it sat idle, without a round trip.

    A terminated backend (``pg_terminate_backend``, a server restart) sends its notice and
    closes the socket; reading what is already there settles it. A connection that died
    silently fails at its first statement instead, and the program is retried whole.

    Raises:
        psycopg.OperationalError: the connection is gone; the pool replaces it.
    """
    pgconn = conn.pgconn
    pgconn.consume_input()
    if conn.closed or pgconn.status != psycopg.pq.ConnStatus.OK:
        raise psycopg.OperationalError("the pooled connection was closed by the server")


async def check_alive_async(conn: psycopg.AsyncConnection[Any]) -> None:
    """:func:`check_alive` for async pools (it never waits)."""
    pgconn = conn.pgconn
    pgconn.consume_input()
    if conn.closed or pgconn.status != psycopg.pq.ConnStatus.OK:
        raise psycopg.OperationalError("the pooled connection was closed by the server")


@dataclass(slots=True)
class _Checked:
    """An owned sync pool's ``check``: :func:`check_alive`, and at the first dead connection
    found, a test of every idle one (``pool.check()``, each bounded), so that the next
    checkout gets a live connection or waits for a new one. psycopg_pool sleeps between
    failed checks of one checkout, 1 s, 2 s, 4 s ...: after a server restart or an outage,
    a pool holding a few dead connections would make the first call wait out those sleeps
    (and, under the step deadline, fail)."""

    pool: ConnectionPool | None = None

    def __call__(self, conn: psycopg.Connection[Any]) -> None:
        try:
            check_alive(conn)
        except psycopg.OperationalError:
            if self.pool is not None:
                with checks_bounded():
                    self.pool.check()
            raise


@dataclass(slots=True)
class _CheckedAsync:
    """:class:`_Checked` for an async pool."""

    pool: AsyncConnectionPool | None = None

    async def __call__(self, conn: psycopg.AsyncConnection[Any]) -> None:
        try:
            await check_alive_async(conn)
        except psycopg.OperationalError:
            if self.pool is not None:
                with checks_bounded():
                    await self.pool.check()
            raise


def is_connection_error(error: BaseException) -> bool:
    """Whether ``error`` means the connection (or the server) went away, or the connection
    lost a prepared statement: worth a retry, on a new connection. What :func:`refusal`
    names is asked first, and never retried."""
    if isinstance(error, psycopg.errors.InvalidSqlStatementName):
        return True
    return isinstance(error, (psycopg.OperationalError, psycopg.InterfaceError, PoolTimeout))


# SQLSTATE classes of an error that passes: a connection exception (08), a transaction rolled
# back by a serialization failure or a deadlock (40), resources short for now (53: too many
# connections, out of memory, disk full), a lock not available (55P03), an operator's
# intervention (57: a shutdown, a restart, a cancel), a system error (58: I/O), and a
# prepared statement its connection lost (26000: a DEALLOCATE ALL on it; the connection is
# replaced, see _reusable).
_PASSING: Final = ("08", "26000", "40", "53", "55P03", "57", "58")
_AUTH: Final = Refusal(
    "STORAGE_AUTH_001",
    "refused the login",
    "Check the user and password of the connection string (or PGUSER, PGPASSWORD, ~/.pgpass), that"
    " the role exists and may log in (CREATE ROLE ... LOGIN PASSWORD ...), and pg_hba.conf",
)
_DATABASE: Final = Refusal(
    "STORAGE_DATABASE_001",
    "has no such database",
    "Create it (CREATE DATABASE), or name an existing one as dbname in the connection string",
)
_SCHEMA: Final = Refusal(
    "STORAGE_DATABASE_001",
    "has no schema the role may use on its search_path",
    "Name an existing schema in the connection string (options='-c search_path=<schema>') and grant the"
    " role threadkeep connects as USAGE and CREATE on it",
)
_PERMISSION: Final = Refusal(
    "STORAGE_PERMISSION_001",
    "refused a privilege to the role threadkeep connects as",
    "Grant it USAGE and CREATE on the schema and SELECT, INSERT, UPDATE and DELETE on the tk_ tables"
    " (docs/settings.md), or connect as the role that owns them",
)
_STATEMENT: Final = Refusal(
    "STORAGE_REFUSED_001",
    "refused a statement",
    "Fix what the server names (a value too large for an index, a constraint, a changed schema)",
)
# A connection refused by the server before it has a session: libpq gives the server's
# message without its SQLSTATE. Other failures to connect (refused, timed out, "the database
# system is starting up", "too many clients") pass, and are retried.
_REFUSED_LOGINS: Final = (
    (re.compile(r'database ".*" does not exist'), _DATABASE),
    (re.compile(r"permission denied for database"), _PERMISSION),
    (
        re.compile(
            r"authentication failed|role \".*\" does not exist|is not permitted to log in"
            r"|no pg_hba\.conf entry|no password supplied|password is required"
        ),
        _AUTH,
    ),
)


def refusal(error: BaseException) -> Refusal | None:
    """What ``error`` is, if the server refused (a login, a database, a privilege, a
    statement), by its SQLSTATE (class 28 a login, 3D000 a database, 3F000 a schema missing
    or not usable, 42501 a privilege, any other but :data:`_PASSING` a statement); for a
    connection refused before it had a session, by libpq's message. None for a dropped
    connection, and for what is not the server's."""
    if not isinstance(error, psycopg.Error):
        return None
    sqlstate = error.sqlstate
    if sqlstate is None:
        if not isinstance(error, psycopg.OperationalError):
            return None
        message = str(error)
        return next((refused for pattern, refused in _REFUSED_LOGINS if pattern.search(message)), None)
    if sqlstate.startswith(_PASSING):
        return None
    if sqlstate.startswith("28"):
        refused = _AUTH
    elif sqlstate == "3D000":
        refused = _DATABASE
    elif sqlstate == "3F000":
        refused = _SCHEMA
    elif sqlstate == "42501":
        refused = _PERMISSION
    else:
        refused = _STATEMENT
    return replace(refused, what=f"{refused.what} (SQLSTATE {sqlstate})")


@dataclass(frozen=True, slots=True)
class PoolOptions:
    """How threadkeep builds the pools it owns.

    Attributes:
        min_size: Connections kept open.
        max_size: Connections at most, per pool.
        timeout: Seconds a call waits for a free connection before it fails (and retries), at
            most what is left of the retry policy's deadline.
        connect_timeout: Seconds a new connection may take.
        command_timeout: Seconds a connection waits for the server's answer before a cancel
            is sent, the connection closed and the step retried on a new one
            (:mod:`.deadline`: a round trip that may commit then has an unknown outcome,
            :class:`_InFlight`); ``None``, no bound.
        prepare_threshold: psycopg's: prepare a statement after it ran this many times;
            ``None`` never prepares (for PgBouncer in transaction mode).
    """

    min_size: int = 1
    max_size: int = 10
    timeout: float = 30.0
    connect_timeout: float = 10.0
    command_timeout: float | None = 30.0
    prepare_threshold: int | None = 5


@dataclass(frozen=True, slots=True)
class PlannedOnce:
    """Statements whose one plan suits every parameter (index probes by key): each runs as a
    prepared statement on its generic plan, so a connection plans it at its first run and
    then only after an ``ANALYZE`` or a schema change of a table it reads.

    Attributes:
        statements: Each such statement, and the statement that runs instead on a connection
            that never prepares (``prepare_threshold=None``: PgBouncer's transaction mode
            before 1.21), with the same parameters.
        settings: A statement setting the planner settings they are planned and run with,
            for their transaction only: it goes in the same pipeline, just before, and the
            two run in one implicit transaction (nothing of it outlives the statement, on
            any pool, through any pooler).
    """

    statements: Mapping[str, str] = field(default_factory=dict)
    settings: str = ""


_NONE_PLANNED: Final = PlannedOnce()

# How long an owned pool keeps trying, in the background, to open a connection it lost or
# could not open (psycopg_pool's ``reconnect_timeout``, 5 minutes by default). Its tries back
# off exponentially (1 s, 2 s, 4 s, ...), and meanwhile the pool counts the connection as
# being opened and opens no other for the calls waiting: after an outage of a minute and a
# half, the first call once the server was back waited 24-29 s for a try due then. At zero,
# a pool gives up on a connection it cannot open at once (it tries twice), and opens one
# again when a call waits for one: every call is a try, with no backoff outlasting an outage.
# Between calls a pool may hold fewer than POOL_MIN_SIZE connections until one needs them.
_RECONNECT_SECONDS: Final = 0.0


class PostgresEngine:
    """Pools and transactions for one Postgres database.

    Args:
        conninfo: The connection string (libpq's ``PG*`` variables fill what it leaves out).
        retry: When a failed transaction runs again.
        options: How owned pools are built.
        pool: A sync pool the application owns; used as given, never closed here.
        async_pool: An async pool the application owns; used as given, never closed here.
        planned_once: Statements each connection plans once (see :class:`PlannedOnce`).
    """

    def __init__(
        self,
        conninfo: str,
        *,
        retry: RetryPolicy,
        options: PoolOptions | None = None,
        pool: ConnectionPool | None = None,
        async_pool: AsyncConnectionPool | None = None,
        planned_once: PlannedOnce | None = None,
        shared_flush: bool = True,
    ) -> None:
        self.conninfo = conninfo
        self._shared_flush = _SharedFlush(shared_flush)
        self.planned_once = planned_once or _NONE_PLANNED
        # what a read's and a write's statements are prepared as (one of each, for every call)
        self._preparing = (_Preparing(False, self.planned_once), _Preparing(True, self.planned_once))
        self.retry = retry
        self.options = options or PoolOptions()
        self._given_pool = pool
        self._given_async_pool = async_pool
        self._pool: ConnectionPool | None = None
        # An async pool belongs to the event loop that opened it: one per loop, closed at
        # the loop's end if not before (see _close_pool).
        self._async_pools: PerLoop[AsyncConnectionPool] = PerLoop(_close_pool, "threadkeep-async-pool-closer")
        # A pool is published once it is ready; callers that come while it opens wait here.
        self._opening = threading.Lock()
        self._opening_async: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, asyncio.Lock] = (
            weakref.WeakKeyDictionary()
        )
        # Per loop, what sends the first round trips of concurrent calls together.
        self._coalescers: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _Coalescer] = (
            weakref.WeakKeyDictionary()
        )
        self._closed = False

    @property
    def location(self) -> str:
        """The connection string without its password."""
        try:
            params = psycopg.conninfo.conninfo_to_dict(self.conninfo)
        except psycopg.ProgrammingError:
            return "postgres"
        params.pop("password", None)
        return psycopg.conninfo.make_conninfo("", **params) or "postgres (from PG* variables)"

    def _connection_kwargs(self) -> dict[str, Any]:
        return {
            "autocommit": True,
            "prepare_threshold": self.options.prepare_threshold,
            "connect_timeout": int(self.options.connect_timeout),
        }

    def _pool_kwargs(self, asynchronous: bool) -> dict[str, Any]:
        """What an owned pool is built with (opened by the caller)."""
        bounded = {}
        if self.options.command_timeout is not None:
            bounded["connection_class"] = timed_classes(self.options.command_timeout)[asynchronous]
        return {
            **bounded,
            "min_size": self.options.min_size,
            "max_size": self.options.max_size,
            "timeout": self.options.timeout,
            "reconnect_timeout": _RECONNECT_SECONDS,
            "kwargs": self._connection_kwargs(),
            "open": False,
        }

    def _refuse_if_closed(self) -> None:
        if self._closed:
            raise StorageError(f"the postgres store at {self.location} is closed: open a new saver")

    # A pool threadkeep opens is published once its min_size connections are open; callers
    # that come meanwhile wait on a lock. A first call that had to wait for a connection made
    # the pool open another beside it (on a busy host, about 2 ms of a first read), and
    # callers using a pool still opening took its connections as they came, so that it never
    # counted as ready and closed itself when the wait timed out. A pool that cannot open in
    # time closes itself and raises PoolTimeout: nothing is published, the call is retried.
    def _sync_pool(self, wait: float | None = None) -> ConnectionPool:
        """The sync pool; opening it waits up to ``wait`` seconds (default: the pool timeout)
        for its connections."""
        self._refuse_if_closed()
        if self._given_pool is not None:
            return self._given_pool
        pool = self._pool
        if pool is None:
            with self._opening:
                self._refuse_if_closed()
                pool = self._pool
                if pool is None:
                    checked = _Checked()
                    pool = checked.pool = ConnectionPool(
                        self.conninfo,
                        check=checked,
                        name="threadkeep",
                        **self._pool_kwargs(asynchronous=False),
                    )
                    pool.open(wait=True, timeout=wait or self.options.timeout)
                    # Published, then the flag read: close() sets the flag, then takes the
                    # pool. So a close() meanwhile (which does not wait for this open) either
                    # takes this pool or leaves it to be closed here; closing it twice is safe.
                    self._pool = pool
                    if self._closed:
                        self._pool = None
                        pool.close()
                        self._refuse_if_closed()
        return pool

    async def _async_pool(self, wait: float | None = None) -> AsyncConnectionPool:
        """The running loop's pool; opening it waits up to ``wait`` seconds (default: the
        pool timeout)."""
        self._refuse_if_closed()
        if self._given_async_pool is not None:
            return self._given_async_pool
        loop = asyncio.get_running_loop()
        pool = self._async_pools.get(loop)
        if pool is None:
            async with self._opening_async.setdefault(loop, asyncio.Lock()):
                pool = self._async_pools.get(loop)
                if pool is None:
                    checked_async = _CheckedAsync()
                    pool = checked_async.pool = AsyncConnectionPool(
                        self.conninfo,
                        check=checked_async,
                        name="threadkeep-async",
                        **self._pool_kwargs(asynchronous=True),
                    )
                    await pool.open(wait=True, timeout=wait or self.options.timeout)
                    self._async_pools.publish(loop, pool)
                    # Published, then the flag read, as in _sync_pool: a close() from another
                    # thread meanwhile either finds this pool (and has its closer close it in
                    # this loop) or leaves it to be closed here.
                    if self._closed:
                        if self._async_pools.take(loop, pool):
                            await pool.close()
                        self._refuse_if_closed()
        return pool

    def run(self, make: ProgramFactory[T], *, write: bool = False, atomic: bool = True) -> T:
        """Run one program, retrying it whole after a dropped connection. A ``write`` that is
        ``atomic`` runs in one transaction; a read runs without one (under READ COMMITTED
        each statement sees its own snapshot either way, and a one-statement read then costs
        one round trip)."""
        prepare = self._preparing[write]

        def attempt(in_flight: _InFlight, tries: Tries) -> T:
            pool = self._sync_pool(tries.wait(self.options.timeout))
            connection = pool.connection(timeout=tries.wait(pool.timeout))
            return self._once(make, connection, write and atomic, prepare, in_flight)

        return self._retrying(attempt, write)

    def setup(self, make: ProgramFactory[T]) -> T:
        """Like :meth:`run`, on a short-lived connection: the format gate and migrations run
        before any pool is needed (an application that only uses the async API never opens a
        sync pool)."""
        prepare = self._preparing[False]
        return self._retrying(
            lambda in_flight, tries: self._once(
                make, self.connect(tries.wait(self.options.connect_timeout)), True, prepare, in_flight
            ),
            False,
        )

    def _retrying(self, attempt: Callable[[_InFlight, Tries], T], write: bool) -> T:
        in_flight = _InFlight()
        tries = Tries(self.retry, write, in_flight)
        while True:
            try:
                return attempt(in_flight, tries)
            except Exception as error:
                self._refuse_if_closed()  # closed meanwhile: say so, not what the closing broke
                delay = tries.failed(error)
                pool = self._given_pool or self._pool
                if pool is not None:
                    # A server restart or a mass termination kills every pooled connection at
                    # once (a stalled network mutes them all): test the idle ones now, each
                    # briefly, instead of failing on each in turn.
                    with checks_bounded():
                        pool.check()
                time.sleep(delay)

    @staticmethod
    def _once(
        make: ProgramFactory[T],
        connection: AbstractContextManager[psycopg.Connection[Any]],
        transaction: bool,
        prepare: _Preparing,
        in_flight: _InFlight,
    ) -> T:
        in_flight.spoilt = False
        with connection as conn:
            try:
                return drive(
                    _round_trips(make(), transaction, in_flight),
                    partial(_send_tracked, conn, prepare, in_flight),
                )
            except BaseException as error:
                if _refused_in_transaction(conn, error, in_flight):
                    try:
                        conn.rollback()
                        wire.forget_prepared(conn)
                    except Exception:
                        conn.close()
                elif not _reusable(conn, error, in_flight):
                    conn.close()
                raise

    async def arun(self, make: ProgramFactory[T], *, write: bool = False, atomic: bool = True) -> T:
        """The same as :meth:`run`, on the event loop's own pool. A first try's first round
        trip that opens no transaction, or holds a whole one, may go with other calls'
        (:func:`_coalescible`, :class:`_Coalescer`); what the program asks after it, on a
        connection of its own."""
        in_flight = _InFlight()
        tries = Tries(self.retry, write, in_flight)
        pool: AsyncConnectionPool | None = None
        prepare = self._preparing[write]
        while True:
            try:
                pool = await self._async_pool(tries.wait(self.options.timeout))
                program = _round_trips(make(), write and atomic, in_flight)
                try:
                    request = next(program)
                except StopIteration as stop:  # a program with nothing to do
                    return stop.value  # type: ignore[no-any-return]
                coalescer = self._coalescer() if tries.first and _coalescible(request, prepare) else None
                if coalescer is not None:
                    reply = await coalescer.send(request, prepare, in_flight)
                    in_flight.unanswered = False
                    if reply is not _ALONE:
                        try:
                            request = program.send(reply)
                        except StopIteration as stop:
                            return stop.value  # type: ignore[no-any-return]
                in_flight.spoilt = False
                async with pool.connection(timeout=tries.wait(pool.timeout)) as conn:
                    try:
                        return await drive_async(
                            program, partial(_send_async_tracked, conn, prepare, in_flight), request
                        )
                    except BaseException as error:
                        if _refused_in_transaction(conn, error, in_flight):
                            try:
                                await conn.rollback()
                                wire.forget_prepared(conn)
                            except Exception:
                                await conn.close()
                        elif not _reusable(conn, error, in_flight):
                            await conn.close()
                        raise
            except Exception as error:
                self._refuse_if_closed()
                delay = tries.failed(error)
                if pool is not None:
                    with checks_bounded():
                        await pool.check()  # as in _retrying
                await asyncio.sleep(delay)

    def _coalescer(self) -> _Coalescer | None:
        """The running loop's coalescer; None on a pool the application gave (its connections
        are used as given, one call each)."""
        if self._given_async_pool is not None:
            return None
        loop = asyncio.get_running_loop()
        coalescer = self._coalescers.get(loop)
        if coalescer is None:
            # Its pool waits are bounded by the deadline too: it serves first tries only.
            wait = min(self.options.timeout, self.retry.deadline or math.inf)
            coalescer = self._coalescers[loop] = _Coalescer(
                partial(self._async_pool, wait), wait, self.options.command_timeout, self._shared_flush
            )
        return coalescer

    def connect(self, timeout: float | None = None) -> psycopg.Connection[Any]:
        """One short-lived connection, closed when its ``with`` block ends; opening it may
        take ``timeout`` seconds (default: the connect timeout; libpq counts whole seconds,
        at least 2)."""
        self._refuse_if_closed()
        kwargs = self._connection_kwargs()
        if timeout is not None:
            kwargs["connect_timeout"] = max(math.ceil(timeout), 1)
        return psycopg.connect(self.conninfo, **kwargs)

    def close(self) -> None:
        """Close the pools this engine opened; pools it was given stay open. The engine
        refuses work afterwards (``StorageError``), as a closed pool would."""
        # Not under the opening lock: a pool another thread is opening may wait for its
        # connections up to the pool timeout. Its opener closes it (_sync_pool).
        self._closed = True
        sync_pool, self._pool = self._pool, None
        if sync_pool is not None:
            sync_pool.close()
        self._async_pools.close_all()

    async def aclose(self) -> None:
        """Close the pools this engine opened, from inside an event loop."""
        self._closed = True  # first: no call on this loop opens a new pool meanwhile
        await self._async_pools.close_here()
        await close_elsewhere(self.close)  # the rest: the sync pool, other loops' pools


@dataclass(slots=True)
class _InFlight:
    """A call's round trip in flight: whether the last one its program asked for may commit
    (it carries the COMMIT, or runs outside a transaction, where each statement commits
    itself), and whether such a round trip went to the server and is still unanswered.

    As the retry rule for :class:`~threadkeep.core.retry.Tries`: a try that failed while
    such a round trip was unanswered (a timeout, a connection lost on the way back) may have
    stored its step; one that failed before it was sent (a connection refused or none free,
    a connection lost while an earlier round trip of its transaction was out) did not, nor
    one the server answered with an error (a deadlock, a serialization failure: it rolled
    the transaction back). A round trip handed to a connection that was already dead
    counts as sent: the client cannot tell. Asked once per failed try, the rule also starts
    the next try clean.
    """

    commits: bool = False
    unanswered: bool = False
    # a round trip of the current try failed, or was cancelled: its connection is closed
    spoilt: bool = False

    def __call__(self, error: BaseException) -> bool:
        unanswered, self.unanswered = self.unanswered, False
        return unanswered and not _server_answer(error)

    def sending(self) -> None:
        self.unanswered = self.unanswered or self.commits


def _server_answer(error: BaseException) -> bool:
    """Whether ``error`` is the server's answer (an error it reported and rolled back on),
    not the loss of its connection: SQLSTATE class 08 (connection exception) and 57P
    (an operator's shutdown, which may come after a COMMIT went through) are losses."""
    sqlstate = getattr(error, "sqlstate", None)
    return sqlstate is not None and not sqlstate.startswith(("08", "57P"))


async def _close_pool(pool: AsyncConnectionPool) -> None:
    """Close an async pool, at the latest when its loop ends: psycopg_pool's workers take a
    cancellation that arrives while they run a maintenance task (a connection being added as
    the pool grows) for a failed task and wait for the next one, so a runner cancelling the
    tasks left would wait for them forever; closing the pool sends them their stop."""
    await pool.close()


_PLACEHOLDER = re.compile(r"%\((\w+)\)([sbt])")


@functools.lru_cache(maxsize=256)
def _fused_sql(statements: tuple[str, ...], read: bool) -> str:
    """One statement running ``statements`` (placeholders of the i-th renamed ``s<i>_``):
    the writes as data-modifying CTEs, and the first as the main query when ``read``."""
    renamed = [_PLACEHOLDER.sub(rf"%(s{i}_\1)\2", sql.strip()) for i, sql in enumerate(statements)]
    first = 1 if read else 0
    ctes = [f"w{i} AS (\n{sql}\n)" for i, sql in enumerate(renamed) if i >= first]
    if read:
        return "WITH r0 AS (\n" + renamed[0] + "\n), " + ", ".join(ctes) + "\nSELECT * FROM r0"
    return "WITH " + ", ".join(ctes) + "\nSELECT 1"


def _fuse(batch: Batch) -> Sql | None:
    """An independent batch as one statement (see :class:`~threadkeep.core.program.Batch`)."""
    statements = [r for r in batch.requests if isinstance(r, Sql)]
    if not batch.independent or len(statements) < 2 or len(statements) != len(batch.requests):
        return None
    params = {f"s{i}_{name}": value for i, r in enumerate(statements) for name, value in r.params.items()}
    return Sql(_fused_sql(tuple(r.sql for r in statements), batch.wanted), params)


def _fused_results(batch: Batch, rows: list[Any]) -> list[Any]:
    if not batch.wanted:
        return [None] * len(batch.requests)
    return [rows, *([[]] * (len(batch.requests) - 1))]


# A statement of a round trip: transaction control as bare text, or a program's request.
_Statement = str | Sql | SqlMany
# Pinned, not the server's default: a put reads the head after it has the thread's lock, and
# only READ COMMITTED gives that read a snapshot taken after the lock holder's commit.
_BEGIN = "BEGIN ISOLATION LEVEL READ COMMITTED"
_COMMIT = "COMMIT"


def _round_trips(
    program: Program[T], transaction: bool, in_flight: _InFlight
) -> Generator[list[_Statement], list[Any], T]:
    """Run ``program`` as round trips: yields the statements of each, receives their results.

    BEGIN travels with the first round trip and COMMIT with the last. A batch whose results
    the program does not read (``Batch(wanted=False)``) is held back and sent with the next
    round trip, or with the COMMIT: a locked put costs two round trips, a read of one
    statement one. A batch that may commit on its own (``Batch(ends=True)``) carries the
    COMMIT, or goes alone if it is one statement that no transaction precedes (a put as one
    statement: one round trip); what the program asks after it runs in a new transaction.
    A failed round trip is raised inside the program, as :func:`~threadkeep.core.program.drive`
    does. ``in_flight`` is told, before each round trip is yielded, whether it may commit.
    """
    held: list[Sql | SqlMany] = []
    begun = False
    try:
        request = next(program)
    except StopIteration as stop:  # a program with nothing to do
        return stop.value  # type: ignore[no-any-return]
    while True:
        try:
            if isinstance(request, Batch) and request.ends:
                statements, shape = _statements(request)
                lone = not begun and not held and len(statements) == 1
                opening = [_BEGIN] if transaction and not begun and not lone else []
                closing = [_COMMIT] if (begun or opening) else []
                sent = [*opening, *held, *statements, *closing]
                first = len(sent) - len(closing) - len(statements)
                held, begun = [], False
                in_flight.commits = True  # its COMMIT, or one statement committing itself
                results = yield sent
                if closing:
                    _check_committed(results[-1])
                reply: Any = shape(results[first : first + len(statements)])
            elif isinstance(request, Batch) and not request.wanted:
                fused = _fuse(request)
                held.extend([fused] if fused is not None else request.requests)
                reply = [None] * len(request.requests)
            else:
                opening = [_BEGIN] if transaction and not begun else []
                begun = begun or transaction
                statements, shape = _statements(request)
                sent = [*opening, *held, *statements]
                held = []
                in_flight.commits = not transaction
                results = yield sent
                reply = shape(results[len(sent) - len(statements) :])
        except Exception as error:
            held = []
            try:
                request = program.throw(error)
            except StopIteration as stop:
                return (yield from _finish(held, begun, stop.value, in_flight))  # type: ignore[no-any-return]
            continue
        try:
            request = program.send(reply)
        except StopIteration as stop:
            return (yield from _finish(held, begun, stop.value, in_flight))  # type: ignore[no-any-return]


def _finish(
    held: list[Sql | SqlMany], begun: bool, value: T, in_flight: _InFlight
) -> Generator[list[_Statement], list[Any], T]:
    """Send what is held back, with the COMMIT.

    Raises:
        psycopg.errors.InFailedSqlTransaction: the server rolled the transaction back instead
            (a program went on after a failed statement): nothing of it was stored.
    """
    tail: list[_Statement] = [*held, *([_COMMIT] if begun else [])]
    if tail:
        in_flight.commits = True
        results = yield tail
        if begun:
            _check_committed(results[-1])
    return value


def _check_committed(answer: object) -> None:
    """Raise unless the server answered a COMMIT with COMMIT.

    Raises:
        psycopg.errors.InFailedSqlTransaction: the server rolled the transaction back instead
            (a program went on after a failed statement): nothing of it was stored.
    """
    if answer != _COMMIT:
        raise psycopg.errors.InFailedSqlTransaction(
            f"the transaction ended in {answer!r}, not COMMIT: a statement of it had failed, "
            "so nothing of it was stored"
        )


def _statements(request: Any) -> tuple[list[Sql | SqlMany], Callable[[list[Any]], Any]]:
    """The statements that answer ``request``, and how their results make its reply."""
    if isinstance(request, Batch):
        fused = _fuse(request)
        if fused is not None:
            return [fused], partial(_fused_reply, request)
        return list(request.requests), _as_sent
    if isinstance(request, (Sql, SqlMany)):
        return [request], _first
    raise TypeError(f"the postgres engine cannot run {request!r}")


def _fused_reply(batch: Batch, results: list[Any]) -> list[Any]:
    return _fused_results(batch, results[0])


def _first(results: list[Any]) -> Any:
    return results[0]


@dataclass(frozen=True, slots=True)
class _Preparing:
    """Which statements of a program become prepared statements, and how.

    A write's may, once psycopg's threshold says so: they skip parsing and planning. A
    read's are not: a prepared statement runs, after five executions, on a generic plan,
    which for a read whose best plan depends on its parameters (a list's filters, a sweep's
    page) can scan where a plan made for the parameters probes an index. A statement
    planned once (``planned``), whatever the program, is prepared at its first run, and so
    is the statement of its settings that goes before it (:func:`_planned`).
    """

    write: bool
    planned: PlannedOnce

    def __call__(self, conn: psycopg.Connection[Any] | psycopg.AsyncConnection[Any], sql: str) -> bool | None:
        """psycopg's ``prepare`` for ``sql`` on ``conn``."""
        planned = sql in self.planned.statements or sql == self.planned.settings
        if planned and conn.prepare_threshold is not None:
            return True
        return None if self.write else False


def _planned(
    conn: psycopg.Connection[Any] | psycopg.AsyncConnection[Any],
    statements: list[_Statement],
    prepare: _Preparing,
) -> tuple[list[_Statement], Callable[[list[Any]], list[Any]]]:
    """The statements of a round trip as they are sent, and how their results make the
    round trip's: a lone statement planned once goes behind its settings, or is replaced by
    its stand-in on a connection that never prepares."""
    if len(statements) != 1 or not isinstance(statements[0], Sql):
        return statements, _as_sent
    lone = statements[0]
    stand_in = prepare.planned.statements.get(lone.sql)
    if stand_in is None:
        return statements, _as_sent
    if conn.prepare_threshold is None:
        return [replace(lone, sql=stand_in)], _as_sent
    return [Sql(prepare.planned.settings, {}), lone], _last


def _as_sent(results: list[Any]) -> list[Any]:
    return results


def _last(results: list[Any]) -> list[Any]:
    return results[-1:]


def _send(conn: psycopg.Connection[Any], statements: list[_Statement], prepare: _Preparing) -> list[Any]:
    """One round trip: a lone statement as itself, several in one pipeline."""
    statements, results = _planned(conn, statements, prepare)
    if len(statements) == 1 and isinstance(statements[0], Sql):
        lone = statements[0]
        return [_rows(conn.execute(lone.sql, lone.params, prepare=prepare(conn, lone.sql), binary=True))]
    with conn.pipeline():
        cursors = [_queue(conn, statement, prepare) for statement in statements]
    return results(
        [_result(statement, cursor) for statement, cursor in zip(statements, cursors, strict=True)]
    )


def _send_tracked(
    conn: psycopg.Connection[Any], prepare: _Preparing, in_flight: _InFlight, statements: list[_Statement]
) -> list[Any]:
    """:func:`_send`, with ``in_flight`` knowing while a round trip that may commit is out."""
    in_flight.sending()
    try:
        results = _send(conn, statements, prepare)
    except BaseException:
        in_flight.spoilt = True
        raise
    in_flight.unanswered = False
    return results


def _queue(
    conn: psycopg.Connection[Any], statement: _Statement, prepare: _Preparing
) -> psycopg.Cursor[Any] | None:
    if isinstance(statement, str):
        return conn.execute(statement)
    if isinstance(statement, SqlMany):
        conn.cursor().executemany(statement.sql, statement.rows)
        return None
    return conn.execute(statement.sql, statement.params, prepare=prepare(conn, statement.sql), binary=True)


def _result(statement: _Statement, cursor: psycopg.Cursor[Any] | None) -> Any:
    """A statement's rows; for transaction control, the server's answer (``COMMIT``, ...)."""
    if isinstance(statement, str) and cursor is not None:
        return cursor.statusmessage
    return _rows(cursor)


def _rows(cursor: psycopg.Cursor[Any] | None) -> list[Any] | None:
    """A synced cursor's rows (``[]`` for a statement without a result)."""
    if cursor is None:
        return None
    return cursor.fetchall() if _returns_rows(cursor) else []


def _returns_rows(cursor: psycopg.Cursor[Any] | psycopg.AsyncCursor[Any]) -> bool:
    """Whether the cursor's statement returned rows, as ``cursor.description is not None``
    says, without building a column object per column (about 35 µs for the state read's)."""
    result = cursor.pgresult
    return result is not None and (result.nfields > 0 or result.status == psycopg.pq.ExecStatus.TUPLES_OK)


def _reusable(
    conn: psycopg.Connection[Any] | psycopg.AsyncConnection[Any], error: BaseException, in_flight: _InFlight
) -> bool:
    """Whether the connection of a try that failed with ``error`` may serve another call:
    only if the program failed by itself (no round trip of the try failed, nothing was
    cancelled) with no transaction open, so that nothing on the connection changed.

    A step the program refused inside its transaction is rolled back instead
    (:func:`_refused_in_transaction`). Any other is closed (the pool opens a new one), not
    rolled back: after a failed
    statement, a cancelled call or a timeout, its prepared statements are not known for
    sure. psycopg's pipeline, left by an error, keeps the names of the statements it was
    to prepare after it, whose Parse the server skipped (the next call running one fails:
    ``prepared statement "_pg3_5" does not exist``); a ROLLBACK on a connection where
    psycopg prepared statements makes it send ``DEALLOCATE ALL``, which drops the shared
    pipelines' prepared statements too (:mod:`.wire`); a cancelled wait leaves results
    unread. A failure costs its call a new connection, and no other call anything."""
    return (
        isinstance(error, Exception)
        and not in_flight.spoilt
        and not conn.closed
        and conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE
    )


def _refused_in_transaction(
    conn: psycopg.Connection[Any] | psycopg.AsyncConnection[Any], error: BaseException, in_flight: _InFlight
) -> bool:
    """Whether the program refused a step by itself inside the transaction it opened (a
    conflict, another user's thread: a :class:`~threadkeep.errors.ThreadkeepError`), every
    statement of it answered and none failed: the transaction is rolled back and the
    connection kept, its prepared statements forgotten (the rollback may have dropped them,
    :func:`.wire.forget_prepared`). Racing runs refuse each other often; closing the
    connection each time cost a new one per conflict."""
    return (
        isinstance(error, ThreadkeepError)
        and not in_flight.spoilt
        and not conn.closed
        and conn.info.transaction_status == psycopg.pq.TransactionStatus.INTRANS
    )


async def _send_async(
    conn: psycopg.AsyncConnection[Any], statements: list[_Statement], prepare: _Preparing
) -> list[Any]:
    statements, results = _planned(conn, statements, prepare)
    if len(statements) == 1 and isinstance(statements[0], Sql):
        lone = statements[0]
        cursor = await conn.execute(lone.sql, lone.params, prepare=prepare(conn, lone.sql), binary=True)
        return [await _rows_async(cursor)]
    async with conn.pipeline():
        cursors = [await _queue_async(conn, statement, prepare) for statement in statements]
    return results(
        [
            cursor.statusmessage if isinstance(statement, str) and cursor else await _rows_async(cursor)
            for statement, cursor in zip(statements, cursors, strict=True)
        ]
    )


async def _send_async_tracked(
    conn: psycopg.AsyncConnection[Any],
    prepare: _Preparing,
    in_flight: _InFlight,
    statements: list[_Statement],
) -> list[Any]:
    in_flight.sending()
    try:
        results = await _send_async(conn, statements, prepare)
    except BaseException:
        in_flight.spoilt = True
        raise
    in_flight.unanswered = False
    return results


async def _queue_async(
    conn: psycopg.AsyncConnection[Any], statement: _Statement, prepare: _Preparing
) -> psycopg.AsyncCursor[Any] | None:
    if isinstance(statement, str):
        return await conn.execute(statement)
    if isinstance(statement, SqlMany):
        await conn.cursor().executemany(statement.sql, statement.rows)
        return None
    prepared = prepare(conn, statement.sql)
    return await conn.execute(statement.sql, statement.params, prepare=prepared, binary=True)


async def _rows_async(cursor: psycopg.AsyncCursor[Any] | None) -> list[Any] | None:
    if cursor is None:
        return None
    return await cursor.fetchall() if _returns_rows(cursor) else []


# A coalesced round trip whose statement failed: it rolled back alone, and is sent again on a
# connection of its own, where its failure reaches its program as any failure does.
_ALONE: Final = object()
# Goes first in a coalesced write: Postgres runs a pipeline's statements one after another,
# so a write waiting for a row another transaction holds (a thread a delete or a locked put
# holds) would hold up every round trip behind it, and its pipeline. It waits no longer than
# this (for its own implicit transaction: nothing outlives it, through any pooler), and is
# then sent again alone (_ALONE), to wait as long as it must.
_BOUND_LOCK_WAITS: Final = "SELECT set_config('lock_timeout', '20ms', true)"
_BOUND: Final = Sql(_BOUND_LOCK_WAITS, {})  # never changed: one for every write
# The same for a write of a pipeline that holds several: it also commits without waiting for
# its WAL to reach disk (for its own implicit transaction), and the pipeline ends with
# _WAL_FLUSH, whose commit waits for the WAL of every write before it. Its calls are answered
# only once that is answered: a write answered is on disk, as on a connection of its own,
# and the pipeline's writes wait for one flush, not each for its own, one after another.
_BOUND_UNFLUSHED: Final = Sql(_BOUND_LOCK_WAITS + ", set_config('synchronous_commit', 'off', true)", {})
_WAL_FLUSH: Final = Sql(FLUSH_WAL, {})


@dataclass(slots=True)
class _SharedFlush:
    """Whether an engine's shared pipelines of several writes share one WAL flush
    (:data:`_WAL_FLUSH`). Off where the engine was told so (the tiered store: its cache must
    never hold what Postgres could still lose), and from the first flush that failed for a
    cause that lasts (:data:`_LASTING`: no privilege on ``tk_flush``, the table or a column
    gone, a publication that needs a replica identity); each such failure would cost every
    call of its pipeline a try. A failure that passes (a serialization failure, a cancel, a
    prepared statement dropped by a ``DEALLOCATE ALL``) costs its pipeline's calls a try,
    and sharing stays on."""

    on: bool

    def failed(self, failure: wire.Failure) -> None:
        lasting = failure.sqlstate is not None and failure.sqlstate.startswith(_LASTING)
        if lasting and self.on:
            self.on = False
            todo = (
                "grant INSERT, SELECT and UPDATE on tk_flush to the role threadkeep connects as"
                if failure.sqlstate == _NO_PRIVILEGE
                else "check tk_flush (migration 0009) and the publications of its schema"
            )
            logger.warning(
                "the closing WAL flush of a shared pipeline (an upsert of tk_flush) failed: %s; from now "
                "on each write of a shared pipeline waits for its own flush, as before migration 0009 (%s)",
                failure,
                todo,
            )
        elif not lasting:
            logger.info(
                "the closing WAL flush of a shared pipeline failed: %s; its calls are tried again", failure
            )


# SQLSTATEs of a flush failure that lasts: its statement or privileges (class 42: no
# privilege, no such table or column) or its table's state (55000: a publication of its
# updates and no replica identity).
_LASTING: Final = ("42", "55000")
_NO_PRIVILEGE: Final = "42501"


def _flushed(rows: list[list[Any]] | None) -> bool:
    """Whether the closing flush wrote its row (an upsert that wrote nothing would commit
    without waiting for the WAL)."""
    return rows is not None and len(rows) == 1 and len(rows[0]) == 1


# A closing flush that committed without its row (it cannot: an upsert writes one).
_NO_ROW: Final = wire.Failure(None, "the upsert of tk_flush returned no row")
# Why the calls of a shared pipeline whose closing flush failed are retried.
_UNFLUSHED: Final = (
    "the closing WAL flush of a shared pipeline (an upsert of tk_flush) failed, so its writes may not"
    " be on disk: its calls are tried again"
)
# The name of the tasks that send coalesced round trips.
_FLUSH_TASK: Final = "threadkeep-coalescer"


# How a round trip's results are made from its statements' (see _planned).
_Shape = Callable[[list[Any]], list[Any]]


def _coalescible(request: list[_Statement], prepare: _Preparing) -> bool:
    """Whether a first round trip can go with other calls': statements only (no BEGIN, so it
    opens no transaction) or a write's whole transaction (BEGIN, statements, COMMIT: a put
    under a history limit), and a write's or a state read's (planned once: index probes by
    key, so it holds up its pipeline about a millisecond at most; a page of a list may read
    a great deal)."""
    inside = _inside(request)
    statements = [statement for statement in inside if isinstance(statement, Sql)]
    if len(statements) != len(inside):
        return False
    return prepare.write or all(statement.sql in prepare.planned.statements for statement in statements)


def _inside(request: list[_Statement]) -> list[_Statement]:
    """A round trip's statements without the BEGIN and COMMIT of a transaction it holds
    whole: in a pipeline, the statements before a Sync are one transaction already."""
    if len(request) > 2 and request[0] is _BEGIN and request[-1] is _COMMIT:
        return request[1:-1]
    return request


def _answered(request: list[_Statement], inside: list[_Statement], results: _Shape) -> _Shape:
    """How the results of ``inside`` (:func:`_inside` of ``request``) make ``request``'s."""
    if inside is request:
        return results
    return partial(_in_transaction, results)


def _in_transaction(results: _Shape, rows: list[Any]) -> list[Any]:
    return ["BEGIN", *results(rows), _COMMIT]


def _bounded(
    statements: list[_Statement], results: _Shape, flushed_later: bool
) -> tuple[list[_Statement], _Shape]:
    """A coalesced write's statements, behind :data:`_BOUND_LOCK_WAITS` (and, if its
    pipeline ends with :data:`_WAL_FLUSH`, committing without waiting for its WAL)."""
    return [_BOUND_UNFLUSHED if flushed_later else _BOUND, *statements], partial(_after_bound, results)


def _after_bound(results: _Shape, rows: list[Any]) -> list[Any]:
    return results(rows[1:])


@dataclass(slots=True)
class _Waiting:
    """A round trip waiting to be coalesced, and where its results go."""

    statements: list[_Statement]
    prepare: _Preparing
    in_flight: _InFlight
    reply: asyncio.Future[Any]


class _Coalescer:
    """First round trips of concurrent calls on one event loop, sent together.

    A call hands over its first round trip if :func:`_coalescible` allows and waits. One
    connection sends every round trip waiting, each followed by a Sync, in one pipeline: each
    round trip is still its own implicit transaction, committed or rolled back alone, as on a
    connection of its own; what the calls share is the pool checkout, the send and the wait.
    A lone call goes at once; calls that come while ``IN_FLIGHT`` pipelines are out wait for
    the next, at most ``MOST`` round trips each. In the benchmark's 32 conversations this cut
    the client's CPU per turn by about a fifth (``docs/benchmarks.md``). A write waits for a
    lock no longer than :data:`_BOUND_LOCK_WAITS` says, then goes alone. The writes of a
    pipeline that holds several share one WAL flush (:data:`_BOUND_UNFLUSHED`,
    :data:`_WAL_FLUSH`); their calls are answered after it.

    The round trips go out on the connection's libpq handle (:mod:`.wire`), not through
    psycopg's cursors, and their results are read back by position, a Sync closing each
    round trip's. A round trip that failed (a statement, or the COMMIT at its Sync, which
    fails only on a deferred constraint or where the server's default isolation is not
    READ COMMITTED) rolled back alone, and is answered :data:`_ALONE`: its call sends it
    again by itself, where the failure takes its usual path. So is one whose parameters
    cannot be sent (it is never queued). The others of its pipeline are answered as usual.
    A dropped connection answers every round trip of its pipeline with its error, and
    their calls retry as after any dropped connection (SPEC W4): a round trip may have
    committed before it, as a lone one may.
    """

    IN_FLIGHT: Final = 2
    MOST: Final = 64

    def __init__(
        self,
        pool: Callable[[], Awaitable[AsyncConnectionPool]],
        wait: float,
        deadline: float | None,
        shared_flush: _SharedFlush,
    ) -> None:
        self.pool = pool  # the loop's pool at each pipeline (a closed one is replaced)
        self.wait = wait  # how long a pipeline waits for a connection
        self.deadline = deadline  # the owned pool's command timeout (deadline.py)
        self.shared_flush = shared_flush
        self.waiting: list[_Waiting] = []
        self.running = 0
        self.tasks: set[asyncio.Task[None]] = set()  # the running ones, kept from the collector

    async def send(self, statements: list[_Statement], prepare: _Preparing, in_flight: _InFlight) -> Any:
        """The results of ``statements`` as :func:`_send_async` gives them, or :data:`_ALONE`;
        ``in_flight`` is told when they go out (the caller, when they are answered).

        Raises:
            Exception: what failed the whole pipeline the round trip went on (a dropped
                connection, the pool's timeout, a closed store).
        """
        loop = asyncio.get_running_loop()
        reply: asyncio.Future[Any] = loop.create_future()
        self.waiting.append(_Waiting(statements, prepare, in_flight, reply))
        if self.running < self.IN_FLIGHT:
            # Counted here and uncounted at the flush's last step, with no await between
            # its finding nothing waiting and that: a round trip is never left unsent.
            self.running += 1
            # In a context of its own: it serves many calls, so none of their context
            # variables (a tracer's span, say) should cover what it sends.
            task = loop.create_task(self._flush(), name=_FLUSH_TASK, context=contextvars.Context())
            self.tasks.add(task)
            task.add_done_callback(self.tasks.discard)
        return await reply

    async def _flush(self) -> None:
        try:
            while self.waiting:
                batch = [waiting for waiting in self.waiting[: self.MOST] if not waiting.reply.done()]
                del self.waiting[: self.MOST]
                if batch:
                    await self._pipeline(batch)
        except BaseException:  # cancelled with its loop: so are the calls waiting
            for waiting in self.waiting:
                waiting.reply.cancel()
            self.waiting.clear()
            raise
        finally:
            self.running -= 1

    async def _pipeline(self, batch: list[_Waiting]) -> None:
        sent: list[tuple[_Waiting, _Shape]] = []
        try:
            pool = await self.pool()
            async with pool.connection(timeout=self.wait) as conn:
                try:
                    pipeline = wire.WirePipeline(conn)
                    writes = [waiting.prepare for waiting in batch if waiting.prepare.write]
                    flushed_later = self.shared_flush.on and len(writes) > 1
                    for waiting in batch:
                        inside = _inside(waiting.statements)
                        statements, results = _planned(conn, inside, waiting.prepare)
                        results = _answered(waiting.statements, inside, results)
                        if waiting.prepare.write:
                            statements, results = _bounded(statements, results, flushed_later)
                        if pipeline.queue(statements, waiting.prepare):
                            waiting.in_flight.sending()
                            sent.append((waiting, results))
                    if flushed_later:
                        queued = pipeline.queue([_WAL_FLUSH], writes[0])
                        assert queued, "a statement without parameters is always queued"
                    trips = pipeline.judge(await wire.wait(conn, pipeline.exchange(), self.deadline))
                    pipeline.end()
                    if flushed_later and not _flushed(trips.pop()):
                        self.shared_flush.failed(pipeline.failures[-1] or _NO_ROW)
                        raise psycopg.OperationalError(_UNFLUSHED)
                except BaseException:
                    # what reached the server, and what is left to read, is not known
                    await conn.close()
                    raise
            for (waiting, results), rows in zip(sent, trips, strict=True):
                if rows is not None and not waiting.reply.done():
                    try:
                        waiting.reply.set_result(results(rows))
                    except Exception as error:  # shaping its rows failed: its own failure
                        waiting.reply.set_exception(error)
        except Exception as error:
            for waiting in batch:
                if not waiting.reply.done():
                    waiting.reply.set_exception(error)
        except BaseException:  # cancelled: what was sent may have run, as for any call cancelled
            for waiting in batch:
                waiting.reply.cancel()
            raise
        for waiting in batch:
            if not waiting.reply.done():
                waiting.reply.set_result(_ALONE)
