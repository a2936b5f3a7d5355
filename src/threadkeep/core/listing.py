"""The thread listing's decisions (SPEC SV1, SV3), free of I/O: what a store's index read
returns for a thread, its status and due time, and how a page is assembled from index reads.

A store answers a :class:`ThreadScan` with :class:`ThreadRow` s, newest write first, from an
index (``Backend.thread_rows``); :func:`page_program` asks it for as many as a page needs,
keeps the rows that pass the filters an index cannot apply (metadata; on Redis, the status),
and stops after :data:`SCAN_BOUND` rows, so one page costs a bounded read whatever the
store holds. A store whose index may hold entries of threads that are gone (Redis: keys
expire on their TTL) reads at most :data:`SCAN_BOUND` entries a scan and says where it
stopped (:class:`ThreadRows`). See :mod:`threadkeep.threads` for the contract.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import Any, Final

from threadkeep.core.program import Program
from threadkeep.core.records import decode_structure, filter_as_stored, matches_filter
from threadkeep.core.retention import PlatformRetention
from threadkeep.threads import Cursor, ThreadPage, ThreadQuery, ThreadStatus, ThreadSummary

__all__ = [
    "CLOCK_STEP",
    "SCAN_BOUND",
    "STATE_OF",
    "ThreadRow",
    "ThreadRows",
    "ThreadScan",
    "page_program",
    "status_of",
    "summarize",
]

# How many index rows one page reads at most when rows are filtered after the index (a
# metadata filter; a status filter on Redis; entries of threads gone, on Redis): past it,
# the page ends short, with a cursor.
SCAN_BOUND: Final = 1000
# How far a thread's listed write time (the SQL stores' tk_threads.active_at) may lag its
# newest put, in seconds: a put moves it only once it is this far behind, so most puts leave
# the listing's indexes alone (a HOT update on Postgres). The listing's order, its write
# time filters and a waiting thread's shown due time are those of the puts to within it;
# the sweep counts from the newest checkpoint itself, so it deletes nothing early.
CLOCK_STEP: Final = 60.0
# The SQL stores' listing state (migrations postgres 12, sqlite 6) of each status a row can hold.
STATE_OF: Final[Mapping[ThreadStatus, int]] = {"waiting": 0, "finished": 1, "interrupted": 2}
_INFINITY: Final = float("inf")


@dataclass(frozen=True, slots=True)
class ThreadScan:
    """One index read: the threads after ``(at, after_id)`` in (written_at, thread_id)
    descending order, at most ``limit`` of them.

    Attributes:
        owner: Only this owner's threads (``None``: any owner's).
        status: Only threads of this status, as far as the store's index knows it (a store
            may return others; :func:`page_program` drops them).
        written_after: Only threads written at or after it.
        written_before: Only threads written before it.
        at: The cursor's write time (``inf``: from the newest).
        after_id: The cursor's thread id (rows of the same write time sort after it only if
            their id is smaller).
        now: The time a live park's deadline is compared with.
        limit: Rows to return at most.
    """

    owner: str | None
    status: ThreadStatus | None
    written_after: float
    written_before: float
    at: float
    after_id: str
    now: float
    limit: int

    def params(self) -> dict[str, object]:
        """The SQL statements' parameters (``state``: :data:`STATE_OF`, ``None``: any)."""
        return {
            "owner": self.owner,
            "state": None if self.status is None or self.status == "parked" else STATE_OF[self.status],
            "unparked": self.status not in (None, "parked"),
            "after": self.written_after,
            "before": self.written_before,
            "at": self.at,
            "id": self.after_id,
            "now": self.now,
            "limit": self.limit,
        }


@dataclass(frozen=True, slots=True)
class ThreadRow:
    """What an index read returns for one thread.

    Attributes:
        thread_id: The thread's id.
        owner: Its owner.
        written_at: Its waiting clock: its newest checkpoint, or a run's start if later.
        waiting_minutes: Its declared waiting retention (``None``: the platform's).
        finished_due: When it is due, if marked finished.
        interrupted: Its newest root checkpoint holds an interrupt write.
        parked_until: The latest deadline of its live parks (``None``: none).
        metadata: Its newest root checkpoint's metadata as stored (``None``: none).
        expires_at: When the store itself drops it, if it does (Redis: its keys' TTL).
    """

    thread_id: str
    owner: str
    written_at: float
    waiting_minutes: int | None
    finished_due: float | None
    interrupted: bool
    parked_until: float | None
    metadata: bytes | str | None = None
    expires_at: float | None = None

    @property
    def key(self) -> Cursor:
        return Cursor(self.written_at, self.thread_id)


