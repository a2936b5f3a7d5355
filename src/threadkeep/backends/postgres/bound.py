"""A bound on each try's wait for the server: ``COMMAND_TIMEOUT_SECONDS``.

A server that stops answering (a backend stopped or stuck, a load balancer or NAT that
dropped the connection without a word) leaves a call waiting for its reply: TCP keepalives
do not see a stopped backend, whose kernel still acknowledges what is sent. So each try on a
connection is watched: if its round trips are not all answered within the command timeout,
a cancel is sent for what the server is running (``cancel_safe``, waited for at most 2 s;
an older libpq than 17 cannot bound its cancel, which holds the interpreter while it waits,
so none is sent there), then the connection's socket is shut down. The wait ends at once
with a connection error, which the engine reports as :class:`NoAnswer` and treats as a
dropped connection: the connection is closed and the step retried whole on a new one
(SPEC W4). A try whose answer came just as it was given up keeps its answer, and its
connection is closed all the same.

What the server did with the step is not known: the cancel stops the statement it reaches,
a transaction it interrupts rolls back, but a backend stopped while idle, or a network that
delivers the request late, may still run it. A step is stored whole or not at all, and a
put whose first try committed passes on its retry.

One daemon thread watches every sync try of the process (:class:`_Watchdog`); an async try
is watched by a timer on its loop, whose give-up awaits ``cancel_safe``.
The sweep and the opening of a store (its format gate and migrations) run unwatched
(:func:`threadkeep.core.retry.maintenance`): their round trips may be long, and no run
waits on them.
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import itertools
import os
import socket
import threading
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from typing import Any, Final

import psycopg

from threadkeep.core.retry import under_maintenance

__all__ = ["NoAnswer", "bounded", "bounded_async"]

# How long a cancel request may take: a server that answers takes milliseconds.
_CANCEL_SECONDS: Final = 2.0
# How late the watchdog may notice a bound that passed (it wakes at most this often).
_TICK_SECONDS: Final = 0.2


class NoAnswer(psycopg.OperationalError):
    """The server did not answer within the bound; the connection was closed. Whether the
    step went through is not known (it is stored whole or not at all)."""

    @classmethod
    def after(cls, seconds: float) -> NoAnswer:
        bound = f"{seconds:g} s (COMMAND_TIMEOUT_SECONDS)"
        return cls(f"Postgres did not answer within {bound}: the connection was closed")


def _shut(fd: int) -> None:
    """Shut down the socket ``fd`` names: a wait on it ends with the connection lost."""
    with contextlib.suppress(OSError), socket.socket(fileno=os.dup(fd)) as sock:
        sock.shutdown(socket.SHUT_RDWR)


def _cancel(conn: psycopg.Connection[Any]) -> None:
    """Cancel what ``conn`` runs, waiting at most :data:`_CANCEL_SECONDS` (``cancel_safe``,
    which libpq 17 bounds; an older libpq's cancel cannot be bounded, and holds the
    interpreter while it waits: it is not sent)."""
    if psycopg.capabilities.has_cancel_safe():
        with contextlib.suppress(Exception):
            conn.cancel_safe(timeout=_CANCEL_SECONDS)


@dataclass(order=True, slots=True)
class _Alarm:
    """A watched try: when it is due, and the connection to give up (a duplicate of its
    socket, so that a connection closed and a descriptor reused meanwhile are never hit)."""

    due: float
    order: int
    bound: float = field(compare=False)
    conn: psycopg.Connection[Any] = field(compare=False)
    fd: int = field(compare=False)
    done: bool = field(default=False, compare=False)
    fired: bool = field(default=False, compare=False)
    lock: threading.Lock = field(default_factory=threading.Lock, compare=False)
    given_up: threading.Event = field(default_factory=threading.Event, compare=False)

    def fire(self) -> None:
        """Give the connection up (in a thread of its own: a cancel may take a while)."""
        with self.lock:
            if self.done:
                return
            self.fired = True
        try:
            _cancel(self.conn)
            _shut(self.fd)
        finally:
            os.close(self.fd)
            self.given_up.set()

    def disarm(self) -> bool:
        """Stop watching; whether the alarm fired (the connection is being given up)."""
        with self.lock:
            self.done = True
            fired = self.fired
        if not fired:  # else its firing closes the duplicate once done with it
            os.close(self.fd)
        return fired


class _Watchdog:
    """One daemon thread that fires the alarms of tries that outlive their bound."""

    def __init__(self) -> None:
        self._alarms: list[_Alarm] = []
        self._order = itertools.count()
        self._woken = threading.Condition()
        self._thread: threading.Thread | None = None
        os.register_at_fork(after_in_child=self._forked)

    def _forked(self) -> None:
        """A child process starts with no watchdog thread and nothing to watch."""
        self._alarms, self._woken, self._thread = [], threading.Condition(), None

    def arm(self, conn: psycopg.Connection[Any], seconds: float) -> _Alarm:
        alarm = _Alarm(time.monotonic() + seconds, next(self._order), seconds, conn, os.dup(conn.fileno()))
        with self._woken:
            heapq.heappush(self._alarms, alarm)
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(
                    target=self._watch, name="threadkeep-pg-watchdog", daemon=True
                )
                self._thread.start()
        return alarm

    def _watch(self) -> None:
        while True:
            with self._woken:
                now = time.monotonic()
                due = []
                while self._alarms and (self._alarms[0].done or self._alarms[0].due <= now):
                    alarm = heapq.heappop(self._alarms)
                    if not alarm.done:
                        due.append(alarm)
                if len(self._alarms) > 1024 and sum(a.done for a in self._alarms) * 2 > len(self._alarms):
                    # tries that ended behind a long one: dropped now, not when it ends
                    self._alarms = [alarm for alarm in self._alarms if not alarm.done]
                    heapq.heapify(self._alarms)
                # Not woken at each arm: a bound is noticed within a tick of passing.
                self._woken.wait(_TICK_SECONDS)
            for alarm in due:
                try:
                    threading.Thread(target=alarm.fire, name="threadkeep-pg-give-up", daemon=True).start()
                except RuntimeError:  # no thread to be had: give it up here
                    alarm.fire()


_WATCHDOG: Final = _Watchdog()


def _bound(seconds: float | None) -> float | None:
    """A try's bound: the command timeout, none for maintenance."""
    return None if seconds is None or under_maintenance() else seconds


