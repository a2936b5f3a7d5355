"""What the server engines (Postgres, Redis) share to close what they opened, per event loop
and across threads."""

from __future__ import annotations

import asyncio
import threading
import weakref
from collections.abc import Callable
from typing import TypeVar

__all__ = ["close_elsewhere", "listed"]

V = TypeVar("V")


def listed(
    per_loop: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, V],
) -> list[tuple[asyncio.AbstractEventLoop, V]]:
    """The entries of a per-loop map, listed again if a loop thread adds one during the
    listing (a weak dictionary's iteration then raises)."""
    while True:
        try:
            return list(per_loop.items())
        except RuntimeError:
            continue


async def close_elsewhere(close: Callable[[], None]) -> None:
    """Run an engine's ``close`` off the event loop: it may block (a sync pool's close), and
    it runs the loops that are stopped but not closed to close what they hold, which cannot
    happen in a thread where a loop is running. On the loop's default executor, or on a
    thread of its own once that executor has shut down (at the end of ``asyncio.run``).

    Raises:
        Exception: what ``close`` raised.
    """
    loop = asyncio.get_running_loop()
    try:
        done = loop.run_in_executor(None, close)
    except RuntimeError:  # the executor has shut down: the loop is ending
        done = loop.create_future()

        def settle(error: BaseException | None) -> None:
            if done.done():  # the awaiting call was cancelled
                return
            if error is None:
                done.set_result(None)
            else:
                done.set_exception(error)

        def run() -> None:
            try:
                close()
            except BaseException as error:
                loop.call_soon_threadsafe(settle, error)
            else:
                loop.call_soon_threadsafe(settle, None)

        threading.Thread(target=run, name="threadkeep-close", daemon=True).start()
    await done
