"""SPEC W4 against real servers: what the server refuses (a login, a database that does not
exist, a privilege, a statement, a command) is not a dropped connection. It is raised at its
first try, with no retry and no backoff wait, as a ``StorageRefusedError`` whose code and
message name what was refused and what to do."""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from tests.providers import POSTGRES_URL, postgres_schema
from tests.servers import RedisServer
from threadkeep import Settings, StorageRefusedError, open_checkpointer
from threadkeep.workload import build_agent, turn_input

pytestmark = pytest.mark.slow

# A retry would wait this long first, and log that it does: the tests count the tries.
SLOW_RETRIES = Settings(retry_backoff_seconds=30, connect_timeout_seconds=5, pool_timeout_seconds=5)


def admin() -> Any:
    import psycopg

    return psycopg.connect(POSTGRES_URL, autocommit=True)


def refused_once(
    error: StorageRefusedError, code: str, caplog: pytest.LogCaptureFixture, *names: str
) -> None:
    """``error`` came at the first try, with ``code``, naming each of ``names``; no try
    was retried."""
    assert error.code == code, error
    assert error.context["attempts"] == 1, error
    assert "Not retried" in error.message
    for name in names:
        assert name in error.message, (name, error.message)
    assert [r.getMessage() for r in caplog.records if "retrying" in r.getMessage()] == []


def invoke(graph: Any, api: str, config: Any) -> Any:
    """A turn of ``graph``, sync or async."""
    if api == "sync":
        return graph.invoke(turn_input(0), config)
    return asyncio.run(graph.ainvoke(turn_input(0), config))


@pytest.fixture
def role() -> Iterator[str]:
    """A role of the test's own (created by the test, dropped after it)."""
    name = f"tk_role_{uuid.uuid4().hex[:12]}"
    yield name
    with admin() as conn:
        conn.execute(f"DROP OWNED BY {name}")
        conn.execute(f"DROP ROLE IF EXISTS {name}")


@pytest.mark.providers("postgres")
def test_w4_a_database_that_does_not_exist_is_refused_at_once(
    provider: Any, caplog: pytest.LogCaptureFixture
) -> None:
    import psycopg

    missing = f"tk_missing_{uuid.uuid4().hex[:12]}"
    params = psycopg.conninfo.conninfo_to_dict(POSTGRES_URL)
    params["dbname"] = missing
    caplog.set_level(logging.WARNING)
    with pytest.raises(StorageRefusedError) as refused:
        open_checkpointer("postgres", psycopg.conninfo.make_conninfo("", **params), settings=SLOW_RETRIES)
    refused_once(refused.value, "STORAGE_DATABASE_001", caplog, missing, "CREATE DATABASE")


