"""Runs SQL programs on Postgres through psycopg 3 connection pools, sync and async.

Each program runs in one transaction on one pooled connection. A :class:`~threadkeep.core.
program.Batch` goes out in pipeline mode: its statements, one round trip. A dropped
connection (the server restarted, ``pg_terminate_backend``, a network cut) retries the whole
program on a fresh connection as the retry policy says (SPEC W4). The pools check a
connection before lending it without a round trip (a backend the server already closed is
replaced rather than used), and after a failure every idle connection is tested with one, so a
server restart costs one retry, not one per pooled connection.

There is no lock around the engine: concurrent calls run on separate connections, and two
writers of one thread queue on that thread's row lock inside Postgres.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import re
import time
import weakref
from collections.abc import Callable
from contextlib import AbstractAsyncContextManager, AbstractContextManager, nullcontext
from dataclasses import dataclass
from functools import partial
from typing import Any, TypeVar

import psycopg
from psycopg_pool import AsyncConnectionPool, ConnectionPool, PoolTimeout

from threadkeep.core.program import Batch, ProgramFactory, Sql, SqlMany, drive, drive_async
from threadkeep.core.retry import RetryPolicy

__all__ = ["PoolOptions", "PostgresEngine", "is_connection_error"]

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


def is_connection_error(error: BaseException) -> bool:
    """Whether ``error`` means the connection (or the server) went away: worth a retry."""
    return isinstance(error, (psycopg.OperationalError, psycopg.InterfaceError, PoolTimeout))


@dataclass(frozen=True, slots=True)
class PoolOptions:
    """How threadkeep builds the pools it owns.

    Attributes:
        min_size: Connections kept open.
        max_size: Connections at most, per pool.
        timeout: Seconds a call waits for a free connection before it fails (and retries).
        connect_timeout: Seconds a new connection may take.
        prepare_threshold: psycopg's: prepare a statement after it ran this many times;
            ``None`` never prepares (for PgBouncer in transaction mode).
    """

    min_size: int = 1
    max_size: int = 10
    timeout: float = 30.0
    connect_timeout: float = 10.0
    prepare_threshold: int | None = 5


class PostgresEngine:
    """Pools and transactions for one Postgres database.

    Args:
        conninfo: The connection string (libpq's ``PG*`` variables fill what it leaves out).
        retry: When a failed transaction runs again.
        options: How owned pools are built.
        pool: A sync pool the application owns; used as given, never closed here.
        async_pool: An async pool the application owns; used as given, never closed here.
    """

    def __init__(
        self,
        conninfo: str,
        *,
        retry: RetryPolicy,
        options: PoolOptions | None = None,
        pool: ConnectionPool | None = None,
        async_pool: AsyncConnectionPool | None = None,
    ) -> None:
        self.conninfo = conninfo
        self.retry = retry
        self.options = options or PoolOptions()
        self._given_pool = pool
        self._given_async_pool = async_pool
        self._pool: ConnectionPool | None = None
        # An async pool belongs to the event loop that opened it: one per loop.
        self._async_pools: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, AsyncConnectionPool] = (
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

    def _sync_pool(self) -> ConnectionPool:
        if self._given_pool is not None:
            return self._given_pool
        if self._pool is None:
            self._pool = ConnectionPool(
                self.conninfo,
                min_size=self.options.min_size,
                max_size=self.options.max_size,
                timeout=self.options.timeout,
                kwargs=self._connection_kwargs(),
                check=check_alive,
                name="threadkeep",
                open=True,
            )
        return self._pool

    async def _async_pool(self) -> AsyncConnectionPool:
        if self._given_async_pool is not None:
            return self._given_async_pool
        loop = asyncio.get_running_loop()
        pool = self._async_pools.get(loop)
        if pool is None:
            pool = AsyncConnectionPool(
                self.conninfo,
                min_size=self.options.min_size,
                max_size=self.options.max_size,
                timeout=self.options.timeout,
                kwargs=self._connection_kwargs(),
                check=check_alive_async,
                name="threadkeep-async",
                open=False,
            )
            await pool.open()
            self._async_pools[loop] = pool
        return pool

    def run(self, make: ProgramFactory[T], *, write: bool = False, atomic: bool = True) -> T:
        """Run one program in one transaction (unless not ``atomic``), retrying it whole after
        a dropped connection."""
        return self._retrying(lambda: self._once(make, self._sync_pool().connection(), atomic))

    def setup(self, make: ProgramFactory[T]) -> T:
        """Like :meth:`run`, on a short-lived connection: the format gate and migrations run
        before any pool is needed (an application that only uses the async API never opens a
        sync pool)."""
        return self._retrying(lambda: self._once(make, self.connect(), True))

    def _retrying(self, attempt: Callable[[], T]) -> T:
        tries = 0
        while True:
            tries += 1
            try:
                return attempt()
            except Exception as error:
                delay = self.retry.delay_after(error, tries)
                pool = self._given_pool or self._pool
                if pool is not None:
                    # A server restart or a mass termination kills every pooled connection at
                    # once: test the idle ones now instead of failing on each in turn.
                    pool.check()
                time.sleep(delay)

    @staticmethod
    def _once(
        make: ProgramFactory[T], connection: AbstractContextManager[psycopg.Connection[Any]], atomic: bool
    ) -> T:
        # The whole transaction runs in pipeline mode: BEGIN travels with the first batch and
        # COMMIT with the last, so a program costs one round trip per batch whose results it
        # reads, and no more.
        with connection as conn, conn.pipeline() as pipe, _transaction(conn, atomic):
            return drive(make(), partial(_execute, conn, pipe))

    async def arun(self, make: ProgramFactory[T], *, write: bool = False, atomic: bool = True) -> T:
        """The same as :meth:`run`, on the event loop's own pool."""
        tries = 0
        pool: AsyncConnectionPool | None = None
        while True:
            tries += 1
            try:
                pool = await self._async_pool()
                async with pool.connection() as conn, conn.pipeline() as pipe, _atransaction(conn, atomic):
                    return await drive_async(make(), partial(_execute_async, conn, pipe))
            except Exception as error:
                delay = self.retry.delay_after(error, tries)
                if pool is not None:
                    await pool.check()  # as in _retrying
                await asyncio.sleep(delay)

    def connect(self) -> psycopg.Connection[Any]:
        """One short-lived connection, closed when its ``with`` block ends."""
        return psycopg.connect(self.conninfo, **self._connection_kwargs())

    def close(self) -> None:
        """Close the pools this engine opened; pools it was given stay open."""
        self._closed = True
        if self._pool is not None:
            self._pool.close()
            self._pool = None
        for loop, pool in list(self._async_pools.items()):
            if not loop.is_closed() and not loop.is_running():
                loop.run_until_complete(pool.close())
        self._async_pools.clear()

    async def aclose(self) -> None:
        """Close the pools this engine opened, from inside an event loop."""
        current = asyncio.get_running_loop()
        pool = self._async_pools.pop(current, None)
        if pool is not None:
            await pool.close()
        self.close()


def _transaction(conn: psycopg.Connection[Any], atomic: bool) -> AbstractContextManager[Any]:
    return conn.transaction() if atomic else nullcontext()


def _atransaction(conn: psycopg.AsyncConnection[Any], atomic: bool) -> AbstractAsyncContextManager[Any]:
    return conn.transaction() if atomic else nullcontext()


_PLACEHOLDER = re.compile(r"%\((\w+)\)s")


@functools.lru_cache(maxsize=256)
def _fused_sql(statements: tuple[str, ...], read: bool) -> str:
    """One statement running ``statements`` (placeholders of the i-th renamed ``s<i>_``):
    the writes as data-modifying CTEs, and the first as the main query when ``read``."""
    renamed = [_PLACEHOLDER.sub(rf"%(s{i}_\1)s", sql.strip()) for i, sql in enumerate(statements)]
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


def _execute(conn: psycopg.Connection[Any], pipe: psycopg.Pipeline, request: Any) -> Any:
    if isinstance(request, Batch) and (fused := _fuse(request)) is not None:
        if request.wanted:
            return _fused_results(request, _execute(conn, pipe, fused))
        conn.execute(fused.sql, fused.params, binary=True)
        return _fused_results(request, [])
    if isinstance(request, SqlMany):
        conn.cursor().executemany(request.sql, request.rows)
        return None
    if isinstance(request, Sql):
        cursor = conn.execute(request.sql, request.params, binary=True)
        pipe.sync()
        return _rows(cursor)
    if isinstance(request, Batch):
        cursors: list[psycopg.Cursor[Any] | None] = []
        for inner in request.requests:
            if isinstance(inner, Sql):
                cursors.append(conn.execute(inner.sql, inner.params, binary=True))
            else:
                conn.cursor().executemany(inner.sql, inner.rows)
                cursors.append(None)
        if not request.wanted:
            return [None] * len(cursors)
        pipe.sync()
        return [_rows(cursor) for cursor in cursors]
    raise TypeError(f"the postgres engine cannot run {request!r}")


def _rows(cursor: psycopg.Cursor[Any] | None) -> list[Any] | None:
    """A synced cursor's rows (``[]`` for a statement without a result)."""
    if cursor is None:
        return None
    return cursor.fetchall() if cursor.description is not None else []


async def _rows_async(cursor: psycopg.AsyncCursor[Any] | None) -> list[Any] | None:
    if cursor is None:
        return None
    return await cursor.fetchall() if cursor.description is not None else []


async def _execute_async(
    conn: psycopg.AsyncConnection[Any], pipe: psycopg.AsyncPipeline, request: Any
) -> Any:
    if isinstance(request, Batch) and (fused := _fuse(request)) is not None:
        if request.wanted:
            return _fused_results(request, await _execute_async(conn, pipe, fused))
        await conn.execute(fused.sql, fused.params, binary=True)
        return _fused_results(request, [])
    if isinstance(request, SqlMany):
        await conn.cursor().executemany(request.sql, request.rows)
        return None
    if isinstance(request, Sql):
        cursor = await conn.execute(request.sql, request.params, binary=True)
        await pipe.sync()
        return await _rows_async(cursor)
    if isinstance(request, Batch):
        cursors: list[psycopg.AsyncCursor[Any] | None] = []
        for inner in request.requests:
            if isinstance(inner, Sql):
                cursors.append(await conn.execute(inner.sql, inner.params, binary=True))
            else:
                await conn.cursor().executemany(inner.sql, inner.rows)
                cursors.append(None)
        if not request.wanted:
            return [None] * len(cursors)
        await pipe.sync()
        return [await _rows_async(cursor) for cursor in cursors]
    raise TypeError(f"the postgres engine cannot run {request!r}")
