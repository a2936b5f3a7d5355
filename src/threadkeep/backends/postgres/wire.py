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
per connection.
"""

from __future__ import annotations

import asyncio
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
from psycopg.generators import fetch_many, send
from psycopg.waiting import READY_R, READY_W, WAIT_R, WAIT_W

__all__ = ["WirePipeline", "wait"]

_PLACEHOLDER = re.compile(r"%\(([^)]+)\)([sbt])|%%|%")
_OK: Final = (pq.ExecStatus.TUPLES_OK, pq.ExecStatus.COMMAND_OK)
_ROWS: Final = pq.ExecStatus.TUPLES_OK
_SYNC: Final = pq.ExecStatus.PIPELINE_SYNC
_FAILED: Final = pq.ExecStatus.FATAL_ERROR
_SQLSTATE: Final = pq.DiagnosticField.SQLSTATE
_UNKNOWN_NAME: Final = b"26000"  # invalid_sql_statement_name: a prepared statement that is gone
_BINARY: Final = pq.Format.BINARY
# Statements prepared (and counted) per connection at most; past it, new ones run unprepared.
_MOST_PREPARED: Final = 128


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


@dataclass(slots=True)
class Prepared:
    """The statements one connection has prepared (by query and parameter types), and how
    often each other one has run: a statement psycopg would prepare once it reached the
    connection's ``prepare_threshold`` is prepared then."""

    names: dict[tuple[bytes, tuple[int, ...]], bytes] = field(default_factory=dict)
    runs: dict[tuple[bytes, tuple[int, ...]], int] = field(default_factory=dict)
    serial: int = 0


_PREPARED: weakref.WeakKeyDictionary[psycopg.AsyncConnection[Any], Prepared] = weakref.WeakKeyDictionary()


# What a round trip expects back, in order: a prepare's key, or None for a statement.
_Slot = tuple[bytes, tuple[int, ...]] | None


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
                dumped.append(
                    (converted.query, values, types, self.tx.formats, prepare(self.conn, statement.sql))
                )
        except Exception:
            return False
        slots: list[_Slot] = []
        for query, values, types, formats, preparing in dumped:
            name = self._name(query, types, preparing, slots)
            if name is None:
                self.pgconn.send_query_params(
                    query, values, param_types=types, param_formats=formats, result_format=_BINARY
                )
            else:
                self.pgconn.send_query_prepared(name, values, param_formats=formats, result_format=_BINARY)
            slots.append(None)
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
        """Send what is queued and read every result back, for :func:`wait`."""
        yield from send(self.pgconn)
        groups: list[list[Any]] = []
        syncs = len(self.trips)
        while syncs:
            results = yield from fetch_many(self.pgconn)
            if not results:
                raise psycopg.OperationalError("the server ended a pipeline before its last result")
            groups.append(results)
            if results[0].status == _SYNC:
                syncs -= 1
        return groups

    def end(self) -> None:
        """Leave pipeline mode, every result read."""
        self.pgconn.exit_pipeline_mode()

    def judge(self, groups: list[list[Any]]) -> list[list[list[Any]] | None]:
        """Each round trip's statements' rows (``[]`` for a statement without), from
        ``groups`` (what :meth:`exchange` read), or None for a round trip that rolled back:
        one whose statement failed, or was skipped after a failure, or whose COMMIT at its
        Sync failed (an error after its statements' results: a deferred constraint, or a
        serialization failure where the server's default isolation is not READ COMMITTED).

        A statement that ran under a name the server no longer knows (a ``DEALLOCATE ALL``
        on the connection: psycopg sends one after some statements, a ``ROLLBACK`` among
        them) makes the connection forget the names of earlier pipelines, and their
        statements are prepared again; the statements this pipeline prepared are named.

        Raises:
            psycopg.OperationalError: a round trip got fewer results than it sent
                statements (never, from a server that follows the protocol).
        """
        trips: list[list[list[Any]] | None] = []
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
            for slot, group in zip(slots, segment, strict=False):
                result = group[-1]
                if result.status in _OK:
                    if slot is not None:
                        parsed.append(slot)
                    elif rows is not None:
                        rows.append(self._rows(result))
                    continue
                rows = None
                if result.status == _FAILED and result.error_field(_SQLSTATE) == _UNKNOWN_NAME:
                    forget = True
            trips.append(rows)
        prepared = self.prepared
        if forget:  # earlier pipelines' names are gone; this one's Parses made new ones
            prepared.names.clear()
            prepared.runs.clear()
        for key in parsed:
            prepared.names[key] = self.parsing[key]
            prepared.runs.pop(key, None)
        return trips

    def _rows(self, result: Any) -> list[Any]:
        if result.status != _ROWS:
            return []
        self.tx.set_pgresult(result)
        return self.tx.load_rows(0, result.ntuples, tuple)


async def wait(conn: psycopg.AsyncConnection[Any], exchange: Generator[Any, Any, Any]) -> Any:
    """What ``exchange`` (a psycopg non-blocking exchange on ``conn``) returns, driven on
    the running loop as ``conn.wait`` drives it, at less cost per wait: the socket stays
    registered while the exchange waits for it, and each readiness steps the exchange in
    the loop's callback. ``conn.wait`` registers the socket, makes a future and a timer,
    and wakes the waiting task at every wait; a pipeline's results, which arrive a few
    rows at a time, cost it dozens of those.

    Raises:
        psycopg.OperationalError: the socket failed (as ``conn.wait`` raises it).
        Exception: what the exchange raised.
    """
    try:
        wanted = next(exchange)
    except StopIteration as stop:
        return stop.value
    loop = asyncio.get_running_loop()
    fileno = conn.pgconn.socket
    done: asyncio.Future[Any] = loop.create_future()
    registered = 0

    def register(wanted: int) -> None:
        nonlocal registered
        if wanted & WAIT_R and not registered & WAIT_R:
            loop.add_reader(fileno, step, READY_R)
        elif registered & WAIT_R and not wanted & WAIT_R:
            loop.remove_reader(fileno)
        if wanted & WAIT_W and not registered & WAIT_W:
            loop.add_writer(fileno, step, READY_W)
        elif registered & WAIT_W and not wanted & WAIT_W:
            loop.remove_writer(fileno)
        registered = wanted

    def step(ready: int) -> None:
        if done.done():
            return
        try:
            wanted = exchange.send(ready)
        except StopIteration as stop:
            register(0)
            done.set_result(stop.value)
        except OSError as error:
            register(0)
            done.set_exception(psycopg.OperationalError(f"connection socket failed: {error}"))
        except Exception as error:
            register(0)
            done.set_exception(error)
        else:
            register(wanted)

    register(wanted)
    try:
        return await done
    finally:
        register(0)
