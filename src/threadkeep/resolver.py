"""Who owns a thread, cached (SPEC SV2): what the HTTP API asks before each thread route
(``threadkeep serve``: :meth:`OwnershipResolver.acheck` with a user key, and
:meth:`OwnershipResolver.aevict` after a delete, a mark or a sweep).

:class:`OwnershipResolver` answers :meth:`~OwnershipResolver.owner_of` from three tiers:

1. an in-process LRU (10,000 entries, 30 s by default);
2. an optional shared Redis cache (1 h), so that a fleet of servers reads the store once per
   thread; ``redis_url`` (``OwnershipResolver.from_settings``: ``LLM_PROVIDER_CHECKPOINT_CACHE_URL``,
   else ``REDIS_URL``) turns it on;
3. the store, through :meth:`ThreadkeepSaver.owner_of <threadkeep.saver.ThreadkeepSaver.owner_of>`
   in operator scope.

The rules:

- Only positive answers are cached: a thread the store does not hold is asked again next
  time (it may be created at any moment).
- :meth:`~OwnershipResolver.evict` (call it after a thread is deleted, or handed to another
  owner) removes the thread from both tiers and leaves a tombstone for ``tombstone_seconds``
  in both: an answer read from the store before the eviction cannot be cached after it, here
  or by another process (the shared cache's write is ``SET NX``, which the tombstone blocks).
  Another process's own LRU may still answer from its copy for up to ``lru_seconds``.
- A Redis failure (down, slow past ``redis_timeout``) falls back to the store: the lookup is
  answered, counted as a shared-tier ``error`` in ``threadkeep_owner_cache_events_total``,
  and logged (``threadkeep.resolver``) at most once a minute.

:attr:`~OwnershipResolver.stats` counts lookups and store reads (``saved``: lookups answered
without the store). The lookup is written once, as a program (:mod:`threadkeep.core.program`)
that the sync and the async methods drive.
"""

from __future__ import annotations

import hashlib
import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final

from threadkeep.core.identity import operator_scope
from threadkeep.core.program import Program, drive, drive_async
from threadkeep.errors import ConfigurationError, StorageForbiddenError
from threadkeep.extras import import_extra
from threadkeep.metrics import OWNER_CACHE_EVENTS
from threadkeep.saver import ThreadkeepSaver
from threadkeep.settings import Settings

__all__ = ["OwnershipResolver", "ResolverStats", "store_identity"]

logger = logging.getLogger("threadkeep.resolver")

_TOMBSTONE: Final = b"-"  # the shared value of an evicted thread; an owner is stored as b"=" + name
_OWNER: Final = b"="
_DEAD: Final = object()  # the local value of an evicted thread
_ERROR_LOG_SECONDS: Final = 60.0


@dataclass(frozen=True, slots=True)
class _Shared:
    """Run one Redis command; the program receives its reply, or :class:`_Unavailable`."""

    command: tuple[Any, ...]


@dataclass(frozen=True, slots=True)
class _Store:
    """Read ``thread_id``'s owner from the store; the program receives it (or ``None``)."""

    thread_id: str


@dataclass(frozen=True, slots=True)
class _Unavailable:
    error: BaseException


@dataclass(slots=True)
class ResolverStats:
    """What a resolver did since it was built.

    Attributes:
        lookups: ``owner_of`` calls.
        local_hits: Answered by the in-process LRU.
        shared_hits: Answered by the shared Redis cache.
        store_reads: Answered by the store.
        errors: Shared-cache commands that failed (the store answered instead).
    """

    lookups: int = 0
    local_hits: int = 0
    shared_hits: int = 0
    store_reads: int = 0
    errors: int = 0

    @property
    def saved(self) -> int:
        """Lookups answered without reading the store."""
        return self.lookups - self.store_reads


class _Lru:
    """Entries that expire, the least recently used dropped past ``size``; thread-safe."""

    def __init__(self, size: int) -> None:
        self.size = size
        self._entries: OrderedDict[str, tuple[object, float]] = OrderedDict()
        self._guard = threading.Lock()

    def get(self, key: str, now: float) -> object | None:
        with self._guard:
            found = self._entries.get(key)
            if found is None:
                return None
            if found[1] <= now:
                del self._entries[key]
                return None
            self._entries.move_to_end(key)
            return found[0]

    def put(self, key: str, value: object, until: float, now: float, *, over_dead: bool) -> None:
        with self._guard:
            found = self._entries.get(key)
            if not over_dead and found is not None and found[0] is _DEAD and found[1] > now:
                return  # evicted meanwhile: the answer may predate the delete
            self._entries[key] = (value, until)
            self._entries.move_to_end(key)
            while len(self._entries) > self.size:
                self._entries.popitem(last=False)


