"""The checkpoint sweep (SPEC SW1-SW8): the one operation that deletes expired threads.

:func:`sweep_checkpoints` deletes every thread marked finished whose due time has passed,
and, on stores whose threads leave by the sweep (postgres, sqlite, tiered), every waiting
thread whose newest checkpoint is older than its waiting retention (declared, else the
platform's). Before anything is deleted, the live-thread filters are asked: a thread one of
them claims is spared (counted, listed, logged at DEBUG, and left marked so the next sweep
asks again); each sweep that spares threads logs one WARNING that counts them by filter and
horizon. It pages through the store 1,000 threads at a time and holds one page in memory.

Nothing runs it in the background: an operator schedules ``threadkeep checkpoints sweep``
(see ``docs/operations.md``) or calls ``POST /api/checkpoints/sweep``.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Collection, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, Final

from threadkeep.core.identity import operator_scope
from threadkeep.core.retention import ExpiredThread, Horizon, SweepPage
from threadkeep.core.retry import maintenance
from threadkeep.errors import ConfigurationError
from threadkeep.metrics import SWEEP_DELETED, SWEEP_RUNS, SWEEP_SPARED, Metrics
from threadkeep.saver import ThreadkeepSaver

__all__ = [
    "DOOMED_LISTED",
    "PAGE_SIZE",
    "LiveThreadFilter",
    "SparedThread",
    "SweepResult",
    "live_thread_filters",
    "register_live_thread_filter",
    "sweep_checkpoints",
    "unregister_live_thread_filter",
]

logger = logging.getLogger("threadkeep.sweep")

PAGE_SIZE: Final = 1000
DOOMED_LISTED: Final = 1000  # a dry run lists at most this many of the threads it would delete

LiveThreadFilter = Callable[[ThreadkeepSaver, Sequence[str], float], Collection[str]]
"""Given the store, a page of thread ids past a horizon and the sweep's clock (epoch
seconds), return the ids still in use."""

_OWNER = re.compile(r"^[a-z][a-z0-9_-]*$")
_FILTERS: dict[str, LiveThreadFilter] = {}

_SKIPPED: Final = {
    "ttl": "waiting horizon: provider {name!r} expires waiting threads by their keys' TTL",
    "process": "waiting horizon: provider {name!r} keeps threads for the life of its process",
}


def register_live_thread_filter(owner: str, fn: LiveThreadFilter) -> None:
    """Ask ``fn`` before the sweep deletes any thread (SPEC SW4).

    ``fn(saver, thread_ids, now)`` returns the ids it claims as live; those are spared. A
    filter that raises fails the sweep (nothing after it is deleted).

    Raises:
        ConfigurationError: ``owner`` is not a lowercase name (``[a-z][a-z0-9_-]*``) or
            already has a filter.
    """
    if not _OWNER.match(owner):
        raise ConfigurationError(
            f"live-thread filter owner {owner!r} must match [a-z][a-z0-9_-]* (it labels a metric)",
            context={"owner": owner},
        )
    if owner in _FILTERS:
        raise ConfigurationError(
            f"a live-thread filter is already registered for {owner!r}; unregister it first",
            context={"owner": owner},
        )
    _FILTERS[owner] = fn


def unregister_live_thread_filter(owner: str) -> None:
    """Remove ``owner``'s filter (if any)."""
    _FILTERS.pop(owner, None)


def live_thread_filters() -> dict[str, LiveThreadFilter]:
    """The registered filters by owner, in the order they are asked."""
    return dict(_FILTERS)


def _parks(saver: ThreadkeepSaver, thread_ids: Sequence[str], now: float) -> Collection[str]:
    """A thread with a live park (SPEC RT5) is still waiting on an answer."""
    return saver.live_parks(thread_ids, now)


def _interrupts(saver: ThreadkeepSaver, thread_ids: Sequence[str], now: float) -> Collection[str]:
    """A thread whose newest root checkpoint holds an interrupt waits to be resumed: for as
    long as it waits, or, with an interrupt horizon (``retention.interrupt_minutes``), until
    that checkpoint is older than the horizon."""
    return saver.interrupted(thread_ids, saver.retention.interrupted_since(now))


register_live_thread_filter("parks", _parks)
register_live_thread_filter("interrupts", _interrupts)


@dataclass(frozen=True, slots=True)
class SparedThread:
    thread_id: str
    horizon: Horizon
    owner: str  # the filter that claimed it


