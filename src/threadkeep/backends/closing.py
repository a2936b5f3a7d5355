"""What the server engines (Postgres, Redis) open per event loop, and how they close it, from
that loop, another loop, or another thread."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import threading
import weakref
from collections.abc import Callable, Coroutine
from typing import Any, Generic, TypeVar

__all__ = ["PerLoop", "close_elsewhere"]

logger = logging.getLogger("threadkeep.backends")

R = TypeVar("R")


class PerLoop(Generic[R]):
    """An engine's resource (a pool, a client) for each event loop that used it, each with a
    task that closes it when cancelled: by the loop's runner, which cancels the tasks left
    when its main coroutine ends (``asyncio.run``), or by :meth:`close_all` from any thread.

    Whoever takes a resource out (:meth:`take`) closes it, so it is closed once.
    """

    def __init__(self, close: Callable[[R], Coroutine[Any, Any, None]], name: str) -> None:
        self._close = close
        self._name = name
        self._resources: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, R] = weakref.WeakKeyDictionary()
        self._closers: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, asyncio.Task[None]] = (
            weakref.WeakKeyDictionary()
        )

    def get(self, loop: asyncio.AbstractEventLoop) -> R | None:
        return self._resources.get(loop)

    def values(self) -> list[R]:
        return [resource for _, resource in self._listed()]

    def __len__(self) -> int:
        return len(self._listed())

    def publish(self, loop: asyncio.AbstractEventLoop, resource: R) -> None:
        """Keep ``resource`` as ``loop``'s (called in that loop), with its closer."""
        self._resources[loop] = resource
        self._closers[loop] = loop.create_task(self._close_at_loop_end(loop, resource), name=self._name)

    def take(self, loop: asyncio.AbstractEventLoop, resource: R) -> bool:
        """Take ``resource`` out, its closer cancelled; whether this caller took it (and so
        must close it)."""
        if not self._remove(loop, resource):
            return False
        closer = self._closers.pop(loop, None)
        if closer is not None:
            with contextlib.suppress(RuntimeError):  # its loop has closed: it will never run
                closer.cancel()
        return True

    def _remove(self, loop: asyncio.AbstractEventLoop, resource: R) -> bool:
        if self._resources.get(loop) is not resource:
            return False
        try:
            del self._resources[loop]
        except KeyError:  # another thread took it first
            return False
        return True

    async def close_here(self) -> None:
        """Close the running loop's resource."""
        loop = asyncio.get_running_loop()
        resource = self._resources.get(loop)
        if resource is not None and self.take(loop, resource):
            await self._close(resource)

    def close_all(self) -> None:
        """Close every loop's resource: a running loop's in that loop (its closer, between
        its other callbacks), a stopped one's by running that loop once (on a thread of its
        own if this thread runs a loop), a closed one's not at all (it died with its loop)."""
        failures: list[Exception] = []
        for loop, resource in self._listed():
            try:
                self._close_for(loop, resource)
            except Exception as error:  # the other loops' resources are closed all the same
                failures.append(error)
        if failures:
            raise failures[0]

    def _close_for(self, loop: asyncio.AbstractEventLoop, resource: R) -> None:
        if loop.is_closed():
            self.take(loop, resource)
        elif loop.is_running():
            closer = self._closers.get(loop)
            if closer is not None:
                try:
                    loop.call_soon_threadsafe(closer.cancel)
                except RuntimeError:  # closed meanwhile
                    self.take(loop, resource)
        elif self.take(loop, resource):
            _run_stopped(loop, functools.partial(self._close, resource))

    async def _close_at_loop_end(self, loop: asyncio.AbstractEventLoop, resource: R) -> None:
        try:
            await loop.create_future()
        except asyncio.CancelledError:
            if self._remove(loop, resource):
                self._closers.pop(loop, None)
                await self._close(resource)
            raise

    def _listed(self) -> list[tuple[asyncio.AbstractEventLoop, R]]:
        """The resources, listed again if a loop thread publishes one during the listing (a
        weak dictionary's iteration then raises)."""
        while True:
            try:
                return list(self._resources.items())
            except RuntimeError:
                continue


def _run_stopped(loop: asyncio.AbstractEventLoop, make: Callable[[], Coroutine[Any, Any, None]]) -> None:
    """Run ``make()`` on ``loop``, which is stopped: here, or on a thread of its own where a
    loop runs here (two loops cannot run in one thread)."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        loop.run_until_complete(make())
        return
    failure: list[BaseException] = []

    def in_thread() -> None:
        try:
            loop.run_until_complete(make())
        except BaseException as error:
            failure.append(error)

    worker = threading.Thread(target=in_thread, name="threadkeep-close")
    worker.start()
    worker.join()
    if failure:
        raise failure[0]


async def close_elsewhere(close: Callable[[], None]) -> None:
    """Run an engine's ``close`` on a thread of its own, off the event loop: it may block (a
    sync pool's close), and it runs stopped loops to close what they hold, which cannot
    happen in a thread where a loop is running.

    Raises:
        Exception: what ``close`` raised.
    """
    loop = asyncio.get_running_loop()
    done = loop.create_future()

    def settle(error: BaseException | None) -> None:
        if done.done():  # the awaiting call was cancelled
            return
        if error is None:
            done.set_result(None)
        else:
            done.set_exception(error)

    def run() -> None:
        error: BaseException | None = None
        try:
            close()
        except BaseException as raised:
            error = raised
        try:
            loop.call_soon_threadsafe(settle, error)
        except RuntimeError:  # the loop has closed: nobody awaits the result
            if error is not None:
                logger.warning("closing the store failed: %s", error)

    threading.Thread(target=run, name="threadkeep-close").start()
    await done
