"""A reset deletes the store's own keys and tables, and nothing else (issue 36 item 5).

The SQLite and Postgres resets beside LangGraph's own savers are driven through the CLI in
``tests/test_cli.py``; here: a Redis store beside other applications' keys and a store whose
prefix starts with its own (or that its prefix, as a SCAN pattern, would match), and a tiered
store beside LangGraph's PostgresSaver tables and other keys on its cache's Redis.
"""

from __future__ import annotations

import uuid
from typing import Any

import pytest
import redis

from tests.providers import (
    CASES,
    REDIS_URL,
    postgres_probe,
    postgres_schema,
    redis_probe,
    require,
    track_redis_prefix,
)
from threadkeep import Settings, open_checkpointer
from threadkeep.workload import build_agent, run_turns

THREAD = {"configurable": {"thread_id": "kept"}}


@pytest.fixture
def client() -> Any:
    require(CASES["redis"], redis_probe())
    return redis.Redis.from_url(REDIS_URL)


@pytest.mark.redis
@pytest.mark.parametrize("glob", ["*", "?", "[a-z]", ""])
def test_redis_reset_deletes_its_own_keys_only(client: Any, glob: str) -> None:
    """Another application's keys under the same prefix, and a store whose prefix the reset's
    prefix would match as a SCAN pattern (``*``, ``?``, ``[a-z]``) or starts, stay."""
    base = track_redis_prefix(f"tktest{uuid.uuid4().hex[:12]}")
    ours, neighbour = f"{base}{glob}", f"{base}x"
    foreign = {f"{ours}:session:1", f"{ours}x", f"{neighbour}:cache"}
    for key in foreign:
        client.set(key, b"another application's")
    with open_checkpointer("redis", REDIS_URL, settings=Settings(), key_prefix=neighbour) as beside:
        run_turns(build_agent(beside), "kept", 1)
    others = set(client.keys(f"{base}*"))
    with open_checkpointer("redis", REDIS_URL, settings=Settings(), key_prefix=ours) as saver:
        run_turns(build_agent(saver), "reset", 1)
        saver.mark_finished(["reset"])
        space = saver.backend.space
        assert client.exists(*space.thread("reset"), space.format_key, space.finished_key) == 11
        saver.backend.reset()

    assert set(client.keys(f"{base}*")) == others
    assert client.exists(*space.thread("reset"), space.format_key, space.finished_key) == 0
    with open_checkpointer("redis", REDIS_URL, settings=Settings(), key_prefix=neighbour) as beside:
        assert beside.get_tuple(THREAD) is not None


@pytest.mark.postgres
@pytest.mark.redis
def test_tiered_reset_keeps_langgraph_tables_and_other_keys(client: Any) -> None:
    import psycopg
    from langgraph.checkpoint.postgres import PostgresSaver

    require(CASES["postgres"], postgres_probe())
    dsn = postgres_schema(uuid.uuid4().hex)
    cache = track_redis_prefix(f"tktestc{uuid.uuid4().hex[:12]}")
    client.set(f"{cache}:session:1", b"another application's")
    with PostgresSaver.from_conn_string(dsn) as theirs:
        theirs.setup()
        run_turns(build_agent(theirs), "theirs", 2)
    with psycopg.connect(dsn) as conn:
        before = conn.execute("SELECT count(*) FROM checkpoints").fetchone()

    settings = Settings().with_values(cache_url=REDIS_URL)
    with open_checkpointer("tiered", dsn, settings=settings, cache_prefix=cache) as saver:
        run_turns(build_agent(saver), "ours", 1)
        assert len(client.keys(f"{cache}:*")) > 1
        saver.backend.reset()

    assert client.keys(f"{cache}:*") == [f"{cache}:session:1".encode()]
    with psycopg.connect(dsn) as conn:
        assert conn.execute("SELECT count(*) FROM checkpoints").fetchone() == before == (18,)
        tables = conn.execute(
            "SELECT tablename FROM pg_tables WHERE schemaname = current_schema()"
        ).fetchall()
    assert {row[0] for row in tables} == {
        "checkpoint_migrations",
        "checkpoints",
        "checkpoint_blobs",
        "checkpoint_writes",
    }
    with PostgresSaver.from_conn_string(dsn) as theirs:
        assert theirs.get_tuple({"configurable": {"thread_id": "theirs"}}) is not None