class ThreadRows(list[ThreadRow]):
    """An index read's rows, when the store stopped reading before it had ``scan.limit``
    of them while its index may hold more (it read :data:`SCAN_BOUND` entries, many of
    threads gone): ``stopped_at`` is the last entry it read, where the next read goes on."""

    def __init__(self, rows: list[ThreadRow], stopped_at: Cursor) -> None:
        super().__init__(rows)
        self.stopped_at = stopped_at


def status_of(row: ThreadRow) -> ThreadStatus:
    """The thread's status, first match wins: parked, interrupted, finished, waiting."""
    if row.parked_until is not None:
        return "parked"
    if row.interrupted:
        return "interrupted"
    if row.finished_due is not None:
        return "finished"
    return "waiting"


def summarize(row: ThreadRow, platform: PlatformRetention) -> ThreadSummary:
    """A row as a listing shows it. ``due``: a finished thread's due time; else its waiting
    clock plus its waiting horizon (declared, else the platform's), as the sweep counts it
    (or the store's own expiry, where keys expire: Redis)."""
    if row.finished_due is not None:
        due: float | None = row.finished_due
    elif row.expires_at is not None:
        due = row.expires_at
    else:
        due = row.written_at + 60 * (row.waiting_minutes or platform.waiting_minutes)
    metadata: Mapping[str, Any] = {}
    if row.metadata is not None:
        metadata = decode_structure(row.metadata, "metadata")
    return ThreadSummary(
        thread_id=row.thread_id,
        owner=row.owner,
        status=status_of(row),
        written_at=row.written_at,
        due=due,
        parked_until=row.parked_until,
        metadata=metadata,
    )


def page_program(
    query: ThreadQuery,
    owner: str | None,
    now: float,
    platform: PlatformRetention,
    read: Callable[[ThreadScan], Program[list[ThreadRow]]],
) -> Program[ThreadPage]:
    """One page of ``query`` for ``owner`` (``None``: any owner), from index reads ``read``.

    Without a metadata filter a page is one read of ``limit + 1`` rows (the one more tells
    whether a next page exists). With one, reads go on until the page is full or
    :data:`SCAN_BOUND` rows were read; the page may then be short, or empty, with a
    ``next_cursor`` that goes on from the last row read. So does a read that stopped short
    (:class:`ThreadRows`).
    """
    wanted = filter_as_stored(query.metadata)
    cursor = query.cursor
    scan = ThreadScan(
        owner=owner,
        status=query.status,
        written_after=-_INFINITY if query.written_after is None else float(query.written_after),
        written_before=_INFINITY if query.written_before is None else float(query.written_before),
        at=_INFINITY,
        after_id="",
        now=now,
        limit=query.limit + 1 if wanted is None else max(query.limit + 1, 100),
    )
    found: list[ThreadSummary] = []
    scanned = 0
    while True:
        if cursor is not None:
            scan = replace(scan, at=cursor.written_at, after_id=cursor.thread_id)
        rows = yield from read(scan)
        stopped = rows.stopped_at if isinstance(rows, ThreadRows) else None
        for row in rows:
            if len(found) == query.limit:  # a row beyond the page: there is a next one
                return ThreadPage(found, Cursor(found[-1].written_at, found[-1].thread_id))
            scanned += 1
            cursor = row.key
            if query.status is not None and status_of(row) != query.status:
                continue
            summary = summarize(row, platform)
            if wanted is not None and not matches_filter(summary.metadata, wanted):
                continue
            found.append(summary)
        if stopped is not None:  # the store read its bound of entries: a short page
            return ThreadPage(found, stopped)
        if len(rows) < scan.limit:  # the index has no more
            return ThreadPage(found, None)
        if scanned >= SCAN_BOUND:
            return ThreadPage(found, cursor)
