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
from threadkeep import CheckpointStoreFormatError, Settings, open_checkpointer
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


def test_typed_array_parameters_reach_the_server_as_the_lists_they_wrap(provider: Any) -> None:
    """The binary dumpers of threadkeep's array parameters (backends/postgres/arrays.py):
    NULLs, empty arrays, non-ASCII text, 32-bit bounds, and a plain list beside them."""
    import enum

    import psycopg

    from threadkeep.backends.postgres.arrays import typed_arrays

    sql = (
        "SELECT %(digests)b::bytea[], %(names)b::text[], %(counts)b::integer[], %(none)b::bytea[],"
        " %(empty)b::text[], %(plain)s::text[]"
    )
    params = {
        "digests": [b"\x00\xff", None, b""],
        "names": ["tâche", None, "", 'a,b{c}"d'],
        "counts": [0, -(2**31), 2**31 - 1, None],
        "none": [None, None],
        "empty": [],
        "plain": ["left as it is"],
    }
    wrapped = typed_arrays(sql, dict(params))
    assert type(wrapped["plain"]) is list
    assert type(wrapped["digests"]) is not list
    with connect(POSTGRES_URL) as conn:
        assert list(conn.execute(sql, wrapped).fetchone()) == list(params.values())

    # Text goes in the connection's client encoding, and a str subclass as its own text
    # (an Enum's value, not its str()), as psycopg's own dumpers send them.
    class Channel(str, enum.Enum):  # noqa: UP042 (str() is not its value, as with StrEnum)
        MESSAGES = "messages"

    text = "SELECT %(names)b::text[]"
    names = ["tâche", Channel.MESSAGES, None]
    latin1 = psycopg.conninfo.make_conninfo(POSTGRES_URL, options="-c client_encoding=LATIN1")
    with connect(latin1) as latin:
        assert latin.execute(text, typed_arrays(text, {"names": names})).fetchone()[0] == [
            "tâche",
            "messages",
            None,
        ]
    with connect(POSTGRES_URL) as conn, pytest.raises(psycopg.DataError, match="32-bit"):
        conn.execute("SELECT %(n)b::integer[]", typed_arrays("SELECT %(n)b::integer[]", {"n": [2**31]}))


class _Coalescing:
    """A Postgres saver's engine on a fresh schema, its async pool open, and how many
    connections that pool has lent so far (a shared pipeline takes one for all its round
    trips; a round trip sent again alone, one more)."""

    def __init__(self, engine: Any, dsn: str) -> None:
        self.engine, self.dsn = engine, dsn
        (self.pool,) = engine._async_pools.values()

    def checkouts(self) -> int:
        return int(self.pool.get_stats().get("requests_num", 0))


@contextlib.asynccontextmanager
async def _coalescing(*statements: str, **settings: Any) -> AsyncIterator[_Coalescing]:
    """:class:`_Coalescing` on a schema ``statements`` set up, with ``settings`` (a pool of
    at most 4 connections unless they say otherwise)."""
    dsn = postgres_schema(uuid.uuid4().hex)
    with connect(dsn) as conn:
        for statement in statements:
            conn.execute(statement)
    with open_checkpointer("postgres", dsn, settings=Settings(**{"pool_max_size": 4, **settings})) as saver:
        await saver.aget_tuple({"configurable": {"thread_id": "nothing"}})  # the pool is open
        yield _Coalescing(saver.backend.engine, dsn)


def _statement(sql: str, **params: Any) -> Any:
    """A program of one statement, whose rows it returns (run ``atomic=False``: the
    statement is its transaction, as a ``put_writes``'s is)."""
    from threadkeep.core.program import Sql

    def program() -> Any:
        return (yield Sql(sql, params))

    return program


async def test_concurrent_calls_share_round_trips_and_each_commits_or_fails_alone(provider: Any) -> None:
    """Concurrent calls' first round trips go out together on one connection, each still its
    own transaction: a statement that fails fails its own call, rolled back, and the calls
    sent with it are stored and answered."""
    import psycopg

    from threadkeep import StorageError

    async with _coalescing("CREATE TABLE coalesced (k INTEGER PRIMARY KEY)") as store:
        engine, dsn, before = store.engine, store.dsn, store.checkouts()
        # the failing call first: its error reaches psycopg while the others are queued
        twice = engine.arun(
            _statement("INSERT INTO coalesced VALUES (1000), (1000)"), write=True, atomic=False
        )
        insert = "INSERT INTO coalesced VALUES (%(k)s) RETURNING k"
        inserts = [engine.arun(_statement(insert, k=k), write=True, atomic=False) for k in range(20)]
        failed, *stored = await asyncio.gather(twice, *inserts, return_exceptions=True)
        requests = store.checkouts() - before
    assert stored == [[(k,)] for k in range(20)]
    assert isinstance(failed, StorageError)
    assert isinstance(failed.__cause__, psycopg.errors.UniqueViolation)
    with connect(dsn) as conn:
        assert [k for (k,) in conn.execute("SELECT k FROM coalesced ORDER BY k")] == list(range(20))
    # one connection for the 21 round trips, and one for the failed one sent again alone
    # (21 without coalescing)
    assert requests <= 3


