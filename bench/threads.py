"""Issue 38's listing benchmark (SPEC SV1, SV3): a page of 50 threads from stores of 1,000,
10,000 and 100,000 threads, on sqlite, postgres and redis.

    ./dev bench threads --runs 15 --json bench/results/threads.json

Each store is seeded directly (SQL ``INSERT ... SELECT`` on Postgres, ``executemany`` on
SQLite, a pipeline on Redis): a thread through the saver's own ``put`` would take hours at
100,000. Every thread gets a row (or hash) and, on the SQL stores, one root checkpoint with
its metadata; 100 owners; one in three is marked finished, one in a hundred is waiting on an
interrupt, one in a thousand is parked. On Redis the thread's hash and its two index
entries are seeded (no checkpoints: the listing reads the newest one's record, absent here).

Timed, each as the median of ``--runs`` calls of ``saver.threads`` after two unmeasured
ones: the operator's first page; a deep page (from a cursor half-way down the index); a
status filter (``finished``); a user's first page. Target (issue 38): under 20 ms a page
and flat in the number of threads.
"""

from __future__ import annotations

import contextlib
import sqlite3
import statistics
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psycopg
import redis

from bench.servers import POSTGRES, REDIS
from threadkeep import Settings, open_checkpointer, operator_scope, user_scope
from threadkeep.backends.redis.keys import KeySpace
from threadkeep.saver import ThreadkeepSaver
from threadkeep.threads import Cursor, ThreadQuery

SIZES = (1_000, 10_000, 100_000)
PAGE = 50
OWNERS = 100
T0 = time.time() - 3_600.0
CHECKPOINT = '{"v": 4, "id": "cp1", "ts": "", "channel_versions": {}, "versions_seen": {}}'
METADATA = '{"source": "loop", "step": 1, "topic": "t%s"}'

# Thread n: written at T0 + n/1000 s (so newer with n), owner n % 100, finished if n % 3 == 0,
# interrupted if n % 100 == 1, parked if n % 1000 == 7.
_PG_SEED = (
    """INSERT INTO tk_threads (thread_id, owner, active_at, finished_due, interrupt_at)
    SELECT 'thread-' || lpad(n::text, 7, '0'), 'user-' || (n %% 100), %(t0)s + n / 1000.0,
           CASE WHEN n %% 3 = 0 THEN %(t0)s + 86400 END, CASE WHEN n %% 100 = 1 THEN 'cp1' END
    FROM generate_series(1, %(threads)s) AS n""",
    """INSERT INTO tk_checkpoints (tid, checkpoint_ns, checkpoint_id, parent_id, run_id, created_at,
                                checkpoint, metadata)
    SELECT t.tid, '', 'cp1', NULL, 'run-' || t.tid, t.active_at, %(checkpoint)s::json,
           format(%(metadata)s, t.tid)::json
    FROM tk_threads AS t""",
    """INSERT INTO tk_writes (tid, checkpoint_ns, checkpoint_id, task_id, idx, task_path, channel, type, value)
    SELECT t.tid, '', 'cp1', 'task', -3, '', '__interrupt__', 'json', '\\x7b7d'
    FROM tk_threads AS t WHERE t.interrupt_at IS NOT NULL""",
    """INSERT INTO tk_parks (tid, park_id, deadline)
    SELECT t.tid, 'p', %(t0)s + 86400 FROM tk_threads AS t WHERE t.tid %% 1000 = 7""",
)
_TABLES = ("tk_threads", "tk_checkpoints", "tk_writes", "tk_parks")


def _name(n: int) -> str:
    return f"thread-{n:07d}"


@contextlib.contextmanager
def postgres_store(threads: int) -> Iterator[ThreadkeepSaver]:
    schema = f"bench_threads_{uuid.uuid4().hex[:12]}"
    dsn = f"{POSTGRES} options='-c search_path={schema}'"
    with psycopg.connect(POSTGRES, autocommit=True) as admin:
        admin.execute(f"CREATE SCHEMA {schema}")  # type: ignore[arg-type]
    try:
        open_checkpointer("postgres", dsn, settings=Settings()).close()  # the schema
        with psycopg.connect(dsn, autocommit=True) as conn:
            params = {"t0": T0, "threads": threads, "checkpoint": CHECKPOINT, "metadata": METADATA % "%s"}
            for statement in _PG_SEED:
                conn.execute(statement, params)  # type: ignore[arg-type]
            for table in _TABLES:
                conn.execute(f"VACUUM ANALYZE {table}")  # type: ignore[arg-type]
        saver = open_checkpointer("postgres", dsn, settings=Settings())
        try:
            yield saver
        finally:
            saver.close()
    finally:
        with psycopg.connect(POSTGRES, autocommit=True) as admin:
            admin.execute(f"DROP SCHEMA {schema} CASCADE")  # type: ignore[arg-type]


