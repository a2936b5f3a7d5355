"""Runs SQL programs on Postgres through psycopg 3 connection pools, sync and async.

Each program runs on one pooled connection, a write in one transaction, through psycopg's
public API: ``execute`` for a round trip of one statement, ``pipeline()`` for several, with
psycopg's own prepared statements (``prepare=``). How a program's requests become round
trips is planned once, for both APIs, in :mod:`.rounds`. Each try is bounded by the command
timeout (:mod:`.bound`).

A dropped connection (the server restarted, ``pg_terminate_backend``, a network cut), or one
that did not answer within the command timeout (a stopped backend, a connection a network
device dropped without a word), retries the whole program on a fresh connection as the
retry policy says (SPEC W4); what the server refuses (a login, a database, a privilege, a
statement: :func:`refusal`) is raised at once, and a try that failed leaves its connection
to the pool only if nothing on it changed (:func:`_reusable`). The pools check a connection
before lending it without a round trip (a backend the server already closed is replaced
rather than used); at the first dead one, and after a dropped connection, an owned pool
replaces every connection it holds (``drain()``): a server restart costs one retry, not one
per pooled connection. A step's waits for a connection and its retries end at the policy's
deadline (``STEP_DEADLINE_SECONDS``), and an owned pool gives up a connection it cannot open
at once (:data:`_RECONNECT_SECONDS`): the first step after an outage is served as soon as
the server answers, not after a reconnection backoff.

There is no lock around the engine: concurrent calls run on separate connections, and two
writers of one thread queue on that thread's row lock inside Postgres. Each write commits
as the session's own settings say (``synchronous_commit``): it is acknowledged once Postgres
says it is durable.
"""

from __future__ import annotations

import asyncio
import logging
import math
import re
import threading
import time
import weakref
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass, replace
from functools import partial
from typing import Any, Final, TypeVar

import psycopg
from psycopg_pool import AsyncConnectionPool, ConnectionPool, PoolTimeout

from threadkeep.backends.closing import PerLoop, close_elsewhere
from threadkeep.backends.postgres.bound import bounded, bounded_async
from threadkeep.backends.postgres.rounds import (
    NONE_PLANNED,
    InFlight,
    PlannedOnce,
    Preparing,
    Statement,
    planned,
    round_trips,
)
from threadkeep.core.program import ProgramFactory, Sql, SqlMany, drive, drive_async
from threadkeep.core.retry import Refusal, RetryPolicy, Tries, maintenance
from threadkeep.errors import StorageError, ThreadkeepError

__all__ = ["PlannedOnce", "PoolOptions", "PostgresEngine", "is_connection_error", "refusal"]