@pytest.mark.providers("postgres")
def test_w4_a_login_the_server_refuses_is_refused_at_once(
    provider: Any, role: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A role that may not log in (the shared test server trusts every local login, so a
    wrong password cannot be refused there: this is the same class of error, 28000)."""
    with admin() as conn:
        conn.execute(f"CREATE ROLE {role} NOLOGIN PASSWORD 'secret'")
    dsn = f"{postgres_schema(uuid.uuid4().hex)} user={role} password=wrong"
    caplog.set_level(logging.WARNING)
    with pytest.raises(StorageRefusedError) as refused:
        open_checkpointer("postgres", dsn, settings=SLOW_RETRIES)
    refused_once(refused.value, "STORAGE_AUTH_001", caplog, "not permitted to log in", "password", "LOGIN")


@pytest.mark.providers("postgres")
@pytest.mark.parametrize("granted", ["nothing", "usage"])
def test_w4_a_role_without_privileges_on_the_schema_is_refused_at_once(
    provider: Any, role: str, granted: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A role that may not use the store's schema (it is not on its search_path then), or
    may use it but not read the store's tables."""
    dsn = postgres_schema(uuid.uuid4().hex)
    open_checkpointer("postgres", dsn, settings=SLOW_RETRIES).close()  # the store, made by its owner
    schema = dsn.rsplit("search_path=", 1)[1].rstrip("'")
    with admin() as conn:
        conn.execute(f"CREATE ROLE {role} LOGIN")
        if granted == "usage":
            conn.execute(f"GRANT USAGE ON SCHEMA {schema} TO {role}")
    caplog.set_level(logging.WARNING)
    with pytest.raises(StorageRefusedError) as refused:
        open_checkpointer("postgres", f"{dsn} user={role}", settings=SLOW_RETRIES)
    if granted == "usage":
        refused_once(refused.value, "STORAGE_PERMISSION_001", caplog, "permission denied", "Grant it USAGE")
    else:
        refused_once(refused.value, "STORAGE_DATABASE_001", caplog, "no schema", "search_path", "USAGE")


@pytest.mark.providers("postgres")
@pytest.mark.parametrize("api", ["sync", "async"])
def test_w4_a_write_the_role_may_not_make_is_refused_at_once(
    provider: Any, role: str, api: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A role that may do all on the store but add a thread: the store opens, and a new
    thread's first write is refused at its first try."""
    dsn = postgres_schema(uuid.uuid4().hex)
    open_checkpointer("postgres", dsn, settings=SLOW_RETRIES).close()
    schema = dsn.rsplit("search_path=", 1)[1].rstrip("'")
    with admin() as conn:
        conn.execute(f"CREATE ROLE {role} LOGIN")
        conn.execute(f"GRANT USAGE, CREATE ON SCHEMA {schema} TO {role}")
        conn.execute(f"GRANT ALL ON ALL TABLES IN SCHEMA {schema} TO {role}")
        conn.execute(f"REVOKE INSERT ON {schema}.tk_threads FROM {role}")
    caplog.set_level(logging.WARNING)
    with open_checkpointer("postgres", f"{dsn} user={role}", settings=SLOW_RETRIES) as saver:
        graph = build_agent(saver)
        config: Any = {"configurable": {"thread_id": "read-only"}}
        with pytest.raises(StorageRefusedError) as refused:
            invoke(graph, api, config)
    refused_once(refused.value, "STORAGE_PERMISSION_001", caplog, "permission denied", "42501", "INSERT")


@pytest.mark.providers("postgres")
@pytest.mark.parametrize("api", ["sync", "async"])
def test_w4_a_statement_the_server_refuses_is_refused_at_once(
    provider: Any, api: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A statement the server refuses with an error psycopg counts as operational
    (program_limit_exceeded, as an index row too large): not retried either."""
    import psycopg

    from tests.faults.test_postgres_faults import POISON

    dsn = postgres_schema(uuid.uuid4().hex)
    with open_checkpointer("postgres", dsn, settings=SLOW_RETRIES) as saver:
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(POISON)
        graph = build_agent(saver)
        config: Any = {"configurable": {"thread_id": "poison-1"}}
        caplog.set_level(logging.WARNING)
        with pytest.raises(StorageRefusedError) as refused:
            invoke(graph, api, config)
        refused_once(refused.value, "STORAGE_REFUSED_001", caplog, "poisoned thread id", "54000")
        assert saver.get_tuple(config) is None  # nothing of it stored


@pytest.fixture
def guarded_redis() -> Iterator[RedisServer]:
    """A redis-server of the test's own whose default user needs the password 'secret', and
    an ACL user 'narrow' (password 'narrow') that may run GET and PING only."""
    server = RedisServer().start()
    server.cli("ACL", "SETUSER", "narrow", "on", ">narrow", "~*", "+get", "+ping", "+hello", "+client")
    server.cli("CONFIG", "SET", "requirepass", "secret")
    yield server
    server.close()


@pytest.mark.providers("redis")
def test_w4_a_wrong_redis_password_is_refused_at_once(
    provider: Any, guarded_redis: RedisServer, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING)
    with pytest.raises(StorageRefusedError) as refused:
        open_checkpointer("redis", f"redis://:wrong@127.0.0.1:{guarded_redis.port}/0", settings=SLOW_RETRIES)
    refused_once(refused.value, "STORAGE_AUTH_001", caplog, "password", "requirepass")
    with pytest.raises(StorageRefusedError) as refused:  # none at all
        open_checkpointer("redis", guarded_redis.url, settings=SLOW_RETRIES)
    assert refused.value.code == "STORAGE_AUTH_001"
    assert refused.value.context["attempts"] == 1


@pytest.mark.providers("redis")
def test_w4_a_redis_user_without_the_commands_is_refused_at_once(
    provider: Any, guarded_redis: RedisServer, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING)
    with pytest.raises(StorageRefusedError) as refused:
        open_checkpointer(
            "redis", f"redis://narrow:narrow@127.0.0.1:{guarded_redis.port}/0", settings=SLOW_RETRIES
        )
    refused_once(refused.value, "STORAGE_PERMISSION_001", caplog, "no permissions", "ACL SETUSER")