@contextlib.contextmanager
def bounded(conn: psycopg.Connection[Any], seconds: float | None) -> Iterator[None]:
    """Watch a sync try on ``conn`` for ``seconds`` (the watchdog thread); a connection
    given up is closed.

    Raises:
        NoAnswer: the try failed after its bound passed (its connection was given up).
    """
    bound = _bound(seconds)
    if bound is None:
        yield
        return
    alarm = _WATCHDOG.arm(conn, bound)
    try:
        yield
    except BaseException as error:
        if alarm.disarm():
            alarm.given_up.wait()
            conn.close()
            if isinstance(error, Exception):
                raise NoAnswer.after(bound) from error
        raise
    if alarm.disarm():  # given up as its answer came: its answer stands
        alarm.given_up.wait()
        conn.close()


@contextlib.asynccontextmanager
async def bounded_async(conn: psycopg.AsyncConnection[Any], seconds: float | None) -> AsyncIterator[None]:
    """Watch an async try on ``conn`` for ``seconds``, with a timer on the running loop (its
    give-up awaits ``cancel_safe``); a connection given up is closed.

    Raises:
        NoAnswer: the try failed after its bound passed (its connection was given up).
    """
    bound = _bound(seconds)
    if bound is None:
        yield
        return
    loop = asyncio.get_running_loop()
    giving_up: list[asyncio.Task[None]] = []
    timer = loop.call_later(bound, lambda: giving_up.append(loop.create_task(_give_up(conn))))
    try:
        yield
    except BaseException as error:
        timer.cancel()
        if giving_up:
            await asyncio.wait(giving_up)
            await conn.close()
            if isinstance(error, Exception):
                raise NoAnswer.after(bound) from error
        raise
    timer.cancel()
    if giving_up:  # given up as its answer came: its answer stands
        await asyncio.wait(giving_up)
        await conn.close()


async def _give_up(conn: psycopg.AsyncConnection[Any]) -> None:
    """:meth:`_Alarm.fire` for an async connection, on its loop."""
    if psycopg.capabilities.has_cancel_safe():
        with contextlib.suppress(Exception):
            await conn.cancel_safe(timeout=_CANCEL_SECONDS)
    with contextlib.suppress(Exception):
        _shut(conn.fileno())
