"""What is specific to the Postgres store: migrations, pools, parallel writers, the gate."""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import contextlib
import functools
import logging
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from langchain_core.messages import HumanMessage

from tests.providers import POSTGRES_URL, Opener, postgres_schema
from threadkeep import CheckpointStoreFormatError, Settings, aopen_checkpointer, open_checkpointer
from threadkeep.backends.postgres import _MIGRATIONS
from threadkeep.backends.sql.programs import FORMAT_GENERATION
from threadkeep.workload import MESSAGES_PER_TURN, build_agent, run_turns, turn_input

pytestmark = pytest.mark.providers("postgres")


def connect(dsn: str) -> Any:
    import psycopg

    return psycopg.connect(dsn, autocommit=True)


def test_p6_every_older_schema_version_upgrades_to_the_newest(provider: Any) -> None:
    newest = len(_MIGRATIONS)
    for version in range(newest):
        dsn = postgres_schema(uuid.uuid4().hex)
        with connect(dsn) as conn:
            conn.execute(
                "CREATE TABLE tk_migrations "
                "(version INTEGER PRIMARY KEY, applied_at DOUBLE PRECISION NOT NULL)"
            )
            for migration in _MIGRATIONS[:version]:
                for statement in migration.statements:
                    conn.execute(statement)
                conn.execute("INSERT INTO tk_migrations VALUES (%s, 0)", (migration.version,))
            if version:
                conn.execute("INSERT INTO tk_meta VALUES ('format_generation', '1')")
        with open_checkpointer("postgres", dsn, settings=Settings()) as saver:
            run_turns(build_agent(saver), "upgraded", 1)
            assert saver.stats()["messages"] == MESSAGES_PER_TURN
        with connect(dsn) as conn:
            applied = [row[0] for row in conn.execute("SELECT version FROM tk_migrations ORDER BY version")]
        assert applied == list(range(1, newest + 1))


# How often each prepared state read ran on its generic plan and on plans made for its
# parameters, on the connection that asks.
_PREPARED_STATE_READS = (
    "SELECT generic_plans, custom_plans FROM pg_prepared_statements"
    " WHERE statement LIKE '%WITH RECURSIVE cp AS%'"
)


def test_the_state_read_probes_indexes_on_an_empty_store_and_after_it_grew(provider: Any) -> None:
    """Each connection keeps one plan of the state read, made at its first read, whatever
    pool it comes from: a plan made on small, unanalyzed tables must still probe by key once
    they hold a history (no sequential scan), and read the right state."""
    from psycopg_pool import ConnectionPool

    dsn = postgres_schema(uuid.uuid4().hex)
    notices: list[str] = []

    def explained(conn: Any) -> None:  # every plan the connection runs, as a notice
        conn.add_notice_handler(lambda diagnostic: notices.append(diagnostic.message_primary or ""))
        conn.execute("LOAD 'auto_explain'")
        conn.execute("SET auto_explain.log_min_duration = 0")
        conn.execute("SET client_min_messages = log")

    with open_checkpointer("postgres", dsn, settings=Settings()) as writer:
        assert writer.get_tuple({"configurable": {"thread_id": "first"}}) is None
        run_turns(build_agent(writer), "first", 3)
        # The application's pool: none of threadkeep's settings on its connections.
        pool = ConnectionPool(
            dsn, min_size=1, max_size=1, kwargs={"autocommit": True}, configure=explained, open=False
        )
        pool.open()
        try:
            with open_checkpointer("postgres", dsn, settings=Settings(), pool=pool) as reader:
                assert reader.get_tuple({"configurable": {"thread_id": "nobody"}}) is None  # planned now
                run_turns(build_agent(writer), "second", 2)
                notices.clear()
                state = reader.get_tuple({"configurable": {"thread_id": "second"}})
            with pool.connection() as conn:
                conn.execute("SET client_min_messages = notice")
                plan_runs = conn.execute(_PREPARED_STATE_READS).fetchall()
        finally:
            pool.close()
    assert state is not None
    assert len(state.checkpoint["channel_values"]["messages"]) == 2 * MESSAGES_PER_TURN
    assert plan_runs == [(2, 0)]  # one plan, made at the first read, for both
    plans = "\n".join(notices)
    assert "Index Scan using tk_message_links_pkey" in plans
    assert "Index Scan using tk_messages_pkey" in plans
    assert "Index Scan using tk_writes_pkey" in plans
    assert "Seq Scan" not in plans


def test_the_state_read_is_planned_once_where_statements_are_prepared(provider: Any) -> None:
    """A saver's connections prepare the state read and run it on its one generic plan;
    where statements are never prepared (PgBouncer in transaction mode), the function
    tk_state, which keeps its own plans, reads the same state instead."""
    dsn = postgres_schema(uuid.uuid4().hex)
    config: Any = {"configurable": {"thread_id": "t"}}
    one = Settings(pool_min_size=1, pool_max_size=1)
    with open_checkpointer("postgres", dsn, settings=one) as saver:
        run_turns(build_agent(saver), "t", 2)
        for _ in range(3):
            newest = saver.get_tuple(config)
        with saver.backend.engine._sync_pool().connection() as conn:
            ((generic, custom),) = conn.execute(_PREPARED_STATE_READS).fetchall()
    assert newest is not None
    assert generic >= 3
    assert custom == 0
    with open_checkpointer("postgres", dsn, settings=one, prepare_threshold=None) as saver:
        unprepared = saver.get_tuple(config)
        with saver.backend.engine._sync_pool().connection() as conn:
            assert conn.execute(_PREPARED_STATE_READS).fetchall() == []
            conn.execute("DROP FUNCTION tk_state")
        with pytest.raises(Exception, match="tk_state"):
            saver.get_tuple(config)
    assert unprepared is not None
    assert unprepared.checkpoint == newest.checkpoint
    with open_checkpointer("postgres", dsn, settings=one) as saver:  # prepares: needs no function
        assert saver.get_tuple(config) == newest


