"""The providers the contract suite runs over, and how a test opens a fresh store on each.

A provider that needs a server registers itself here with a probe. Without the server the
provider's tests are skipped locally and fail under ``CI=true``: CI never skips silently.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from threadkeep import Settings, ThreadkeepError, ThreadkeepSaver, open_checkpointer

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


def postgres_probe() -> str | None:
    try:
        import psycopg

        with psycopg.connect(POSTGRES_URL, connect_timeout=3):
            return None
    except Exception as exc:
        return f"no Postgres at {POSTGRES_URL!r} ({exc})"


def postgres_schema(unique: str) -> str:
    """A fresh, empty schema for one test, and the DSN that uses it; dropped at session end."""
    return _dsn(SCHEMAS.create(f"tk_test_{unique[:16]}"))


def postgres_store(unique: str) -> str:
    """The DSN of a fresh store for one test of the provider fixture: a schema another test
    left, emptied (:meth:`SchemaPool.give_back`), or a new one."""
    return _dsn(SCHEMAS.lend(f"tk_test_{unique[:16]}"))


def drop_postgres_schemas() -> None:
    SCHEMAS.drop_all()


def _dsn(schema: str) -> str:
    return f"{POSTGRES_URL} options='-c search_path={schema}'"


# What a schema holds, as a digest, and the bytes its tables take: the objects in it (found
# through their dependency on it, by index: pg_class has no index on the namespace, and a
# scan of it costs what the catalog has grown to), its relations' columns, indexes,
# constraints, triggers, rules, policies and sequences, its functions, its privileges, and
# the recorded format and migrations. Names are the schema's own (its name taken out of the
# definitions that qualify with it).
_SHAPE = """
WITH member AS (
    SELECT classid, objid FROM pg_depend
    WHERE refclassid = 'pg_namespace'::regclass AND refobjid = %(namespace)s
), rel AS (
    SELECT oid, relname, relkind, relpersistence, reloptions, relacl, relowner, relrowsecurity, relreplident
    FROM pg_class WHERE oid IN (SELECT objid FROM member WHERE classid = 'pg_class'::regclass)
)
SELECT md5(replace(string_agg(line, E'\\n' ORDER BY line), %(schema)s || '.', '')),
       (SELECT sum(pg_total_relation_size(oid)) FROM rel WHERE relkind = 'r')
