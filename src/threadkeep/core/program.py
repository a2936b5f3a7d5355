"""Programs: storage logic written once, as sans-I/O generators.

A *program* is a generator that yields requests (an SQL statement with its parameters, a
Redis script call, ...) and receives each request's result; its return value is the
operation's result. An *engine* runs a program on a sync or an async connection, a write
inside one transaction. So every decision lives once, in the program; engines only move bytes, and a
retry after a dropped connection simply runs the program again on a fresh connection.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Generator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final, Protocol, TypeVar

__all__ = [
    "END_TRANSACTION",
    "Batch",
    "Engine",
    "Program",
    "ProgramFactory",
    "Sql",
    "SqlMany",
    "drive",
    "drive_async",
]

T = TypeVar("T")
# drive_async's default request: none made yet, the program is to be started.
_FIRST: Any = object()
T_co = TypeVar("T_co", covariant=True)

Program = Generator[Any, Any, T]
ProgramFactory = Callable[[], Program[T]]


@dataclass(frozen=True, slots=True)
class Sql:
    """Run one statement; the program receives the rows it returns (``[]`` for none)."""

    sql: str
    params: Mapping[str, object]


@dataclass(frozen=True, slots=True)
class SqlMany:
    """Run one statement once per parameter set; the program receives ``None``."""

    sql: str
    rows: Sequence[Mapping[str, object]]


@dataclass(frozen=True, slots=True)
class Batch:
    """Run statements in order; the program receives the list of their results.

    The program needs none of the results before the last statement is sent, so an engine
    may send them all at once (Postgres pipeline mode: one round trip instead of one each).
    With ``wanted=False`` the program needs no results at all (it receives ``None``s), and
    the statements may travel with the transaction's COMMIT.

    ``independent=True`` says more: every statement but the first is a write, no statement
    reads what another writes, and only the first (a read, when ``wanted``) returns rows;
    the others' results are ``[]``. An engine may then run the batch as one statement
    (Postgres: the writes as data-modifying CTEs of the read), which costs the client one
    statement's work instead of one per statement.

    ``ends=True`` says the batch's statements may commit on their own, before the program
    goes on: an engine sends the transaction's COMMIT with them (or nothing more, for a lone
    statement that no transaction precedes: one statement is atomic), and runs what the
    program asks next in a new transaction. An engine that holds one transaction for the
    whole program (SQLite) may keep it, except in a schema program (:meth:`Engine.setup`),
    where every such batch ends its transaction (:data:`END_TRANSACTION`).
    """

    requests: tuple[Sql | SqlMany, ...]
    wanted: bool = True
    independent: bool = False
    ends: bool = False


# The end of a transaction in a schema program of several (the upgrade of a store: its format
# checked, each migration, its format recorded): what came before commits, and what the
# program asks next runs in a transaction of its own. ``Engine.setup`` honours it always.
END_TRANSACTION: Final = Batch((), wanted=False, ends=True)


class Engine(Protocol):
    """Runs programs against one store, each write in its own transaction."""

    def run(self, make: ProgramFactory[T], *, write: bool = False, atomic: bool = True) -> T:
        """Run the program ``make()`` builds; a ``write`` in one transaction.

        ``write`` takes the store's write lock; ``atomic=False`` says the program's
        statements are each idempotent and guarded, so it may run without a transaction.
        A read (``write=False``) may run without one too where each statement is consistent
        on its own (Postgres under READ COMMITTED).
        """
        ...

    async def arun(self, make: ProgramFactory[T], *, write: bool = False, atomic: bool = True) -> T:
        """The same as :meth:`run`, without blocking the event loop."""
        ...

    def setup(self, make: ProgramFactory[T]) -> T:
        """Run a schema program (the format gate, a migration) on one connection, in a write
        transaction that each :data:`END_TRANSACTION` it yields commits (what it asks next
        runs in a new one); a retry runs the whole program again."""
        ...

    def close(self) -> None:
        """Release what the engine opened (never what it was given)."""
        ...

    async def aclose(self) -> None:
        """The same as :meth:`close`, from inside an event loop."""
        ...


def drive(program: Program[T], execute: Callable[[Any], Any]) -> T:
    """Run ``program`` to its end, answering each request with ``execute(request)``.

    A request that fails is raised inside the program, which may handle it (the tiered
    provider clears its cache on a conflict); one it does not handle ends the run.
    """
    try:
        request = next(program)
        while True:
            try:
                reply = execute(request)
            except Exception as error:
                request = program.throw(error)
            else:
                request = program.send(reply)
    except StopIteration as stop:
        return stop.value  # type: ignore[no-any-return]


async def drive_async(
    program: Program[T], execute: Callable[[Any], Awaitable[Any]], request: Any = _FIRST
) -> T:
    """Run ``program`` to its end, answering each request with ``await execute(request)``
    (failures are raised inside the program, as :func:`drive` says). ``request``: the
    request a program already started has made, to answer first."""
    try:
        if request is _FIRST:
            request = next(program)
        while True:
            try:
                reply = await execute(request)
            except Exception as error:
                request = program.throw(error)
            else:
                request = program.send(reply)
    except StopIteration as stop:
        return stop.value  # type: ignore[no-any-return]