async def test_a_coalesced_call_waiting_on_a_lock_does_not_hold_up_the_others(provider: Any) -> None:
    """A write that waits for a row lock another transaction holds gives up its place in
    its shared pipeline after a short wait, and waits alone: the calls sent with it, and
    after it, are answered meanwhile."""
    dsn = postgres_schema(uuid.uuid4().hex)
    with connect(dsn) as conn:
        conn.execute("CREATE TABLE coalesced (k INTEGER PRIMARY KEY, n INTEGER NOT NULL DEFAULT 0)")
        conn.execute("INSERT INTO coalesced (k) VALUES (0)")
    with open_checkpointer("postgres", dsn, settings=Settings(pool_max_size=4)) as saver:
        engine = saver.backend.engine
        blocker = connect(dsn)
        blocker.autocommit = False
        blocker.execute("SELECT 1 FROM coalesced WHERE k = 0 FOR UPDATE")
        try:
            update = _statement("UPDATE coalesced SET n = n + 1 WHERE k = 0 RETURNING n")
            # two writes that wait, each alone in a pipeline of its own: both pipelines out
            waiting = asyncio.ensure_future(engine.arun(update, write=True, atomic=False))
            await asyncio.sleep(0.005)
            also = asyncio.ensure_future(engine.arun(update, write=True, atomic=False))
            await asyncio.sleep(0.005)
            insert = "INSERT INTO coalesced (k) VALUES (%(k)s) RETURNING k"
            inserts = [engine.arun(_statement(insert, k=k), write=True, atomic=False) for k in range(1, 11)]
            stored = await asyncio.wait_for(asyncio.gather(*inserts), 5)
            assert stored == [[(k,)] for k in range(1, 11)]
            # both still waiting for the lock, each on a connection of its own
            assert not waiting.done()
            assert not also.done()
        finally:
            blocker.rollback()
            blocker.close()
        assert sorted(await asyncio.wait_for(asyncio.gather(waiting, also), 5)) == [[(1,)], [(2,)]]


@pytest.mark.parametrize("blocker", ["rows", "table"])
@pytest.mark.parametrize("call", ["put", "put_writes"])
async def test_a_put_or_writes_waiting_for_a_lock_holds_up_no_other(
    provider: Any, call: str, blocker: str
) -> None:
    """The saver's own coalesced writes (the put that continues its head, a task's writes)
    bound their lock waits: while another transaction holds their threads' rows, or a
    table they write in a mode that lets reads through (as a CREATE INDEX without
    CONCURRENTLY does), two such calls, each alone in one of the two shared pipelines, give
    up their places and wait alone, and other threads' state reads are answered meanwhile.
    Both are stored once the locks are gone. (A bound inside the write's own statement would
    come too late for the table: a statement takes its table locks before it runs.)"""
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
            for index in range(2):  # each alone in a pipeline of its own: both pipelines out
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


async def test_w4_a_connection_dropped_under_coalesced_calls_retries_each(provider: Any) -> None:
    """The backend of a shared pipeline is terminated while it runs: every call sent on it
    is retried on its own (as after any dropped connection) and nothing is lost; the call
    that terminates its backend at every try fails with StorageError."""
    from threadkeep import StorageError

    table = "CREATE TABLE coalesced (k INTEGER PRIMARY KEY)"
    async with _coalescing(table, retry_attempts=3, retry_backoff_seconds=0.01) as store:
        engine, dsn = store.engine, store.dsn
        insert = "INSERT INTO coalesced VALUES (%(k)s) ON CONFLICT DO NOTHING"
        calls = [engine.arun(_statement(insert, k=k), write=True, atomic=False) for k in range(10)]
        kill = engine.arun(
            _statement("SELECT pg_terminate_backend(pg_backend_pid())"), write=True, atomic=False
        )
        more = [engine.arun(_statement(insert, k=k), write=True, atomic=False) for k in range(10, 20)]
        *done, killed = await asyncio.gather(*calls, *more, kill, return_exceptions=True)
    assert not [result for result in done if isinstance(result, BaseException)]
    assert isinstance(killed, StorageError)
    with connect(dsn) as conn:
        assert [k for (k,) in conn.execute("SELECT k FROM coalesced ORDER BY k")] == list(range(20))