FROM (
    SELECT format('object %%s', pg_describe_object(classid, objid, 0)) AS line FROM member
    UNION ALL
    SELECT format('relation %%s %%s %%s %%s %%s %%s %%s %%s', relname, relkind, relpersistence, reloptions,
                  relacl, relowner, relrowsecurity, relreplident)
    FROM rel
    UNION ALL
    SELECT format('column %%s.%%s %%s %%s %%s %%s %%s', r.relname, a.attname,
                  format_type(a.atttypid, a.atttypmod), a.attnotnull, a.attidentity, a.attgenerated,
                  pg_get_expr(d.adbin, d.adrelid))
    FROM rel AS r JOIN pg_attribute AS a ON a.attrelid = r.oid
    LEFT JOIN pg_attrdef AS d ON d.adrelid = a.attrelid AND d.adnum = a.attnum
    WHERE a.attnum > 0 AND NOT a.attisdropped
    UNION ALL
    SELECT format('index %%s %%s %%s', pg_get_indexdef(i.indexrelid), i.indisvalid, i.indisready)
    FROM rel AS r JOIN pg_index AS i ON i.indrelid = r.oid
    UNION ALL
    SELECT format('constraint %%s %%s', c.conname, pg_get_constraintdef(c.oid))
    FROM rel AS r JOIN pg_constraint AS c ON c.conrelid = r.oid
    UNION ALL
    SELECT format('trigger %%s %%s', pg_get_triggerdef(t.oid), t.tgenabled)
    FROM rel AS r JOIN pg_trigger AS t ON t.tgrelid = r.oid
    UNION ALL
    SELECT format('rule %%s', pg_get_ruledef(w.oid)) FROM rel AS r JOIN pg_rewrite AS w ON w.ev_class = r.oid
    UNION ALL
    SELECT format('policy %%s %%s', r.relname, p.polname)
    FROM rel AS r JOIN pg_policy AS p ON p.polrelid = r.oid
    UNION ALL
    SELECT format('sequence %%s %%s %%s %%s %%s', r.relname, s.seqstart, s.seqincrement, s.seqmax, s.seqcycle)
    FROM rel AS r JOIN pg_sequence AS s ON s.seqrelid = r.oid
    UNION ALL
    SELECT format('function %%s(%%s) %%s %%s %%s %%s %%s', p.proname,
                  pg_get_function_identity_arguments(p.oid), pg_get_function_result(p.oid), p.provolatile,
                  p.proconfig, p.proacl, md5(p.prosrc))
    FROM member AS m JOIN pg_proc AS p ON p.oid = m.objid AND m.classid = 'pg_proc'::regclass
    UNION ALL
    SELECT format('schema %%s %%s', nspacl, nspowner) FROM pg_namespace WHERE oid = %(namespace)s
    UNION ALL
    SELECT format('meta %%s %%s', key, value) FROM tk_meta
    UNION ALL
    SELECT format('migration %%s', version) FROM tk_migrations
) AS shape
"""
# For the emptying's transaction: its names resolve in the schema; a lock that something
# still holds on it makes it give up instead of waiting; the shape's lookups go by index.
_EMPTYING = """
SELECT set_config('search_path', %(schema)s, true), set_config('lock_timeout', '2s', true),
       set_config('enable_hashjoin', 'off', true), set_config('enable_mergejoin', 'off', true)
