"""The tiered provider: Redis hot over Postgres cold (SPEC T1-T9).

Postgres, through the Postgres provider's backend, is the source of truth and keeps every
checkpoint's history (20 per thread and namespace unless ``state_history_limit`` says
otherwise). Redis, through the Redis provider's scripts and key layout, keeps the newest
state of each active thread for ``cache_ttl`` seconds, so a load is one Redis round trip.
See ``docs/tiered.md`` for the design, the failure matrix and the tuning knobs.
"""

from __future__ import annotations

import math
from typing import Any

from threadkeep.backends.postgres import open_postgres_backend
from threadkeep.backends.redis.engine import RedisEngine
from threadkeep.backends.redis.keys import KeySpace
from threadkeep.backends.tiered.backend import TieredBackend
from threadkeep.backends.tiered.cache import StateCache
from threadkeep.backends.tiered.engine import TieredEngine
from threadkeep.core.retry import RetryPolicy
from threadkeep.errors import ConfigurationError
from threadkeep.metrics import METRICS
from threadkeep.providers import FACTS, Provider, SaverOptions, saver_kwargs
from threadkeep.saver import ThreadkeepSaver
from threadkeep.settings import Settings

__all__ = ["DEFAULT_HISTORY_LIMIT", "TIERED_PROVIDER", "build_tiered", "open_tiered_backend"]

DEFAULT_HISTORY_LIMIT = 20

_OPTIONS = frozenset(
    {
        "pool",
        "async_pool",
        "prepare_threshold",
        "min_size",
        "max_size",
        "cache_client",
        "cache_async_client",
        "cache_prefix",
        "cache_cluster",
        "cache_ttl",
        "cache_lease",
        "cache_timeout",
    }
)
_POSTGRES_OPTIONS = frozenset({"pool", "async_pool", "prepare_threshold", "min_size", "max_size"})


def open_tiered_backend(
    settings: Settings, options: SaverOptions, *, isolate: bool, gate: bool = True
) -> TieredBackend:
    """The Postgres store the settings name (with ``gate``: checked and migrated) behind a
    cache on their Redis. Redis may be down: the backend then uses Postgres alone until it
    is back."""
    extra: dict[str, Any] = dict(options.backend)
    url = settings.redis_url_for("tiered")
    client = extra.get("cache_client")
    if url is None and client is None:
        raise ConfigurationError(
            "the tiered provider needs a Redis for its cache: set LLM_PROVIDER_CHECKPOINT_CACHE_URL "
            "(or REDIS_URL), or pass cache_client=",
            context={"variable": "LLM_PROVIDER_CHECKPOINT_CACHE_URL"},
        )
    ttl = extra.get("cache_ttl", settings.cache_ttl_seconds)
    if isinstance(ttl, bool) or not isinstance(ttl, int | float) or ttl <= 0:
        raise ConfigurationError(
            f"cache_ttl={ttl!r} must be a positive number of seconds", context={"option": "cache_ttl"}
        )
    lease = extra.get("cache_lease", settings.cache_lease_seconds)
    if isinstance(lease, bool) or not isinstance(lease, int | float) or not 0 < lease < math.inf:
        raise ConfigurationError(
            f"cache_lease={lease!r} must be a positive number of seconds", context={"option": "cache_lease"}
        )
    timeout = float(extra.get("cache_timeout", 1.0))
    cache_engine = RedisEngine(
        url or "redis://localhost:6379/0",
        # Never retried: a cache that does not answer at once is skipped, not waited for.
        retry=RetryPolicy(attempts=1, backoff=0.0, retryable=lambda _: False, store="redis cache"),
        cluster=extra.get("cache_cluster"),
        client=client,
        async_client=extra.get("cache_async_client"),
        connect_timeout=min(timeout, settings.connect_timeout_seconds),
        socket_timeout=timeout,
    )
    metrics = options.metrics or METRICS
    durable = open_postgres_backend(
        settings, gate=gate, metrics=metrics, **{k: v for k, v in extra.items() if k in _POSTGRES_OPTIONS}
    )
    return TieredBackend(
        durable,
        StateCache(KeySpace(extra.get("cache_prefix", "tkc")), int(ttl * 1000), int(lease * 1000)),
        TieredEngine(durable.engine, cache_engine, metrics),
        isolate=isolate,
        metrics=metrics,
        clock=options.clock,
    )


def build_tiered(settings: Settings, options: SaverOptions) -> ThreadkeepSaver:
    """Build a tiered saver (SPEC P2: the Postgres DSN in the connection string, the Redis
    URL in ``LLM_PROVIDER_CHECKPOINT_CACHE_URL``)."""
    kwargs = saver_kwargs(settings, options)
    if options.state_history_limit is None and settings.state_history_limit is None:
        kwargs["state_history_limit"] = DEFAULT_HISTORY_LIMIT
    backend = open_tiered_backend(settings, options, isolate=kwargs["enforce_user_isolation"])
    return ThreadkeepSaver(backend, FACTS["tiered"], **kwargs)


def _tiered_admin(settings: Settings) -> TieredBackend:
    # `threadkeep store reset` must empty the cache too, or it would serve deleted threads.
    return open_tiered_backend(settings, SaverOptions(), isolate=settings.enforce_user_isolation, gate=False)


TIERED_PROVIDER = Provider(build_tiered, _tiered_admin, _OPTIONS)
