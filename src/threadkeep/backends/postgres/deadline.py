"""A bound on every wait for the server, on the connections of the pools threadkeep opens.

A server that stops answering (a backend stopped or stuck, a load balancer or NAT that
dropped the connection without a word) leaves a call waiting for its reply: libpq's
keepalives do not see a stopped backend, whose kernel still acknowledges what is sent. So
each wait of a pooled connection for the server ends after ``COMMAND_TIMEOUT_SECONDS``:
the connection is then closed (what the server did with the step is not known) and the
wait raises ``psycopg.OperationalError``, which the engine treats as a dropped connection:
the step is retried whole on a fresh one (SPEC W4; a put whose first try committed passes
on the retry). A pool the application gives keeps its own connections' behaviour.

The bound is on each wait (psycopg's ``Connection.wait``: a round trip's send and reply,
a COMMIT, a pool's health check), not on a whole step; a step of several round trips may
take several. The shared pipeline's exchange (:func:`threadkeep.backends.postgres.wire.wait`)
has the same bound.
"""

from __future__ import annotations

import functools
import time
from typing import Any, ClassVar, TypeVar

import psycopg
from psycopg.abc import PQGen

__all__ = ["TimedAsyncConnection", "TimedConnection", "no_answer", "timed_classes"]

RV = TypeVar("RV")


def no_answer(seconds: float) -> psycopg.OperationalError:
    """The error a wait that timed out raises (the connection is closed by then)."""
    return psycopg.OperationalError(
        f"Postgres did not answer within {seconds:g} s (COMMAND_TIMEOUT_SECONDS): the connection "
        "was closed; the step is retried on a new one"
    )


class TimedConnection(psycopg.Connection[Any]):
    """A connection whose waits for the server end after ``command_timeout`` seconds."""

    command_timeout: ClassVar[float] = 30.0

    def wait(self, gen: PQGen[RV], interval: float = 0.1, timeout: float | None = None) -> RV:
        if timeout is not None:  # psycopg's own bound (a cancel, a close)
            return super().wait(gen, interval, timeout)
        started = time.monotonic()
        try:
            return super().wait(gen, interval, self.command_timeout)
        except psycopg.OperationalError as error:
            if time.monotonic() - started < self.command_timeout:
                raise  # not the bound: the connection failed by itself
            self.pgconn.finish()
            raise no_answer(self.command_timeout) from error


class TimedAsyncConnection(psycopg.AsyncConnection[Any]):
    """The async :class:`TimedConnection`."""

    command_timeout: ClassVar[float] = 30.0

    async def wait(
        self,
        gen: PQGen[RV],
        interval: float = 0.1,
        timeout: float | None = None,  # noqa: ASYNC109  # psycopg's signature, overridden
    ) -> RV:
        if timeout is not None:
            return await super().wait(gen, interval, timeout)
        started = time.monotonic()
        try:
            return await super().wait(gen, interval, self.command_timeout)
        except psycopg.OperationalError as error:
            if time.monotonic() - started < self.command_timeout:
                raise
            self.pgconn.finish()
            raise no_answer(self.command_timeout) from error


@functools.lru_cache(maxsize=16)
def timed_classes(seconds: float) -> tuple[type[TimedConnection], type[TimedAsyncConnection]]:
    """The connection classes bounded at ``seconds`` (one pair per value)."""
    attributes = {"command_timeout": float(seconds), "__module__": __name__}
    return (
        type(f"TimedConnection{seconds:g}s", (TimedConnection,), attributes),
        type(f"TimedAsyncConnection{seconds:g}s", (TimedAsyncConnection,), attributes),
    )