"""
_NAMESPACE = "SELECT oid FROM pg_namespace WHERE nspname = %(schema)s"
_TABLES = """
SELECT relname FROM pg_class
WHERE relnamespace = %(namespace)s AND relkind = 'r' AND relname NOT IN ('tk_meta', 'tk_migrations')
"""
_IDENTITIES = """
SELECT c.relname, a.attname FROM pg_class AS c JOIN pg_attribute AS a ON a.attrelid = c.oid
WHERE c.relnamespace = %(namespace)s AND a.attidentity <> ''
"""
_RESTART = "SELECT setval(pg_get_serial_sequence(%(table)s, %(column)s), 1, false)"
# A schema whose tables (their dead rows, which nothing vacuums on a server without
# autovacuum, included) take more than this is not lent again.
_REUSE_BYTES = 2 * 1024 * 1024


class SchemaPool:
    """The Postgres schemas of this session's tests: created, lent to the provider fixture,
    emptied for another test, dropped when the session ends.

    Migrating a new schema is most of what opening a fresh store costs (about 100 ms on
    the 2-core test machine; the provider fixture opens about 1,000 a run). A schema the
    provider fixture lent to a test that passed is emptied and lent again, if it is
    exactly what a fresh store's migrations leave (the same relations, columns, indexes,
    constraints, triggers, privileges, ``tk_state``, format and migrations: a test may have
    changed any of it). Its rows are deleted, its identities restarted, and it is renamed:
    a connection the test left open finds none of its tables any more, rather than the
    next test's. A failed test's schema, and one that changed or is in use, is left as it
    is until the session ends.
    """

    def __init__(self) -> None:
        self.created: list[str] = []
        self.idle: list[str] = []
        self.lent: list[str] = []
        self._connection: Any = None
        self._fresh: tuple[str, list[str], list[tuple[str, str]]] | None = None

    def connection(self) -> Any:
        """The session's own connection (opened again if a test closed it)."""
        import psycopg

        if self._connection is None or self._connection.closed or self._connection.broken:
            self._connection = psycopg.connect(
                POSTGRES_URL, autocommit=True, application_name="threadkeep-tests"
            )
        return self._connection

    def create(self, schema: str) -> str:
        from psycopg import sql

        self.connection().execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(schema)))
        self.created.append(schema)
        return schema

    def lend(self, schema: str) -> str:
        """An emptied schema, or a new one named ``schema``."""
        lent = self.idle.pop() if self.idle else self.create(schema)
        self.lent.append(lent)
        return lent

    def give_back(self, reusable: bool) -> None:
        """Take back what was lent to the test that ended, for another test if ``reusable``
        (it passed) and each schema is as a fresh store's migrations leave it."""
        lent, self.lent = self.lent, []
        for schema in lent if reusable else ():
            emptied = self._emptied(schema)
            if emptied is not None:
                self.idle.append(emptied)

    def _emptied(self, schema: str) -> str | None:
        import psycopg
        from psycopg import sql

        renamed = f"tk_test_{uuid.uuid4().hex[:16]}"
        try:
            shape, tables, identities = self._fresh_shape()
            conn = self.connection()
            with conn.transaction():
                conn.execute(_EMPTYING, {"schema": schema})
                found = conn.execute(_NAMESPACE, {"schema": schema}).fetchone()
                if found is None:  # the test dropped it
                    return None
                got, size = conn.execute(_SHAPE, {"namespace": found[0], "schema": schema}).fetchone()
                if got != shape or size > _REUSE_BYTES:
                    return None
                for table in tables:
                    conn.execute(sql.SQL("DELETE FROM {}").format(sql.Identifier(table)))
                for table, column in identities:
                    conn.execute(_RESTART, {"table": table, "column": column})
                rename = sql.SQL("ALTER SCHEMA {} RENAME TO {}")
                conn.execute(rename.format(sql.Identifier(schema), sql.Identifier(renamed)))
        except (psycopg.Error, ThreadkeepError):  # the server failed: the schema is left as it is
            return None
        self.created[self.created.index(schema)] = renamed
        return renamed

    def _fresh_shape(self) -> tuple[str, list[str], list[tuple[str, str]]]:
        """What a fresh store's migrations leave: its shape, its tables but the format's
        and the migrations', and its identity columns (read from a new schema that a saver
        opened, then lent as any other)."""
        if self._fresh is None:
            schema = self.create(f"tk_test_{uuid.uuid4().hex[:16]}")
            open_checkpointer("postgres", _dsn(schema), settings=Settings()).close()
            conn = self.connection()
            with conn.transaction():
                conn.execute(_EMPTYING, {"schema": schema})
                ((namespace,),) = conn.execute(_NAMESPACE, {"schema": schema}).fetchall()
                names = {"namespace": namespace, "schema": schema}
                shape = conn.execute(_SHAPE, names).fetchone()[0]
                tables = sorted(row[0] for row in conn.execute(_TABLES, names))
                identities = sorted((row[0], row[1]) for row in conn.execute(_IDENTITIES, names))
            self._fresh = (shape, tables, identities)
            self.idle.append(schema)
        return self._fresh

    def drop_all(self) -> None:
        from psycopg import sql

        if self.created:
            conn = self.connection()
            for schema in self.created:
                conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(schema)))
        self.created, self.idle, self.lent = [], [], []
        if self._connection is not None:
            self._connection.close()
            self._connection = None


SCHEMAS = SchemaPool()


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
    dsn = postgres_store(unique)
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

    # One pass over the keyspace for every prefix (a pass per prefix cost ~1,000 passes a run),
    # the keys deleted a thousand at a time.
    client = redis.Redis.from_url(REDIS_URL)
    prefixes = tuple(prefix.encode() for prefix in _PREFIXES)
    doomed = [key for key in client.scan_iter(count=1000) if key.startswith(prefixes)]
    for start in range(0, len(doomed), 1000):
        client.delete(*doomed[start : start + 1000])
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
    dsn = postgres_store(unique)
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
