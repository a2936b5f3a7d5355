"""Runs tiered programs: each request is a whole program for one of the two stores.

A tiered program (see :mod:`threadkeep.backends.tiered.backend`) decides the order of the
two tiers and yields :class:`Durable` (a Postgres program, in its own transaction, retried
as the Postgres engine retries) or :class:`Cached` (a Redis program). A durable failure is
raised inside the tiered program; a cache failure never is: it is logged, counted and
answered with :data:`UNAVAILABLE`, so a cache problem can slow a call but never fail it
(SPEC T2, T3). Both the sync and the async API drive the same programs.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, Final, TypeVar

from threadkeep.core.program import Engine, ProgramFactory, drive, drive_async
from threadkeep.errors import StorageError
from threadkeep.metrics import CACHE_EVENTS, Metrics

__all__ = ["UNAVAILABLE", "Cached", "Durable", "TieredEngine"]

logger = logging.getLogger("threadkeep.tiered")
T = TypeVar("T")


class _Unavailable:
    def __repr__(self) -> str:
        return "<cache unavailable>"

    def __bool__(self) -> bool:
        return False


UNAVAILABLE: Final = _Unavailable()


@dataclass(frozen=True, slots=True)
class Durable:
    """Run a program on the source of truth; the program receives its result or its error."""

    make: ProgramFactory[Any]
    write: bool = False
    atomic: bool = True


@dataclass(frozen=True, slots=True)
class Cached:
    """Run a program on the cache; the program receives its result, or :data:`UNAVAILABLE`
    if the cache failed (``what`` names the operation in the log)."""

    make: ProgramFactory[Any]
    what: str


class TieredEngine:
    """The engines of both tiers, behind one.

    Args:
        durable: The source of truth's engine (Postgres).
        cache: The hot tier's engine (Redis); never retried, and never fatal.
        metrics: Where cache errors are counted.
    """

    def __init__(self, durable: Engine, cache: Engine, metrics: Metrics) -> None:
        self.durable = durable
        self.cache = cache
        self.metrics = metrics
        self._closed = False

    def run(self, make: ProgramFactory[T], *, write: bool = False, atomic: bool = True) -> T:
        """Run a tiered program; each of its requests runs whole on its tier."""
        self._refuse_if_closed()
        return drive(make(), self._execute)

    async def arun(self, make: ProgramFactory[T], *, write: bool = False, atomic: bool = True) -> T:
        """The same as :meth:`run`, on the event loop."""
        self._refuse_if_closed()
        return await drive_async(make(), self._execute_async)

    def _refuse_if_closed(self) -> None:
        # Before the cache is asked: its refusal would pass for a cache failure.
        if self._closed:
            raise StorageError("the tiered store is closed: open a new saver")

    def setup(self, make: ProgramFactory[T]) -> T:
        """Run a schema program (format gate, migrations) on the source of truth."""
        return self.durable.setup(make)

    def _execute(self, request: Durable | Cached) -> Any:
        if isinstance(request, Durable):
            return self.durable.run(request.make, write=request.write, atomic=request.atomic)
        try:
            return self.cache.run(request.make)
        except Exception as error:
            return self._unavailable(request, error)

    async def _execute_async(self, request: Durable | Cached) -> Any:
        if isinstance(request, Durable):
            return await self.durable.arun(request.make, write=request.write, atomic=request.atomic)
        try:
            return await self.cache.arun(request.make)
        except Exception as error:
            return self._unavailable(request, error)

    def _unavailable(self, request: Cached, error: Exception) -> _Unavailable:
        self.metrics.inc(CACHE_EVENTS, event="error")
        logger.warning(
            "the tiered cache failed to %s (%s: %s); using Postgres",
            request.what,
            type(error).__name__,
            error,
        )
        return UNAVAILABLE

    def close(self) -> None:
        """Close what both engines opened (never a pool or client they were given); the
        engine refuses work afterwards."""
        self._closed = True
        try:
            self.cache.close()
        finally:
            self.durable.close()

    async def aclose(self) -> None:
        """:meth:`close`, from inside an event loop."""
        self._closed = True
        try:
            await self.cache.aclose()
        finally:
            await self.durable.aclose()