def store_identity(saver: ThreadkeepSaver) -> str:
    """A short stable name of the store ``saver`` reads: a hash of its provider and its
    location (no secret: the location holds no password)."""
    where = f"{saver.facts.name}\0{saver.backend.location()}".encode()
    return hashlib.sha256(where).hexdigest()[:16]


class OwnershipResolver:
    """Thread owners, from an LRU, an optional shared Redis cache, then the store (SPEC SV2).

    Args:
        saver: The store to read owners from (in operator scope).
        redis_url: The shared cache's Redis; ``None``: no shared tier.
        lru_size: Entries the in-process LRU holds.
        lru_seconds: How long the LRU keeps an answer.
        shared_seconds: How long the shared cache keeps an answer.
        tombstone_seconds: How long an eviction blocks caching the thread again; longer than a
            store read takes.
        redis_timeout: Seconds a shared-cache command may take before the store is asked.
        key_prefix: The shared cache's keys are ``<key_prefix>:<thread id>``. Default:
            ``tkowner:<store>``, ``<store>`` a hash of the store's provider and location
            (:func:`store_identity`), so that stores sharing one Redis do not see each
            other's owners.
        clock: Monotonic seconds; tests pass a controllable one.

    Raises:
        ConfigurationError: a size or a duration that is not positive.
        MissingExtraError: ``redis_url`` without the ``[redis]`` extra.
    """

    def __init__(
        self,
        saver: ThreadkeepSaver,
        *,
        redis_url: str | None = None,
        lru_size: int = 10_000,
        lru_seconds: float = 30,
        shared_seconds: int = 3600,
        tombstone_seconds: int = 60,
        redis_timeout: float = 0.5,
        key_prefix: str | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        for name, value in (
            ("lru_size", lru_size),
            ("lru_seconds", lru_seconds),
            ("shared_seconds", shared_seconds),
            ("tombstone_seconds", tombstone_seconds),
            ("redis_timeout", redis_timeout),
        ):
            if isinstance(value, bool) or not isinstance(value, int | float) or value <= 0:
                raise ConfigurationError(
                    f"OwnershipResolver {name}={value!r} must be a positive number", context={"option": name}
                )
        self.saver = saver
        self.lru_seconds = lru_seconds
        self.shared_seconds = int(shared_seconds)
        self.tombstone_seconds = int(tombstone_seconds)
        self.key_prefix = f"tkowner:{store_identity(saver)}" if key_prefix is None else key_prefix
        self.clock = clock
        self.stats = ResolverStats()
        self._local = _Lru(lru_size)
        self._count = saver.metrics.counter(OWNER_CACHE_EVENTS)
        self._stats_guard = threading.Lock()
        self._logged_error_at = -_ERROR_LOG_SECONDS
        self._client: Any = None
        self._async_client: Any = None
        self._redis_url = redis_url
        if redis_url is not None:
            redis = import_extra("redis", "the ownership resolver's shared cache", "redis")
            self._client = redis.Redis.from_url(
                redis_url, socket_timeout=redis_timeout, socket_connect_timeout=redis_timeout
            )
        self._redis_timeout = redis_timeout

    @classmethod
    def from_settings(cls, saver: ThreadkeepSaver, settings: Settings, **options: Any) -> OwnershipResolver:
        """A resolver whose shared cache is ``LLM_PROVIDER_CHECKPOINT_CACHE_URL`` (else
        ``REDIS_URL``; neither: no shared tier)."""
        options.setdefault("redis_url", settings.cache_url or settings.redis_url)
        return cls(saver, **options)

    # the rules, once --------------------------------------------------------------------------

    def _key(self, thread_id: str) -> str:
        return f"{self.key_prefix}:{thread_id}"

    def _lookup(self, thread_id: str) -> Program[str | None]:
        now = self.clock()
        local = self._local.get(thread_id, now)
        if isinstance(local, str):
            self._counted(local_hits=1)
            self._count.labels(tier="local", event="hit").inc()
            return local
        self._count.labels(tier="local", event="miss").inc()
        evicted = local is _DEAD
        if self._client is not None and not evicted:
            reply = yield _Shared(("GET", self._key(thread_id)))
            if isinstance(reply, _Unavailable):
                self._failed(reply.error)
            elif reply is not None and bytes(reply).startswith(_OWNER):
                cached = bytes(reply)[1:].decode()
                self._counted(shared_hits=1)
                self._count.labels(tier="shared", event="hit").inc()
                self._local.put(thread_id, cached, now + self.lru_seconds, now, over_dead=False)
                return cached
            else:
                evicted = reply is not None  # a tombstone
                self._count.labels(tier="shared", event="miss").inc()
        owner: str | None = yield _Store(thread_id)
        self._counted(store_reads=1)
        if owner is None or evicted:
            return owner  # only positive answers are cached; none in a tombstone's time
        self._local.put(thread_id, owner, now + self.lru_seconds, now, over_dead=False)
        if self._client is not None:
            # NX: a tombstone another process left meanwhile wins over this (older) answer.
            value = _OWNER + owner.encode()
            stored = yield _Shared(("SET", self._key(thread_id), value, "NX", "EX", self.shared_seconds))
            if isinstance(stored, _Unavailable):
                self._failed(stored.error)
        return owner

    def _evict(self, thread_id: str) -> Program[None]:
        now = self.clock()
        self._local.put(thread_id, _DEAD, now + self.tombstone_seconds, now, over_dead=True)
        if self._client is not None:
            done = yield _Shared(("SET", self._key(thread_id), _TOMBSTONE, "EX", self.tombstone_seconds))
            if isinstance(done, _Unavailable):
                self._failed(done.error)

    def _counted(self, **counts: int) -> None:
        with self._stats_guard:
            self.stats.lookups += 1
            for name, amount in counts.items():
                setattr(self.stats, name, getattr(self.stats, name) + amount)

    def _failed(self, error: BaseException) -> None:
        with self._stats_guard:
            self.stats.errors += 1
            now = self.clock()
            log = now - self._logged_error_at >= _ERROR_LOG_SECONDS
            if log:
                self._logged_error_at = now
        self._count.labels(tier="shared", event="error").inc()
        if log:
            logger.warning(
                "ownership resolver: the shared cache failed (%s); the store answers until it is back",
                error,
            )

    # sync and async drivers --------------------------------------------------------------------

    def _execute(self, request: _Shared | _Store) -> Any:
        if isinstance(request, _Store):
            with operator_scope():
                return self.saver.owner_of(request.thread_id)
        try:
            return self._client.execute_command(*request.command)
        except Exception as error:  # any failure of the cache: the store answers
            return _Unavailable(error)

    async def _aexecute(self, request: _Shared | _Store) -> Any:
        if isinstance(request, _Store):
            with operator_scope():
                return await self.saver.aowner_of(request.thread_id)
        try:
            return await self._aclient().execute_command(*request.command)
        except Exception as error:
            return _Unavailable(error)

    def _aclient(self) -> Any:
        # An asyncio client belongs to the event loop it first runs on; the resolver is used
        # from one loop (the server's).
        if self._async_client is None:
            import redis.asyncio

            self._async_client = redis.asyncio.Redis.from_url(
                str(self._redis_url),
                socket_timeout=self._redis_timeout,
                socket_connect_timeout=self._redis_timeout,
            )
        return self._async_client

    def owner_of(self, thread_id: str) -> str | None:
        """The user who owns ``thread_id``; ``None``: the store holds no such thread.

        Raises:
            StorageError: the store failed (a shared-cache failure does not raise).
        """
        return drive(self._lookup(thread_id), self._execute)

    async def aowner_of(self, thread_id: str) -> str | None:
        """Async :meth:`owner_of`."""
        return await drive_async(self._lookup(thread_id), self._aexecute)

    def evict(self, thread_id: str) -> None:
        """Forget ``thread_id``'s owner in both tiers, leaving a tombstone in each (after a
        delete, or an owner change)."""
        drive(self._evict(thread_id), self._execute)

    async def aevict(self, thread_id: str) -> None:
        """Async :meth:`evict`."""
        await drive_async(self._evict(thread_id), self._aexecute)

    def check(self, thread_id: str, user: str, *, action: str = "read") -> str | None:
        """``thread_id``'s owner, if ``user`` may ``action`` it (``None``: no such thread).

        Raises:
            StorageForbiddenError: another user owns it (counted in
                ``threadkeep_forbidden_total{operation="read"}``).
        """
        return self._allowed(thread_id, self.owner_of(thread_id), user, action)

    async def acheck(self, thread_id: str, user: str, *, action: str = "read") -> str | None:
        """Async :meth:`check`."""
        return self._allowed(thread_id, await self.aowner_of(thread_id), user, action)

    def _allowed(self, thread_id: str, owner: str | None, user: str, action: str) -> str | None:
        if owner is not None and owner != user:
            self.saver.metrics.meters(self.saver.facts.name).forbidden("read")
            raise StorageForbiddenError(thread_id, user, action=action)
        return owner

    def close(self) -> None:
        """Close the sync Redis client (the async one: :meth:`aclose`)."""
        if self._client is not None:
            self._client.close()

    async def aclose(self) -> None:
        """Close both Redis clients."""
        self.close()
        if self._async_client is not None:
            await self._async_client.aclose()
