"""A shared pipeline's statements, sent on the connection's libpq handle.

A coalesced pipeline (``engine._Coalescer``) carries the first round trips of many calls,
each followed by a Sync. Through psycopg's cursors each statement would cost a cursor (with
its own adapters map, types registry and transformer, kept until the pipeline is read), a
pass through psycopg's prepared-statement bookkeeping and a send of its own: most of a
shared pipeline's client CPU, for a few rows of results. :class:`WirePipeline` queues the
statements on the connection's ``PGconn`` in pipeline mode instead, dumps their parameters
with one psycopg ``Transformer`` (so every value is adapted exactly as psycopg adapts it),
sends what libpq has not sent yet once every round trip is queued, and reads the results
back by position: each round trip's statements, then its Sync.

A statement becomes a prepared statement once it ran the connection's
``prepare_threshold`` times (:class:`Prepared`), under a name of its own (``_tk<n>``), kept
per connection. In a pipeline of one round trip, a statement whose rows its program takes
early (``Sql.early``) is read in chunks, handed over as they arrive. :func:`wait` drives
the exchange on the event loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import re
import weakref
from collections.abc import Callable, Generator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

import psycopg
from psycopg import pq
from psycopg.adapt import PyFormat, Transformer

# psycopg's own non-blocking exchanges (in C with psycopg_binary), as its pipelines use them.
from psycopg.generators import fetch, fetch_many, send
from psycopg.waiting import READY_R, READY_W, WAIT_R, WAIT_W

from threadkeep.backends.postgres.deadline import NoAnswer, give_up_async

__all__ = ["Failure", "WirePipeline", "wait"]

_PLACEHOLDER = re.compile(r"%\(([^)]+)\)([sbt])|%%|%")
_OK: Final = (pq.ExecStatus.TUPLES_OK, pq.ExecStatus.COMMAND_OK)
_ROWS: Final = pq.ExecStatus.TUPLES_OK
_SYNC: Final = pq.ExecStatus.PIPELINE_SYNC
_FAILED: Final = pq.ExecStatus.FATAL_ERROR
_SQLSTATE: Final = pq.DiagnosticField.SQLSTATE
_MESSAGE: Final = pq.DiagnosticField.MESSAGE_PRIMARY
_UNKNOWN_NAME: Final = b"26000"  # invalid_sql_statement_name: a prepared statement that is gone
_BINARY: Final = pq.Format.BINARY
# Statements prepared (and counted) per connection at most; past it, new ones run unprepared.
_MOST_PREPARED: Final = 128
# Rows per chunk of a statement read in chunks (a cold read's messages: about 32 KB).
_CHUNK_ROWS: Final = 32
_CHUNK: Final = pq.ExecStatus.TUPLES_CHUNK
_HOLD_ROWS: Final = (_ROWS, _CHUNK)


@dataclass(frozen=True, slots=True)
class _Converted:
    """A statement as libpq takes it: ``$n`` placeholders, and its parameters' names and
    formats in their order."""

    query: bytes
    names: tuple[str, ...]
    formats: tuple[PyFormat, ...]


@functools.lru_cache(maxsize=256)
def _converted(sql: str, encoding: str) -> _Converted:
    """``sql``'s ``%(name)s`` (``b``, ``t``) placeholders as ``$n``, as psycopg converts them.

    Raises:
        psycopg.ProgrammingError: a placeholder psycopg would refuse too.
    """
    names: list[str] = []
    formats: list[PyFormat] = []
    parts: list[str] = []
    end = 0
    for match in _PLACEHOLDER.finditer(sql):
        parts.append(sql[end : match.start()])
        end = match.end()
        name, kind = match.groups()
        if match.group() == "%%":
            parts.append("%")
            continue
        if name is None:
            raise psycopg.ProgrammingError(f"only %(name)s, %(name)b and %(name)t placeholders: {sql!r}")
        if name not in names:
            names.append(name)
            formats.append(PyFormat(kind))
        elif formats[names.index(name)] != PyFormat(kind):
            raise psycopg.ProgrammingError(f"placeholder {name!r} has more than one format: {sql!r}")
        parts.append(f"${names.index(name) + 1}")
    parts.append(sql[end:])
    return _Converted("".join(parts).encode(encoding), tuple(names), tuple(formats))


@dataclass(frozen=True, slots=True)
class Failure:
    """Why a round trip of a pipeline rolled back: the server's SQLSTATE and message."""

    sqlstate: str | None
    message: str

    def __str__(self) -> str:
        return f"{self.message} (SQLSTATE {self.sqlstate})" if self.sqlstate else self.message