@contextlib.contextmanager
def sqlite_store(threads: int) -> Iterator[ThreadkeepSaver]:
    with tempfile.TemporaryDirectory() as folder:
        path = str(Path(folder) / "bench.sqlite")
        open_checkpointer("sqlite", path, settings=Settings()).close()  # the schema
        with sqlite3.connect(path) as conn:
            conn.executemany(
                "INSERT INTO tk_threads (tid, thread_id, owner, active_at, finished_due, interrupt_at) "
                "VALUES (?, ?, ?, ?, ?, ?)",
                (
                    (
                        n,
                        _name(n),
                        f"user-{n % OWNERS}",
                        T0 + n / 1000,
                        T0 + 86_400 if n % 3 == 0 else None,
                        "cp1" if n % 100 == 1 else None,
                    )
                    for n in range(1, threads + 1)
                ),
            )
            conn.executemany(
                "INSERT INTO tk_checkpoints (tid, checkpoint_ns, checkpoint_id, parent_id, run_id, "
                "created_at, checkpoint, metadata) VALUES (?, '', 'cp1', NULL, ?, ?, ?, ?)",
                ((n, f"run-{n}", T0 + n / 1000, CHECKPOINT, METADATA % n) for n in range(1, threads + 1)),
            )
            conn.executemany(
                "INSERT INTO tk_writes (tid, checkpoint_ns, checkpoint_id, task_id, idx, task_path, channel, "
                "type, value) VALUES (?, '', 'cp1', 'task', -3, '', '__interrupt__', 'json', x'7b7d')",
                ((n,) for n in range(1, threads + 1) if n % 100 == 1),
            )
            conn.executemany(
                "INSERT INTO tk_parks (tid, park_id, deadline) VALUES (?, 'p', ?)",
                ((n, T0 + 86_400) for n in range(1, threads + 1) if n % 1000 == 7),
            )
            conn.execute("ANALYZE")
        saver = open_checkpointer("sqlite", path, settings=Settings())
        try:
            yield saver
        finally:
            saver.close()


@contextlib.contextmanager
def redis_store(threads: int) -> Iterator[ThreadkeepSaver]:
    prefix = f"bench-threads-{uuid.uuid4().hex[:12]}"
    space = KeySpace(prefix)
    client = redis.Redis.from_url(REDIS)
    open_checkpointer("redis", REDIS, settings=Settings(), key_prefix=prefix).close()  # its format key
    try:
        pipe = client.pipeline(transaction=False)
        for n in range(1, threads + 1):
            thread_id, owner, written = _name(n), f"user-{n % OWNERS}", T0 + n / 1000
            fields: dict[str, Any] = {"id": thread_id, "owner": owner, "created": written}
            if n % 3 == 0:
                fields["finished_due"] = T0 + 86_400
            if n % 1000 == 7:
                fields["park\0p"] = T0 + 86_400
            key = space.thread(thread_id)[0]
            pipe.hset(key, mapping=fields)
            pipe.pexpire(key, 7 * 86_400_000)
            pipe.zadd(space.listing_key, {thread_id: written})
            pipe.zadd(space.owner_listing_key(owner), {thread_id: written})
            if n % 5000 == 0:
                pipe.execute()
        pipe.execute()
        saver = open_checkpointer("redis", REDIS, settings=Settings(), key_prefix=prefix)
        try:
            yield saver
        finally:
            saver.close()
    finally:
        for key in client.scan_iter(match=f"{prefix}:*", count=5000):
            client.unlink(key)
        client.close()


STORES: dict[str, Callable[[int], contextlib.AbstractContextManager[ThreadkeepSaver]]] = {
    "sqlite": sqlite_store,
    "postgres": postgres_store,
    "redis": redis_store,
}


def _median_ms(call: Callable[[], Any], runs: int) -> float:
    for _ in range(2):
        call()
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        call()
        times.append((time.perf_counter() - start) * 1000)
    return statistics.median(times)


def measure_store(saver: ThreadkeepSaver, threads: int, runs: int) -> dict[str, float]:
    middle = threads // 2
    deep = Cursor(T0 + middle / 1000, _name(middle))
    figures: dict[str, float] = {}
    with operator_scope():
        first = saver.threads(ThreadQuery(limit=PAGE))
        assert len(first.threads) == PAGE, len(first.threads)
        figures["first_page_ms"] = _median_ms(lambda: saver.threads(ThreadQuery(limit=PAGE)), runs)
        figures["deep_page_ms"] = _median_ms(lambda: saver.threads(ThreadQuery(limit=PAGE, cursor=deep)), runs)
        figures["finished_ms"] = _median_ms(
            lambda: saver.threads(ThreadQuery(limit=PAGE, status="finished")), runs
        )
    with user_scope("user-42"):
        figures["user_page_ms"] = _median_ms(lambda: saver.threads(ThreadQuery(limit=PAGE)), runs)
    return figures


def main(runs: int = 15, sizes: tuple[int, ...] = SIZES, stores: tuple[str, ...] = tuple(STORES)) -> dict[str, Any]:
    results: dict[str, Any] = {"page": PAGE, "sizes": list(sizes), "stores": {}}
    for store in stores:
        results["stores"][store] = {}
        for threads in sizes:
            with STORES[store](threads) as saver:
                figures = measure_store(saver, threads, runs)
            results["stores"][store][str(threads)] = figures
            print(
                f"{store:9} {threads:>7} threads: "
                + "  ".join(f"{name[:-3]} {value:6.2f} ms" for name, value in figures.items()),
                flush=True,
            )
    return results
