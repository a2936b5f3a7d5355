"""When to retry a transaction, free of I/O (SPEC W4).

A dropped connection retries the whole transaction on a fresh connection: ``attempts`` in
all, waiting ``backoff`` seconds before the second and doubling each time (1 s, then 2 s by
default). An error that is the server's answer (a login refused, a database missing, a
privilege lacking, a statement refused: the engine's ``refused`` rule names it) becomes a
``StorageRefusedError`` at once, named as what it is; anything else, and a connection
failure that outlasts the attempts, a ``StorageError`` at once: a run fails visibly instead
of continuing on unsaved state.
"""

from __future__ import annotations

import contextlib
import contextvars
import logging
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
    does not cut them short (``backends/postgres/deadline.py``)."""
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
    """

    attempts: int
    backoff: float
    retryable: Callable[[BaseException], bool]
    store: str
    refused: Callable[[BaseException], Refusal | None] = _never_refused

    def delay_after(
        self, error: BaseException, attempt: int, *, unconfirmed: bool = False, write: bool = True
    ) -> float:
        """How long to wait before try ``attempt + 1`` after ``error`` ended try ``attempt``;
        ``unconfirmed``: a try so far (this one included) ended without an answer, so its
        step may have run, or may still run, on the server; ``write``: the call stores a
        step of a thread (the last error says what became of it). A read's, and a schema
        program's (the format gate, a migration: each one transaction), says nothing of
        steps.

        Raises:
            ThreadkeepError: ``error`` itself when it is one of ours (a conflict, a refusal).
            StorageRefusedError: the server refused (``refused`` names it): not retried.
            StorageError: the error is not a dropped connection, or it was the last try.
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
        logger.warning(
            "%s connection failed (attempt %s of %s): %s; retrying in %.1f s",
            self.store,
            attempt,
            self.attempts,
            error,
            delay,
        )
        return delay


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
    """One call's tries under ``policy``: how many have failed, and whether one of them may
    have run its step on the server without answering (``unanswered`` says so of a failed
    try's error: on Postgres, one that came while a round trip that may commit was out; on
    Redis, a script's reply lost). An engine's sync and
    async retry loops keep their count here, and learn from :meth:`failed` how long to
    wait, or that the call has failed for good.
    """

    policy: RetryPolicy
    write: bool
    unanswered: Callable[[BaseException], bool]
    failures: int = field(default=0, init=False)
    unconfirmed: bool = field(default=False, init=False)

    @property
    def first(self) -> bool:
        """Whether no try has failed yet."""
        return self.failures == 0

    def failed(self, error: BaseException) -> float:
        """Count a failed try: the seconds to wait before the next (raises as
        :meth:`RetryPolicy.delay_after` does, with what the tries so far tell)."""
        self.failures += 1
        self.unconfirmed = self.unconfirmed or self.unanswered(error)
        return self.policy.delay_after(error, self.failures, unconfirmed=self.unconfirmed, write=self.write)