async def test_w1_a_shared_pipeline_of_writes_is_answered_only_once_its_wal_is_flushed(provider: Any) -> None:
    """The writes of a shared pipeline that holds several commit without waiting for their
    WAL to reach disk, and the pipeline ends with one round trip that waits for it (an
    upsert of ``tk_flush``, committed as the session's ``synchronous_commit`` says: its
    commit waits for every WAL record before its own). Their calls are answered only after
    it. While that upsert waits for a lock another transaction holds, every write is
    committed and visible to others, and not one of their calls is answered; once it goes
    through, all are. A lone write commits as the session says, with no flush after it."""
    async with _coalescing("CREATE TABLE coalesced (k INTEGER PRIMARY KEY)") as store:
        engine, dsn = store.engine, store.dsn
        insert = "INSERT INTO coalesced VALUES (%(k)s) RETURNING k, current_setting('synchronous_commit')"
        lone = await engine.arun(_statement(insert, k=100), write=True, atomic=False)
        assert lone == [(100, "on")]
        with connect(dsn) as conn:
            assert conn.execute("SELECT count(*) FROM tk_flush").fetchone()[0] == 0
        holder = connect(dsn)
        holder.autocommit = False
        holder.execute("LOCK TABLE tk_flush IN EXCLUSIVE MODE")
        try:
            calls = [
                asyncio.ensure_future(engine.arun(_statement(insert, k=k), write=True, atomic=False))
                for k in range(10)
            ]
            committed = 0
            with connect(dsn) as reader:
                for _ in range(500):
                    await asyncio.sleep(0.01)
                    committed = reader.execute("SELECT count(*) FROM coalesced WHERE k < 100").fetchone()[0]
                    if committed == 10:
                        break
            assert committed == 10
            await asyncio.sleep(0.2)
            assert not any(call.done() for call in calls)
        finally:
            holder.rollback()
            holder.close()
        assert await asyncio.wait_for(asyncio.gather(*calls), 5) == [[(k, "off")] for k in range(10)]
    with connect(dsn) as conn:
        assert conn.execute("SELECT sum(flushes) FROM tk_flush").fetchone()[0] >= 1