def test_the_state_statement_returns_what_tk_state_returns(provider: Any) -> None:
    """The two forms of the state read (the prepared statement, and the function that runs
    where statements are never prepared) return the same rows, for every thread, namespace,
    checkpoint, owner and walk: message lists with pages, a fork, a subgraph's namespace
    with an interrupted task's writes, a thread that does not exist."""
    from tests.graphs import subgraph_graph
    from threadkeep.backends.postgres.queries import PLANNED_ONCE, SELECT_STATE_AT, SELECT_STATE_LATEST

    dsn = postgres_schema(uuid.uuid4().hex)
    with open_checkpointer("postgres", dsn, settings=Settings()) as saver:
        graph = build_agent(saver)
        run_turns(graph, "agent", 5)  # 40 messages: a page closes at position 31
        config: Any = {"configurable": {"thread_id": "agent"}}
        middle = next(s for s in graph.get_state_history(config) if len(s.values["messages"]) == 20)
        graph.update_state(middle.config, {"messages": [HumanMessage("a fork", id="fork")]})
        subgraph_graph(saver).invoke({"topic": "t", "notes": []}, {"configurable": {"thread_id": "nested"}})
    with connect(dsn) as conn:
        found = conn.execute(
            "SELECT t.thread_id, c.checkpoint_ns, c.checkpoint_id"
            " FROM tk_threads AS t JOIN tk_checkpoints AS c USING (tid)"
        ).fetchall()
        owners = [row[0] for row in conn.execute("SELECT DISTINCT owner FROM tk_threads")]
        cases = {*found, *((thread, ns, None) for thread, ns, _ in found), ("nobody", "", None)}
        states = 0
        for thread_id, ns, checkpoint_id in cases:
            for owner in (None, *owners, "someone else"):
                for walk in (True, False):
                    params = {
                        "thread_id": thread_id,
                        "owner": owner,
                        "checkpoint_ns": ns,
                        "checkpoint_id": checkpoint_id,
                        "walk": walk,
                    }
                    statement = SELECT_STATE_LATEST if checkpoint_id is None else SELECT_STATE_AT
                    rows = conn.execute(statement, params, binary=True).fetchall()
                    by_function = conn.execute(PLANNED_ONCE[statement], params, binary=True).fetchall()
                    assert collections.Counter(rows) == collections.Counter(by_function), params
                    states += bool(rows)
    assert states > 100  # most cases read a state
    assert len({ns for _, ns, _ in found}) == 2  # the root's namespace and the subgraph's


def test_s1_long_lists_are_walked_by_pages_and_read_the_same_without_them(provider: Any) -> None:
    """Every 32nd link holds its page; a new process reads every list (the newest state, a
    fork made mid-page, each older checkpoint of a list) as it was written, and the same once
    the pages are gone (links written before migration 6 have none)."""
    dsn = postgres_schema(uuid.uuid4().hex)
    config: Any = {"configurable": {"thread_id": "long"}}
    with open_checkpointer("postgres", dsn, settings=Settings()) as writer:
        graph = build_agent(writer)
        run_turns(graph, "long", 9)  # 72 messages: pages close at positions 31 and 63
        history = list(graph.get_state_history(config))
        fork_from = next(state for state in history if len(state.values["messages"]) == 37)
        forked = graph.update_state(
            fork_from.config, {"messages": [HumanMessage("a fork, mid-page", id="f")]}
        )
        graph.invoke(None, forked)
        run_turns(graph, "long", 3, first=9)  # on the fork, past its own page at 63
        written = {
            state.config["configurable"]["checkpoint_id"]: state.values["messages"]
            for state in graph.get_state_history(config)
        }
    assert max(map(len, written.values())) == 9 * MESSAGES_PER_TURN

    with connect(dsn) as conn:
        pages = conn.execute(
            "SELECT octet_length(page), page_prev IS NULL FROM tk_message_links WHERE page IS NOT NULL"
        ).fetchall()
    assert sorted(pages) == [(512, False), (512, False), (512, True)]  # 31, then 63 on each branch

    def read_back() -> dict[str, Any]:
        with open_checkpointer("postgres", dsn, settings=Settings()) as reader:
            graph = build_agent(reader)
            newest = graph.get_state(config)  # walks in the state read
            states = {
                s.config["configurable"]["checkpoint_id"]: s.values["messages"]
                for s in graph.get_state_history(config)
            }
            assert states[newest.config["configurable"]["checkpoint_id"]] == newest.values["messages"]
            return states

    assert read_back() == written
    with connect(dsn) as conn:
        conn.execute("UPDATE tk_message_links SET page = NULL, page_prev = NULL")
    assert read_back() == written


def test_s1_a_list_missing_a_stored_message_fails_the_read_naming_what_is_missing(provider: Any) -> None:
    """A message row lost from under its list (a hand-made delete) fails a new reader's read
    of that state, saying how many of the list's messages are stored; nothing passes for the
    list with a message left out."""
    from threadkeep import CheckpointSerializationError

    dsn = postgres_schema(uuid.uuid4().hex)
    config: Any = {"configurable": {"thread_id": "t"}}
    with open_checkpointer("postgres", dsn, settings=Settings()) as writer:
        run_turns(build_agent(writer), "t", 2)
    with connect(dsn) as conn:
        conn.execute("DELETE FROM tk_messages WHERE digest = (SELECT digest FROM tk_messages LIMIT 1)")
    expected = f"incomplete: {2 * MESSAGES_PER_TURN - 1} of {2 * MESSAGES_PER_TURN} messages are stored"
    with (
        open_checkpointer("postgres", dsn, settings=Settings()) as reader,
        pytest.raises(CheckpointSerializationError, match=expected),
    ):
        reader.get_tuple(config)


