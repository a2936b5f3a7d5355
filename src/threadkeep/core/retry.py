"""When to retry a transaction, free of I/O (SPEC W4).

A dropped connection retries the whole transaction on a fresh connection: ``attempts`` in
all, waiting ``backoff`` seconds before the second and doubling each time (1 s, then 2 s by
default), all within the step's ``deadline`` (10 s by default): a wait for a connection is
cut to what is left of it, and no try starts after it. An error that is the server's answer
(a login refused, a database missing, a privilege lacking, a statement refused: the
engine's ``refused`` rule names it) becomes a ``StorageRefusedError`` at once, named as what
it is; anything else, and a connection failure that outlasts the attempts or the deadline,
a ``StorageError`` at once: a run fails visibly instead of continuing on unsaved state.
"""

from __future__ import annotations

import contextlib
import contextvars
import logging
import math
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from threadkeep.errors import StorageError, StorageRefusedError, ThreadkeepError

__all__ = ["Refusal", "RetryPolicy", "Tries", "maintenance", "under_maintenance"]

logger = logging.getLogger("threadkeep.retry")

_MAINTENANCE: contextvars.ContextVar[bool] = contextvars.ContextVar("threadkeep_maintenance", default=False)


@contextlib.contextmanager
def maintenance() -> Iterator[None]:
    """Mark the work inside as maintenance (the sweep): its round trips may be long (the rows
    of many threads deleted at once) and nobody waits on them, so a store's command timeout
    does not cut them short (``backends/postgres/bound.py``)."""
    token = _MAINTENANCE.set(True)
    try:
        yield
    finally:
        _MAINTENANCE.reset(token)


def under_maintenance() -> bool:
    """Whether the calling code runs inside :func:`maintenance`."""
    return _MAINTENANCE.get()


@dataclass(frozen=True, slots=True)
class Refusal:
    """What an error the server answered with is (an engine's ``refused`` rule tells).

    Attributes:
        code: The :class:`StorageRefusedError` code: ``STORAGE_AUTH_001``,
            ``STORAGE_DATABASE_001``, ``STORAGE_PERMISSION_001`` or ``STORAGE_REFUSED_001``.
        what: What the server refused, after "the <store> store ...".
        todo: What to do about it.
    """

    code: str
    what: str
    todo: str


def _never_refused(error: BaseException) -> Refusal | None:
    return None


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """Retries of one engine.

    Attributes:
        attempts: Tries in all, the first included.
        backoff: Seconds before the second try; each later wait doubles.
        retryable: Whether an exception means the connection dropped.
        store: Names the store in error messages.
        refused: What an exception is when it is the server's refusal, asked before
            ``retryable`` (a refused login is a connection error to some drivers); None
            for anything else.
        deadline: Seconds one call (a step) may spend on its tries, waits for a connection
            and backoffs together (``STEP_DEADLINE_SECONDS``); ``None``, no bound but the
            attempts. A round trip already sent is bounded by the command timeout instead.
        on_retry: Told each time a try is to run again (the retries metric counts there).
    """

    attempts: int
    backoff: float
    retryable: Callable[[BaseException], bool]
    store: str
    refused: Callable[[BaseException], Refusal | None] = _never_refused
    deadline: float | None = None
    on_retry: Callable[[], None] | None = None

    def delay_after(
        self,
        error: BaseException,
        attempt: int,
        *,
        unconfirmed: bool = False,
        write: bool = True,
        time_left: float = math.inf,
    ) -> float:
        """How long to wait before try ``attempt + 1`` after ``error`` ended try ``attempt``;
        ``unconfirmed``: a try so far (this one included) ended without an answer, so its
        step may have run, or may still run, on the server; ``write``: the call stores a
        step of a thread (the last error says what became of it). A read's, and a schema
        program's (the format gate, a migration: each one transaction), says nothing of
        steps. ``time_left``: seconds left of the step's deadline.

        Raises:
            ThreadkeepError: ``error`` itself when it is one of ours (a conflict, a refusal).
            StorageRefusedError: the server refused (``refused`` names it): not retried.
            StorageError: the error is not a dropped connection, it was the last try, or
                the deadline would pass before the next try starts.
        """
        if isinstance(error, ThreadkeepError):
            raise error
        refusal = self.refused(error)
        if refusal is not None:
            raise StorageRefusedError(
                f"the {self.store} store {refusal.what}: {error}. {refusal.todo}. Not retried: the server"
                f" answered, the connection did not drop{_outcome(write, unconfirmed)}",
                code=refusal.code,
                context={"attempts": attempt},
            ) from error
        if not self.retryable(error):
            raise StorageError(
                f"the {self.store} store failed: {error}", context={"attempts": attempt}
            ) from error
        if attempt >= self.attempts:
            outcome = _outcome(write, unconfirmed)
            raise StorageError(
                f"the {self.store} store was unreachable after {attempt} attempt{'s' if attempt > 1 else ''}:"
                f" {error}{outcome}",
                context={"attempts": attempt},
            ) from error
        delay: float = self.backoff * 2 ** (attempt - 1)
        if delay >= time_left:
            raise self.out_of_time(error, attempt, unconfirmed=unconfirmed, write=write) from error
        logger.warning(
            "%s connection failed (attempt %s of %s): %s; retrying in %.1f s",
            self.store,
            attempt,
            self.attempts,
            error,
            delay,
        )
        if self.on_retry is not None:
            self.on_retry()
        return delay

    def out_of_time(
        self, error: BaseException, attempt: int, *, unconfirmed: bool = False, write: bool = True
    ) -> StorageError:
        """The error of a call whose deadline passed, or would pass before its next try,
        after ``error`` ended try ``attempt`` (raise it ``from error``)."""
        tries = f"{attempt} attempt{'s' if attempt > 1 else ''}"
        return StorageError(
            f"the {self.store} store was unreachable within the step deadline of {self.deadline:g} s"
            f" (LLM_PROVIDER_CHECKPOINT_STEP_DEADLINE_SECONDS; {tries}):"
            f" {error}{_outcome(write, unconfirmed)}. Check that the {self.store} server is up and"
            " reachable; raise the deadline to wait longer for it",
            context={"attempts": attempt, "deadline_seconds": self.deadline},
        )


