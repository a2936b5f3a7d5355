"""The tiered provider's operations: Postgres first, then the cache (SPEC T1-T7).

Each operation is a tiered program over the Postgres provider's programs and the cache's
(:mod:`threadkeep.backends.tiered.engine` runs them):

- ``put``: the durable put; then the cache, with the same state. A conflict
  (``StaleStateError``) clears the thread's entry before it is re-raised (T5); a failed
  durable write never reaches the cache (T2).
- ``put_writes``: the durable writes; then the entry, if it holds their checkpoint (T6).
- ``get_tuple`` of the newest state: the cache, if the state is within its lease; past it,
  the state once checked against Postgres's newest (one indexed lookup), which renews the
  lease; on a miss, a cache error or a state Postgres has moved past, Postgres, and the state
  read is written to the cache (T3). Reads of history (an explicit checkpoint id, ``list``)
  go to Postgres. The backend remembers which state the cache served as the newest of each
  thread (:class:`_Served`), so a write based on it, a branch too, needs it to still be the
  head (nothing of this goes into the configs LangGraph sees).
- the tool-call ledger: Postgres only; the cache holds none of it.
- deletes, copies, prunes and owner changes: Postgres (which refuses another user's thread
  before anything changes), then the affected entries are cleared and held for a while, so a
  write under way cannot bring the removed state back (``lua/forget.lua``).

An entry is keyed by thread and user: under user isolation the user is the thread's owner
(the only user who may read it; an operator's call looks the owner up), without isolation
it is the same for everyone.
"""

from __future__ import annotations

import dataclasses
import hashlib
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from functools import partial
from typing import Any

from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import CheckpointTuple
from langgraph.checkpoint.serde.base import SerializerProtocol

from threadkeep.backends.postgres import queries
from threadkeep.backends.redis import programs as redis_programs
from threadkeep.backends.sql.backend import SqlBackend
from threadkeep.backends.tiered.cache import Loaded, StateCache
from threadkeep.backends.tiered.engine import UNAVAILABLE, Cached, Durable, TieredEngine
from threadkeep.core.identity import Actor
from threadkeep.core.ledger import CallBegin, CallEnd, StoredCall
from threadkeep.core.listing import ThreadRow, ThreadScan
from threadkeep.core.messages import ContentCache, EncodingMemo
from threadkeep.core.program import Program, Sql
from threadkeep.core.records import ListQuery, PutStep, StoredCheckpoint, Target, WritesStep
from threadkeep.core.retention import ExpiredThread, Park, SweepPage, ThreadRetention
from threadkeep.errors import StaleStateError
from threadkeep.metrics import CACHE_EVENTS, Metrics

__all__ = ["TieredBackend"]

_SHARED = ""  # the user part of every entry when isolation is off


class _Served:
    """The checkpoint the cache last served as the newest state of each (thread, namespace,
    entry user), for this process's most recent 10,000 threads.

    A put whose parent is such a state needs it to still be the head (SPEC W2, T4): the cache
    may have served it past a newer state another writer committed, and an ``update_state``
    or fork built on it would otherwise branch beside the true head. LangGraph's own read
    before ``update_state`` is the newest-state read this records; a read of a checkpoint by
    id (time travel) goes to Postgres and is not recorded.
    """

    LIMIT = 10_000

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._heads: OrderedDict[tuple[str, str, str], str] = OrderedDict()

    def record(self, key: tuple[str, str, str], checkpoint_id: str) -> None:
        with self._lock:
            self._heads[key] = checkpoint_id
            self._heads.move_to_end(key)
            if len(self._heads) > self.LIMIT:
                self._heads.popitem(last=False)

    def forget(self, key: tuple[str, str, str]) -> None:
        with self._lock:
            self._heads.pop(key, None)

    def get(self, key: tuple[str, str, str]) -> str | None:
        with self._lock:
            return self._heads.get(key)


def _wall_ms() -> int:
    """This host's clock, in ms: where a lease starts when Redis's time is not at hand. The
    lease's bound holds across hosts whose clocks agree with Redis's (docs/tiered.md)."""
    return int(time.time() * 1000)


def writes_digest(writes: Iterable[tuple[str, str, int, str, str, bytes]]) -> str:
    """The digest ``NEWEST_VERSION`` computes over a checkpoint's pending writes (task id,
    index, type and value of each, in key order; ``""`` for none): equal only if the writes
    are. A count would miss a special write (an interrupt, a resume, an error) replaced in
    place, which keeps its key."""
    rows = sorted((task_id, idx, kind, value) for _, task_id, idx, _, kind, value in writes)
    if not rows:
        return ""
    text = "\x1e".join(
        "\x1f".join((task_id, str(idx), kind, hashlib.md5(value).hexdigest()))
        for task_id, idx, kind, value in rows
    )
    return hashlib.md5(text.encode()).hexdigest()