async def test_w4_a_shared_pipeline_whose_flush_fails_has_its_calls_tried_again(
    provider: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """When the closing flush fails, nothing says the pipeline's writes reached disk: their
    calls are not answered as stored, but tried again, each on a connection of its own, as
    after a dropped connection. The engine then stops sharing flushes (the causes last: a
    privilege, a table gone), and says so once: the next pipeline's writes each commit as
    the session says, with no flush after them."""
    table = "CREATE TABLE coalesced (k INTEGER PRIMARY KEY)"
    async with _coalescing(table, retry_attempts=3, retry_backoff_seconds=0.01) as store:
        engine, dsn = store.engine, store.dsn
        with connect(dsn) as conn:
            conn.execute("ALTER TABLE tk_flush RENAME TO tk_flush_gone")
        again = "INSERT INTO coalesced VALUES (%(k)s) ON CONFLICT DO NOTHING"  # as a put's retry passes
        calls = [engine.arun(_statement(again, k=k), write=True, atomic=False) for k in range(10)]
        results = await asyncio.gather(*calls, return_exceptions=True)
        assert not [result for result in results if isinstance(result, BaseException)]
        assert "closing WAL flush of a shared pipeline" in caplog.text
        assert 'relation "tk_flush" does not exist (SQLSTATE 42P01)' in caplog.text  # what failed it
        assert caplog.text.count("from now on each write") == 1
        insert = "INSERT INTO coalesced VALUES (%(k)s) RETURNING k, current_setting('synchronous_commit')"
        after = [engine.arun(_statement(insert, k=k), write=True, atomic=False) for k in range(10, 20)]
        assert await asyncio.gather(*after) == [[(k, "on")] for k in range(10, 20)]
        assert caplog.text.count("from now on each write") == 1
    with connect(dsn) as conn:
        assert [k for (k,) in conn.execute("SELECT k FROM coalesced ORDER BY k")] == list(range(20))


async def test_w4_a_shared_flush_that_fails_for_a_passing_cause_keeps_sharing(
    provider: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """A flush that fails for a cause that passes (here its prepared statement dropped by a
    ``DEALLOCATE ALL`` on its connection) has its pipeline's calls tried again, says what
    failed it, and blames no privilege: the next pipelines still share a flush."""
    caplog.set_level(logging.INFO)
    table = "CREATE TABLE coalesced (k INTEGER PRIMARY KEY)"
    settings = {"pool_min_size": 1, "pool_max_size": 1, "prepare_threshold": 0, "retry_backoff_seconds": 0.01}
    async with _coalescing(table, **settings) as store:
        engine = store.engine
        insert = (
            "INSERT INTO coalesced VALUES (%(k)s) ON CONFLICT DO NOTHING"
            " RETURNING current_setting('synchronous_commit')"
        )

        async def inserts(keys: range) -> list[Any]:
            return await asyncio.gather(
                *(engine.arun(_statement(insert, k=k), write=True, atomic=False) for k in keys)
            )

        await inserts(range(10))
        assert any("tk_flush" in statement for statement, _ in await _prepared_statements(engine))
        await engine.arun(
            _statement("DEALLOCATE ALL"), write=True, atomic=False
        )  # shared, on the one connection
        await inserts(range(10, 20))  # names gone: the flush fails once, its calls go again
        assert await inserts(range(20, 30)) == [[("off",)]] * 10  # a shared flush after them
    failed = [r for r in caplog.records if "closing WAL flush of a shared pipeline failed" in r.getMessage()]
    assert failed, "the flush whose statement was dropped failed"
    assert all("_tk" in r.getMessage() and "26000" in r.getMessage() for r in failed)
    assert all(r.levelno < logging.WARNING for r in failed)
    assert "grant" not in caplog.text


async def test_a_coalesced_pipeline_leaves_no_setting_on_its_connection(provider: Any) -> None:
    """The lock wait bound of a shared pipeline ends with it: the next call on the same
    connection waits for locks as the server's settings say."""
    settings = Settings(pool_min_size=1, pool_max_size=1)
    with open_checkpointer("postgres", postgres_schema(uuid.uuid4().hex), settings=settings) as saver:
        engine = saver.backend.engine
        selects = [
            engine.arun(_statement("SELECT %(k)s::integer", k=k), write=True, atomic=False) for k in range(5)
        ]
        assert await asyncio.gather(*selects) == [[(k,)] for k in range(5)]
        # a transaction is never coalesced: it runs on the pool's one connection by itself
        assert await engine.arun(_statement("SHOW lock_timeout"), write=True) == [("0",)]


async def test_a_coalesced_transaction_of_one_round_trip_stays_whole(provider: Any) -> None:
    """A write whose one round trip holds its whole transaction (BEGIN, statements, COMMIT:
    a put under a history limit) shares a pipeline as one transaction: a failing statement
    rolls back the statements before it, and the transactions sent with it commit."""
    from threadkeep import StorageError
    from threadkeep.core.program import Batch, Sql

    insert = "INSERT INTO coalesced VALUES (%(k)s)"

    def pair(first: int, second: int) -> Any:
        def program() -> Any:
            yield Batch((Sql(insert, {"k": first}), Sql(insert, {"k": second})), ends=True)
            return first

        return program

    async with _coalescing("CREATE TABLE coalesced (k INTEGER PRIMARY KEY)") as store:
        engine, dsn, before = store.engine, store.dsn, store.checkouts()
        failing = engine.arun(pair(100, 100), write=True)  # its second insert fails
        pairs = [engine.arun(pair(k, k + 50), write=True) for k in range(10)]
        failed, *stored = await asyncio.gather(failing, *pairs, return_exceptions=True)
        requests = store.checkouts() - before
    assert stored == list(range(10))
    assert isinstance(failed, StorageError)
    with connect(dsn) as conn:
        rows = [k for (k,) in conn.execute("SELECT k FROM coalesced ORDER BY k")]
    assert rows == [*range(10), *range(50, 60)]  # not 100: its transaction rolled back whole
    assert requests <= 3


async def test_a_coalesced_round_trip_whose_commit_fails_rolls_back_alone(provider: Any) -> None:
    """A round trip of a shared pipeline can fail at the COMMIT its Sync makes (a deferred
    constraint; a serialization failure where the server's default isolation is stricter):
    that round trip rolled back, its call gets the error as a lone call would, and the round
    trips sent with it, before and after, are stored and answered."""
    import psycopg

    from threadkeep import StorageError

    table = "CREATE TABLE coalesced (k INTEGER, UNIQUE (k) DEFERRABLE INITIALLY DEFERRED)"
    async with _coalescing(table) as store:
        engine, dsn, requests = store.engine, store.dsn, store.checkouts()
        insert = "INSERT INTO coalesced VALUES (%(k)s) RETURNING k"
        before = [engine.arun(_statement(insert, k=k), write=True, atomic=False) for k in range(10)]
        # each statement succeeds; the constraint is checked at the commit
        twice = engine.arun(
            _statement("INSERT INTO coalesced VALUES (1000), (1000) RETURNING k"), write=True, atomic=False
        )
        after = [engine.arun(_statement(insert, k=k), write=True, atomic=False) for k in range(10, 20)]
        # queued in this order: the failing round trip has others before and after it
        results = await asyncio.gather(*before, twice, *after, return_exceptions=True)
        requests = store.checkouts() - requests
    failed = results.pop(10)
    assert results == [[(k,)] for k in range(20)]
    # the shared pipelines, and the failed round trip sent again alone: no call retried
    assert requests <= 4
    assert isinstance(failed, StorageError)
    assert isinstance(failed.__cause__, psycopg.errors.UniqueViolation)
    with connect(dsn) as conn:
        assert [k for (k,) in conn.execute("SELECT k FROM coalesced ORDER BY k")] == list(range(20))


async def test_a_coalesced_round_trip_whose_parameters_cannot_be_sent_goes_alone(provider: Any) -> None:
    """A parameter psycopg cannot adapt keeps its round trip out of the shared pipeline:
    nothing of it is queued, the round trips before and after it are stored and answered
    from the same pipeline, and its call fails as it would alone, with psycopg's own error."""
    import psycopg

    from threadkeep import StorageError

    async with _coalescing("CREATE TABLE coalesced (k INTEGER PRIMARY KEY)") as store:
        engine, requests = store.engine, store.checkouts()
        insert = "INSERT INTO coalesced VALUES (%(k)s) RETURNING k"
        calls = [engine.arun(_statement(insert, k=k), write=True, atomic=False) for k in range(20)]
        unsendable = engine.arun(_statement(insert, k=object()), write=True, atomic=False)
        results = await asyncio.gather(*calls[:10], unsendable, *calls[10:], return_exceptions=True)
        requests = store.checkouts() - requests
    failed = results.pop(10)
    assert results == [[(k,)] for k in range(20)]
    assert isinstance(failed, StorageError)
    assert isinstance(failed.__cause__, psycopg.ProgrammingError)
    assert requests <= 4  # the shared pipelines, and the unsendable call alone


async def _prepared_statements(engine: Any) -> list[tuple[str, int]]:
    """The statements the engine's shared pipelines prepared on its pool's one connection,
    and how often each ran by its name (read in a transaction, which is never coalesced:
    it runs on that connection alone)."""
    names = (
        "SELECT statement, generic_plans + custom_plans FROM pg_prepared_statements"
        " WHERE name LIKE %(prefix)s ORDER BY name"
    )
    return await engine.arun(_statement(names, prefix=r"\_tk%"), write=True)  # type: ignore[no-any-return]


@pytest.mark.parametrize("threshold", [0, 2, None])
async def test_coalesced_statements_are_prepared_once_they_ran_prepare_threshold_times(
    provider: Any, threshold: int | None
) -> None:
    """A shared pipeline's write statements become prepared statements on their connection
    once they ran ``prepare_threshold`` times, as psycopg's own would, and never where the
    threshold is None (PgBouncer in transaction mode before 1.21)."""
    settings = Settings(pool_min_size=1, pool_max_size=1, prepare_threshold=threshold)
    with open_checkpointer("postgres", postgres_schema(uuid.uuid4().hex), settings=settings) as saver:
        engine = saver.backend.engine
        select = "SELECT %(k)s::integer"
        prepared = []
        for k in range(4):
            # a write's round trip: the lock wait bound, then the statement
            assert await engine.arun(_statement(select, k=k), write=True, atomic=False) == [(k,)]
            prepared.append(sorted(runs for _, runs in await _prepared_statements(engine)))
    if threshold is None:
        assert prepared == [[], [], [], []]
    else:
        # both prepared at the run after their first ``threshold`` runs, and run by name since
        assert prepared == [[run + 1 - threshold] * 2 if run >= threshold else [] for run in range(4)]


async def test_coalesced_statements_are_prepared_again_after_their_names_were_dropped(provider: Any) -> None:
    """psycopg sends ``DEALLOCATE ALL`` after a failed transaction's ROLLBACK on a connection
    where it prepared statements of its own, which drops the shared pipelines' prepared
    statements too: their next round trips fail once (and go alone), then the statements are
    prepared again, and the round trips after that share pipelines as before."""
    from threadkeep import StorageError
    from threadkeep.core.program import Batch, Sql

    table = "CREATE TABLE coalesced (k INTEGER PRIMARY KEY)"
    async with _coalescing(table, pool_min_size=1, pool_max_size=1, prepare_threshold=0) as store:
        engine = store.engine
        insert = "INSERT INTO coalesced VALUES (%(k)s) RETURNING k"

        async def inserts(keys: range) -> list[Any]:
            return await asyncio.gather(
                *(engine.arun(_statement(insert, k=k), write=True, atomic=False) for k in keys)
            )

        async def prepared() -> list[str]:  # the inserts' (the state read's are prepared too)
            return sorted(
                statement
                for statement, _ in await _prepared_statements(engine)
                if "coalesced" in statement or "lock_timeout" in statement
            )

        assert await inserts(range(5)) == [[(k,)] for k in range(5)]
        assert len(await prepared()) == 2

        def failing() -> Any:  # a lone transaction psycopg rolls back
            yield Batch((Sql("SELECT 1", {}), Sql("SELECT 1/0", {})))

        with pytest.raises(StorageError):
            await engine.arun(failing, write=True)
        assert await _prepared_statements(engine) == []  # psycopg's DEALLOCATE ALL

        # their names were gone: these went alone, and the connection forgot the names
        assert await inserts(range(5, 10)) == [[(k,)] for k in range(5, 10)]
        requests = store.checkouts()
        assert await inserts(range(10, 30)) == [[(k,)] for k in range(10, 30)]
        assert store.checkouts() - requests <= 3  # shared again
        assert len(await prepared()) == 2  # prepared again


async def test_a_statement_prepared_in_a_round_trip_that_fails_fails_no_round_trip_after_it(
    provider: Any,
) -> None:
    """A round trip prepares a statement it runs for the first time, and a statement of it
    before the Parse fails, which skips the Parse: the round trips after it in the same
    shared pipeline, which run the same statement, do not depend on that Parse (they run it
    unprepared), so they are answered from the pipeline."""
    from threadkeep import StorageError
    from threadkeep.core.program import Batch, Sql

    select = "SELECT %(k)s::integer"

    def failing() -> Any:  # a duplicate key, then the statement it would prepare
        yield Batch((Sql("INSERT INTO coalesced VALUES (0)", {}), Sql(select, {"k": -1})))

    table = ("CREATE TABLE coalesced (k INTEGER PRIMARY KEY)", "INSERT INTO coalesced VALUES (0)")
    async with _coalescing(*table, pool_min_size=1, pool_max_size=1, prepare_threshold=0) as store:
        engine, requests = store.engine, store.checkouts()
        calls = [engine.arun(_statement(select, k=k), write=True, atomic=False) for k in range(10)]
        failed, *answered = await asyncio.gather(
            engine.arun(failing, write=True, atomic=False), *calls, return_exceptions=True
        )
        requests = store.checkouts() - requests
    assert isinstance(failed, StorageError)
    assert answered == [[(k,)] for k in range(10)]
    assert requests <= 3  # the shared pipeline (and the failed round trip, sent again alone)


async def test_a_statement_due_to_be_prepared_waits_for_a_table_lock_no_longer_than_its_bound(
    provider: Any,
) -> None:
    """A statement prepared in a shared pipeline takes its table locks when it is parsed: its
    Parse goes behind the write's lock wait bound, so a round trip whose table another
    transaction locks gives up its place after the bound and waits alone, and the round
    trips sent with it are answered meanwhile."""
    dsn = postgres_schema(uuid.uuid4().hex)
    with connect(dsn) as conn:
        conn.execute("CREATE TABLE coalesced (k INTEGER PRIMARY KEY)")
        conn.execute("CREATE TABLE other (k INTEGER PRIMARY KEY)")
    # every statement is prepared at its first run, on connections that prepared nothing yet
    settings = Settings(pool_min_size=1, pool_max_size=2, prepare_threshold=0)
    with open_checkpointer("postgres", dsn, settings=settings) as saver:
        engine = saver.backend.engine
        await saver.aget_tuple({"configurable": {"thread_id": "nothing"}})  # the pool is open
        holder = connect(dsn)
        holder.autocommit = False
        holder.execute("LOCK TABLE coalesced IN SHARE MODE")  # lets reads through, stops writes
        try:
            blocked = asyncio.ensure_future(
                engine.arun(
                    _statement("INSERT INTO coalesced VALUES (%(k)s) RETURNING k", k=1),
                    write=True,
                    atomic=False,
                )
            )
            insert = "INSERT INTO other VALUES (%(k)s) RETURNING k"
            others = [engine.arun(_statement(insert, k=k), write=True, atomic=False) for k in range(10)]
            assert await asyncio.wait_for(asyncio.gather(*others), 5) == [[(k,)] for k in range(10)]
            assert not blocked.done()
        finally:
            holder.rollback()
            holder.close()
        assert await asyncio.wait_for(blocked, 5) == [(1,)]


async def test_shared_pipelines_send_text_in_the_connections_client_encoding(provider: Any) -> None:
    """Shared round trips go out on libpq with their queries and text parameters in the
    connection's client encoding, as psycopg's own cursors send them: concurrent runs of
    threads named (and holding messages) outside ASCII, on connections whose client
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


def _queued_trips(conn: Any, *trips: list[Any]) -> Any:
    """A pipeline on ``conn`` with ``trips`` (each a list of ``Sql``) queued."""
    from threadkeep.backends.postgres import wire

    pipeline = wire.WirePipeline(conn)
    for trip in trips:
        assert pipeline.queue(trip, lambda conn, sql: False)
    return pipeline


def _queued(conn: Any, *statements: tuple[str, dict[str, Any]]) -> Any:
    """A shared pipeline on ``conn`` with each of ``statements`` as a round trip of its own."""
    from threadkeep.core.program import Sql

    return _queued_trips(conn, *([Sql(sql, params)] for sql, params in statements))


async def test_a_shared_pipeline_larger_than_the_socket_buffers_is_sent_and_read_whole(provider: Any) -> None:
    """A shared pipeline's exchange waits to write as well as to read: round trips whose
    parameters are far larger than the socket's buffers all reach the server, and every
    result comes back, in order."""
    import psycopg

    from threadkeep.backends.postgres import wire

    # The first value alone is more than the buffers hold: no result can come back before
    # it is all written, so only a wait to write sends the rest.
    sizes = [32_000_000, 10, 2_000_000, 10]
    async with await psycopg.AsyncConnection.connect(POSTGRES_URL, autocommit=True) as conn:
        statement = "SELECT length(%(v)s::bytea), %(k)s::integer"
        pipeline = _queued(conn, *((statement, {"v": b"x" * size, "k": k}) for k, size in enumerate(sizes)))
        trips = pipeline.judge(await asyncio.wait_for(wire.wait(conn, pipeline.exchange()), 30))
        pipeline.end()
        assert trips == [[[(size, k)]] for k, size in enumerate(sizes)]
        assert await (await conn.execute("SELECT 1")).fetchone() == (1,)


@contextlib.asynccontextmanager
async def _waiting_exchange() -> AsyncIterator[tuple[Any, asyncio.Future[Any]]]:
    """A shared pipeline's exchange waiting on a statement that sleeps: its connection, and
    the exchange running as a task. The backend is ended and the connection closed
    afterwards (as the engine closes a connection whose exchange failed)."""
    import psycopg

    from threadkeep.backends.postgres import wire

    async with await psycopg.AsyncConnection.connect(POSTGRES_URL, autocommit=True) as conn:
        pid = conn.info.backend_pid
        pipeline = _queued(conn, ("SELECT pg_sleep(30)", {}))
        exchange = asyncio.ensure_future(wire.wait(conn, pipeline.exchange()))
        try:
            await asyncio.sleep(0.2)
            assert not exchange.done()
            yield conn, exchange
        finally:
            exchange.cancel()
            with connect(POSTGRES_URL) as admin:
                admin.execute("SELECT pg_terminate_backend(%s)", (pid,))
            await conn.close()


async def test_a_shared_pipeline_cancelled_while_it_waits_leaves_the_loop_watching_nothing(
    provider: Any,
) -> None:
    """Cancelling a shared pipeline while it waits for its results (its loop shutting down,
    say) ends the wait at once, and the loop no longer watches the connection's socket."""
    loop = asyncio.get_running_loop()
    async with _waiting_exchange() as (conn, exchange):
        fileno = conn.pgconn.socket
        exchange.cancel()
        with pytest.raises(asyncio.CancelledError):
            await asyncio.wait_for(exchange, 1)
        assert not loop.remove_reader(fileno)
        assert not loop.remove_writer(fileno)


async def test_a_shared_pipeline_whose_backend_ends_while_it_waits_fails_with_a_connection_error(
    provider: Any,
) -> None:
    """A shared pipeline whose backend is terminated while it waits for its results fails
    with the connection's error (the calls on it retry as after any dropped connection),
    and the loop no longer watches the socket."""
    import psycopg

    from threadkeep.backends.postgres.engine import is_connection_error

    loop = asyncio.get_running_loop()
    async with _waiting_exchange() as (conn, exchange):
        fileno = conn.pgconn.socket
        with connect(POSTGRES_URL) as admin:
            admin.execute("SELECT pg_terminate_backend(%s)", (conn.info.backend_pid,))
        with pytest.raises(psycopg.OperationalError) as failed:
            await asyncio.wait_for(exchange, 5)
        assert is_connection_error(failed.value)
        assert not loop.remove_reader(fileno)
        assert not loop.remove_writer(fileno)


async def test_a_shared_pipeline_whose_backend_ends_while_it_is_sent_fails_with_a_connection_error(
    provider: Any,
) -> None:
    """A shared pipeline whose backend is terminated while it is still being sent (a
    parameter larger than the socket buffers, behind a statement that keeps the server
    from reading) fails with the connection's error at once, and the loop no longer
    watches the socket (libpq has closed it: unwatching it must not fail the wait)."""
    import psycopg

    from threadkeep.backends.postgres import wire

    loop = asyncio.get_running_loop()
    async with await psycopg.AsyncConnection.connect(POSTGRES_URL, autocommit=True) as conn:
        fileno = conn.pgconn.socket
        pipeline = _queued(
            conn, ("SELECT pg_sleep(3)", {}), ("SELECT length(%(v)s::bytea)", {"v": b"x" * 64_000_000})
        )
        exchange = asyncio.ensure_future(wire.wait(conn, pipeline.exchange()))
        await asyncio.sleep(0.3)
        assert not exchange.done()
        with connect(POSTGRES_URL) as admin:
            admin.execute("SELECT pg_terminate_backend(%s)", (conn.info.backend_pid,))
        with pytest.raises(psycopg.OperationalError):
            await asyncio.wait_for(exchange, 5)
        assert not loop.remove_reader(fileno)
        assert not loop.remove_writer(fileno)
        await conn.close()


async def test_an_exchange_that_closes_its_socket_and_fails_fails_the_wait() -> None:
    """An exchange that fails while the loop watches its socket both ways, after libpq
    closed the socket (as on a dropped connection), fails the wait with its error: the
    selector's refusal to unwatch a closed socket neither hangs it nor replaces the error."""
    import socket
    import types

    import psycopg
    from psycopg.waiting import WAIT_RW

    from threadkeep.backends.postgres import wire

    ours, theirs = socket.socketpair()
    theirs.send(b"x")  # readable and writable: both callbacks run in the same pass

    def exchange() -> Any:
        yield WAIT_RW
        ours.close()
        raise psycopg.OperationalError("server closed the connection unexpectedly")

    conn: Any = types.SimpleNamespace(pgconn=types.SimpleNamespace(socket=ours.fileno()))
    try:
        with pytest.raises(psycopg.OperationalError, match="closed the connection"):
            await asyncio.wait_for(wire.wait(conn, exchange()), 2)
    finally:
        theirs.close()


async def test_a_shared_exchange_the_server_never_answers_ends_at_its_deadline() -> None:
    """The shared pipeline's wait gives up after the owned pool's command timeout, and
    leaves the loop watching nothing (the caller closes the connection)."""
    import socket
    import types

    import psycopg
    from psycopg.waiting import WAIT_R

    from threadkeep.backends.postgres import wire

    ours, theirs = socket.socketpair()  # nothing is ever sent: never readable
    given_up: list[str] = []

    def exchange() -> Any:
        yield WAIT_R
        raise AssertionError("stepped without an answer")

    async def cancel_safe(**bound: float) -> None:
        given_up.append("cancel")

    pgconn = types.SimpleNamespace(socket=ours.fileno(), finish=lambda: given_up.append("finish"))
    conn: Any = types.SimpleNamespace(pgconn=pgconn, cancel_safe=cancel_safe)
    loop = asyncio.get_running_loop()
    try:
        with pytest.raises(psycopg.OperationalError, match=r"did not answer within 0\.2 s"):
            await asyncio.wait_for(wire.wait(conn, exchange(), 0.2), 5)
        assert not loop.remove_reader(ours.fileno())  # no longer watched
        cancels = psycopg.capabilities.has_cancel_safe()
        assert given_up == (["cancel", "finish"] if cancels else ["finish"])  # the server's statement too
    finally:
        ours.close()
        theirs.close()


async def _exchanged(conn: Any, *trips: list[Any]) -> list[Any]:
    """What a pipeline of ``trips`` (each a list of ``Sql``) on ``conn`` answers."""
    from threadkeep.backends.postgres import wire

    pipeline = _queued_trips(conn, *trips)
    trips_rows = pipeline.judge(await asyncio.wait_for(wire.wait(conn, pipeline.exchange()), 5))
    pipeline.end()
    return trips_rows


async def test_a_statement_read_early_is_handed_over_in_chunks_when_it_goes_alone(provider: Any) -> None:
    """A statement whose rows its program takes early (``Sql.early``), in a pipeline of its
    round trip alone, is read in chunks, each handed over as it arrives, and every row is
    still returned; one that fails part way hands over what came before the failure and
    fails. In a pipeline shared with other round trips it is read whole: its calls are all
    answered when the exchange ends, and none should wait for another's early work."""
    import psycopg

    from threadkeep.core.program import Sql

    every = [(g,) for g in range(1, 101)]
    hundred = "SELECT g FROM generate_series(1, 100) AS g"
    chunks: list[list[Any]] = []
    failing: list[list[Any]] = []
    shared: list[list[Any]] = []
    async with await psycopg.AsyncConnection.connect(POSTGRES_URL, autocommit=True) as conn:
        alone = await _exchanged(conn, [Sql("SELECT 'first'", {}), Sql(hundred, {}, chunks.append)])
        assert alone == [[[("first",)], every]]
        assert [len(chunk) for chunk in chunks] == [32, 32, 32, 4]
        assert [row for chunk in chunks for row in chunk] == every
        divided = "SELECT 1 / (150 - g) FROM generate_series(1, 200) AS g"
        assert await _exchanged(conn, [Sql(divided, {}, failing.append)]) == [None]
        # the rows before the division by zero came in whole chunks; the rest never came
        assert [len(chunk) for chunk in failing] == [32, 32, 32, 32]
        both = await _exchanged(conn, [Sql(hundred, {}, shared.append)], [Sql("SELECT 'other'", {})])
        assert both == [[every], [[("other",)]]]
        assert shared == []


@pytest.mark.parametrize(
    "settings",
    [{}, {"prepare_threshold": None}, {"inline_compress_bytes": 256}],
    ids=["prepared", "never-prepared", "compressed-messages"],
)
async def test_a_cold_read_decodes_its_messages_while_their_rows_arrive(
    provider: Any, monkeypatch: pytest.MonkeyPatch, settings: dict[str, Any]
) -> None:
    """A read that walks a thread's messages (a new process, a cold thread) decodes them as
    their rows arrive, while the server still looks up the rest, and reads back what a
    read that decodes them at the end reads: on a connection that never prepares (the
    state read is then the function ``tk_state``) and with messages stored compressed too."""
    from threadkeep.backends.sql import programs

    dsn = postgres_schema(uuid.uuid4().hex)
    config: Any = {"configurable": {"thread_id": "cold"}}
    with open_checkpointer("postgres", dsn, settings=Settings(**settings)) as saver:
        run_turns(build_agent(saver), "cold", 10)
    with open_checkpointer("postgres", dsn, settings=Settings(**settings)) as saver:
        expected = saver.get_tuple(config)  # sync: read whole, decoded at the end
    taken: list[Any] = []
    take = programs._EarlyMessages.take

    def kept(self: Any, tail: bytes, count: int) -> list[Any] | None:
        taken.append(take(self, tail, count))
        return taken[-1]  # type: ignore[no-any-return]

    monkeypatch.setattr(programs._EarlyMessages, "take", kept)
    with open_checkpointer("postgres", dsn, settings=Settings(**settings)) as saver:
        state = await saver.aget_tuple(config)
    assert expected is not None
    assert state is not None
    assert len(taken) == 1
    # the list decoded early is the list the read hands over
    assert state.checkpoint["channel_values"]["messages"] is taken[0]
    assert len(taken[0]) == 10 * MESSAGES_PER_TURN
    assert state.checkpoint == expected.checkpoint
    assert state.metadata == expected.metadata


async def test_a_cold_read_of_a_damaged_message_names_it_as_a_read_at_the_end_does(provider: Any) -> None:
    """A stored message that cannot be read back fails a read that decodes messages as
    their rows arrive with the error a read that decodes them at the end gives, naming the
    message's place in its list."""
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
    reads back its own message objects, whether decoded as their rows arrived or after."""
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
