"""Runs SQL programs on SQLite: a file in WAL mode, or a private in-memory database.

Transactions are explicit (the connection is in autocommit mode): ``BEGIN IMMEDIATE`` for a
write takes the write lock up front, so two writers never deadlock upgrading a read lock;
``BEGIN`` for a read sees one consistent snapshot. Async callers run the same sync program
on a worker thread, as SQLite has no async driver of its own.
"""

from __future__ import annotations

import asyncio
import logging
import sqlite3
import threading
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any, TypeVar

from threadkeep.core.program import Batch, ProgramFactory, Sql, SqlMany, drive
from threadkeep.errors import StorageError

__all__ = ["SqliteEngine"]

logger = logging.getLogger("threadkeep.sqlite")
T = TypeVar("T")

MEMORY = ":memory:"


class SqliteEngine:
    """A small pool of SQLite connections to one database.

    Args:
        path: The database file, created with its folder if missing; ``":memory:"`` for a
            private in-memory database that lives as long as the engine.
        synchronous: SQLite's ``synchronous`` pragma. ``NORMAL`` (the default) is durable
            against a crash of the process in WAL mode; ``FULL`` also against power loss.
        busy_timeout_ms: How long a writer waits for another process's write lock.
        max_connections: How many connections may be open at once (readers run in
            parallel; SQLite admits one writer at a time).
    """

    def __init__(
        self,
        path: str = MEMORY,
        *,
        synchronous: str = "NORMAL",
        busy_timeout_ms: int = 5000,
        max_connections: int = 8,
    ) -> None:
        self.path = path
        self.memory = path == MEMORY
        self._synchronous = synchronous
        self._busy_timeout_ms = busy_timeout_ms
        # A private in-memory database exists only on its one connection.
        self._slots = threading.BoundedSemaphore(1 if self.memory else max_connections)
        self._idle: list[sqlite3.Connection] = []
        self._open: list[sqlite3.Connection] = []
        self._guard = threading.Lock()
        # SQLite admits one writer; a second one waits in its busy handler, which sleeps
        # 1 ms, 2 ms, 5 ms, ... between tries. Writers of this process queue here instead
        # and start the moment the lock is free (other processes still use busy_timeout).
        self._writer = threading.Lock()
        self._closed = False
        if not self.memory:
            folder = Path(path).expanduser().parent
            try:
                folder.mkdir(parents=True, exist_ok=True)
            except OSError as exc:
                raise StorageError(
                    f"cannot create the folder {folder} for the sqlite store: {exc}; "
                    "set LLM_PROVIDER_CHECKPOINT_CONN_STRING to a writable path"
                ) from exc
        self._idle.append(self._connect())

    @property
    def location(self) -> str:
        return "memory" if self.memory else str(Path(self.path).expanduser())

    def _enter_wal(self, conn: sqlite3.Connection) -> None:
        """Switch a new file to WAL. The switch needs the file to itself, and SQLite answers
        "locked" at once, without its busy handler, when several first uses race; so wait
        here, up to the busy timeout."""
        deadline = time.monotonic() + self._busy_timeout_ms / 1000
        while True:
            try:
                conn.execute("PRAGMA journal_mode = WAL")
                return
            except sqlite3.OperationalError as exc:
                if "locked" not in str(exc) or time.monotonic() >= deadline:
                    raise
                time.sleep(0.01)

    def _connect(self) -> sqlite3.Connection:
        try:
            conn = sqlite3.connect(
                self.path,
                isolation_level=None,
                check_same_thread=False,
                timeout=self._busy_timeout_ms / 1000,
            )
            conn.execute(f"PRAGMA busy_timeout = {int(self._busy_timeout_ms)}")
            if not self.memory:
                # WAL lets readers in other processes run while one process writes.
                self._enter_wal(conn)
            conn.execute(f"PRAGMA synchronous = {_pragma_word(self._synchronous)}")
        except sqlite3.Error as exc:
            raise StorageError(f"cannot open the sqlite store at {self.location}: {exc}") from exc
        self._open.append(conn)
        return conn

    def _acquire(self) -> sqlite3.Connection:
        if self._closed:
            raise StorageError(f"the sqlite store at {self.location} is closed")
        self._slots.acquire()
        with self._guard:
            if self._idle:
                return self._idle.pop()
        try:
            return self._connect()
        except BaseException:
            self._slots.release()
            raise

    def _release(self, conn: sqlite3.Connection) -> None:
        with self._guard:
            self._idle.append(conn)
        self._slots.release()

    def run(self, make: ProgramFactory[T], *, write: bool = False, atomic: bool = True) -> T:
        """Run one program in one transaction; roll back everything if it fails."""
        if write:
            with self._writer:
                return self._run(make, write=True)
        return self._run(make, write=False)

    def _run(self, make: ProgramFactory[T], *, write: bool, steps: bool = False) -> T:
        """Run ``make()`` in a transaction; with ``steps``, one transaction per part of it
        (each batch that ``ends`` commits, and a new write transaction begins)."""
        conn = self._acquire()
        opening = "BEGIN IMMEDIATE" if write else "BEGIN"
        execute = partial(_execute_steps, conn, opening) if steps else partial(_execute, conn)
        try:
            conn.execute(opening)
            try:
                result = drive(make(), execute)
            except BaseException:
                if conn.in_transaction:
                    conn.execute("ROLLBACK")
                raise
            conn.execute("COMMIT")
            return result
        except sqlite3.Error as exc:
            raise StorageError(f"the sqlite store at {self.location} failed: {exc}") from exc
        finally:
            self._release(conn)

    def setup(self, make: ProgramFactory[T], *, transaction: bool = True) -> T:
        """Run a schema program in write transactions, one per part of it that ends at
        :data:`~threadkeep.core.program.END_TRANSACTION` (always in a transaction:
        ``transaction`` is for engines where a read may go without one)."""
        with self._writer:
            return self._run(make, write=True, steps=True)

    async def asetup(self, make: ProgramFactory[T], *, transaction: bool = True) -> T:
        """:meth:`setup`, off the event loop."""
        return await self._off_loop(partial(self.setup, make))

    async def arun(self, make: ProgramFactory[T], *, write: bool = False, atomic: bool = True) -> T:
        """Run one program without blocking the event loop.

        The in-memory database answers in microseconds and is shared by one connection, so it
        runs inline, as LangGraph's own ``InMemorySaver`` does; a file runs on a worker thread.
        """
        return await self._off_loop(partial(self.run, make, write=write))

    async def _off_loop(self, call: Callable[[], T]) -> T:
        """``call()`` on a worker thread; inline for the in-memory database."""
        if self.memory:
            return call()
        return await asyncio.to_thread(call)

    async def aclose(self) -> None:
        """Close every connection; the engine refuses work afterwards."""
        self.close()

    def close(self) -> None:
        """Close every connection; the engine refuses work afterwards."""
        with self._guard:
            self._closed = True
            conns, self._open, self._idle = self._open, [], []
        for conn in conns:
            conn.close()


def _execute(conn: sqlite3.Connection, request: Any) -> Any:
    if isinstance(request, Sql):
        return conn.execute(request.sql, request.params).fetchall()
    if isinstance(request, SqlMany):
        conn.executemany(request.sql, request.rows)
        return None
    if isinstance(request, Batch):
        # In process there is no round trip to save: the statements simply run in order.
        return [_execute(conn, inner) for inner in request.requests]
    raise TypeError(f"the sqlite engine cannot run {request!r}")


def _execute_steps(conn: sqlite3.Connection, opening: str, request: Any) -> Any:
    """:func:`_execute`, ending the transaction after a batch that ``ends`` (a schema
    program's steps: :meth:`SqliteEngine.setup`) and opening the next."""
    result = _execute(conn, request)
    if isinstance(request, Batch) and request.ends:
        conn.execute("COMMIT")
        conn.execute(opening)
    return result


def _pragma_word(value: str) -> str:
    word = value.upper()
    if word not in {"OFF", "NORMAL", "FULL", "EXTRA"}:
        raise ValueError(f"synchronous={value!r} is not OFF, NORMAL, FULL or EXTRA")
    return word