@dataclass(slots=True)
class Prepared:
    """The statements one connection has prepared (by query and parameter types), and how
    often each other one has run: a statement psycopg would prepare once it reached the
    connection's ``prepare_threshold`` is prepared then."""

    names: dict[tuple[bytes, tuple[int, ...]], bytes] = field(default_factory=dict)
    runs: dict[tuple[bytes, tuple[int, ...]], int] = field(default_factory=dict)
    serial: int = 0


_PREPARED: weakref.WeakKeyDictionary[psycopg.AsyncConnection[Any], Prepared] = weakref.WeakKeyDictionary()


def forget_prepared(conn: Any) -> None:
    """Forget the statements ``conn`` prepared: after a ROLLBACK, psycopg may have sent
    ``DEALLOCATE ALL`` (it does where it prepared statements of its own). The serial goes
    on, so a name still held by the server is never prepared again."""
    prepared = _PREPARED.get(conn)
    if prepared is not None:
        prepared.names.clear()
        prepared.runs.clear()


# What a round trip expects back, in order: a prepare's key; or a statement: None, or what
# takes its rows as they arrive (``Sql.early``).
_Early = Callable[[list[Any]], None]
_Slot = tuple[bytes, tuple[int, ...]] | _Early | None


class WirePipeline:
    """Round trips queued on ``conn`` in pipeline mode, each its own implicit transaction.

    Use: :meth:`queue` each round trip, then ``await wait(conn, pipeline.exchange())`` and
    :meth:`end`. A failure anywhere leaves the connection to be closed (:meth:`end` is not
    reached).
    """

    def __init__(self, conn: psycopg.AsyncConnection[Any]) -> None:
        self.conn = conn
        self.pgconn = conn.pgconn
        self.encoding = conn.info.encoding
        self.tx = Transformer.from_context(conn)
        self.threshold = conn.prepare_threshold
        prepared = _PREPARED.get(conn)
        if prepared is None:
            prepared = _PREPARED[conn] = Prepared()
        self.prepared = prepared
        self.trips: list[list[_Slot]] = []
        # the statements this pipeline prepares, by key: named once their Parse succeeded
        self.parsing: dict[tuple[bytes, tuple[int, ...]], bytes] = {}
        # the rows of statements read in chunks, by their results' place in the exchange
        self.streamed: dict[int, list[Any]] = {}
        # what :meth:`judge` found failed each round trip (None: it committed)
        self.failures: list[Failure | None] = []
        self.chunks = True
        self.pgconn.enter_pipeline_mode()

    def queue(
        self,
        statements: Sequence[Any],
        prepare: Callable[[psycopg.AsyncConnection[Any], str], bool | None],
    ) -> bool:
        """Queue one round trip: ``statements`` (``Sql``: ``sql`` and ``params``), then a
        Sync; ``prepare(conn, sql)`` is psycopg's ``prepare`` for each. False, with nothing
        queued, if a statement's parameters cannot be sent (the round trip goes alone,
        where its error takes its usual path).

        A statement due to be prepared is prepared just before it runs, behind the round
        trip's statements before it (a write's lock wait bound: a Parse takes its table
        locks too). No other round trip of the pipeline runs it by that name (a failure
        before the Parse skips it): the name serves the pipelines after this one, once
        :meth:`judge` saw the Parse succeed."""
        dumped = []
        try:
            for statement in statements:
                converted = _converted(statement.sql, self.encoding)
                params: Mapping[str, Any] = statement.params
                values = self.tx.dump_sequence(
                    list(map(params.__getitem__, converted.names)), converted.formats
                )
                types = self.tx.types or ()
                preparing = prepare(self.conn, statement.sql)
                dumped.append((converted.query, values, types, self.tx.formats, preparing, statement.early))
        except Exception:
            return False
        slots: list[_Slot] = []
        for query, values, types, formats, preparing, early in dumped:
            name = self._name(query, types, preparing, slots)
            if name is None:
                self.pgconn.send_query_params(
                    query, values, param_types=types, param_formats=formats, result_format=_BINARY
                )
            else:
                self.pgconn.send_query_prepared(name, values, param_formats=formats, result_format=_BINARY)
            slots.append(early)
        self.pgconn.pipeline_sync()
        self.trips.append(slots)
        return True

    def _name(
        self, query: bytes, types: tuple[int, ...], preparing: bool | None, slots: list[_Slot]
    ) -> bytes | None:
        """The prepared statement to run ``query`` as, or None; one that is due is
        prepared now (its Parse sent, its key added to ``slots``)."""
        if preparing is False or self.threshold is None:
            return None
        key = (query, types)
        prepared = self.prepared
        name = prepared.names.get(key)
        if name is not None or key in self.parsing:
            return name
        if preparing is None:
            runs = prepared.runs.get(key, 0)
            if runs < self.threshold:
                if len(prepared.runs) >= _MOST_PREPARED:  # one-off statements: start over
                    prepared.runs.clear()
                prepared.runs[key] = runs + 1
                return None
        if len(prepared.names) + len(self.parsing) >= _MOST_PREPARED:
            return None
        prepared.serial += 1
        name = self.parsing[key] = b"_tk%d" % prepared.serial
        self.pgconn.send_prepare(name, query, param_types=types)
        slots.append(key)
        return name

    def exchange(self) -> Generator[Any, Any, list[list[pq.abc.PGresult]]]:
        """Send what is queued and read every result back, for :func:`wait`: each round
        trip's, a statement's or a Parse's results at a time, up to its Sync. In a pipeline
        of one round trip, a statement with an ``early`` reader is read in chunks, each
        handed to it as it arrives. Not in a shared one: its calls are all answered when
        its exchange ends, and work done in it would hold them all up."""
        yield from send(self.pgconn)
        groups: list[list[Any]] = []
        alone = len(self.trips) == 1
        for slots in self.trips:
            at = 0
            while True:
                early = slots[at] if alone and at < len(slots) else None
                if callable(early) and self._chunked():
                    results = yield from self._streamed(len(groups), early)
                else:
                    results = yield from fetch_many(self.pgconn)
                if not results:
                    raise psycopg.OperationalError("the server ended a pipeline before its last result")
                groups.append(results)
                at += 1
                if results[0].status == _SYNC:
                    break
        return groups

    def _chunked(self) -> bool:
        """Whether the next statement's rows now come in chunks: not before libpq 17, nor
        where libpq refuses (an aborted pipeline's statement, which returns no rows)."""
        if not self.chunks:
            return False
        try:
            self.pgconn.set_chunked_rows_mode(_CHUNK_ROWS)
        except psycopg.NotSupportedError:
            self.chunks = False
            return False
        except psycopg.OperationalError:
            return False
        return True

    def _streamed(self, group: int, early: _Early) -> Generator[Any, Any, list[pq.abc.PGresult]]:
        """One statement's results, read in chunks of rows: each chunk's rows are loaded,
        kept for :meth:`judge` (under ``group``) and handed to ``early``; the results
        returned are the others (its end, or its error)."""
        results: list[Any] = []
        rows: list[Any] = []
        while True:
            result = yield from fetch(self.pgconn)
            if result is None:
                break
            if result.status != _CHUNK:
                results.append(result)
                continue
            chunk = self._rows(result)
            rows.extend(chunk)
            with contextlib.suppress(Exception):  # its program reads the rows again anyway
                early(chunk)
        self.streamed[group] = rows
        return results

    def end(self) -> None:
        """Leave pipeline mode, every result read."""
        self.pgconn.exit_pipeline_mode()

    def judge(self, groups: list[list[Any]]) -> list[list[list[Any]] | None]:
        """Each round trip's statements' rows (``[]`` for a statement without), from
        ``groups`` (what :meth:`exchange` read), or None for a round trip that rolled back:
        one whose statement failed, or was skipped after a failure, or whose COMMIT at its
        Sync failed (an error after its statements' results: a deferred constraint, or a
        serialization failure where the server's default isolation is not READ COMMITTED);
        :attr:`failures` then says what failed each.

        A statement that ran under a name the server no longer knows (a ``DEALLOCATE ALL``
        on the connection: psycopg sends one after some statements, a ``DROP`` among
        them) makes the connection forget the names of earlier pipelines, and their
        statements are prepared again; the statements this pipeline prepared are named.

        Raises:
            psycopg.OperationalError: a round trip got fewer results than it sent
                statements (never, from a server that follows the protocol).
        """
        trips: list[list[list[Any]] | None] = []
        self.failures = []
        parsed: list[tuple[bytes, tuple[int, ...]]] = []
        forget = False
        at = 0
        for slots in self.trips:
            end = at
            while groups[end][0].status != _SYNC:
                end += 1
            segment, at = groups[at:end], end + 1
            if len(segment) < len(slots):
                raise psycopg.OperationalError("a pipeline's results are out of step with its statements")
            rows: list[list[Any]] | None = (
                [] if len(segment) == len(slots) else None
            )  # else: its COMMIT failed
            for index, (slot, group) in enumerate(
                zip(slots, segment, strict=False), start=end - len(segment)
            ):
                result = group[-1]
                if result.status in _OK:
                    if isinstance(slot, tuple):
                        parsed.append(slot)
                    elif rows is not None:
                        streamed = self.streamed.get(index)
                        if streamed is None:
                            rows.append(self._rows(result))
                        else:  # its chunks' rows, and any its last result holds (none, from libpq 17)
                            rows.append(streamed + self._rows(result) if result.ntuples else streamed)
                    continue
                rows = None
                if result.status == _FAILED and result.error_field(_SQLSTATE) == _UNKNOWN_NAME:
                    forget = True
            trips.append(rows)
            self.failures.append(None if rows is not None else self._failure(segment))
        prepared = self.prepared
        if forget:  # earlier pipelines' names are gone; this one's Parses made new ones
            prepared.names.clear()
            prepared.runs.clear()
        for key in parsed:
            prepared.names[key] = self.parsing[key]
            prepared.runs.pop(key, None)
        return trips

    def _failure(self, segment: list[list[Any]]) -> Failure:
        """What failed a round trip that rolled back: the first error among its results."""
        for group in segment:
            for result in group:
                if result.status == _FAILED:
                    sqlstate = result.error_field(_SQLSTATE)
                    message = result.error_field(_MESSAGE) or b""
                    return Failure(
                        sqlstate.decode() if sqlstate else None, message.decode(self.encoding, "replace")
                    )
        return Failure(None, "the round trip was skipped or rolled back")

    def _rows(self, result: Any) -> list[Any]:
        """The rows of a result that holds rows (a statement's, or a chunk of them)."""
        if result.status not in _HOLD_ROWS:
            return []
        self.tx.set_pgresult(result)
        return self.tx.load_rows(0, result.ntuples, tuple)


