"""What a window on the store shows of its threads (SPEC SV1, SV3): one row per thread.

:meth:`ThreadkeepSaver.threads <threadkeep.saver.ThreadkeepSaver.threads>` answers a
:class:`ThreadQuery` with a :class:`ThreadPage`, newest write first, read from an index on
every provider (never a scan of the checkpoints). The HTTP API (``GET /api/threads``), the
CLI (``threadkeep threads list``) and the inspector page all read it, and show the same
fields (:meth:`ThreadSummary.to_dict` is the JSON row).

A thread's status, first match wins:

- ``parked``: a run on it is parked on a question whose deadline has not passed (SPEC RT5);
- ``interrupted``: its newest checkpoint has a pending interrupt, and no live park;
- ``finished``: its owner marked it finished (it leaves on the finished horizon);
- ``waiting``: anything else (it leaves on the waiting horizon).

Whose threads a query sees follows the calling scope (:mod:`threadkeep.core.identity`): in a
:func:`~threadkeep.core.identity.user_scope`, that user's threads only (``owner`` may only
name that user); in :func:`~threadkeep.core.identity.operator_scope`, every thread, narrowed
by ``owner`` when it is given.
"""

from __future__ import annotations

import base64
import binascii
import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Final, Literal, get_args

from threadkeep.core.ids import checked_id
from threadkeep.errors import ConfigurationError, InvalidInputError

__all__ = ["MAX_PAGE", "STATUSES", "Cursor", "ThreadPage", "ThreadQuery", "ThreadStatus", "ThreadSummary"]

ThreadStatus = Literal["waiting", "finished", "parked", "interrupted"]
STATUSES: Final[tuple[ThreadStatus, ...]] = get_args(ThreadStatus)
MAX_PAGE: Final = 500


@dataclass(frozen=True, slots=True)
class Cursor:
    """Where a page ends: the last row's write time and thread id (the index's order)."""

    written_at: float
    thread_id: str

    def encode(self) -> str:
        raw = json.dumps([self.written_at, self.thread_id], separators=(",", ":")).encode()
        return base64.urlsafe_b64encode(raw).decode().rstrip("=")

    @classmethod
    def decode(cls, text: str) -> Cursor:
        """Raises:
        ConfigurationError: a cursor this module did not write (kind ``invalid``: 422): not
            base64 of a JSON pair, a write time that is not a finite number, or a thread id
            no store could hold (:func:`threadkeep.core.ids.checked_id`)."""
        try:
            raw = base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
            written_at, thread_id = json.loads(raw)
            if (
                isinstance(written_at, bool)
                or not isinstance(written_at, int | float)
                or not math.isfinite(written_at)
            ):
                raise ValueError(text)
            checked_id(thread_id, "cursor")
        except (ValueError, TypeError, OverflowError, binascii.Error, InvalidInputError):
            raise ConfigurationError(
                f"the cursor {text[:40]!r} is not one a thread listing returned: pass the "
                "next_cursor of the previous page, or no cursor for the first page",
                context={"cursor": text[:40]},
            ) from None
        return cls(float(written_at), thread_id)


@dataclass(frozen=True, slots=True)
class ThreadQuery:
    """One page of a thread listing.

    Attributes:
        owner: Only this user's threads (the operator's filter; a user's own scope sets it).
        status: Only threads of this status.
        written_after: Only threads last written at or after this time (epoch seconds).
        written_before: Only threads last written before this time (epoch seconds).
        metadata: Only threads whose newest checkpoint's metadata holds each of these
            key/value pairs (as ``list``'s ``filter=``).
        limit: Rows per page, 1 to :data:`MAX_PAGE`.
        cursor: The previous page's ``next_cursor``; ``None``: the first page.
    """

    owner: str | None = None
    status: ThreadStatus | None = None
    written_after: float | None = None
    written_before: float | None = None
    metadata: Mapping[str, Any] | None = None
    limit: int = 50
    cursor: Cursor | None = None

    def __post_init__(self) -> None:
        if self.status is not None and self.status not in STATUSES:
            raise ConfigurationError(
                f"unknown thread status {self.status!r}: choose one of {', '.join(STATUSES)}",
                context={"status": self.status},
            )
        if not 1 <= self.limit <= MAX_PAGE:
            raise ConfigurationError(
                f"a page holds 1 to {MAX_PAGE} threads, not {self.limit}: pass a limit in that range",
                context={"limit": self.limit},
            )


@dataclass(frozen=True, slots=True)
class ThreadSummary:
    """One thread, as a listing shows it.

    Attributes:
        thread_id: The thread's id.
        owner: The user who owns it.
        status: See the module's docstring.
        written_at: When it was last written (epoch seconds).
        due: When the sweep may delete it (epoch seconds), by the horizon in force; a live
            park holds it past this (``parked_until``).
        parked_until: The latest deadline of its live parks, else ``None``.
        metadata: Its newest checkpoint's metadata.
    """

    thread_id: str
    owner: str
    status: ThreadStatus
    written_at: float
    due: float | None
    parked_until: float | None = None
    metadata: Mapping[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        """The JSON row of the API and of ``threadkeep threads list --json``."""
        return {
            "thread_id": self.thread_id,
            "owner": self.owner,
            "status": self.status,
            "written_at": self.written_at,
            "due": self.due,
            "parked_until": self.parked_until,
            "metadata": dict(self.metadata),
        }


@dataclass(frozen=True, slots=True)
class ThreadPage:
    """A page of threads, newest write first; ``next_cursor`` is ``None`` on the last page."""

    threads: list[ThreadSummary]
    next_cursor: Cursor | None

    def to_dict(self) -> dict[str, Any]:
        return {
            "threads": [thread.to_dict() for thread in self.threads],
            "next_cursor": self.next_cursor.encode() if self.next_cursor else None,
        }