def _outcome(write: bool, unconfirmed: bool) -> str:
    """What became of a write whose tries failed (nothing to say of a read's)."""
    if not write:
        return ""
    if unconfirmed:
        return (
            "; a try got no answer and the server may have run it or still run it:"
            " a step is stored whole or not at all"
        )
    return "; nothing of this step was stored"


@dataclass(slots=True)
class Tries:
    """One call's tries under ``policy``: how many have failed, whether one of them may
    have run its step on the server without answering (``unanswered`` says so of a failed
    try's error: on Postgres, one that came while a round trip that may commit was out; on
    Redis, a script's reply lost), and how much of the step's deadline is left (counted
    from the construction, on ``clock``). An engine's sync and async retry loops keep their
    count here, bound their waits for a connection with :meth:`wait`, and learn from
    :meth:`failed` how long to wait, or that the call has failed for good.
    """

    policy: RetryPolicy
    write: bool
    unanswered: Callable[[BaseException], bool]
    clock: Callable[[], float] = time.monotonic
    failures: int = field(default=0, init=False)
    unconfirmed: bool = field(default=False, init=False)
    started: float = field(default=0.0, init=False)
    last: BaseException | None = field(default=None, init=False)

    def __post_init__(self) -> None:
        self.started = self.clock()

    @property
    def first(self) -> bool:
        """Whether no try has failed yet."""
        return self.failures == 0

    def time_left(self) -> float:
        """Seconds left of the step's deadline (infinite without one)."""
        if self.policy.deadline is None:
            return math.inf
        return self.started + self.policy.deadline - self.clock()

    def wait(self, seconds: float) -> float:
        """How long a try may wait for a connection: ``seconds``, cut to what is left of
        the deadline.

        Raises:
            StorageError: a try failed and the deadline has passed since (the engine's work
                between two tries, a test of its idle connections, took what was left).
        """
        left = self.time_left()
        if left <= 0 and self.last is not None:
            raise self.policy.out_of_time(
                self.last, self.failures, unconfirmed=self.unconfirmed, write=self.write
            ) from self.last
        return max(min(seconds, left), 0.01)

    def failed(self, error: BaseException) -> float:
        """Count a failed try: the seconds to wait before the next (raises as
        :meth:`RetryPolicy.delay_after` does, with what the tries so far tell, and when the
        deadline would pass before the next try)."""
        self.failures += 1
        self.last = error
        self.unconfirmed = self.unconfirmed or self.unanswered(error)
        return self.policy.delay_after(
            error, self.failures, unconfirmed=self.unconfirmed, write=self.write, time_left=self.time_left()
        )