async def wait(
    conn: psycopg.AsyncConnection[Any], exchange: Generator[Any, Any, Any], deadline: float | None = None
) -> Any:
    """What ``exchange`` (a psycopg non-blocking exchange on ``conn``) returns, driven on
    the running loop as ``conn.wait`` drives it, at less cost per wait: the socket stays
    registered while the exchange waits for it, and each readiness steps the exchange in
    the loop's callback (:class:`_Stepper`). ``conn.wait`` registers the socket, makes a
    future and a timer, and wakes the waiting task at every wait; a pipeline's results,
    which arrive a few rows at a time, cost it dozens of those. On a loop that is not
    asyncio's selector loop (uvloop drops a reader after a poll error without a word),
    ``conn.wait`` drives it.

    A cancelled wait stops at once, without the server cancel ``conn.wait`` sends: the
    caller closes the connection, and the server may finish the statement it was running.
    One that lasts ``deadline`` seconds (the owned pool's command timeout, :mod:`.deadline`)
    stops too, after a cancel is sent for the server's statement; the caller closes the
    connection.

    Raises:
        psycopg.OperationalError: the socket failed (as ``conn.wait`` raises it);
            :class:`~.deadline.NoAnswer` if the server did not answer within ``deadline``.
        Exception: what the exchange raised.
    """
    loop = asyncio.get_running_loop()
    if not isinstance(loop, asyncio.selector_events.BaseSelectorEventLoop):
        return await conn.wait(exchange)  # bounded by the connection's class, if timed
    try:
        wanted = next(exchange)
    except StopIteration as stop:
        return stop.value
    stepper = _Stepper(loop, conn.pgconn.socket, exchange)
    try:
        stepper.register(wanted)
    except OSError as error:
        stepper.unregister()
        raise psycopg.OperationalError(f"connection socket failed: {error}") from error
    timer = None if deadline is None else loop.call_later(deadline, stepper.expire, deadline)
    try:
        return await stepper.done
    except NoAnswer:
        await give_up_async(conn)
        raise
    finally:
        if timer is not None:
            timer.cancel()
        stepper.unregister()