@pytest.mark.parametrize("damage", ["page out of order", "link names another message"])
def test_s1_a_list_whose_links_do_not_lead_to_its_tail_is_refused(provider: Any, damage: str) -> None:
    """A page is read in place of the 32 links it closes, and a link names its message: one
    damaged (by hand, by a bug) so that it names the right messages in the wrong order, or
    another message of the thread, must not be read as the list. A new reader refuses the
    state and its history (each walk checks that the digests lead to the list's tail)."""
    from threadkeep import CheckpointSerializationError

    dsn = postgres_schema(uuid.uuid4().hex)
    config: Any = {"configurable": {"thread_id": "t"}}
    with open_checkpointer("postgres", dsn, settings=Settings()) as writer:
        run_turns(build_agent(writer), "t", 5)  # 40 messages: a page closes at position 31
    with connect(dsn) as conn:
        if damage == "page out of order":
            changed = conn.execute(
                "UPDATE tk_message_links"
                " SET page = substring(page from 17 for 16) || substring(page from 1 for 16)"
                " || substring(page from 33) WHERE page IS NOT NULL"
            ).rowcount
        else:  # the newest link, past the page: only the newest checkpoint's list has it
            changed = conn.execute(
                "UPDATE tk_message_links SET digest = (SELECT digest FROM tk_message_links"
                " WHERE prev IS NULL) WHERE node = (SELECT node FROM tk_message_links AS l"
                " WHERE NOT EXISTS (SELECT 1 FROM tk_message_links AS n WHERE n.prev = l.node))"
            ).rowcount
    assert changed == 1
    with open_checkpointer("postgres", dsn, settings=Settings()) as reader:
        with pytest.raises(CheckpointSerializationError, match="do not lead to the list's tail"):
            reader.get_tuple(config)
        with pytest.raises(CheckpointSerializationError, match="do not lead to the list's tail"):
            list(reader.list(config))
    with connect(dsn) as conn:  # the fourth checkpoint: a list of the first turn, before the damage
        ids = conn.execute("SELECT checkpoint_id FROM tk_checkpoints ORDER BY checkpoint_id").fetchall()
        (early_id,) = ids[3]
    with open_checkpointer("postgres", dsn, settings=Settings()) as reader:
        early = reader.get_tuple({"configurable": {"thread_id": "t", "checkpoint_id": early_id}})
        assert early is not None
        assert len(early.checkpoint["channel_values"]["messages"]) == 3


@pytest.mark.parametrize("prepare_threshold", [5, None], ids=["statement", "tk_state"])
@pytest.mark.parametrize("loop", ["link", "page"])
def test_s1_a_walk_caught_in_a_loop_of_links_stops_at_the_list_length(
    provider: Any, loop: str, prepare_threshold: int | None
) -> None:
    """A link (or a page) damaged to name a later node of its list makes a loop, which a
    walk would follow until the command timeout at every try. The state read stops at the
    list's length (its reference says it) and the reader refuses the state at once, by the
    prepared statement and by the function ``tk_state`` alike."""
    from threadkeep import CheckpointSerializationError

    dsn = postgres_schema(uuid.uuid4().hex)
    config: Any = {"configurable": {"thread_id": "t"}}
    with open_checkpointer("postgres", dsn, settings=Settings()) as writer:
        run_turns(build_agent(writer), "t", 9)  # 72 messages: pages close at 31 and 63
    newest = (
        "(SELECT node FROM tk_message_links AS l"
        " WHERE NOT EXISTS (SELECT 1 FROM tk_message_links AS n WHERE n.prev = l.node))"
    )
    with connect(dsn) as conn:
        if loop == "link":  # the link two before the newest names the newest as its prev
            sql = (
                f"UPDATE tk_message_links SET prev = {newest} WHERE node = (SELECT prev FROM"
                f" tk_message_links WHERE node = (SELECT prev FROM tk_message_links WHERE node = {newest}))"
            )
        else:  # the second page names the newest node as the one before its first message
            sql = (
                f"UPDATE tk_message_links SET page_prev = {newest} WHERE page IS NOT NULL"
                " AND page_prev IN (SELECT node FROM tk_message_links WHERE page IS NOT NULL)"
            )
        assert conn.execute(sql).rowcount == 1
    # Without the bound, each try would run until the command timeout and end in StorageError.
    settings = Settings(command_timeout_seconds=3, retry_attempts=1, prepare_threshold=prepare_threshold)
    with (
        open_checkpointer("postgres", dsn, settings=settings) as reader,
        pytest.raises(CheckpointSerializationError, match="inconsistent"),
    ):
        reader.get_tuple(config)


def test_asyncio_run_ends_while_the_pool_is_busy_with_its_own_work(provider: Any) -> None:
    """asyncio.run cancels the tasks left when its coroutine ends. A psycopg_pool worker in
    the middle of a maintenance task (a connection being added as the pool grows) takes that
    for a failed task and waits for the next: without the saver closing its pool first, the
    program never exits. A subprocess, so that a hang fails this test and nothing else."""
    script = f"""
import asyncio
from threadkeep import Settings, open_checkpointer
saver = open_checkpointer("postgres", {postgres_schema(uuid.uuid4().hex)!r}, settings=Settings())
class Slow:  # maintenance work still running when the loop ends
    async def run(self):
        await asyncio.sleep(30)
async def main():
    await saver.aget_tuple({{"configurable": {{"thread_id": "t"}}}})
    (pool,) = saver.backend.engine._async_pools.values()
    pool.run_task(Slow())
    await asyncio.sleep(0.1)
asyncio.run(main())
print("ended")
"""
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=30, check=False
    )
    assert done.stdout.strip() == "ended", done.stderr[-2000:]


def test_p6_migrations_are_serialized_by_an_advisory_lock(provider: Any) -> None:
    dsn = postgres_schema(uuid.uuid4().hex)
    errors: list[BaseException] = []

    def first_use() -> None:
        try:
            open_checkpointer("postgres", dsn, settings=Settings()).close()
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=first_use) for _ in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    with connect(dsn) as conn:
        assert conn.execute("SELECT count(*) FROM tk_migrations").fetchone()[0] == len(_MIGRATIONS)
        assert conn.execute("SELECT value FROM tk_meta").fetchall() == [(str(FORMAT_GENERATION),)]


