"""The Redis provider: plain Redis 6.2+ (or Valkey), no modules, single server or Cluster.

Each step is one Lua script over the ten keys of one thread, which share a hash tag; every
key a write stores carries the thread's waiting retention as its TTL (SPEC R1, R2). Importing
it imports redis-py (``pip install 'threadkeep[redis]'``): the provider table imports it when
the redis provider is first chosen.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping, Sequence
from typing import Any

from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import CheckpointTuple
from langgraph.checkpoint.serde.base import SerializerProtocol

from threadkeep.backends.redis import ledger, programs
from threadkeep.backends.redis.engine import RedisEngine, is_connection_error, refusal
from threadkeep.backends.redis.keys import KeySpace
from threadkeep.core.identity import Actor
from threadkeep.core.ledger import CallBegin, CallEnd, StoredCall
from threadkeep.core.listing import ThreadRow, ThreadScan
from threadkeep.core.messages import ContentCache, EncodingMemo
from threadkeep.core.program import Program
from threadkeep.core.records import ListQuery, PutStep, Target, WritesStep
from threadkeep.core.retention import ExpiredThread, Park, SweepPage, ThreadRetention
from threadkeep.core.retry import RetryPolicy
from threadkeep.errors import ConfigurationError
from threadkeep.metrics import METRICS, Metrics
from threadkeep.providers import FACTS, Provider, SaverOptions, saver_kwargs
from threadkeep.saver import ThreadkeepSaver
from threadkeep.settings import Settings

__all__ = ["REDIS_PROVIDER", "RedisBackend", "build_redis", "open_redis_backend"]

_OPTIONS = frozenset({"client", "async_client", "key_prefix", "cluster"})


class RedisBackend:
    """The storage operations of one Redis store, as program factories.

    Args:
        engine: Runs the programs (owns the clients it opened).
        space: The store's keys.
        ttl_ms: The waiting retention every write gives the thread's keys (SPEC R2).
    """

    # A write's messages are stored whole: a step is one script, and the thread's messages
    # are shared only by its message lists.
    messages_by_reference = False

    def __init__(self, engine: RedisEngine, space: KeySpace, ttl_ms: int) -> None:
        self.engine = engine
        self.space = space
        self.ttl_ms = ttl_ms
        self._programs = programs

    def open(self) -> None:
        """Check the format gate and record this generation (SPEC P6)."""
        self.engine.setup(lambda: self._programs.ensure_format(self.space))
        self.engine.setup(lambda: self._programs.record_format(self.space))

    def put(self, step: PutStep) -> Program[RunnableConfig]:
        return self._programs.put(self.space, step, self.ttl_ms)

    def put_writes(self, step: WritesStep) -> Program[None]:
        return self._programs.put_writes(self.space, step, self.ttl_ms)

    def get_tuple(
        self,
        target: Target,
        serde: SerializerProtocol,
        content: ContentCache,
        memo: EncodingMemo | None = None,
    ) -> Program[CheckpointTuple | None]:
        return self._programs.get_tuple(self.space, target, serde, content, memo)

    def list_page(
        self, query: ListQuery, serde: SerializerProtocol, content: ContentCache
    ) -> Program[tuple[list[CheckpointTuple], ListQuery | None]]:
        return self._programs.list_page(self.space, query, serde, content)

    def delete_thread(self, thread_id: str, owner: str | None) -> Program[bool]:
        return self._programs.delete_thread(self.space, thread_id, owner)

    def owner_of(self, thread_id: str) -> Program[str | None]:
        return self._programs.owner_of(self.space, thread_id)

    def run_threads(self, run_ids: Sequence[str], owner: str | None) -> Program[list[tuple[str, str]] | None]:
        """``None``: Redis keeps no index of runs (its delete reads every thread)."""
        return _no_index()

    def delete_for_runs(
        self,
        run_ids: Sequence[str],
        owner: str | None,
        spare: Mapping[str, Collection[tuple[str, str]]] | None = None,
    ) -> Program[int]:
        return self._programs.delete_for_runs(self.space, run_ids, owner, spare)

    def copy_thread(self, source: str, target: str, actor: Actor, now: float) -> Program[bool]:
        return self._programs.copy_thread(self.space, source, target, actor, now=now, ttl_ms=self.ttl_ms)

    def prune(
        self,
        thread_ids: Iterable[str],
        strategy: str,
        owner: str | None,
        keep: Mapping[str, Mapping[str, int]] | None = None,
    ) -> Program[None]:
        return self._programs.prune(self.space, thread_ids, strategy, owner, keep)

    def assign_owner(
        self, thread_ids: Sequence[str], user: str, force: bool
    ) -> Program[dict[str, str | None]]:
        return self._programs.assign_owner(self.space, thread_ids, user, force, self.ttl_ms)

    # retention (SPEC RT1-RT5, SW1-SW8) ----------------------------------------------------------

    def start_thread(
        self, thread_id: str, actor: Actor, declared: ThreadRetention, now: float
    ) -> Program[None]:
        return self._programs.start_thread(
            self.space, thread_id, actor, declared, ttl_ms=self.ttl_ms, now=now
        )

    def mark_finished(
        self, thread_ids: Sequence[str], actor: Actor, finished_minutes: int, now: float
    ) -> Program[dict[str, float]]:
        return self._programs.mark_finished(self.space, thread_ids, actor, finished_minutes, now)

    def thread_retention(
        self, thread_id: str, owner: str | None
    ) -> Program[tuple[ThreadRetention, float | None] | None]:
        return self._programs.thread_retention(self.space, thread_id, owner)

    def expired_page(self, page: SweepPage) -> Program[list[ExpiredThread]]:
        return self._programs.expired_page(self.space, page)

    def count_expired(self, page: SweepPage) -> Program[int]:
        return self._programs.count_expired(self.space, page)

    def delete_threads(
        self, threads: Sequence[ExpiredThread], page: SweepPage | None = None
    ) -> Program[list[str]]:
        return self._programs.delete_threads(self.space, threads, page)

    def threads_named(self, thread_ids: Sequence[str]) -> Program[list[ExpiredThread]]:
        return self._programs.threads_named(self.space, thread_ids)

    def record_park(self, park: Park) -> Program[None]:
        return self._programs.record_park(self.space, park, self.ttl_ms)

    def clear_park(self, thread_id: str, park_id: str, actor: Actor) -> Program[None]:
        return self._programs.clear_park(self.space, thread_id, park_id, actor)

    def live_parks(self, thread_ids: Sequence[str], now: float, owner: str | None) -> Program[set[str]]:
        return self._programs.live_parks(self.space, thread_ids, now, owner)

    def interrupted(self, thread_ids: Sequence[str], since: float | None) -> Program[set[str]]:
        return self._programs.interrupted(self.space, thread_ids, since)

    def thread_rows(self, scan: ThreadScan) -> Program[list[ThreadRow]]:
        return self._programs.thread_rows(self.space, scan)

    # the tool-call ledger (SPEC TM5) -------------------------------------------------------------

    def begin_tool_call(self, step: CallBegin) -> Program[StoredCall]:
        return ledger.begin_tool_call(self.space, step, self.ttl_ms)

    def end_tool_call(self, step: CallEnd) -> Program[None]:
        return ledger.end_tool_call(self.space, step, self.ttl_ms)

    def tool_calls(self, thread_id: str, owner: str | None) -> Program[list[StoredCall]]:
        return ledger.tool_calls(self.space, thread_id, owner)

    # the store ------------------------------------------------------------------------------------

    def stats(self, thread_id: str | None = None) -> dict[str, Any]:
        return self.engine.run(lambda: self._programs.stats(self.space, thread_id))

    def location(self) -> str:
        return f"{self.engine.location} (keys {self.space.prefix}:*)"

    def check(self) -> None:
        self.engine.setup(lambda: self._programs.ensure_format(self.space))

    def reset(self) -> None:
        self.engine.setup(lambda: self._programs.reset(self.space))


def open_redis_backend(
    settings: Settings, *, gate: bool = True, metrics: Metrics | None = None, **options: Any
) -> RedisBackend:
    """Open the Redis store the settings name; with ``gate``, run the format gate.
    ``metrics``: where its retries are counted (default: :data:`threadkeep.metrics.METRICS`)."""
    url = settings.redis_url_for("redis")
    client = options.get("client")
    if url is None and client is None:
        raise ConfigurationError(
            "the redis provider needs a server: set LLM_PROVIDER_CHECKPOINT_CONN_STRING (or REDIS_URL) "
            "to a redis:// URL, or pass client=",
            context={"variable": "LLM_PROVIDER_CHECKPOINT_CONN_STRING"},
        )
    engine = RedisEngine(
        url or "redis://localhost:6379/0",
        retry=RetryPolicy(
            attempts=settings.retry_attempts,
            backoff=settings.retry_backoff_seconds,
            retryable=is_connection_error,
            store="redis",
            refused=refusal,
            deadline=settings.step_deadline_seconds,
            on_retry=(metrics or METRICS).meters(settings.provider).retried,
        ),
        cluster=options.get("cluster"),
        client=client,
        async_client=options.get("async_client"),
        connect_timeout=settings.connect_timeout_seconds,
        socket_timeout=settings.command_timeout_seconds,
    )
    backend = RedisBackend(
        engine, KeySpace(options.get("key_prefix", "tk")), settings.retention_waiting_minutes * 60_000
    )
    if gate:
        try:
            backend.open()
        except BaseException:
            engine.close()
            raise
    return backend


def build_redis(settings: Settings, options: SaverOptions) -> ThreadkeepSaver:
    backend = open_redis_backend(settings, metrics=options.metrics, **options.backend)
    return ThreadkeepSaver(backend, FACTS["redis"], **saver_kwargs(settings, options))


def _redis_admin(settings: Settings) -> RedisBackend:
    return open_redis_backend(settings, gate=False)


REDIS_PROVIDER = Provider(build_redis, _redis_admin, _OPTIONS)


def _no_index() -> Program[list[tuple[str, str]] | None]:
    return None
    yield  # a program that asks nothing
