"""A bound on every wait for the server, on the connections of the pools threadkeep opens.

A server that stops answering (a backend stopped or stuck, a load balancer or NAT that
dropped the connection without a word) leaves a call waiting for its reply: libpq's
keepalives do not see a stopped backend, whose kernel still acknowledges what is sent. So
each wait of a pooled connection for the server ends after ``COMMAND_TIMEOUT_SECONDS``.
A cancel is then sent for what the server is running (libpq 17's cancel, itself bounded; an
older libpq's cannot be bounded and is not sent), the connection closed, and the wait
raises :class:`NoAnswer`, which the engine treats as a dropped connection: the step is
retried whole on a fresh one (SPEC W4). What the server did with the step is not known: the
cancel stops the statement it reaches, a transaction it interrupts rolls back, but a
backend stopped while idle, or a network that delivers the request late, may still run
it. A step is stored whole or not at all, and a put whose first try committed passes on its
retry. A pool the application gives keeps its own connections' behaviour.

The bound is on each wait (psycopg's ``Connection.wait``): a round trip's send and its
whole reply, a lock wait included, a batch with its COMMIT, a pool's check of a
connection. A step of several round trips may take several bounds. The shared pipeline's
exchange (:func:`threadkeep.backends.postgres.wire.wait`) has the same bound. The sweep
runs without it (:func:`threadkeep.core.retry.maintenance`): its round trips delete the rows
of up to a page of threads at once, and no run waits on them. After a
failure the engine tests the pool's idle connections (:func:`checks_bounded`: each
within :data:`CHECK_SECONDS`, without a cancel), so a stalled network costs one bound and a
few seconds per idle connection, not a bound each.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import time
from collections.abc import Iterator
from typing import Any, ClassVar, Final, TypeVar

import psycopg
from psycopg.abc import PQGen

from threadkeep.core.retry import under_maintenance

__all__ = [
    "CHECK_SECONDS",
    "NoAnswer",
    "TimedAsyncConnection",
    "TimedConnection",
    "checks_bounded",
    "give_up",
    "give_up_async",
    "timed_classes",
]

RV = TypeVar("RV")

# How long a pool's test of an idle connection (an empty query) may take after a failure,
# and a cancel request: a server that answers takes milliseconds.
CHECK_SECONDS: Final = 2.0
_CANCEL_SECONDS: Final = 2.0
_CHECKING: contextvars.ContextVar[float | None] = contextvars.ContextVar(
    "threadkeep_pg_checking", default=None
)


class NoAnswer(psycopg.OperationalError):
    """The server did not answer within the bound; the connection was closed. Whether the
    step went through is not known (it is stored whole or not at all)."""

    @classmethod
    def after(cls, seconds: float) -> NoAnswer:
        checking = _CHECKING.get() is not None
        bound = "testing an idle connection" if checking else "COMMAND_TIMEOUT_SECONDS"
        return cls(f"Postgres did not answer within {seconds:g} s ({bound}): the connection was closed")


@contextlib.contextmanager
def checks_bounded() -> Iterator[None]:
    """Bound each wait inside by :data:`CHECK_SECONDS` too (a pool's ``check()``)."""
    token = _CHECKING.set(CHECK_SECONDS)
    try:
        yield
    finally:
        _CHECKING.reset(token)


def _bound(command_timeout: float) -> float | None:
    """The bound of a wait: the command timeout, the check bound while a pool tests its
    connections, none for maintenance (the sweep: long round trips, nobody waiting)."""
    checking = _CHECKING.get()
    if checking is not None:
        return min(command_timeout, checking)
    return None if under_maintenance() else command_timeout


def _cancels() -> bool:
    """Whether a given-up wait sends a cancel: one that can be bounded, for a statement (a
    pool's test of an idle connection runs an empty one)."""
    return _CHECKING.get() is None and psycopg.capabilities.has_cancel_safe()


def give_up(conn: psycopg.Connection[Any]) -> None:
    """Cancel what ``conn`` is running (where :func:`_cancels`), and close it."""
    try:
        if _cancels():
            conn.cancel_safe(timeout=_CANCEL_SECONDS)
    except Exception:  # the connection is closed either way
        pass
    finally:
        conn.pgconn.finish()


async def give_up_async(conn: psycopg.AsyncConnection[Any]) -> None:
    """The async :func:`give_up`."""
    try:
        if _cancels():
            await conn.cancel_safe(timeout=_CANCEL_SECONDS)
    except Exception:
        pass
    finally:
        conn.pgconn.finish()


class TimedConnection(psycopg.Connection[Any]):
    """A connection whose waits for the server end after ``command_timeout`` seconds."""

    command_timeout: ClassVar[float] = 30.0

    def wait(self, gen: PQGen[RV], interval: float = 0.1, timeout: float | None = None) -> RV:
        bound = None if timeout is not None else _bound(self.command_timeout)
        if bound is None:  # psycopg's own bound (a cancel, a close), or none (the sweep)
            return super().wait(gen, interval, timeout)
        started = time.monotonic()
        try:
            return super().wait(gen, interval, bound)
        except psycopg.OperationalError as error:
            if time.monotonic() - started < bound:
                raise  # not the bound: the connection failed by itself
            give_up(self)
            raise NoAnswer.after(bound) from error


class TimedAsyncConnection(psycopg.AsyncConnection[Any]):
    """The async :class:`TimedConnection`."""

    command_timeout: ClassVar[float] = 30.0

    async def wait(
        self,
        gen: PQGen[RV],
        interval: float = 0.1,
        timeout: float | None = None,  # noqa: ASYNC109  # psycopg's signature, overridden
    ) -> RV:
        bound = None if timeout is not None else _bound(self.command_timeout)
        if bound is None:
            return await super().wait(gen, interval, timeout)
        started = time.monotonic()
        try:
            return await super().wait(gen, interval, bound)
        except psycopg.OperationalError as error:
            if time.monotonic() - started < bound:
                raise
            await give_up_async(self)
            raise NoAnswer.after(bound) from error


@functools.lru_cache(maxsize=16)
def timed_classes(seconds: float) -> tuple[type[TimedConnection], type[TimedAsyncConnection]]:
    """The connection classes bounded at ``seconds`` (one pair per value)."""
    attributes = {"command_timeout": float(seconds), "__module__": __name__}
    return (
        type(f"TimedConnection{seconds:g}s", (TimedConnection,), attributes),
        type(f"TimedAsyncConnection{seconds:g}s", (TimedAsyncConnection,), attributes),
    )
