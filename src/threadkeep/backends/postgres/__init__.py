"""The Postgres provider: the shared SQL programs on psycopg 3 pools, sync and async.

Importing it imports psycopg (``pip install 'threadkeep[postgres]'``): the provider table
imports it when the postgres (or tiered) provider is first chosen.
"""

from __future__ import annotations

from typing import Any

import psycopg
from psycopg.conninfo import conninfo_to_dict

from threadkeep.backends.postgres import queries
from threadkeep.backends.postgres.engine import (
    PlannedOnce,
    PoolOptions,
    PostgresEngine,
    is_connection_error,
    refusal,
)
from threadkeep.backends.sql.backend import SqlBackend, load_migrations
from threadkeep.core.retry import RetryPolicy
from threadkeep.errors import ConfigurationError
from threadkeep.metrics import METRICS, Metrics
from threadkeep.providers import FACTS, Provider, SaverOptions, saver_kwargs
from threadkeep.saver import ThreadkeepSaver
from threadkeep.settings import Settings

__all__ = ["POSTGRES_PROVIDER", "build_postgres", "open_postgres_backend"]

_MIGRATIONS = load_migrations(__name__)
_OPTIONS = frozenset({"pool", "async_pool", "prepare_threshold", "min_size", "max_size"})


def _engine(settings: Settings, metrics: Metrics, **options: Any) -> PostgresEngine:
    pool, async_pool = options.get("pool"), options.get("async_pool")
    conninfo = settings.postgres_dsn()
    if not conninfo and pool is not None:
        conninfo = pool.conninfo
    elif not conninfo and async_pool is not None:
        conninfo = async_pool.conninfo
    if not conninfo:
        # libpq would fill every parameter in from its defaults (the user's name as the
        # database, a local socket): a misspelled variable must not create tables there.
        raise ConfigurationError(
            f"the {settings.provider} provider needs a Postgres database: set "
            "LLM_PROVIDER_CHECKPOINT_CONN_STRING (or DATABASE_URL) to a postgresql:// URL or a "
            "libpq connection string, or pass pool=. To take every parameter from libpq's PG* "
            "variables, set it to postgresql://",
            context={"variable": "LLM_PROVIDER_CHECKPOINT_CONN_STRING", "provider": settings.provider},
        )
    try:
        conninfo_to_dict(conninfo)
    except psycopg.ProgrammingError as exc:  # not a URL or a libpq string: no use retrying
        raise ConfigurationError(
            f"the {settings.provider} provider's connection string cannot be read ({exc}): fix "
            "LLM_PROVIDER_CHECKPOINT_CONN_STRING (or DATABASE_URL, or the pool's conninfo); it "
            "takes a postgresql:// URL or a libpq string of key=value pairs",
            context={"variable": "LLM_PROVIDER_CHECKPOINT_CONN_STRING", "provider": settings.provider},
        ) from exc
    return PostgresEngine(
        conninfo,
        retry=RetryPolicy(
            attempts=settings.retry_attempts,
            backoff=settings.retry_backoff_seconds,
            retryable=is_connection_error,
            store="postgres",
            refused=refusal,
            deadline=settings.step_deadline_seconds,
            on_retry=metrics.meters(settings.provider).retried,
        ),
        options=PoolOptions(
            min_size=options.get("min_size", settings.pool_min_size),
            max_size=options.get("max_size", settings.pool_max_size),
            timeout=settings.pool_timeout_seconds,
            connect_timeout=settings.connect_timeout_seconds,
            command_timeout=settings.command_timeout_seconds,
            prepare_threshold=options.get("prepare_threshold", settings.prepare_threshold),
        ),
        pool=pool,
        async_pool=async_pool,
        planned_once=PlannedOnce(queries.PLANNED_ONCE, queries.PLANNED_ONCE_SETTINGS),
    )


def open_postgres_backend(
    settings: Settings, *, gate: bool = True, metrics: Metrics | None = None, **options: Any
) -> SqlBackend:
    """Open the Postgres store the settings name; with ``gate``, check and migrate it.
    ``metrics``: where its retries are counted (default: :data:`threadkeep.metrics.METRICS`)."""
    engine = _engine(settings, metrics or METRICS, **options)
    backend = SqlBackend(engine, queries, _MIGRATIONS)
    if gate:
        try:
            backend.open()
        except BaseException:
            engine.close()
            raise
    return backend


def build_postgres(settings: Settings, options: SaverOptions) -> ThreadkeepSaver:
    backend = open_postgres_backend(settings, metrics=options.metrics, **options.backend)
    return ThreadkeepSaver(backend, FACTS["postgres"], **saver_kwargs(settings, options))


async def abuild_postgres(settings: Settings, options: SaverOptions) -> ThreadkeepSaver:
    """:func:`build_postgres` from inside an event loop: the format gate runs on the loop's
    pool, whose connection the first read then uses."""
    backend = open_postgres_backend(settings, gate=False, metrics=options.metrics, **options.backend)
    try:
        await backend.aopen()
    except BaseException:
        await backend.engine.aclose()
        raise
    return ThreadkeepSaver(backend, FACTS["postgres"], **saver_kwargs(settings, options))


def _postgres_admin(settings: Settings) -> SqlBackend:
    return open_postgres_backend(settings, gate=False)


POSTGRES_PROVIDER = Provider(build_postgres, _postgres_admin, _OPTIONS, abuild_postgres)
