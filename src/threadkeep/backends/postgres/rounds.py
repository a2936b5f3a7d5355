"""How a program's requests become round trips to Postgres: a pure module, no connection.

An engine hands :func:`round_trips` a program and sends each list of statements it yields
as one round trip (one statement alone, several in one pipeline), then sends back their
results. The plan is written once here for the sync and the async engine, and tested
without a server (``tests/backends/test_postgres_rounds.py``):

- BEGIN travels with a transaction's first round trip and COMMIT with its last;
- a batch whose results nobody reads is held back, to travel with the next round trip or
  the COMMIT (a locked put costs two round trips, a one-statement read one);
- an independent batch runs as one statement (its writes as data-modifying CTEs);
- a statement planned once (:class:`PlannedOnce`) goes behind its planner settings, or is
  replaced by its stand-in on a connection that never prepares;
- :class:`InFlight` knows whether a round trip that may commit is out unanswered, so that a
  step whose tries ran out says truthfully whether it may have been stored.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable, Generator, Mapping
from dataclasses import dataclass, field, replace
from functools import partial
from typing import Any, Final, TypeVar

import psycopg

from threadkeep.core.program import Batch, Program, Sql, SqlMany

__all__ = [
    "BEGIN",
    "COMMIT",
    "InFlight",
    "PlannedOnce",
    "Preparing",
    "Statement",
    "planned",
    "round_trips",
]

T = TypeVar("T")


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


NONE_PLANNED: Final = PlannedOnce()


@dataclass(slots=True)
class InFlight:
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
Statement = str | Sql | SqlMany
# Pinned, not the server's default: a put reads the head after it has the thread's lock, and
# only READ COMMITTED gives that read a snapshot taken after the lock holder's commit.
BEGIN = "BEGIN ISOLATION LEVEL READ COMMITTED"
COMMIT = "COMMIT"


def round_trips(
    program: Program[T], transaction: bool, in_flight: InFlight
) -> Generator[list[Statement], list[Any], T]:
    """Run ``program`` as round trips: yields the statements of each, receives their results.

    BEGIN travels with the first round trip and COMMIT with the last. A batch whose results
    the program does not read (``Batch(wanted=False)``) is held back and sent with the next
    round trip, or with the COMMIT: a locked put costs two round trips, a read of one
    statement one. A batch that may commit on its own (``Batch(ends=True)``) carries the
    COMMIT, or goes alone if it is one statement that no transaction precedes (a put as one
    statement: one round trip); what the program asks after it runs in a new transaction.
    An empty one (:data:`~threadkeep.core.program.END_TRANSACTION`) carries only the COMMIT,
    and nothing at all when no transaction is open. A failed round trip is raised inside
    the program, as :func:`~threadkeep.core.program.drive` does. ``in_flight`` is told,
    before each round trip is yielded, whether it may commit.
    """
    held: list[Sql | SqlMany] = []
    begun = False
    reply: Any
    try:
        request = next(program)
    except StopIteration as stop:  # a program with nothing to do
        return stop.value  # type: ignore[no-any-return]
    while True:
        try:
            if isinstance(request, Batch) and request.ends and not (request.requests or begun or held):
                reply = []  # a transaction's end (END_TRANSACTION) with no transaction open
            elif isinstance(request, Batch) and request.ends:
                statements, shape = _statements(request)
                lone = not begun and not held and len(statements) == 1
                opening = [BEGIN] if transaction and not begun and not lone else []
                closing = [COMMIT] if (begun or opening) else []
                sent = [*opening, *held, *statements, *closing]
                first = len(sent) - len(closing) - len(statements)
                held, begun = [], False
                in_flight.commits = True  # its COMMIT, or one statement committing itself
                results = yield sent
                if closing:
                    _check_committed(results[-1])
                reply = shape(results[first : first + len(statements)])
            elif isinstance(request, Batch) and not request.wanted:
                fused = _fuse(request)
                held.extend([fused] if fused is not None else request.requests)
                reply = [None] * len(request.requests)
            else:
                opening = [BEGIN] if transaction and not begun else []
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
    held: list[Sql | SqlMany], begun: bool, value: T, in_flight: InFlight
) -> Generator[list[Statement], list[Any], T]:
    """Send what is held back, with the COMMIT.

    Raises:
        psycopg.errors.InFailedSqlTransaction: the server rolled the transaction back instead
            (a program went on after a failed statement): nothing of it was stored.
    """
    tail: list[Statement] = [*held, *([COMMIT] if begun else [])]
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
    if answer != COMMIT:
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
class Preparing:
    """Which statements of a program become prepared statements, and how.

    A write's may, once psycopg's threshold says so: they skip parsing and planning. A
    read's are not: a prepared statement runs, after five executions, on a generic plan,
    which for a read whose best plan depends on its parameters (a list's filters, a sweep's
    page) can scan where a plan made for the parameters probes an index. A statement
    planned once (``planned``), whatever the program, is prepared at its first run, and so
    is the statement of its settings that goes before it (:func:`planned`).
    """

    write: bool
    planned: PlannedOnce

    def __call__(self, sql: str, prepare_threshold: int | None) -> bool | None:
        """psycopg's ``prepare`` for ``sql`` on a connection of ``prepare_threshold``."""
        planned = sql in self.planned.statements or sql == self.planned.settings
        if planned and prepare_threshold is not None:
            return True
        return None if self.write else False


def planned(
    statements: list[Statement], prepare: Preparing, prepare_threshold: int | None
) -> tuple[list[Statement], Callable[[list[Any]], list[Any]]]:
    """The statements of a round trip as they are sent on a connection of
    ``prepare_threshold``, and how their results make the round trip's: a lone statement
    planned once goes behind its settings, or is replaced by its stand-in on a connection
    that never prepares (``None``)."""
    if len(statements) != 1 or not isinstance(statements[0], Sql):
        return statements, _as_sent
    lone = statements[0]
    stand_in = prepare.planned.statements.get(lone.sql)
    if stand_in is None:
        return statements, _as_sent
    if prepare_threshold is None:
        return [replace(lone, sql=stand_in)], _as_sent
    return [Sql(prepare.planned.settings, {}), lone], _last


def _as_sent(results: list[Any]) -> list[Any]:
    return results


def _last(results: list[Any]) -> list[Any]:
    return results[-1:]