def test_p6_a_new_store_is_upgraded_on_one_connection_one_transaction_per_migration(
    provider: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Opening a new store connects twice: for the format gate's read, then for the whole
    upgrade, whose migrations each commit on their own (one transaction id each)."""
    from threadkeep.backends.postgres.engine import PostgresEngine

    dsn = postgres_schema(uuid.uuid4().hex)
    connections: list[float | None] = []
    original = PostgresEngine.connect

    def counted(engine: PostgresEngine, timeout: float | None = None) -> Any:
        connections.append(timeout)
        return original(engine, timeout)

    monkeypatch.setattr(PostgresEngine, "connect", counted)
    open_checkpointer("postgres", dsn, settings=Settings()).close()
    assert len(connections) == 2
    with connect(dsn) as conn:
        transactions = conn.execute("SELECT count(DISTINCT xmin::text) FROM tk_migrations").fetchone()[0]
    assert transactions == len(_MIGRATIONS)


def test_p6_a_postgres_store_of_another_generation_is_refused(open_saver: Opener) -> None:
    saver = open_saver()
    run_turns(build_agent(saver), "t", 1)
    dsn = saver.backend.engine.conninfo
    with connect(dsn) as conn:
        conn.execute("UPDATE tk_meta SET value = '0'")
    with pytest.raises(CheckpointStoreFormatError, match="reset the checkpoint store"):
        open_checkpointer("postgres", dsn, settings=Settings())


def test_p6_a_postgres_store_migrated_by_a_newer_version_is_refused(open_saver: Opener) -> None:
    saver = open_saver()
    dsn = saver.backend.engine.conninfo
    with connect(dsn) as conn:
        conn.execute("INSERT INTO tk_migrations VALUES (%s, 0)", (len(_MIGRATIONS) + 1,))
    with pytest.raises(CheckpointStoreFormatError, match="at least as new as the one that migrated"):
        open_checkpointer("postgres", dsn, settings=Settings())


async def test_p6_an_open_from_the_loop_migrates_on_the_connection_its_first_read_uses(provider: Any) -> None:
    """``aopen_checkpointer`` runs the format gate and the migrations on the loop's pool: a
    store left at migration 5 is brought up to date, no sync pool and no other connection
    is opened, and the first read takes the pool's one connection."""
    dsn = postgres_schema(uuid.uuid4().hex)
    with connect(dsn) as conn:
        conn.execute(
            "CREATE TABLE tk_migrations (version INTEGER PRIMARY KEY, applied_at DOUBLE PRECISION NOT NULL)"
        )
        for migration in _MIGRATIONS[:5]:
            for statement in migration.statements:
                conn.execute(statement)
            conn.execute("INSERT INTO tk_migrations VALUES (%s, 0)", (migration.version,))
        conn.execute("INSERT INTO tk_meta VALUES ('format_generation', '1')")
    saver = await aopen_checkpointer("postgres", dsn, settings=Settings(pool_min_size=1))
    try:
        engine = saver.backend.engine
        (pool,) = engine._async_pools.values()
        config = {"configurable": {"thread_id": "t"}}
        assert (await saver.aget_tuple(config)) is None
        assert pool.get_stats()["connections_num"] == 1
        assert engine._pool is None
        await build_agent(saver).ainvoke(turn_input(0), config)
        assert (await saver.aget_tuple(config)) is not None
    finally:
        await saver.aclose()
    with connect(dsn) as conn:
        applied = [row[0] for row in conn.execute("SELECT version FROM tk_migrations ORDER BY version")]
    assert applied == list(range(1, len(_MIGRATIONS) + 1))


async def test_an_open_from_the_loop_counts_its_retries_where_it_is_told(provider: Any) -> None:
    """``aopen_checkpointer(metrics=...)`` counts the engine's retries into that registry, as
    the sync open does."""
    from threadkeep.metrics import Metrics

    mine = Metrics()
    dsn = postgres_schema(uuid.uuid4().hex)
    saver = await aopen_checkpointer("postgres", dsn, settings=Settings(), metrics=mine)
    try:
        assert saver.backend.engine.retry.on_retry == mine.meters("postgres").retried
    finally:
        await saver.aclose()


async def test_p6_an_open_from_the_loop_refuses_a_store_of_another_generation(open_saver: Opener) -> None:
    saver = open_saver()
    dsn = saver.backend.engine.conninfo
    with connect(dsn) as conn:
        conn.execute("UPDATE tk_meta SET value = '0'")
    with pytest.raises(CheckpointStoreFormatError, match="reset the checkpoint store"):
        await aopen_checkpointer("postgres", dsn, settings=Settings())


def test_p6_langgraph_tables_in_the_same_schema_are_left_alone(provider: Any) -> None:
    """A database shared with LangGraph's own savers is not refused: only tk_ tables are ours."""
    dsn = postgres_schema(uuid.uuid4().hex)
    with connect(dsn) as conn:
        conn.execute("CREATE TABLE checkpoints (thread_id TEXT, checkpoint JSONB)")
        conn.execute("INSERT INTO checkpoints VALUES ('theirs', '{}')")
    with open_checkpointer("postgres", dsn, settings=Settings()) as saver:
        run_turns(build_agent(saver), "ours", 1)
    with connect(dsn) as conn:
        assert conn.execute("SELECT count(*) FROM checkpoints").fetchone()[0] == 1


async def test_postgres_pooled_saver_serves_threads_in_parallel(open_saver: Opener) -> None:
    """No instance-wide lock: a put blocked on one thread's row does not hold up another."""
    saver = open_saver()
    graph = build_agent(saver)
    await graph.ainvoke(turn_input(0), {"configurable": {"thread_id": "blocked"}})
    blocker = connect(saver.backend.engine.conninfo)
    blocker.autocommit = False
    blocker.execute("SELECT 1 FROM tk_threads WHERE thread_id = 'blocked' FOR UPDATE")
    blocked = asyncio.create_task(graph.ainvoke(turn_input(1), {"configurable": {"thread_id": "blocked"}}))
    await build_agent(saver).ainvoke(turn_input(0), {"configurable": {"thread_id": "free"}})
    # the other thread's whole run went through while this one waits on its row lock
    assert not blocked.done()
    blocker.rollback()
    blocker.close()
    await asyncio.wait_for(blocked, 10)
    assert (
        len(
            saver.get_tuple({"configurable": {"thread_id": "blocked"}}).checkpoint["channel_values"][
                "messages"
            ]
        )
        == 2 * MESSAGES_PER_TURN
    )


def test_p7_a_pool_the_application_owns_is_used_and_left_open(provider: Any) -> None:
    from psycopg_pool import ConnectionPool

    dsn = postgres_schema(uuid.uuid4().hex)
    pool = ConnectionPool(dsn, min_size=1, max_size=2, kwargs={"autocommit": True}, open=True)
    try:
        with open_checkpointer("postgres", dsn, settings=Settings(), pool=pool) as saver:
            run_turns(build_agent(saver), "shared-pool", 1)
            assert saver.backend.engine._pool is None  # it made no pool of its own
        with pool.connection() as conn:  # still open after the saver closed
            assert conn.execute("SELECT count(*) FROM tk_threads").fetchone()[0] == 1
    finally:
        pool.close()


async def test_p7_an_async_pool_the_application_owns_is_used_and_left_open(provider: Any) -> None:
    from psycopg_pool import AsyncConnectionPool

    dsn = postgres_schema(uuid.uuid4().hex)
    pool = AsyncConnectionPool(dsn, min_size=1, max_size=2, kwargs={"autocommit": True}, open=False)
    await pool.open()
    try:
        async with open_checkpointer("postgres", dsn, settings=Settings(), async_pool=pool) as saver:
            await build_agent(saver).ainvoke(turn_input(0), {"configurable": {"thread_id": "t"}})
        async with pool.connection() as conn:
            cursor = await conn.execute("SELECT count(*) FROM tk_threads")
            assert (await cursor.fetchone())[0] == 1
    finally:
        await pool.close()


def test_p7_pools_threadkeep_opened_are_closed_with_the_saver(open_saver: Opener) -> None:
    saver = open_saver(min_size=1, max_size=3)
    run_turns(build_agent(saver), "t", 1)
    pool = saver.backend.engine._pool
    assert pool is not None
    assert pool.max_size == 3
    saver.close()
    assert pool.closed
    # closed, it refuses calls rather than open pools nobody would close
    from threadkeep import StorageError

    with pytest.raises(StorageError, match="is closed"):
        saver.get_tuple({"configurable": {"thread_id": "t"}})
    with pytest.raises(StorageError, match="is closed"):
        asyncio.run(saver.aget_tuple({"configurable": {"thread_id": "t"}}))
    engine = saver.backend.engine
    assert engine._pool is None
    assert not engine._async_pools


def test_pool_sizes_and_timeouts_come_from_the_settings(provider: Any, tmp_path: Path) -> None:
    settings = Settings(pool_min_size=2, pool_max_size=4, pool_timeout_seconds=7, connect_timeout_seconds=3)
    with open_checkpointer("postgres", postgres_schema(uuid.uuid4().hex), settings=settings) as saver:
        saver.get_tuple({"configurable": {"thread_id": "nothing"}})
        pool = saver.backend.engine._pool
        assert (pool.min_size, pool.max_size, pool.timeout) == (2, 4, 7)
        assert pool.kwargs["connect_timeout"] == 3


def test_w1_a_write_that_went_on_after_a_failed_statement_is_not_reported_stored(
    open_saver: Opener,
) -> None:
    from threadkeep.core.program import Sql

    saver = open_saver()

    def swallowing() -> Any:
        with contextlib.suppress(Exception):  # the program goes on, as a buggy one might
            yield Sql("SELECT 1 / 0", {})
        return "stored?"

    with pytest.raises(Exception, match="nothing of it was stored"):
        saver.backend.engine.run(swallowing, write=True)


def test_postgres_location_hides_the_password(provider: Any) -> None:
    from threadkeep.backends.postgres.engine import PostgresEngine
    from threadkeep.core.retry import RetryPolicy

    engine = PostgresEngine(
        "host=db user=app password=s3cret dbname=prod",
        retry=RetryPolicy(attempts=1, backoff=0, retryable=lambda e: False, store="postgres"),
    )
    assert "s3cret" not in engine.location
    assert "host=db" in engine.location
    assert POSTGRES_URL  # the tests' server is configured


async def test_p7_a_first_call_takes_a_ready_connection_and_grows_no_pool(provider: Any) -> None:
    """An owned pool is ready before the first call takes a connection: that call does not
    wait for one, so the pool does not start a second connection beside it (which a lone
    caller never needs)."""
    dsn = postgres_schema(uuid.uuid4().hex)
    with open_checkpointer("postgres", dsn, settings=Settings(pool_min_size=1)) as saver:
        saver.get_tuple({"configurable": {"thread_id": "nothing"}})
        assert saver.backend.engine._pool.get_stats()["pool_size"] == 1
        await saver.aget_tuple({"configurable": {"thread_id": "nothing"}})
        (pool,) = saver.backend.engine._async_pools.values()
        assert pool.get_stats()["pool_size"] == 1


def _busy(call: Any, until: float) -> int:
    """Call ``call`` until ``until`` (time.monotonic); how many calls there were."""
    done = 0
    while time.monotonic() < until:
        call()
        done += 1
    return done


async def _abusy(call: Any, until: float) -> int:
    done = 0
    while time.monotonic() < until:
        await call()
        done += 1
    return done


def test_p7_first_calls_from_many_threads_share_one_ready_pool(provider: Any) -> None:
    """Threads that start on a new saver at once, and keep its one connection busy for
    longer than the pool timeout, all get the pool once it is ready: waiting for it to
    be ready does not time out behind them (and close it)."""
    settings = Settings(pool_min_size=1, pool_max_size=1, pool_timeout_seconds=1)
    with open_checkpointer("postgres", postgres_schema(uuid.uuid4().hex), settings=settings) as saver:
        until = time.monotonic() + 2.5
        read = functools.partial(saver.get_tuple, {"configurable": {"thread_id": "nothing"}})
        with concurrent.futures.ThreadPoolExecutor(8) as threads:
            calls = list(threads.map(lambda _: _busy(read, until), range(8)))
        assert all(calls)
        assert not saver.backend.engine._pool.closed


async def test_p7_first_calls_from_many_tasks_share_one_ready_pool(provider: Any) -> None:
    """The same on the async API: one pool per event loop, ready before any task uses it."""
    settings = Settings(pool_min_size=1, pool_max_size=1, pool_timeout_seconds=1)
    with open_checkpointer("postgres", postgres_schema(uuid.uuid4().hex), settings=settings) as saver:
        until = time.monotonic() + 2.5
        read = functools.partial(saver.aget_tuple, {"configurable": {"thread_id": "nothing"}})
        calls = await asyncio.gather(*(_abusy(read, until) for _ in range(8)))
        assert all(calls)
        (pool,) = saver.backend.engine._async_pools.values()
        assert not pool.closed


@contextlib.asynccontextmanager
async def _engine_on(*statements: str, **settings: Any) -> AsyncIterator[Any]:
    """A Postgres saver's engine on a fresh schema ``statements`` set up, its async pool
    open, with ``settings`` (a pool of at most 4 connections unless they say otherwise)."""
    dsn = postgres_schema(uuid.uuid4().hex)
    with connect(dsn) as conn:
        for statement in statements:
            conn.execute(statement)
    with open_checkpointer("postgres", dsn, settings=Settings(**{"pool_max_size": 4, **settings})) as saver:
        await saver.aget_tuple({"configurable": {"thread_id": "nothing"}})  # the pool is open
        yield saver.backend.engine


def _statement(sql: str, **params: Any) -> Any:
    """A program of one statement, whose rows it returns (run ``atomic=False``: the
    statement is its transaction, as a ``put_writes``'s is)."""
    from threadkeep.core.program import Sql

    def program() -> Any:
        return (yield Sql(sql, params))

    return program


@pytest.mark.parametrize("blocker", ["rows", "table"])
@pytest.mark.parametrize("call", ["put", "put_writes"])
async def test_a_put_or_writes_waiting_for_a_lock_holds_up_no_other(
    provider: Any, call: str, blocker: str
) -> None:
    """A write waiting for a lock holds up no other call: while another transaction holds
    two threads' rows, or a table they write in a mode that lets reads through (as a CREATE
    INDEX without CONCURRENTLY does), a put (or a task's writes) on each waits, on a
    connection of its own, and other threads' state reads are answered meanwhile. Both
    are stored once the locks are gone."""
    from langgraph.checkpoint.base import create_checkpoint

    dsn = postgres_schema(uuid.uuid4().hex)
    held_threads = ("held-a", "held-b")
    with open_checkpointer("postgres", dsn, settings=Settings(pool_max_size=4)) as saver:
        graph = build_agent(saver)
        for thread in (*held_threads, *(f"free-{i}" for i in range(10))):
            await graph.ainvoke(turn_input(0), {"configurable": {"thread_id": thread}})
        held = [await saver.aget_tuple({"configurable": {"thread_id": t}}) for t in held_threads]
        free = [await saver.aget_tuple({"configurable": {"thread_id": f"free-{i}"}}) for i in range(10)]
        children = [create_checkpoint(h.checkpoint, None, h.metadata["step"] + 1) for h in held]

        def send(index: int) -> asyncio.Future[Any]:
            state = held[index]
            if call == "put":
                metadata = {"source": "loop", "step": state.metadata["step"] + 1, "parents": {}}
                return asyncio.ensure_future(saver.aput(state.config, children[index], metadata, {}))
            return asyncio.ensure_future(saver.aput_writes(state.config, [("note", "kept")], "task-1"))

        holder = connect(dsn)
        holder.autocommit = False
        if blocker == "rows":
            holder.execute("SELECT 1 FROM tk_threads WHERE thread_id IN ('held-a', 'held-b') FOR UPDATE")
        else:
            holder.execute(f"LOCK TABLE {'tk_threads' if call == 'put' else 'tk_writes'} IN SHARE MODE")
        try:
            waiting = []
            for index in range(2):
                waiting.append(send(index))
                await asyncio.sleep(0.005)
            others = [saver.aget_tuple({"configurable": {"thread_id": f"free-{i}"}}) for i in range(10)]
            read = await asyncio.wait_for(asyncio.gather(*others), 5)
            assert [state.checkpoint["id"] for state in read] == [state.checkpoint["id"] for state in free]
            assert not any(future.done() for future in waiting)
        finally:
            holder.rollback()
            holder.close()
        await asyncio.wait_for(asyncio.gather(*waiting), 5)
        for state, child in zip(held, children, strict=True):
            thread = state.config["configurable"]["thread_id"]
            latest = await saver.aget_tuple({"configurable": {"thread_id": thread}})
            if call == "put":
                assert latest.checkpoint["id"] == child["id"]
            else:
                assert ("task-1", "note", "kept") in latest.pending_writes


async def test_a_statement_prepared_in_a_round_trip_that_fails_fails_no_call_after_it(
    provider: Any,
) -> None:
    """A pipeline prepares a statement it runs for the first time, and a statement before
    the Parse fails, which skips the Parse: the calls after it, on the one connection of
    the pool, run the same statement and are answered (the failed try's connection was
    replaced, with whatever psycopg thought it had prepared)."""
    from threadkeep import StorageError
    from threadkeep.core.program import Batch, Sql

    select = "SELECT %(k)s::integer"

    def failing() -> Any:  # a duplicate key, then the statement it would prepare
        yield Batch((Sql("INSERT INTO coalesced VALUES (0)", {}), Sql(select, {"k": -1})))

    table = ("CREATE TABLE coalesced (k INTEGER PRIMARY KEY)", "INSERT INTO coalesced VALUES (0)")
    async with _engine_on(*table, pool_min_size=1, pool_max_size=1, prepare_threshold=0) as engine:
        calls = [engine.arun(_statement(select, k=k), write=True, atomic=False) for k in range(10)]
        failed, *answered = await asyncio.gather(
            engine.arun(failing, write=True, atomic=False), *calls, return_exceptions=True
        )
    assert isinstance(failed, StorageError)
    assert answered == [[(k,)] for k in range(10)]


async def test_text_goes_in_the_connections_client_encoding(provider: Any) -> None:
    """Queries and text parameters go in the connection's client encoding: concurrent runs
    of threads named (and holding messages) outside ASCII, on connections whose client
    encoding is LATIN1, read back what they stored."""
    from psycopg.conninfo import conninfo_to_dict, make_conninfo

    dsn = postgres_schema(uuid.uuid4().hex)
    options = f"{conninfo_to_dict(dsn)['options']} -c client_encoding=LATIN1"
    latin1 = make_conninfo(dsn, options=options)
    with connect(latin1) as probe:
        assert probe.execute("SHOW client_encoding").fetchone() == ("LATIN1",)
    threads = [f"tâche-{i}" for i in range(8)]
    with open_checkpointer("postgres", latin1, settings=Settings(pool_max_size=4)) as saver:
        graph = build_agent(saver)
        finals = await asyncio.gather(
            *(graph.ainvoke(turn_input(0), {"configurable": {"thread_id": thread}}) for thread in threads)
        )
        states = [await saver.aget_tuple({"configurable": {"thread_id": thread}}) for thread in threads]
    for thread, final, state in zip(threads, finals, states, strict=True):
        assert state is not None
        assert state.config["configurable"]["thread_id"] == thread
        assert state.checkpoint["channel_values"]["messages"] == final["messages"]
    with connect(dsn) as conn:
        stored = {thread for (thread,) in conn.execute("SELECT thread_id FROM tk_threads")}
    assert stored == set(threads)


async def test_a_cold_read_of_a_damaged_message_names_it(provider: Any) -> None:
    """A stored message that cannot be read back fails a cold read, sync or async, with
    one error naming the message's place in its list."""
    from threadkeep import CheckpointSerializationError

    dsn = postgres_schema(uuid.uuid4().hex)
    config: Any = {"configurable": {"thread_id": "cold"}}
    with open_checkpointer("postgres", dsn) as saver:
        run_turns(build_agent(saver), "cold", 10)
    with connect(dsn) as conn:
        damaged = conn.execute(
            "UPDATE tk_messages SET value = '\\xc1' WHERE position('Turn 3:'::bytea IN value) > 0"
        )
        assert damaged.rowcount == 1
    with open_checkpointer("postgres", dsn) as saver, pytest.raises(CheckpointSerializationError) as whole:
        saver.get_tuple(config)
    with open_checkpointer("postgres", dsn) as saver, pytest.raises(CheckpointSerializationError) as early:
        await saver.aget_tuple(config)
    assert whole.value.path == early.value.path == f"channel_values.messages[{3 * MESSAGES_PER_TURN}]"
    assert str(early.value) == str(whole.value)


async def test_a_cold_read_of_one_list_in_two_channels_gives_each_its_own_messages(provider: Any) -> None:
    """A list two channels hold is walked once per channel by a cold read: each channel
    reads back its own message objects."""
    from langgraph.checkpoint.base import create_checkpoint, empty_checkpoint

    dsn = postgres_schema(uuid.uuid4().hex)
    messages = [HumanMessage(f"m{i}" * 40, id=str(i)) for i in range(70)]
    checkpoint = create_checkpoint(empty_checkpoint(), None, 0)
    checkpoint["channel_values"] = {"a": messages, "b": list(messages)}
    checkpoint["channel_versions"] = {"a": "00001", "b": "00001"}
    config: Any = {"configurable": {"thread_id": "twice", "checkpoint_ns": ""}}
    with open_checkpointer("postgres", dsn) as saver:
        saver.put(config, checkpoint, {"source": "input", "step": -1}, {"a": "00001", "b": "00001"})
    with open_checkpointer("postgres", dsn) as saver:
        found = await saver.aget_tuple(config)
    assert found is not None
    values = found.checkpoint["channel_values"]
    assert values == {"a": messages, "b": messages}
    assert not {id(message) for message in values["a"]} & {id(message) for message in values["b"]}


@pytest.mark.parametrize("api", ["sync", "async"])
def test_w2_a_refused_step_keeps_its_connection(
    open_saver: Opener, api: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Racing runs refuse each other often: a conflict rolls its transaction back and keeps
    the connection (it cost a new connection and a pool WARNING each), and every call after
    it, prepared statements and shared round trips included, succeeds."""
    from langgraph.checkpoint.base import create_checkpoint, empty_checkpoint

    from threadkeep import StaleStateError

    saver = open_saver()
    config = {"configurable": {"thread_id": "racing", "checkpoint_ns": ""}}
    root = empty_checkpoint()
    first = saver.put(config, root, {"source": "input", "step": -1}, {})
    saver.put(first, create_checkpoint(root, None, 0), {"source": "loop", "step": 0}, {})

    async def conflicts() -> int:
        refused = 0
        for _ in range(20):
            try:
                if api == "sync":
                    saver.put(first, create_checkpoint(root, None, 0), {"source": "loop", "step": 0}, {})
                else:
                    await saver.aput(
                        first, create_checkpoint(root, None, 0), {"source": "loop", "step": 0}, {}
                    )
            except StaleStateError:
                refused += 1
        graph = build_agent(saver)
        for turn in range(3):  # what comes after: reads, puts, writes, on the same connections
            if api == "sync":
                graph.invoke(turn_input(turn), {"configurable": {"thread_id": "after"}})
            else:
                await graph.ainvoke(turn_input(turn), {"configurable": {"thread_id": "after"}})
        return refused

    with caplog.at_level(logging.INFO):
        assert asyncio.run(conflicts()) == 20
    assert not [r for r in caplog.records if "discarding" in r.getMessage() or r.levelno >= logging.WARNING]
    state = saver.get_tuple({"configurable": {"thread_id": "after"}})
    assert len(state.checkpoint["channel_values"]["messages"]) == 3 * MESSAGES_PER_TURN


def test_a_connection_string_that_cannot_be_read_is_a_configuration_error(provider: Any) -> None:
    """Refused at open, named as a setting to fix: not 'the postgres store failed' (503)."""
    from threadkeep import ConfigurationError

    with pytest.raises(ConfigurationError, match="connection string cannot be read") as refused:
        open_checkpointer("postgres", "host=127.0.0.1 dbname=has spaces")
    assert refused.value.kind == "invalid"
    assert "has spaces" not in str(refused.value.context)


def test_a_deployment_set_up_by_its_environment_can_turn_prepared_statements_off(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Behind PgBouncer in transaction mode (before 1.21) a statement prepared on one server
    connection is missing on the next. ``LLM_PROVIDER_CHECKPOINT_PREPARE_THRESHOLD=null``
    turns prepared statements off for every store the environment opens: a saver's, past
    psycopg's threshold, and ``threadkeep store``'s."""
    from threadkeep.providers import registration

    dsn = postgres_schema(uuid.uuid4().hex)
    environment = {
        "LLM_PROVIDER_CHECKPOINT": "postgres",
        "LLM_PROVIDER_CHECKPOINT_CONN_STRING": dsn,
        "LLM_PROVIDER_CHECKPOINT_POOL_MAX_SIZE": "1",
        "LLM_PROVIDER_CHECKPOINT_PREPARE_THRESHOLD": "null",
    }
    for variable, value in environment.items():
        monkeypatch.setenv(variable, value)
    with open_checkpointer() as saver:
        run_turns(build_agent(saver), "t", 2)  # every write statement runs more than 5 times
        for _ in range(6):
            assert saver.get_tuple({"configurable": {"thread_id": "t"}}) is not None
        with saver.backend.engine._sync_pool().connection() as conn:
            assert conn.execute("SELECT count(*) FROM pg_prepared_statements").fetchone() == (0,)
    admin = registration("postgres").admin(Settings.from_env())
    try:
        assert admin.engine.options.prepare_threshold is None
    finally:
        admin.engine.close()
    monkeypatch.delenv("LLM_PROVIDER_CHECKPOINT_PREPARE_THRESHOLD")
    with open_checkpointer() as saver:  # the default prepares
        saver.get_tuple({"configurable": {"thread_id": "t"}})
        with saver.backend.engine._sync_pool().connection() as conn:
            assert conn.execute("SELECT count(*) FROM pg_prepared_statements").fetchone() != (0,)


def _blocked_by(dsn: str, pids: set[int]) -> set[int]:
    """The backends waiting for a lock one of ``pids`` holds (or waits for first)."""
    with connect(dsn) as conn:
        rows = conn.execute(
            "SELECT pid FROM pg_stat_activity WHERE pg_blocking_pids(pid) && %s::integer[]", (list(pids),)
        ).fetchall()
    return {row[0] for row in rows}


async def _until_blocked(dsn: str, pids: set[int], count: int) -> set[int]:
    for _ in range(500):
        blocked = _blocked_by(dsn, pids)
        if len(blocked) >= count:
            return blocked
        await asyncio.sleep(0.01)
    raise AssertionError(f"fewer than {count} backends waited for {pids}")


async def test_an_interrupt_whose_mark_waited_for_a_newer_put_leaves_the_thread_listed_waiting(
    provider: Any,
) -> None:
    """A task's interrupt write on a checkpoint whose mark (tk_threads.interrupt_at) waited
    for the thread's row while a put of a newer root checkpoint held it: once both commit,
    the interrupt is not the newest checkpoint's, and the listing's status filter finds the
    thread waiting, as its state says (the mark re-reads the row's head, which the put
    moved; its own snapshot predates the put)."""
    from langgraph.checkpoint.base import create_checkpoint
    from langgraph.types import Interrupt

    from threadkeep import operator_scope
    from threadkeep.threads import ThreadQuery

    dsn = postgres_schema(uuid.uuid4().hex)
    with open_checkpointer("postgres", dsn, settings=Settings(pool_max_size=4)) as saver:
        thread = {"configurable": {"thread_id": "asked"}}
        await build_agent(saver).ainvoke(turn_input(0), thread)
        state = await saver.aget_tuple(thread)
        child = create_checkpoint(state.checkpoint, None, state.metadata["step"] + 1)
        metadata = {"source": "loop", "step": state.metadata["step"] + 1, "parents": {}}
        holder = connect(dsn)
        holder.autocommit = False
        holder.execute("SELECT 1 FROM tk_threads WHERE thread_id = 'asked' FOR NO KEY UPDATE")
        holder_pid = holder.info.backend_pid
        try:
            put = asyncio.ensure_future(saver.aput(state.config, child, metadata, {}))
            (put_pid,) = await _until_blocked(dsn, {holder_pid}, 1)
            interrupt = [Interrupt(value="go on?")]
            mark = asyncio.ensure_future(
                saver.aput_writes(state.config, [("__interrupt__", interrupt)], "task-1")
            )
            await _until_blocked(dsn, {holder_pid, put_pid}, 2)
        finally:
            holder.rollback()
            holder.close()
        await asyncio.wait_for(asyncio.gather(put, mark), 10)
        latest = await saver.aget_tuple(thread)
        assert latest.checkpoint["id"] == child["id"]
        assert not latest.pending_writes
        with operator_scope():
            assert [t.thread_id for t in saver.threads(ThreadQuery(status="waiting")).threads] == ["asked"]
            assert saver.threads(ThreadQuery(status="interrupted")).threads == []