logger = logging.getLogger("threadkeep.postgres")
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
    found, every connection the pool holds replaced (``drain()``), so that the next
    checkout gets a new one. psycopg_pool sleeps between failed checks of one checkout,
    1 s, 2 s, 4 s ...: after a server restart, a pool holding a few dead connections would
    make the first call wait out those sleeps (and, under the step deadline, fail)."""

    pool: ConnectionPool | None = None

    def __call__(self, conn: psycopg.Connection[Any]) -> None:
        try:
            check_alive(conn)
        except psycopg.OperationalError:
            if self.pool is not None:
                self.pool.drain()
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
                await self.pool.drain()
            raise


def is_connection_error(error: BaseException) -> bool:
    """Whether ``error`` means the connection (or the server) went away, or the connection
    lost a prepared statement: worth a retry, on a new connection. What :func:`refusal`
    names is asked first, and never retried."""
    if isinstance(error, psycopg.errors.InvalidSqlStatementName):
        return True
    return isinstance(error, (psycopg.OperationalError, psycopg.InterfaceError, PoolTimeout))


def _lost(error: BaseException) -> bool:
    """Whether ``error`` says the connection was lost (closed by the server or the network,
    or given up for not answering, :class:`~.bound.NoAnswer`), as every connection of its
    pool may be: not a wait for a free connection, nor a lost prepared statement."""
    if isinstance(error, PoolTimeout) or not isinstance(
        error, (psycopg.OperationalError, psycopg.InterfaceError)
    ):
        return False
    sqlstate = error.sqlstate
    return sqlstate is None or sqlstate.startswith(("08", "57P"))


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
        command_timeout: Seconds a try waits for the server's answers before a cancel is
            sent, the connection closed and the step retried on a new one (:mod:`.bound`: a
            round trip that may commit then has an unknown outcome,
            :class:`~.rounds.InFlight`); ``None``, no bound.
        prepare_threshold: psycopg's: prepare a statement after it ran this many times;
            ``None`` never prepares (for PgBouncer in transaction mode).
    """

    min_size: int = 1
    max_size: int = 10
    timeout: float = 30.0
    connect_timeout: float = 10.0
    command_timeout: float | None = 30.0
    prepare_threshold: int | None = 5


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
    ) -> None:
        self.conninfo = conninfo
        self.planned_once = planned_once or NONE_PLANNED
        # what a read's and a write's statements are prepared as (one of each, for every call)
        self._preparing = (Preparing(False, self.planned_once), Preparing(True, self.planned_once))
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

    def _pool_kwargs(self) -> dict[str, Any]:
        """What an owned pool is built with (opened by the caller)."""
        return {
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
                        **self._pool_kwargs(),
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
                        **self._pool_kwargs(),
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

        def attempt(in_flight: InFlight, tries: Tries) -> T:
            pool = self._sync_pool(tries.wait(self.options.timeout))
            connection = pool.connection(timeout=tries.wait(pool.timeout))
            return self._once(make, connection, write and atomic, self._preparing[write], in_flight)

        return self._retrying(attempt, write)

    def setup(self, make: ProgramFactory[T], *, transaction: bool = True) -> T:
        """Like :meth:`run`, on a short-lived connection: the format gate and migrations run
        before any pool is needed (an application that only uses the async API never opens a
        sync pool). A program of several transactions (the upgrade of a store: each step
        ends at :data:`~threadkeep.core.program.END_TRANSACTION`) runs them all on that one
        connection; a retry runs it again whole. Unbounded by the command timeout, as
        maintenance: a migration may rewrite a table, and a second process waits for the
        first one's migrations. A read that is one statement at a time needs no
        ``transaction``."""
        prepare = self._preparing[False]
        with maintenance():
            return self._retrying(
                lambda in_flight, tries: self._once(
                    make,
                    self.connect(tries.wait(self.options.connect_timeout)),
                    transaction,
                    prepare,
                    in_flight,
                ),
                False,
            )

    async def asetup(self, make: ProgramFactory[T], *, transaction: bool = True) -> T:
        """Like :meth:`setup`, on the event loop's pool: an application that opens the store
        from its loop (:func:`~threadkeep.providers.aopen_checkpointer`) checks the format on
        the connection its first read then uses, instead of one opened for the check."""
        with maintenance():
            return await self._arun(make, False, transaction, self._preparing[False])

    def _retrying(self, attempt: Callable[[InFlight, Tries], T], write: bool) -> T:
        in_flight = InFlight()
        tries = Tries(self.retry, write, in_flight)
        while True:
            try:
                return attempt(in_flight, tries)
            except Exception as error:
                self._refuse_if_closed()  # closed meanwhile: say so, not what the closing broke
                delay = tries.failed(error)
                pool = self._pool
                if pool is not None and _lost(error):
                    # A server restart or a mass termination kills every pooled connection at
                    # once (a stalled network mutes them all): replace them all now, instead
                    # of failing on each in turn.
                    pool.drain()
                time.sleep(delay)

    def _once(
        self,
        make: ProgramFactory[T],
        connection: AbstractContextManager[psycopg.Connection[Any]],
        transaction: bool,
        prepare: Preparing,
        in_flight: InFlight,
    ) -> T:
        in_flight.spoilt = False
        with connection as conn:
            try:
                with bounded(conn, self.options.command_timeout):
                    return drive(
                        round_trips(make(), transaction, in_flight),
                        partial(_send_tracked, conn, prepare, in_flight),
                    )
            except BaseException as error:
                if _refused_in_transaction(conn, error, in_flight):
                    try:
                        conn.rollback()
                    except Exception:
                        conn.close()
                elif not _reusable(conn, error, in_flight):
                    conn.close()
                raise

    async def arun(self, make: ProgramFactory[T], *, write: bool = False, atomic: bool = True) -> T:
        """The same as :meth:`run`, on the event loop's own pool."""
        return await self._arun(make, write, write and atomic, self._preparing[write])

    async def _arun(self, make: ProgramFactory[T], write: bool, transaction: bool, prepare: Preparing) -> T:
        in_flight = InFlight()
        tries = Tries(self.retry, write, in_flight)
        pool: AsyncConnectionPool | None = None
        while True:
            try:
                pool = await self._async_pool(tries.wait(self.options.timeout))
                in_flight.spoilt = False
                async with pool.connection(timeout=tries.wait(pool.timeout)) as conn:
                    try:
                        async with bounded_async(conn, self.options.command_timeout):
                            return await drive_async(
                                round_trips(make(), transaction, in_flight),
                                partial(_send_async_tracked, conn, prepare, in_flight),
                            )
                    except BaseException as error:
                        if _refused_in_transaction(conn, error, in_flight):
                            try:
                                await conn.rollback()
                            except Exception:
                                await conn.close()
                        elif not _reusable(conn, error, in_flight):
                            await conn.close()
                        raise
            except Exception as error:
                self._refuse_if_closed()
                delay = tries.failed(error)
                if pool is not None and pool is not self._given_async_pool and _lost(error):
                    await pool.drain()  # as in _retrying
                await asyncio.sleep(delay)

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


async def _close_pool(pool: AsyncConnectionPool) -> None:
    """Close an async pool, at the latest when its loop ends: psycopg_pool's workers take a
    cancellation that arrives while they run a maintenance task (a connection being added as
    the pool grows) for a failed task and wait for the next one, so a runner cancelling the
    tasks left would wait for them forever; closing the pool sends them their stop."""
    await pool.close()


def _send(conn: psycopg.Connection[Any], statements: list[Statement], prepare: Preparing) -> list[Any]:
    """One round trip: a lone statement as itself, several in one pipeline."""
    statements, results = planned(statements, prepare, conn.prepare_threshold)
    if len(statements) == 1 and isinstance(statements[0], Sql):
        lone = statements[0]
        return [
            _rows(
                conn.execute(
                    lone.sql, lone.params, prepare=prepare(lone.sql, conn.prepare_threshold), binary=True
                )
            )
        ]
    with conn.pipeline():
        cursors = [_queue(conn, statement, prepare) for statement in statements]
    return results(
        [_result(statement, cursor) for statement, cursor in zip(statements, cursors, strict=True)]
    )


def _send_tracked(
    conn: psycopg.Connection[Any], prepare: Preparing, in_flight: InFlight, statements: list[Statement]
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
    conn: psycopg.Connection[Any], statement: Statement, prepare: Preparing
) -> psycopg.Cursor[Any] | None:
    if isinstance(statement, str):
        return conn.execute(statement)
    if isinstance(statement, SqlMany):
        conn.cursor().executemany(statement.sql, statement.rows)
        return None
    return conn.execute(
        statement.sql, statement.params, prepare=prepare(statement.sql, conn.prepare_threshold), binary=True
    )


def _result(statement: Statement, cursor: psycopg.Cursor[Any] | None) -> Any:
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
    conn: psycopg.Connection[Any] | psycopg.AsyncConnection[Any], error: BaseException, in_flight: InFlight
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
    ``prepared statement "_pg3_5" does not exist``); a cancelled wait leaves results
    unread. A failure costs its call a new connection, and no other call anything."""
    return (
        isinstance(error, Exception)
        and not in_flight.spoilt
        and not conn.closed
        and conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE
    )


def _refused_in_transaction(
    conn: psycopg.Connection[Any] | psycopg.AsyncConnection[Any], error: BaseException, in_flight: InFlight
) -> bool:
    """Whether the program refused a step by itself inside the transaction it opened (a
    conflict, another user's thread: a :class:`~threadkeep.errors.ThreadkeepError`), every
    statement of it answered and none failed: the transaction is rolled back and the
    connection kept (psycopg keeps its prepared statements in step with the rollback).
    Racing runs refuse each other often; closing the connection each time would cost a new
    one per conflict."""
    return (
        isinstance(error, ThreadkeepError)
        and not in_flight.spoilt
        and not conn.closed
        and conn.info.transaction_status == psycopg.pq.TransactionStatus.INTRANS
    )


async def _send_async(
    conn: psycopg.AsyncConnection[Any], statements: list[Statement], prepare: Preparing
) -> list[Any]:
    statements, results = planned(statements, prepare, conn.prepare_threshold)
    if len(statements) == 1 and isinstance(statements[0], Sql):
        lone = statements[0]
        cursor = await conn.execute(
            lone.sql, lone.params, prepare=prepare(lone.sql, conn.prepare_threshold), binary=True
        )
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
    prepare: Preparing,
    in_flight: InFlight,
    statements: list[Statement],
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
    conn: psycopg.AsyncConnection[Any], statement: Statement, prepare: Preparing
) -> psycopg.AsyncCursor[Any] | None:
    if isinstance(statement, str):
        return await conn.execute(statement)
    if isinstance(statement, SqlMany):
        await conn.cursor().executemany(statement.sql, statement.rows)
        return None
    prepared = prepare(statement.sql, conn.prepare_threshold)
    return await conn.execute(statement.sql, statement.params, prepare=prepared, binary=True)


async def _rows_async(cursor: psycopg.AsyncCursor[Any] | None) -> list[Any] | None:
    if cursor is None:
        return None
    return await cursor.fetchall() if _returns_rows(cursor) else []