def _newest_version(target: Target) -> Program[tuple[str, str] | None]:
    """Postgres's newest checkpoint id of ``target``'s namespace and the digest of its
    pending writes (:func:`writes_digest`), for the reader ``target`` names; ``None``: none."""
    params = {
        "thread_id": target.thread_id,
        "owner": target.actor.owner_filter,
        "checkpoint_ns": target.checkpoint_ns,
    }
    rows = yield Sql(queries.NEWEST_VERSION, params)
    return (str(rows[0][0]), str(rows[0][1])) if rows else None


class TieredBackend:
    """Postgres, the source of truth, behind a Redis cache of each thread's newest state.

    Args:
        durable: The Postgres provider's backend.
        cache: The hot tier's programs.
        engine: Runs tiered programs on both tiers.
        isolate: Whether threads belong to users (SPEC W3); it decides the entries' keys.
        metrics: Where hits, misses, skipped writes and cleared entries are counted.
        clock: Wall-clock seconds, for entries seeded after a miss.
    """

    # The cache stores a task's writes as the durable tier is sent them: whole.
    messages_by_reference = False

    def __init__(
        self,
        durable: SqlBackend,
        cache: StateCache,
        engine: TieredEngine,
        *,
        isolate: bool,
        metrics: Metrics,
        clock: Callable[[], float],
    ) -> None:
        self.durable = durable
        self.cache = cache
        self.engine = engine
        self.isolate = isolate
        self.metrics = metrics
        self.clock = clock
        self.served = _Served()

    # whose entry ---------------------------------------------------------------------------

    def _reader(self, actor: Actor) -> str | None:
        """The entry a read by ``actor`` may use; ``None``: none (an operator under isolation
        could read any owner's thread, and must not be served another's entry)."""
        if not self.isolate:
            return _SHARED
        return actor.owner_filter

    def _entry_user(self, thread_id: str, actor: Actor) -> Program[str | None]:
        """The user part of ``thread_id``'s entry; ``None`` if the thread has no owner."""
        user = self._reader(actor)
        if user is not None:
            return user
        owner: str | None = yield Durable(lambda: self.durable.owner_of(thread_id))
        return owner

    def _forget(self, thread_id: str, user: str | None, *, removed: bool = False) -> Program[None]:
        """Clear the entry; ``removed``: the thread's durable state was removed (see
        :meth:`StateCache.forget`)."""
        if user is None:
            return
        existed = yield Cached(lambda: self.cache.forget(thread_id, user, removed=removed), "clear an entry")
        if existed:
            self.metrics.inc(CACHE_EVENTS, event="cleared")

    # writes ------------------------------------------------------------------------------------

    def put(self, step: PutStep) -> Program[RunnableConfig]:
        thread_id, actor = step.target.thread_id, step.target.actor
        served = self.served.get((thread_id, step.target.checkpoint_ns, self._reader(actor) or _SHARED))
        if served is not None and served == step.parent_id:
            step = dataclasses.replace(step, served_head=served)
        since = _wall_ms()  # before the commit: the state is the head from then until another
        try:
            config: RunnableConfig = yield Durable(lambda: self.durable.put(step), write=True)
        except StaleStateError:
            yield from self._forget(thread_id, (yield from self._entry_user(thread_id, actor)))
            raise
        user = yield from self._entry_user(thread_id, actor)
        if user is not None:
            outcome = yield Cached(lambda: self.cache.store(step, user, since=since), "write a state")
            if outcome == "skipped":
                self.metrics.inc(CACHE_EVENTS, event="skipped")
            elif outcome is UNAVAILABLE:
                # A failed write may have left an older state behind: drop it if Redis lets us.
                yield from self._forget(thread_id, user)
        return config

    def put_writes(self, step: WritesStep) -> Program[None]:
        thread_id, actor = step.target.thread_id, step.target.actor
        yield Durable(lambda: self.durable.put_writes(step), write=True, atomic=False)
        user = yield from self._entry_user(thread_id, actor)
        if user is not None:
            outcome = yield Cached(lambda: self.cache.store_writes(step, user), "write pending writes")
            if outcome is UNAVAILABLE:
                yield from self._forget(thread_id, user)

    # reads -------------------------------------------------------------------------------------

    def get_tuple(
        self,
        target: Target,
        serde: SerializerProtocol,
        content: ContentCache,
        memo: EncodingMemo | None = None,
    ) -> Program[CheckpointTuple | None]:
        user = self._reader(target.actor) if target.checkpoint_id is None else None
        since = None  # when the state Postgres answers with was known to be the newest
        if user is not None:
            loaded = yield Cached(lambda: self.cache.load(target, user, content), "read a state")
            if isinstance(loaded, Loaded):
                since = loaded.read_at
                if loaded.state is None:
                    self.metrics.inc(CACHE_EVENTS, event="miss")
                else:
                    cached, cached_lists = loaded.state
                    if loaded.valid or (yield from self._confirm(target, user, cached, loaded.read_at)):
                        self.metrics.inc(CACHE_EVENTS, event="hit")
                        self.served.record(
                            (target.thread_id, target.checkpoint_ns, user), cached.checkpoint_id
                        )
                        return cached.to_tuple(serde, cached_lists, content, memo)
                    self.metrics.inc(CACHE_EVENTS, event="stale")
        if since is None:
            since = _wall_ms()
        found = yield Durable(lambda: self.durable.get_stored(target, content))
        if found is None:
            return None
        stored, lists = found
        if user is not None:
            now = self.clock()
            seed = partial(
                self.cache.seed, stored, lists, target.actor, user, now=now, since=since, serde=serde
            )
            yield Cached(seed, "seed a state")
        return stored.to_tuple(serde, lists, content, memo)  # type: ignore[no-any-return]

    def _confirm(
        self, target: Target, user: str, cached: StoredCheckpoint, read_at: int | None
    ) -> Program[bool]:
        """Whether ``cached``, an entry's state past its lease, is still Postgres's newest
        state of the namespace (the same checkpoint, with the same pending writes); if so, its
        lease is renewed from ``read_at``, the Redis time of the read (before the check)."""
        newest = yield Durable(lambda: _newest_version(target))
        if newest != (cached.checkpoint_id, writes_digest(cached.writes)):
            return False
        if read_at is not None:
            renew = partial(self.cache.renew, target, user, cached.checkpoint_id, read_at)
            if (yield Cached(renew, "renew a lease")):
                self.metrics.inc(CACHE_EVENTS, event="confirmed")
        return True

    def list_page(
        self, query: ListQuery, serde: SerializerProtocol, content: ContentCache
    ) -> Program[tuple[list[CheckpointTuple], ListQuery | None]]:
        page = yield Durable(lambda: self.durable.list_page(query, serde, content))
        return page  # type: ignore[no-any-return]

    # deletes and copies ------------------------------------------------------------------------

    def delete_thread(self, thread_id: str, owner: str | None) -> Program[bool]:
        user = yield from self._entry_user(thread_id, Actor(owner or "", owner))
        deleted = yield Durable(lambda: self.durable.delete_thread(thread_id, owner), write=True)
        yield from self._forget(thread_id, user, removed=True)
        return bool(deleted)

    def owner_of(self, thread_id: str) -> Program[str | None]:
        owner: str | None = yield Durable(lambda: self.durable.owner_of(thread_id))
        return owner

    def run_threads(self, run_ids: Sequence[str], owner: str | None) -> Program[list[tuple[str, str]] | None]:
        threads = yield Durable(lambda: self.durable.run_threads(run_ids, owner))
        return threads  # type: ignore[no-any-return]

    def delete_for_runs(
        self,
        run_ids: Sequence[str],
        owner: str | None,
        spare: Mapping[str, Collection[tuple[str, str]]] | None = None,
    ) -> Program[int]:
        threads = yield Durable(lambda: self.durable.run_threads(run_ids, owner))
        removed = yield Durable(lambda: self.durable.delete_for_runs(run_ids, owner, spare), write=True)
        for thread_id, thread_owner in threads:
            yield from self._forget(thread_id, thread_owner if self.isolate else _SHARED, removed=True)
        return int(removed)

    def copy_thread(self, source: str, target: str, actor: Actor, now: float) -> Program[bool]:
        copied = yield Durable(lambda: self.durable.copy_thread(source, target, actor, now), write=True)
        yield from self._forget(target, (yield from self._entry_user(target, actor)), removed=True)
        return bool(copied)

    def prune(
        self,
        thread_ids: Iterable[str],
        strategy: str,
        owner: str | None,
        keep: Mapping[str, Mapping[str, int]] | None = None,
    ) -> Program[None]:
        ids = list(thread_ids)
        users = []
        for thread_id in ids:
            users.append((yield from self._entry_user(thread_id, Actor(owner or "", owner))))
        yield Durable(lambda: self.durable.prune(ids, strategy, owner, keep), write=True)
        for thread_id, user in zip(ids, users, strict=True):
            yield from self._forget(thread_id, user, removed=True)

    def assign_owner(
        self, thread_ids: Sequence[str], user: str, force: bool
    ) -> Program[dict[str, str | None]]:
        before: dict[str, str | None] = yield Durable(
            lambda: self.durable.assign_owner(thread_ids, user, force), write=True
        )
        if self.isolate:  # the entries are the old owners': a read by them must not find one
            for thread_id, owner in before.items():
                if owner is not None and owner != user:
                    yield from self._forget(thread_id, owner, removed=True)
        return before

    # retention: Postgres keeps it; a swept thread's entry leaves with it -----------------------

    def start_thread(
        self, thread_id: str, actor: Actor, declared: ThreadRetention, now: float
    ) -> Program[None]:
        yield Durable(lambda: self.durable.start_thread(thread_id, actor, declared, now), write=True)

    def mark_finished(
        self, thread_ids: Sequence[str], actor: Actor, finished_minutes: int, now: float
    ) -> Program[dict[str, float]]:
        marked = yield Durable(
            lambda: self.durable.mark_finished(thread_ids, actor, finished_minutes, now), write=True
        )
        return marked  # type: ignore[no-any-return]

    def thread_retention(
        self, thread_id: str, owner: str | None
    ) -> Program[tuple[ThreadRetention, float | None] | None]:
        found = yield Durable(lambda: self.durable.thread_retention(thread_id, owner))
        return found  # type: ignore[no-any-return]

    def expired_page(self, page: SweepPage) -> Program[list[ExpiredThread]]:
        found = yield Durable(lambda: self.durable.expired_page(page))
        return found  # type: ignore[no-any-return]

    def count_expired(self, page: SweepPage) -> Program[int]:
        count = yield Durable(lambda: self.durable.count_expired(page))
        return int(count)

    def delete_threads(
        self, threads: Sequence[ExpiredThread], page: SweepPage | None = None
    ) -> Program[list[str]]:
        deleted: list[str] = yield Durable(lambda: self.durable.delete_threads(threads, page), write=True)
        gone = set(deleted)
        for thread in threads:
            if thread.thread_id in gone:
                owner = thread.owner if self.isolate else _SHARED
                yield from self._forget(thread.thread_id, owner, removed=True)
        return deleted

    def threads_named(self, thread_ids: Sequence[str]) -> Program[list[ExpiredThread]]:
        found = yield Durable(lambda: self.durable.threads_named(thread_ids))
        return found  # type: ignore[no-any-return]

    def record_park(self, park: Park) -> Program[None]:
        yield Durable(lambda: self.durable.record_park(park), write=True)

    def clear_park(self, thread_id: str, park_id: str, actor: Actor) -> Program[None]:
        yield Durable(lambda: self.durable.clear_park(thread_id, park_id, actor), write=True)

    def live_parks(self, thread_ids: Sequence[str], now: float, owner: str | None) -> Program[set[str]]:
        live = yield Durable(lambda: self.durable.live_parks(thread_ids, now, owner))
        return live  # type: ignore[no-any-return]

    def interrupted(self, thread_ids: Sequence[str], since: float | None) -> Program[set[str]]:
        waiting = yield Durable(lambda: self.durable.interrupted(thread_ids, since))
        return waiting  # type: ignore[no-any-return]

    def thread_rows(self, scan: ThreadScan) -> Program[list[ThreadRow]]:
        # The listing reads Postgres, the source of truth; the cache holds no index of threads.
        rows = yield Durable(lambda: self.durable.thread_rows(scan))
        return rows  # type: ignore[no-any-return]

    def thread_row(self, thread_id: str, owner: str | None, now: float) -> Program[ThreadRow | None]:
        row = yield Durable(lambda: self.durable.thread_row(thread_id, owner, now))
        return row  # type: ignore[no-any-return]

    # the store ---------------------------------------------------------------------------------

    # the tool-call ledger (SPEC TM5): Postgres only, never cached, so it holds with the cache lost

    def begin_tool_call(self, step: CallBegin) -> Program[StoredCall]:
        begin = Durable(lambda: self.durable.begin_tool_call(step), write=True, atomic=False)
        stored: StoredCall = yield begin
        return stored

    def end_tool_call(self, step: CallEnd) -> Program[None]:
        yield Durable(lambda: self.durable.end_tool_call(step), write=True)

    def tool_calls(self, thread_id: str, owner: str | None) -> Program[list[StoredCall]]:
        stored: list[StoredCall] = yield Durable(lambda: self.durable.tool_calls(thread_id, owner))
        return stored

    def stats(self, thread_id: str | None = None) -> dict[str, Any]:
        return self.durable.stats(thread_id)

    def location(self) -> str:
        cache_at = getattr(self.engine.cache, "location", "redis")
        return f"{self.durable.location()}; cache {self.cache.space.prefix}:* on {cache_at}"

    def check(self) -> None:
        self.durable.check()

    def reset(self) -> None:
        """Reset Postgres, then remove every cache entry."""
        self.durable.reset()
        self.engine.cache.run(lambda: redis_programs.reset(self.cache.space))