class _Stepper:
    """An exchange stepped by the loop's callbacks on its socket, registered for what it
    waits for; ``done`` settles with what it returns or raises."""

    __slots__ = ("done", "exchange", "fileno", "loop", "registered")

    def __init__(
        self, loop: asyncio.AbstractEventLoop, fileno: int, exchange: Generator[Any, Any, Any]
    ) -> None:
        self.loop, self.fileno, self.exchange = loop, fileno, exchange
        self.done: asyncio.Future[Any] = loop.create_future()
        self.registered = 0

    def register(self, wanted: int) -> None:
        """Watch the socket for what the exchange waits for (``Wait`` flags), and no more."""
        loop, fileno, registered = self.loop, self.fileno, self.registered
        if wanted & WAIT_R and not registered & WAIT_R:
            loop.add_reader(fileno, self.step, READY_R)
        elif registered & WAIT_R and not wanted & WAIT_R:
            loop.remove_reader(fileno)
        if wanted & WAIT_W and not registered & WAIT_W:
            loop.add_writer(fileno, self.step, READY_W)
        elif registered & WAIT_W and not wanted & WAIT_W:
            loop.remove_writer(fileno)
        self.registered = wanted

    def unregister(self) -> None:
        """Watch the socket no more. libpq closes the socket of a connection it finds
        dropped: the selector then refuses the removal (EBADF), having forgotten it."""
        was, self.registered = self.registered, 0
        if was & WAIT_R:
            with contextlib.suppress(OSError):
                self.loop.remove_reader(self.fileno)
        if was & WAIT_W:
            with contextlib.suppress(OSError):
                self.loop.remove_writer(self.fileno)

    def expire(self, deadline: float) -> None:
        """End the wait: the server did not answer within ``deadline`` seconds."""
        if not self.done.done():
            self.done.set_exception(NoAnswer.after(deadline))
        self.unregister()

    def step(self, ready: int) -> None:
        """Step the exchange on ``ready``; once it ends, settle ``done`` first, then stop
        watching (so that a failure to stop leaves nothing waiting)."""
        done = self.done
        if done.done():  # the other direction's callback, queued in the same pass
            return
        try:
            self.register(self.exchange.send(ready))
            return
        except StopIteration as stop:
            done.set_result(stop.value)
        except OSError as error:
            done.set_exception(psycopg.OperationalError(f"connection socket failed: {error}"))
        except BaseException as error:
            done.set_exception(error)
            if not isinstance(error, Exception):  # the loop's to handle, once nothing waits
                self.unregister()
                raise
        self.unregister()
