"""The providers the contract suite runs over, and how a test opens a fresh store on each.

A provider that needs a server registers itself here with a probe. Without the server the
provider's tests are skipped locally and fail under ``CI=true``: CI never skips silently.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from threadkeep import Settings, ThreadkeepSaver, open_checkpointer

Opener = Callable[..., ThreadkeepSaver]


@dataclass(frozen=True)
class ProviderCase:
    """How to open a fresh, empty store of one provider for one test."""

    name: str
    open: Callable[[Path, str], Opener]  # (tmp_path, unique id) -> opener(**options)
    probe: Callable[[], str | None] = lambda: None  # why the provider cannot run, or None


def _sqlite(tmp_path: Path, unique: str) -> Opener:
    path = tmp_path / f"{unique}.sqlite"
    return lambda settings=None, **options: open_checkpointer(
        "sqlite", str(path), settings=settings or Settings(), **options
    )


def _memory(tmp_path: Path, unique: str) -> Opener:
    return lambda settings=None, **options: open_checkpointer(
        "memory", settings=settings or Settings(), **options
    )


POSTGRES_URL = os.environ.get("THREADKEEP_TEST_POSTGRES_URL", "host=127.0.0.1 user=postgres dbname=test")
_SCHEMAS: list[str] = []


def postgres_probe() -> str | None:
    try:
        import psycopg

        with psycopg.connect(POSTGRES_URL, connect_timeout=3):
            return None
    except Exception as exc:
        return f"no Postgres at {POSTGRES_URL!r} ({exc})"


def postgres_schema(unique: str) -> str:
    """A fresh schema for one test, and the DSN that uses it; dropped at session end."""
    import psycopg

    schema = f"tk_test_{unique[:16]}"
    with psycopg.connect(POSTGRES_URL, autocommit=True) as conn:
        conn.execute(f"CREATE SCHEMA {schema}")
    _SCHEMAS.append(schema)
    return f"{POSTGRES_URL} options='-c search_path={schema}'"


def drop_postgres_schemas() -> None:
    if not _SCHEMAS:
        return
    import psycopg

    with psycopg.connect(POSTGRES_URL, autocommit=True) as conn:
        for schema in _SCHEMAS:
            conn.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")
    _SCHEMAS.clear()


def stored_checkpoint_ids(dsn: str, thread_id: str) -> list[str]:
    """The checkpoint ids Postgres holds for ``thread_id`` (what was acknowledged), in order."""
    import psycopg

    with psycopg.connect(dsn, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT c.checkpoint_id FROM tk_checkpoints c JOIN tk_threads t ON t.tid = c.tid "
            "WHERE t.thread_id = %s ORDER BY c.checkpoint_id",
            (thread_id,),
        ).fetchall()
    return [row[0] for row in rows]


def _postgres(tmp_path: Path, unique: str) -> Opener:
    dsn = postgres_schema(unique)
    return lambda settings=None, **options: open_checkpointer(
        "postgres", dsn, settings=settings or Settings(), **options
    )


REDIS_URL = os.environ.get("THREADKEEP_TEST_REDIS_URL", "redis://127.0.0.1:6379/0")
_PREFIXES: list[str] = []


def redis_probe() -> str | None:
    try:
        import redis

        redis.Redis.from_url(REDIS_URL, socket_connect_timeout=3).ping()
        return None
    except Exception as exc:
        return f"no Redis at {REDIS_URL!r} ({exc})"


def track_redis_prefix(prefix: str) -> str:
    """``prefix``, whose keys on the test Redis (and those of any prefix it starts, such as
    a store a test opens beside it) are deleted when the session ends."""
    _PREFIXES.append(prefix)
    return prefix


def drop_redis_prefixes() -> None:
    if not _PREFIXES:
        return
    import redis

    client = redis.Redis.from_url(REDIS_URL)
    for prefix in _PREFIXES:
        for key in client.scan_iter(match=f"{prefix}*", count=1000):
            client.delete(key)
    _PREFIXES.clear()


def _redis(tmp_path: Path, unique: str) -> Opener:
    prefix = track_redis_prefix(f"tktest{unique[:12]}")

    def open_(settings: Settings | None = None, **options: Any) -> ThreadkeepSaver:
        options.setdefault("key_prefix", prefix)
        return open_checkpointer("redis", REDIS_URL, settings=settings or Settings(), **options)

    return open_


def cluster_probe() -> str | None:
    try:
        from tests.servers import redis_cluster

        redis_cluster()
        return None
    except Exception as exc:
        return f"cannot start a local Redis Cluster ({exc})"


def _redis_cluster(tmp_path: Path, unique: str) -> Opener:
    from tests.servers import redis_cluster

    prefix = f"tktest{unique[:12]}"
    url = redis_cluster().url

    def open_(settings: Settings | None = None, **options: Any) -> ThreadkeepSaver:
        options.setdefault("key_prefix", prefix)
        return open_checkpointer("redis", url, settings=settings or Settings(), **options)

    return open_


def tiered_probe() -> str | None:
    return postgres_probe() or redis_probe()


# The contract suite reads whole histories (time travel, the conformance suite's list
# clauses); tiered keeps 20 checkpoints unless told otherwise, which its own tests check.
TIERED_KEEPS_ALL = 1_000_000


def _tiered(tmp_path: Path, unique: str) -> Opener:
    dsn = postgres_schema(unique)
    prefix = track_redis_prefix(f"tktestc{unique[:12]}")

    def open_(settings: Settings | None = None, **options: Any) -> ThreadkeepSaver:
        options.setdefault("cache_prefix", prefix)
        options.setdefault("state_history_limit", TIERED_KEEPS_ALL)
        base = (settings or Settings()).with_values(cache_url=REDIS_URL)
        return open_checkpointer("tiered", dsn, settings=base, **options)

    return open_


CASES: dict[str, ProviderCase] = {
    "memory": ProviderCase("memory", _memory),
    "sqlite": ProviderCase("sqlite", _sqlite),
    "postgres": ProviderCase("postgres", _postgres, postgres_probe),
    "redis": ProviderCase("redis", _redis, redis_probe),
    "redis-cluster": ProviderCase("redis-cluster", _redis_cluster, cluster_probe),
    "tiered": ProviderCase("tiered", _tiered, tiered_probe),
}

# Providers whose store several saver instances (and processes) share.
SHARED_STORE = frozenset({"sqlite", "postgres", "redis", "redis-cluster", "tiered"})


def require(case: ProviderCase, reason: str | None) -> None:
    """Skip (locally) or fail (under CI=true) when the provider's server is missing."""
    if reason is None:
        return
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(f"{case.name}: {reason} (CI=true: a missing server is a failure)")
    pytest.skip(f"{case.name}: {reason}")


def provider_params(names: list[str] | None = None) -> list[Any]:
    return [pytest.param(CASES[name], id=name) for name in (names or list(CASES))]