@dataclass
class SweepResult:
    """What a sweep did (SPEC SW6); :meth:`to_dict` is the HTTP route's and ``--json``'s body.

    ``doomed`` lists, on a dry run, the threads a sweep would delete (nothing is deleted;
    the first 1,000 are listed, ``swept_count`` counts them all).
    """

    provider: str
    waiting_minutes: int
    finished_minutes: int
    swept_count: int = 0
    finished_swept: int = 0
    waiting_swept: int = 0
    spared: list[SparedThread] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    dry_run: bool = False
    doomed: list[dict[str, str]] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def spared_counts(self) -> dict[str, dict[str, int]]:
        """How many threads each filter (``owner``) spared, by horizon, owners in the order
        they first spared one."""
        counts: dict[str, dict[str, int]] = {}
        for spared in self.spared:
            by_horizon = counts.setdefault(spared.owner, {})
            by_horizon[spared.horizon] = by_horizon.get(spared.horizon, 0) + 1
        return counts

    def spared_summary(self) -> str:
        """The spared threads counted by filter and horizon, e.g. ``interrupts 170 (finished
        10, waiting 160), parks 10 (finished 10)``; empty when none was spared."""
        return ", ".join(
            f"{owner} {sum(by_horizon.values())} ("
            + ", ".join(f"{horizon} {count}" for horizon, count in sorted(by_horizon.items()))
            + ")"
            for owner, by_horizon in self.spared_counts().items()
        )


def sweep_checkpoints(
    saver: ThreadkeepSaver | None = None,
    *,
    now: float | None = None,
    dry_run: bool = False,
    progress: Callable[[SweepResult, int], None] | None = None,
    metrics: Metrics | None = None,
    on_deleted: Callable[[Sequence[str]], None] | None = None,
) -> SweepResult:
    """Delete the threads past their horizon that nobody claims (SPEC SW1-SW8).

    Args:
        saver: The store to sweep; default: the deployment's configured one (opened from
            the settings and closed afterwards).
        now: The sweep's clock (epoch seconds); default: the saver's clock.
        dry_run: Find and filter, but delete nothing; ``doomed`` lists what would go.
        progress: Called after each page with the result so far and the number of threads
            the sweep expects to visit (counted once, at the start).
        metrics: Where runs, spared and deleted threads are counted; default: the saver's.
        on_deleted: Called after each page with the ids of the threads it deleted (``threadkeep
            serve`` evicts them from its ownership resolver).

    Raises:
        Exception: whatever a live-thread filter raised (with a note naming the filter).
    """
    if saver is None:
        from threadkeep.providers import open_checkpointer

        with open_checkpointer() as owned:
            return sweep_checkpoints(
                owned, now=now, dry_run=dry_run, progress=progress, metrics=metrics, on_deleted=on_deleted
            )
    if saver.declared is not None:
        raise ConfigurationError(
            "sweep the deployment's store with a saver built from its settings (open_checkpointer()), "
            "not a run's saver_for(..., waiting_minutes=...): the sweep would apply that run's "
            "retention to every thread",
            context={"declared_waiting_minutes": saver.declared.waiting_minutes},
        )
    with operator_scope():
        return _Sweep(
            saver,
            saver.clock() if now is None else now,
            dry_run,
            progress,
            metrics or saver.metrics,
            on_deleted=on_deleted,
        ).run()


