"""A thread's window reads (SPEC SV1, SV3), written once for the HTTP API and the CLI.

``GET /api/threads/{id}/history`` and ``threadkeep threads history`` page a thread's
checkpoints with :func:`history_page`; ``GET /api/threads/{id}/retention``, ``threadkeep
threads show`` and the inspector show :func:`retention_of`. Each is one program (the style of
:mod:`threadkeep.core.program`): it asks for the checkpoints and marks it needs, and a sync
and an async driver answer each ask through the saver's own methods, so the cursor's checks
and the view's sources are the same in both.

Both read the thread's root graph (namespace ``""``) in the calling scope: a thread of
another user is not seen (:class:`~threadkeep.errors.ThreadNotFoundError`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from threadkeep.core.program import Program, drive, drive_async
from threadkeep.errors import ConfigurationError, ThreadNotFoundError
from threadkeep.threads import MAX_PAGE
from threadkeep.views import history_view, retention_view

if TYPE_CHECKING:
    from langchain_core.runnables import RunnableConfig

    from threadkeep.saver import ThreadkeepSaver

__all__ = ["ahistory_page", "aretention_of", "history_page", "retention_of", "root_config"]


def root_config(thread_id: str, checkpoint_id: str | None = None) -> RunnableConfig:
    """The config of a thread's root graph (namespace ``""``), or of one checkpoint of it."""
    configurable: dict[str, Any] = {"thread_id": thread_id, "checkpoint_ns": ""}
    if checkpoint_id is not None:
        configurable["checkpoint_id"] = checkpoint_id
    return {"configurable": configurable}


# --- what the programs ask for ------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Get:
    """``get_tuple(config)``."""

    config: RunnableConfig


@dataclass(frozen=True, slots=True)
class _List:
    """``list(config, before=, limit=)``, as a list."""

    config: RunnableConfig
    before: RunnableConfig | None
    limit: int


@dataclass(frozen=True, slots=True)
class _Retention:
    """``thread_retention(thread_id)``."""

    thread_id: str


@dataclass(frozen=True, slots=True)
class _Parks:
    """``live_parks(thread_ids, now)``."""

    thread_ids: Sequence[str]
    now: float


@dataclass(frozen=True, slots=True)
class _Row:
    """``thread_row(thread_id)``: the listing's row."""

    thread_id: str


# --- the programs ---------------------------------------------------------------------------------


def _history(thread_id: str, limit: int, cursor: str | None) -> Program[dict[str, Any]]:
    if not 1 <= limit <= MAX_PAGE:
        raise ConfigurationError(
            f"a page holds 1 to {MAX_PAGE} checkpoints, not {limit}: pass a limit in that range",
            context={"limit": limit},
        )
    if (yield _Get(root_config(thread_id))) is None:
        raise ThreadNotFoundError(thread_id)
    if cursor and (yield _Get(root_config(thread_id, cursor))) is None:
        raise ConfigurationError(
            f"the cursor {cursor[:40]!r} is not a checkpoint of thread {thread_id!r}: pass the "
            "next_cursor of the previous page, or no cursor for the first page",
            context={"cursor": cursor[:40]},
        )
    before = root_config(thread_id, cursor) if cursor else None
    found = yield _List(root_config(thread_id), before, limit + 1)
    rows = [history_view(item) for item in found[:limit]]
    more = len(found) > limit
    return {"checkpoints": rows, "next_cursor": rows[-1]["checkpoint_id"] if more else None}


def _retention(saver: ThreadkeepSaver, thread_id: str) -> Program[dict[str, Any]]:
    head = yield _Get(root_config(thread_id))
    retention = yield _Retention(thread_id)
    if head is None or retention is None:
        raise ThreadNotFoundError(thread_id)
    now = saver.clock()
    parked = thread_id in (yield _Parks([thread_id], now))
    row = yield _Row(thread_id)
    declared, finished_due = retention
    return retention_view(head, declared, finished_due, saver.retention, now=now, parked=parked, row=row)


# --- the drivers ----------------------------------------------------------------------------------


def _execute(saver: ThreadkeepSaver, ask: Any) -> Any:
    if isinstance(ask, _Get):
        return saver.get_tuple(ask.config)
    if isinstance(ask, _List):
        return list(saver.list(ask.config, before=ask.before, limit=ask.limit))
    if isinstance(ask, _Retention):
        return saver.thread_retention(ask.thread_id)
    if isinstance(ask, _Parks):
        return saver.live_parks(ask.thread_ids, ask.now)
    return saver.thread_row(ask.thread_id)


async def _aexecute(saver: ThreadkeepSaver, ask: Any) -> Any:
    if isinstance(ask, _Get):
        return await saver.aget_tuple(ask.config)
    if isinstance(ask, _List):
        return [item async for item in saver.alist(ask.config, before=ask.before, limit=ask.limit)]
    if isinstance(ask, _Retention):
        return await saver.athread_retention(ask.thread_id)
    if isinstance(ask, _Parks):
        return await saver.alive_parks(ask.thread_ids, ask.now)
    return await saver.athread_row(ask.thread_id)


def history_page(
    saver: ThreadkeepSaver, thread_id: str, *, limit: int = 50, cursor: str | None = None
) -> dict[str, Any]:
    """One page of ``thread_id``'s checkpoints, newest first: ``{"checkpoints":
    [history_view], "next_cursor"}`` (the last row's checkpoint id; ``None`` on the last page).

    Raises:
        ThreadNotFoundError: no such thread that the scope sees.
        ConfigurationError: ``limit`` out of 1 to :data:`~threadkeep.threads.MAX_PAGE`, or a
            ``cursor`` that is not a checkpoint of the thread.
    """
    return drive(_history(thread_id, limit, cursor), lambda ask: _execute(saver, ask))


async def ahistory_page(
    saver: ThreadkeepSaver, thread_id: str, *, limit: int = 50, cursor: str | None = None
) -> dict[str, Any]:
    """Async :func:`history_page`."""
    return await drive_async(_history(thread_id, limit, cursor), lambda ask: _aexecute(saver, ask))


def retention_of(saver: ThreadkeepSaver, thread_id: str) -> dict[str, Any]:
    """``thread_id``'s :func:`~threadkeep.views.retention_view`, its due time and status
    read from the thread's listing row where the store has one (the listing's, and the
    sweep's, waiting clock).

    Raises:
        ThreadNotFoundError: no such thread that the scope sees.
    """
    return drive(_retention(saver, thread_id), lambda ask: _execute(saver, ask))


async def aretention_of(saver: ThreadkeepSaver, thread_id: str) -> dict[str, Any]:
    """Async :func:`retention_of`."""
    return await drive_async(_retention(saver, thread_id), lambda ask: _aexecute(saver, ask))