class _Sweep:
    def __init__(
        self,
        saver: ThreadkeepSaver,
        now: float,
        dry_run: bool,
        progress: Callable[[SweepResult, int], None] | None,
        metrics: Metrics,
        *,
        on_deleted: Callable[[Sequence[str]], None] | None = None,
    ) -> None:
        self.saver = saver
        self.on_deleted = on_deleted
        self.now = now
        self.dry_run = dry_run
        self.progress = progress
        self.metrics = metrics
        self.total = 0  # threads the sweep expects to visit (counted only for a progress report)
        self.result = SweepResult(
            provider=saver.facts.name,
            waiting_minutes=saver.retention.waiting_minutes,
            finished_minutes=saver.retention.finished_minutes,
            dry_run=dry_run,
        )

    def run(self) -> SweepResult:
        with maintenance():  # long round trips, nobody waiting: no command timeout
            result = self._run()
        self.metrics.inc(SWEEP_RUNS, dry_run=str(self.dry_run).lower())
        return result

    def _run(self) -> SweepResult:
        expiry = self.saver.facts.expiry
        horizons: list[Horizon] = ["finished", "waiting"] if expiry == "sweep" else ["finished"]
        if expiry != "sweep":
            self.result.skipped.append(_SKIPPED[expiry].format(name=self.saver.facts.name))
        if self.progress is not None:
            self.total = sum(self.saver.count_expired(self._page(horizon)) for horizon in horizons)
        for horizon in horizons:
            self._horizon(horizon)
        logger.info(
            "checkpoint sweep of %s: %d deleted (%d finished, %d waiting), %d spared%s",
            self.result.provider,
            self.result.swept_count,
            self.result.finished_swept,
            self.result.waiting_swept,
            len(self.result.spared),
            " (dry run)" if self.dry_run else "",
        )
        if self.result.spared:
            logger.warning(
                "checkpoint sweep of %s: %d thread(s) past their horizon kept because a live-thread "
                "filter claims them: %s; one kept sweep after sweep waits on something nobody "
                "answers (list them: threadkeep checkpoints sweep --dry-run --list; bound how long "
                "an interrupt spares its thread: LLM_PROVIDER_CHECKPOINT_RETENTION_INTERRUPT_MINUTES)",
                self.result.provider,
                len(self.result.spared),
                self.result.spared_summary(),
            )
        return self.result

    def _page(self, horizon: Horizon, after: int = 0, kept: int = 0) -> SweepPage:
        return SweepPage(horizon, self.now, self.result.waiting_minutes, after, kept, PAGE_SIZE)

    def _horizon(self, horizon: Horizon) -> None:
        after, kept = 0, 0
        while True:
            page = self.saver.expired_page(self._page(horizon, after, kept))
            if not page:
                return
            after = page[-1].key
            claimed = self._claimed(page, horizon)
            doomed = [thread for thread in page if thread.thread_id not in claimed]
            if self.dry_run:
                room = DOOMED_LISTED - len(self.result.doomed)
                self.result.doomed.extend(
                    {"thread_id": t.thread_id, "horizon": horizon} for t in doomed[:room]
                )
                deleted = len(doomed)
                kept += len(page)
            else:
                gone = self._delete(doomed, horizon)
                if gone and self.on_deleted is not None:
                    self.on_deleted(gone)
                deleted = len(gone)
                self.metrics.inc(SWEEP_DELETED, deleted, horizon=horizon)
                kept += len(page) - deleted  # a store without keys skips what stayed behind
            self.result.swept_count += deleted
            if horizon == "finished":
                self.result.finished_swept += deleted
            else:
                self.result.waiting_swept += deleted
            if self.progress is not None:
                self.progress(self.result, self.total)
            if len(page) < PAGE_SIZE:
                return

    def _delete(self, doomed: Sequence[ExpiredThread], horizon: Horizon) -> list[str]:
        """Delete ``doomed``, each only if it is still past ``horizon`` and not parked when
        its delete runs (SPEC SW5).

        One round: every store deletes a thread whole in one transaction (SQLite,
        Postgres, the tiered store's Postgres) or one script (Redis), after checking it
        again there. What a writer stores after that belongs to a run that started after
        its delete: a live thread, which stays. (Deleting again whatever bears the thread's
        name would delete puts that run saw acknowledged.)
        """
        return self.saver.delete_threads(doomed, self._page(horizon)) if doomed else []

    def _claimed(self, page: Sequence[ExpiredThread], horizon: Horizon) -> dict[str, str]:
        """Ask every filter about the page; ``{thread id: the first filter that claimed it}``."""
        ids = [thread.thread_id for thread in page]
        claimed: dict[str, str] = {}
        for owner, fn in _FILTERS.items():
            try:
                live = set(fn(self.saver, ids, self.now)) & set(ids)
            except Exception as error:
                error.add_note(f"raised by the live-thread filter {owner!r}: the sweep stopped there")
                logger.error("checkpoint sweep: the live-thread filter %r raised; sweep failed", owner)
                raise
            for thread_id in live:
                claimed.setdefault(thread_id, owner)
        for thread_id, owner in claimed.items():
            logger.debug(
                "checkpoint sweep: thread %s is past the %s horizon but %s reports it live; kept",
                thread_id,
                horizon,
                owner,
            )
            self.metrics.inc(SWEEP_SPARED, horizon=horizon, owner=owner)
            self.result.spared.append(SparedThread(thread_id, horizon, owner))
        return claimed
