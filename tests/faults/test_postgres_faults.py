"""SPEC W4 on a real Postgres: killed connections are retried; an outage fails the run visibly
and leaves nothing half-written. And SPEC W2 when two writers queue on a thread's lock."""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from langgraph.types import Durability

from tests.providers import POSTGRES_URL, postgres_schema
from tests.servers import TcpProxy
from threadkeep import Settings, StaleStateError, StorageError, open_checkpointer
from threadkeep.backends.sql.programs import INLINE_VALUE_BYTES
from threadkeep.workload import MESSAGES_PER_TURN, build_agent, run_turns, turn_input

pytestmark = [pytest.mark.providers("postgres"), pytest.mark.slow]
CHECKPOINTS_PER_TURN = MESSAGES_PER_TURN + 1
FAST_RETRIES = Settings(retry_backoff_seconds=0.05, pool_timeout_seconds=1, connect_timeout_seconds=1)


def admin() -> Any:
    import psycopg

    return psycopg.connect(POSTGRES_URL, autocommit=True)


def until_no_backend(where: str, params: tuple[Any, ...], what: str) -> None:
    """Wait (up to 10 s, a guard against a hang) until no backend of ``pg_stat_activity``
    matches ``where``; ``what`` names the failure."""
    with admin() as watcher:
        deadline = time.monotonic() + 10
        while watcher.execute(f"SELECT count(*) FROM pg_stat_activity WHERE {where}", params).fetchone()[0]:  # type: ignore[index]
            assert time.monotonic() < deadline, what
            time.sleep(0.05)


@pytest.fixture
def proxy() -> Iterator[TcpProxy]:
    import psycopg

    port = int(psycopg.conninfo.conninfo_to_dict(POSTGRES_URL).get("port") or 5432)
    proxy = TcpProxy(port).accept()
    yield proxy
    proxy.close()


def through(proxy: TcpProxy, dsn: str, name: str) -> str:
    return f"{dsn} host=127.0.0.1 port={proxy.port} application_name={name}"


def run_behind_a_held_row(
    dsn: str, name: str, held: tuple[str, tuple[Any, ...]], *, first: Any, second: Any, what: str
) -> None:
    """Race ``first`` and ``second`` (callables run on the saver named ``name``) at one
    moment: an uncommitted row (``held``: an INSERT and its parameters) makes ``first``'s
    statement wait in the middle of its work; then ``second`` runs until it waits too (on a
    lock ``first`` holds) or ends; then the row is released and both finish."""
    import psycopg

    with psycopg.connect(dsn, autocommit=True) as holder, admin() as watcher:
        holder.execute("BEGIN")
        holder.execute(*held)
        runs = [threading.Thread(target=first), threading.Thread(target=second)]
        runs[0].start()
        deadline = time.monotonic() + 10
        while lock_waiters(watcher, name) < 1 and time.monotonic() < deadline:
            time.sleep(0.02)
        assert lock_waiters(watcher, name) == 1, f"{what} should be waiting on the held row"
        runs[1].start()
        deadline = time.monotonic() + 10
        while lock_waiters(watcher, name) < 2 and runs[1].is_alive() and time.monotonic() < deadline:
            time.sleep(0.02)
        holder.execute("ROLLBACK")
        for run in runs:
            run.join(10)


def lock_waiters(conn: Any, application_name: str) -> int:
    """How many backends of ``application_name`` are waiting for a lock."""
    row = conn.execute(
        "SELECT count(*) FROM pg_stat_activity WHERE application_name = %s AND wait_event_type = 'Lock'",
        (application_name,),
    ).fetchone()
    return int(row[0])


def checkpoints(dsn: str, thread_id: str) -> int:
    with open_checkpointer("postgres", dsn, settings=Settings()) as saver:
        return len(list(saver.list({"configurable": {"thread_id": thread_id}})))


def test_w4_terminated_backends_are_replaced_and_the_run_finishes(provider: Any) -> None:
    dsn = postgres_schema(uuid.uuid4().hex)
    name = f"tk-kill-{uuid.uuid4().hex[:8]}"
    with open_checkpointer("postgres", f"{dsn} application_name={name}", settings=FAST_RETRIES) as saver:
        graph = build_agent(saver)
        killed = 0
        for turn in range(3):
            graph.invoke(turn_input(turn), {"configurable": {"thread_id": "survivor"}})
            with admin() as conn:
                killed += conn.execute(
                    "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
                    "WHERE application_name = %s",
                    (name,),
                ).fetchone()[0]
        assert killed >= 3  # the saver's pooled connections really were killed between turns
        state = saver.get_tuple({"configurable": {"thread_id": "survivor"}})
        assert len(state.checkpoint["channel_values"]["messages"]) == 3 * MESSAGES_PER_TURN
    assert checkpoints(dsn, "survivor") == 3 * CHECKPOINTS_PER_TURN


def test_w4_a_connection_cut_inside_a_transaction_is_retried_whole(
    provider: Any, proxy: TcpProxy, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    from threadkeep.backends.postgres import engine as pg
    from threadkeep.backends.postgres import queries

    dsn = postgres_schema(uuid.uuid4().hex)
    cuts = {"left": 2}
    original = pg._send

    def cutting(conn: Any, statements: list[Any], prepare: Any) -> Any:
        # In the middle of a put's transaction, after its first round trip (BEGIN, the thread
        # locked), the network dies before the rows and the COMMIT go out.
        reply = original(conn, statements, prepare)
        if cuts["left"] and any(isinstance(s, pg.Sql) and s.sql == queries.LOCK_THREAD for s in statements):
            cuts["left"] -= 1
            proxy.cut()
        return reply

    monkeypatch.setattr(pg, "_send", cutting)
    caplog.set_level(logging.WARNING, logger="threadkeep.retry")
    with open_checkpointer("postgres", through(proxy, dsn, "tk-cut"), settings=FAST_RETRIES) as saver:
        run_turns(build_agent(saver), "cut", 2)
    assert cuts["left"] == 0
    assert sum("retrying" in record.message for record in caplog.records) >= 2
    assert checkpoints(dsn, "cut") == 2 * CHECKPOINTS_PER_TURN


def test_w4_postgres_refusing_connections_fails_the_run_and_leaves_nothing_half_written(
    provider: Any, proxy: TcpProxy
) -> None:
    dsn = postgres_schema(uuid.uuid4().hex)
    with open_checkpointer("postgres", through(proxy, dsn, "tk-down"), settings=FAST_RETRIES) as saver:
        graph = build_agent(saver)
        graph.invoke(turn_input(0), {"configurable": {"thread_id": "outage"}})
        stored = checkpoints(dsn, "outage")
        proxy.refuse()  # Postgres is gone for longer than the retries
        with pytest.raises(StorageError, match="unreachable after 3 attempts"):
            graph.invoke(turn_input(1), {"configurable": {"thread_id": "outage"}})
    # every checkpoint that was stored reads back whole, and none of the failed turn's exist
    with open_checkpointer("postgres", dsn, settings=Settings()) as direct:
        history = list(direct.list({"configurable": {"thread_id": "outage"}}))
        assert len(history) == stored == CHECKPOINTS_PER_TURN
        assert len(history[0].checkpoint["channel_values"]["messages"]) == MESSAGES_PER_TURN
        assert direct.stats("outage")["messages"] == MESSAGES_PER_TURN


# COMMAND_TIMEOUT_SECONDS at 2 s: a wait for a server that stopped answering gives up. The
# step deadline leaves room for every attempt, each a bound and a test of the idle
# connections (tests/faults/test_outages.py holds a step to its deadline).
MUTE_AFTER_2S = Settings(
    retry_backoff_seconds=0.05,
    pool_timeout_seconds=2,
    connect_timeout_seconds=2,
    command_timeout_seconds=2,
    step_deadline_seconds=60,
)


class Turns:
    """Turns of one thread run in a thread of their own, so that a hang fails the test
    instead of stopping it; for ``async``, all on one event loop (whose pool a fault hits).
    ``between`` runs after each turn but the last."""

    def __init__(self, graph: Any, thread_id: str, api: str, count: int, between: Callable[[], None]) -> None:
        self.finished = threading.Event()
        self.error: BaseException | None = None
        config: Any = {"configurable": {"thread_id": thread_id}}

        async def all_async() -> None:
            for turn in range(count):
                await graph.ainvoke(turn_input(turn), config)
                if turn < count - 1:
                    between()

        def run() -> None:
            try:
                if api == "sync":
                    for turn in range(count):
                        graph.invoke(turn_input(turn), config)
                        if turn < count - 1:
                            between()
                else:
                    asyncio.run(all_async())
            except BaseException as error:
                self.error = error
            self.finished.set()

        threading.Thread(target=run, daemon=True).start()

    def result(self, seconds: float, what: str) -> BaseException | None:
        """What the turns raised (None if they finished), failing if they took ``seconds``."""
        assert self.finished.wait(seconds), what
        return self.error


@pytest.mark.parametrize("api", ["sync", "async"])
def test_w4_a_connection_that_stops_answering_is_closed_and_the_step_retried(
    provider: Any, proxy: TcpProxy, api: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Every open connection goes mute (a load balancer or NAT that dropped them without a
    word; keepalives are not set): each wait gives up after COMMAND_TIMEOUT_SECONDS, closes
    its connection and the step is retried on a new one. Without the bound, the turn waits
    for ever."""
    dsn = postgres_schema(uuid.uuid4().hex)
    caplog.set_level(logging.WARNING, logger="threadkeep.retry")
    with open_checkpointer("postgres", through(proxy, dsn, "tk-mute"), settings=MUTE_AFTER_2S) as saver:
        turns = Turns(build_agent(saver), "mute", api, 2, proxy.stall)
        assert turns.result(60, "a mute connection held the turn") is None
    assert any("did not answer within 2 s" in record.message for record in caplog.records)
    assert checkpoints(dsn, "mute") == 2 * CHECKPOINTS_PER_TURN


def _children_of_local_postmaster(pids: list[int]) -> bool:
    """Whether every one of ``pids`` is a backend of the server under test, running on this
    machine (its postmaster's pid, from ``postmaster.pid`` in its data directory, is their
    parent): only then may the test stop them."""
    import os

    with admin() as conn:
        directory = conn.execute("SHOW data_directory").fetchone()[0]  # type: ignore[index]
    try:
        with open(os.path.join(directory, "postmaster.pid")) as pidfile:
            postmaster = int(pidfile.readline())
        parents = []
        for pid in pids:
            with open(f"/proc/{pid}/status") as status:
                parents += [int(line.split()[1]) for line in status if line.startswith("PPid:")]
    except (OSError, ValueError):
        return False
    return parents == [postmaster] * len(pids)


@pytest.mark.parametrize("api", ["sync", "async"])
def test_w4_a_stopped_backend_is_given_up_and_the_step_retried(provider: Any, api: str) -> None:
    """The saver's backends stop (SIGSTOP: alive to the kernel, which still acknowledges
    what is sent, so neither keepalives nor TCP timeouts see it): the next turn gives up
    on them and finishes on new ones, with every checkpoint."""
    import os
    import signal

    dsn = postgres_schema(uuid.uuid4().hex)
    name = f"tk-stop-{uuid.uuid4().hex[:8]}"
    stopped: list[int] = []
    guard = threading.Lock()
    cleaning = False

    def stop_its_backends() -> None:
        with admin() as conn:
            pids = [
                pid
                for (pid,) in conn.execute(
                    "SELECT pid FROM pg_stat_activity WHERE application_name = %s", (name,)
                ).fetchall()
            ]
        assert pids, "the saver has no connection to stop"
        assert _children_of_local_postmaster(pids), "Postgres must run here, as processes the test can signal"
        with guard:  # never stopped once the test cleans up: nothing would resume it
            if cleaning:
                return
            for pid in pids:
                os.kill(pid, signal.SIGSTOP)
                stopped.append(pid)

    try:
        with open_checkpointer("postgres", f"{dsn} application_name={name}", settings=MUTE_AFTER_2S) as saver:
            turns = Turns(build_agent(saver), "stopped", api, 2, stop_its_backends)
            assert turns.result(60, "a stopped backend held the turn") is None
            assert stopped
            state = saver.get_tuple({"configurable": {"thread_id": "stopped"}})
            assert len(state.checkpoint["channel_values"]["messages"]) == 2 * MESSAGES_PER_TURN
    finally:
        with guard:
            cleaning = True
            for pid in stopped:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGCONT)
    assert checkpoints(dsn, "stopped") == 2 * CHECKPOINTS_PER_TURN
    # resumed, the given-up backends find their client gone and end
    until_no_backend("pid = ANY(%s)", (stopped,), "a given-up connection was left open")


@pytest.mark.parametrize("api", ["sync", "async"])
def test_w4_postgres_answering_nothing_fails_the_run_and_leaves_nothing_half_written(
    provider: Any, proxy: TcpProxy, api: str
) -> None:
    """Open connections mute and new ones never let through, for longer than the retries:
    the turn fails with StorageError instead of waiting, and what was stored reads back."""
    dsn = postgres_schema(uuid.uuid4().hex)
    stored: list[int] = []

    def silence() -> None:
        stored.append(checkpoints(dsn, "silent"))
        proxy.hold()
        proxy.stall()

    with open_checkpointer("postgres", through(proxy, dsn, "tk-silent"), settings=MUTE_AFTER_2S) as saver:
        error = Turns(build_agent(saver), "silent", api, 2, silence).result(120, "the outage held the turn")
        proxy.release()
    assert isinstance(error, StorageError)
    assert "unreachable after 3 attempts" in str(error)
    with open_checkpointer("postgres", dsn, settings=Settings()) as direct:
        history = list(direct.list({"configurable": {"thread_id": "silent"}}))
        assert [len(history)] == stored == [CHECKPOINTS_PER_TURN]
        assert direct.stats("silent")["messages"] == MESSAGES_PER_TURN


@pytest.mark.parametrize("api", ["sync", "async"])
def test_w4_a_step_given_up_is_cancelled_on_the_server(provider: Any, api: str) -> None:
    """A turn whose put waits on a lock longer than the bound, at every try: the run fails,
    the given-up statements are cancelled on the server (none is left waiting on the lock,
    to commit once it is free), and once the lock goes nothing of the failed step appears."""
    import psycopg

    dsn = postgres_schema(uuid.uuid4().hex)
    name = f"tk-cancel-{uuid.uuid4().hex[:8]}"
    with open_checkpointer("postgres", f"{dsn} application_name={name}", settings=MUTE_AFTER_2S) as saver:
        graph = build_agent(saver)
        assert Turns(graph, "locked", api, 1, lambda: None).result(30, "the first turn hung") is None
        stored = checkpoints(dsn, "locked")
        with psycopg.connect(dsn, autocommit=True) as holder:
            holder.execute("BEGIN")
            holder.execute("SELECT 1 FROM tk_threads WHERE thread_id = 'locked' FOR UPDATE")
            error = Turns(graph, "locked", api, 1, lambda: None).result(120, "the locked turn hung")
            assert isinstance(error, StorageError)
            assert "a try got no answer" in str(error)
            until_no_backend(  # the tries' statements were cancelled, not left queued
                "application_name = %s AND wait_event_type = 'Lock'",
                (name,),
                "a given-up statement still waits on the lock",
            )
            holder.execute("COMMIT")
        time.sleep(0.5)  # what a left-over statement would commit, once the lock is free
    assert checkpoints(dsn, "locked") == stored


# A server (or role) whose default isolation is stricter than READ COMMITTED: the saver's
# transactions pin their own level, so the head read after the lock still sees the winner.
SERVER_DEFAULTS = {
    "read committed": "",
    "repeatable read": r"-c default_transaction_isolation=repeatable\ read",
}


@pytest.mark.parametrize("server_default", sorted(SERVER_DEFAULTS), ids=lambda level: level.replace(" ", "-"))
def test_w2_writers_queued_on_the_thread_lock_cannot_both_continue_the_head(
    provider: Any, server_default: str
) -> None:
    """Two puts continue the same head while a third party holds the thread's row lock: both
    wait, and when it is released the first to get the lock writes; the second must see that
    write and be refused (a head read in the statement that waited would still see the old one)."""
    import psycopg
    from langgraph.checkpoint.base import create_checkpoint, empty_checkpoint
    from psycopg.conninfo import conninfo_to_dict, make_conninfo

    dsn = postgres_schema(uuid.uuid4().hex)
    name = f"tk-queue-{uuid.uuid4().hex[:8]}"
    options = f"{conninfo_to_dict(dsn)['options']} {SERVER_DEFAULTS[server_default]}"
    saver_dsn = make_conninfo(dsn, options=options, application_name=name)
    with psycopg.connect(saver_dsn) as probe:
        assert probe.execute("SHOW default_transaction_isolation").fetchone() == (server_default,)
    with open_checkpointer("postgres", saver_dsn, settings=Settings()) as saver:
        start = {"configurable": {"thread_id": "queue", "checkpoint_ns": ""}}
        root = saver.put(start, empty_checkpoint(), {}, {})
        outcome: dict[int, Any] = {}

        def continue_head(racer: int) -> None:
            checkpoint = create_checkpoint(empty_checkpoint(), None, racer)
            try:
                outcome[racer] = saver.put(root, checkpoint, {"step": racer}, {})
            except Exception as error:
                outcome[racer] = error

        with psycopg.connect(dsn, autocommit=True) as holder:
            holder.execute("BEGIN")
            holder.execute("SELECT 1 FROM tk_threads WHERE thread_id = 'queue' FOR UPDATE")
            racers = [threading.Thread(target=continue_head, args=(racer,)) for racer in (1, 2)]
            for racer in racers:
                racer.start()
            with admin() as conn:
                deadline = time.monotonic() + 10
                while lock_waiters(conn, name) < 2 and time.monotonic() < deadline:
                    time.sleep(0.02)
                assert lock_waiters(conn, name) == 2, "both puts should be waiting for the thread's lock"
            holder.execute("COMMIT")
            for racer in racers:
                racer.join(10)

        stale = [error for error in outcome.values() if isinstance(error, StaleStateError)]
        won = [config for config in outcome.values() if isinstance(config, dict)]
        assert len(won) == 1, outcome
        assert len(stale) == 1, outcome
        assert stale[0].expected == root["configurable"]["checkpoint_id"]
        assert stale[0].current == won[0]["configurable"]["checkpoint_id"]
        assert len(list(saver.list({"configurable": {"thread_id": "queue"}}))) == 2


def test_deleting_a_run_while_a_put_reuses_its_values_keeps_the_values_the_put_needs(provider: Any) -> None:
    """A put continues a checkpoint of run ``r1`` and keeps its channel ``kept`` unchanged, so
    the new checkpoint refers to the value ``r1`` stored. ``delete_for_runs(["r1"])`` runs
    while that put is in flight: it must wait for the put and keep the value, not collect it
    as unreferenced from a snapshot that does not hold the new checkpoint yet."""
    from langgraph.checkpoint.base import empty_checkpoint

    # values too large to sit in their checkpoint's row: they are rows of tk_blobs
    kept, added = "from r1" * INLINE_VALUE_BYTES, "by r2" * INLINE_VALUE_BYTES

    dsn = postgres_schema(uuid.uuid4().hex)
    name = f"tk-runs-{uuid.uuid4().hex[:8]}"
    with open_checkpointer("postgres", f"{dsn} application_name={name}", settings=Settings()) as saver:
        start = {"configurable": {"thread_id": "runs", "checkpoint_ns": ""}}
        first = {
            **empty_checkpoint(),
            "channel_values": {"kept": kept},
            "channel_versions": {"kept": "1"},
        }
        config = saver.put(start, first, {"run_id": "r1"}, {"kept": "1"})
        second = {
            **empty_checkpoint(),
            "channel_values": {"kept": kept, "added": added},
            "channel_versions": {"kept": "1", "added": "2"},
        }
        outcome: dict[str, Any] = {}

        def put() -> None:
            outcome["put"] = saver.put(config, second, {"run_id": "r2"}, {"added": "2"})

        def delete() -> None:
            saver.delete_for_runs(["r1"])
            outcome["deleted"] = True

        # The put's value insert waits on an uncommitted row of the same key: the put is then
        # in flight, holding the thread's lock, its checkpoint not committed.
        held = (
            "INSERT INTO tk_blobs (tid, checkpoint_ns, channel, version, type, value) "
            "SELECT tid, '', 'added', '2', 'held', '' FROM tk_threads WHERE thread_id = 'runs'",
            (),
        )
        run_behind_a_held_row(dsn, name, held, first=put, second=delete, what="the put")

        assert outcome.get("deleted"), outcome
        assert "put" in outcome, outcome
        head = saver.get_tuple({"configurable": {"thread_id": "runs"}})
        assert head.checkpoint["id"] == second["id"]
        assert head.checkpoint["channel_values"] == {"kept": kept, "added": added}
        assert [t.checkpoint["id"] for t in saver.list(start)] == [second["id"]]


def test_writes_that_race_a_delete_of_their_thread_leave_no_rows_behind(provider: Any) -> None:
    """A task's writes are in flight (their insert waits on a row another transaction holds)
    when the thread is deleted. They must either land before the delete, and go with the
    thread, or find the thread gone: never stay behind as rows no thread owns (SPEC SW5)."""
    from langgraph.checkpoint.base import empty_checkpoint

    dsn = postgres_schema(uuid.uuid4().hex)
    name = f"tk-orphan-{uuid.uuid4().hex[:8]}"
    with open_checkpointer("postgres", f"{dsn} application_name={name}", settings=Settings()) as saver:
        start = {"configurable": {"thread_id": "doomed", "checkpoint_ns": ""}}
        config = saver.put(start, empty_checkpoint(), {}, {})
        checkpoint_id = config["configurable"]["checkpoint_id"]
        outcome: dict[str, Any] = {}

        def put_writes() -> None:
            saver.put_writes(config, [("messages", "late")], "task-1")
            outcome["written"] = True

        def delete() -> None:
            saver.delete_thread("doomed")
            outcome["deleted"] = True

        held = (
            "INSERT INTO tk_writes (tid, checkpoint_ns, checkpoint_id, task_id, idx, task_path, "
            "channel, type, value) SELECT tid, '', %s, 'task-1', 0, '', 'messages', 'held', '' "
            "FROM tk_threads WHERE thread_id = 'doomed'",
            (checkpoint_id,),
        )
        run_behind_a_held_row(dsn, name, held, first=put_writes, second=delete, what="the writes")
        assert outcome == {"written": True, "deleted": True}
        with admin() as watcher:
            schema = conninfo_schema(dsn)
            orphans = watcher.execute(
                f"SELECT (SELECT count(*) FROM {schema}.tk_writes), "
                f"(SELECT count(*) FROM {schema}.tk_threads)"
            ).fetchone()
        assert orphans == (0, 0)
        assert saver.get_tuple({"configurable": {"thread_id": "doomed"}}) is None


def conninfo_schema(dsn: str) -> str:
    """The schema a test DSN's search_path names."""
    from psycopg.conninfo import conninfo_to_dict

    return str(conninfo_to_dict(dsn)["options"]).split("search_path=")[1].split()[0]


def test_a_copy_is_whole_while_the_source_is_pruned(provider: Any) -> None:
    """``copy_thread`` copies the source's checkpoints, then their channel values, in one
    transaction. A prune of the source that commits between the two must not leave the copy
    with a checkpoint whose values are gone: the copy holds the source still."""
    from langgraph.checkpoint.base import empty_checkpoint

    dsn = postgres_schema(uuid.uuid4().hex)
    name = f"tk-copy-{uuid.uuid4().hex[:8]}"
    with open_checkpointer("postgres", f"{dsn} application_name={name}", settings=Settings()) as saver:
        source = {"configurable": {"thread_id": "source", "checkpoint_ns": ""}}
        first = {**empty_checkpoint(), "channel_values": {"x": "v1"}, "channel_versions": {"x": "1"}}
        first_config = saver.put(source, first, {}, {"x": "1"})
        second = {**empty_checkpoint(), "channel_values": {"x": "v2"}, "channel_versions": {"x": "2"}}
        saver.put(first_config, second, {}, {"x": "2"})
        saver.put({"configurable": {"thread_id": "target", "checkpoint_ns": ""}}, empty_checkpoint(), {}, {})
        outcome: dict[str, Any] = {}

        def copy() -> None:
            saver.copy_thread("source", "target")
            outcome["copied"] = True

        def prune() -> None:
            saver.prune(["source"], strategy="keep_latest")
            outcome["pruned"] = True

        # The copy's checkpoint insert waits on an uncommitted row of the same key.
        held = (
            "INSERT INTO tk_checkpoints (tid, checkpoint_ns, checkpoint_id, created_at, checkpoint, "
            "metadata) SELECT tid, '', %s, 0, '{}', '{}' FROM tk_threads WHERE thread_id = 'target'",
            (first["id"],),
        )
        run_behind_a_held_row(dsn, name, held, first=copy, second=prune, what="the copy")

        assert outcome == {"copied": True, "pruned": True}
        target = {"configurable": {"thread_id": "target", "checkpoint_ns": ""}}
        copied = {t.checkpoint["id"]: t.checkpoint["channel_values"] for t in saver.list(target)}
        assert copied[first["id"]] == {"x": "v1"}
        assert copied[second["id"]] == {"x": "v2"}
        assert [t.checkpoint["id"] for t in saver.list(source)] == [second["id"]]


@pytest.mark.parametrize("api", ["sync", "async"])
def test_p7_close_does_not_wait_for_a_pool_another_thread_is_opening(
    provider: Any, proxy: TcpProxy, api: str
) -> None:
    """A saver closed while another thread's first call is opening its pool (a server slow
    to answer) closes at once; the pool, once open, is closed by its opener, not published,
    and that call is refused as any call on a closed saver is."""
    name = f"tk_closing_{uuid.uuid4().hex[:6]}"
    settings = Settings(pool_min_size=1, pool_timeout_seconds=30, connect_timeout_seconds=30)
    saver = open_checkpointer("postgres", through(proxy, postgres_schema(name), name), settings=settings)
    engine = saver.backend.engine
    config: Any = {"configurable": {"thread_id": "t"}}
    proxy.hold()  # the schema is set up: only the pool's connection waits
    refused: list[BaseException] = []

    def first_call() -> None:
        try:
            if api == "sync":
                saver.get_tuple(config)
            else:
                asyncio.run(saver.aget_tuple(config))
        except BaseException as error:
            refused.append(error)

    caller = threading.Thread(target=first_call)
    try:
        caller.start()
        assert proxy.holding.wait(10), "the first call's pool never connected"
        closer = threading.Thread(target=saver.close)
        closer.start()
        closer.join(10)  # a guard against a hang only: the pool would wait 30 s for its connection
        assert not closer.is_alive(), "close() waited for the pool another thread is opening"
        assert caller.is_alive()  # its pool is still opening
    finally:
        proxy.release()  # the pool now opens
    caller.join(30)
    assert not caller.is_alive()
    (error,) = refused
    assert isinstance(error, StorageError)
    assert "is closed" in str(error)
    assert engine._pool is None
    assert not engine._async_pools
    # the pool that opened was closed: none of its connections stays
    until_no_backend("application_name = %s", (name,), "the pool opened after close() was left open")


def test_w4_the_sweep_is_not_cut_short_by_the_command_timeout(provider: Any) -> None:
    """The sweep's round trips may be long (the rows of a page of threads deleted at once, a
    lock to wait for) and nobody waits on them: they run without the command timeout, where
    a call with the same bound gives up."""
    import psycopg

    from tests.retention.test_retention import Clock, write
    from threadkeep import sweep_checkpoints

    dsn = postgres_schema(uuid.uuid4().hex)
    clock = Clock()
    settings = Settings(
        retention_waiting_minutes=600,
        retention_finished_minutes=60,
        retry_attempts=2,  # 2 tries of 1 s each: the lock below outlasts them
        retry_backoff_seconds=0.05,
        command_timeout_seconds=1,
    )
    with open_checkpointer("postgres", dsn, settings=settings, clock=clock) as saver:
        for thread in ("done", "busy"):
            write(saver, thread)
        saver.mark_finished(["done"])
        clock.advance(61)
        with psycopg.connect(dsn, autocommit=True) as holder:
            holder.execute("BEGIN")
            holder.execute("SELECT 1 FROM tk_threads WHERE thread_id IN ('done', 'busy') FOR UPDATE")
            with pytest.raises(StorageError, match="did not answer within 1 s"):
                saver.delete_thread("busy")  # a call: bounded
            release = threading.Timer(3.5, holder.execute, ("COMMIT",))
            release.start()
            try:
                result = sweep_checkpoints(saver)  # waits 3.5 s for the lock, past every try's bound
            finally:
                release.join()
        assert result.finished_swept == 1
        assert saver.get_tuple({"configurable": {"thread_id": "done"}}) is None
        assert saver.get_tuple({"configurable": {"thread_id": "busy"}}) is not None


@pytest.mark.parametrize("case", ["one statement", "with its commit", "in its transaction"])
@pytest.mark.parametrize("api", ["sync", "async"])
def test_w4_a_step_whose_connection_died_unanswered_says_what_became_of_it(
    provider: Any, proxy: TcpProxy, api: str, case: str
) -> None:
    """A put's round trip reaches the server, its answer is lost, then its connection dies
    (a plain connection error, well within the command timeout) and Postgres refuses
    connections for the tries left. A round trip that commits (a put as one statement; one
    whose statements go between BEGIN and COMMIT, under a history limit) was stored, so the
    final StorageError must not say that nothing of it was; a put whose connection died
    while its transaction was still open (a thread's first put: its rows and COMMIT were
    never sent) stored nothing, and says so. Sync, and async (where a put as one round trip
    goes in a shared pipeline)."""
    import psycopg
    from langgraph.checkpoint.base import empty_checkpoint

    dsn = postgres_schema(uuid.uuid4().hex)
    settings = Settings(
        retry_backoff_seconds=0.05,
        pool_timeout_seconds=1,
        connect_timeout_seconds=1,
        retry_attempts=2,
        state_history_limit=5 if case == "with its commit" else None,
    )
    metadata: Any = {"source": "loop", "step": 0}
    first, lost = empty_checkpoint(), empty_checkpoint()
    warm: Any = {"configurable": {"thread_id": "t", "checkpoint_ns": ""}}
    thread: Any = {
        "configurable": {"thread_id": "t" if case != "in its transaction" else "new", "checkpoint_ns": ""}
    }
    parent = {"checkpoint_id": first["id"]} if case != "in its transaction" else {}
    config: Any = {"configurable": {**thread["configurable"], **parent}}
    arrived = (
        ("SELECT count(*) FROM tk_checkpoints WHERE checkpoint_id = %s", (lost["id"],))
        if case != "in its transaction"
        else (
            "SELECT count(*) FROM pg_stat_activity"
            " WHERE application_name = %s AND state = 'idle in transaction'",
            ("tk-lost",),
        )
    )
    problems: list[str] = []

    def refuse_once_arrived() -> None:  # the lost put's answer never comes: cut it off
        with psycopg.connect(dsn, autocommit=True) as watcher:
            deadline = time.monotonic() + 10
            while not watcher.execute(*arrived).fetchone()[0]:  # type: ignore[index]
                if time.monotonic() > deadline:
                    problems.append("the put never reached the server")
                    break
                time.sleep(0.02)
        proxy.refuse()

    cutter = threading.Thread(target=refuse_once_arrived, daemon=True)
    with open_checkpointer("postgres", through(proxy, dsn, "tk-lost"), settings=settings) as saver:
        saver.put(warm, first, metadata, {})  # thread t exists: a put on it continues its head

        async def put_async() -> None:
            await saver.aget_tuple(warm)  # this loop's pool, open
            proxy.mute_replies()
            cutter.start()
            await saver.aput(config, lost, metadata, {})

        def put_sync() -> None:
            proxy.mute_replies()
            cutter.start()
            saver.put(config, lost, metadata, {})

        put = (lambda: asyncio.run(put_async())) if api == "async" else put_sync
        with pytest.raises(StorageError, match="unreachable after 2 attempts") as failed:
            put()
        cutter.join(15)
        assert not problems
        if case == "one statement":  # a put that finds no connection at all stored nothing
            again = empty_checkpoint()
            put_again = (
                (lambda: asyncio.run(saver.aput(config, again, metadata, {})))
                if api == "async"
                else (lambda: saver.put(config, again, metadata, {}))
            )
            with pytest.raises(StorageError, match="nothing of this step was stored"):
                put_again()
    with open_checkpointer("postgres", dsn, settings=Settings()) as direct:
        stored = direct.get_tuple(thread)
    if case == "in its transaction":
        assert "nothing of this step was stored" in str(failed.value)
        assert stored is None  # rolled back with its connection
    else:
        assert "nothing of this step was stored" not in str(failed.value)
        assert "may have run it" in str(failed.value)
        assert stored is not None
        assert stored.checkpoint["id"] == lost["id"]  # it was stored


# A thread id the server refuses: a trigger raises for it when its thread row is inserted,
# the first statement of its first write, so the rest of that round trip (statements due to
# be prepared among them) is skipped. With program_limit_exceeded, an "index row too big"'s
# SQLSTATE; it holds whatever ids the saver refuses before they reach the server.
POISON = """
CREATE FUNCTION tk_poison() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.thread_id LIKE 'poison-%' THEN
        RAISE EXCEPTION 'poisoned thread id %', NEW.thread_id USING ERRCODE = 'program_limit_exceeded';
    END IF;
    RETURN NEW;
END $$;
CREATE TRIGGER tk_poison BEFORE INSERT ON tk_threads FOR EACH ROW EXECUTE FUNCTION tk_poison();
"""
# Long enough for a good call on a busy host; a call waiting on a held lock gives up after it.
MIXED = Settings(
    retry_backoff_seconds=0.05,
    pool_min_size=1,
    pool_max_size=2,
    command_timeout_seconds=1,
    pool_timeout_seconds=5,
)


def _mixed_round(r: int) -> list[str]:
    """What round ``r`` of the mixed calls runs, besides its good call."""
    kinds = ["bad"]
    if r % 5 == 0:
        kinds.append("too long")  # an id too long for the thread index (or refused up front)
    if r % 3 == 0:
        kinds.append("racing")
    if r % 4 == 1:
        kinds.append("cancelled")
    if r in (10, 30):
        kinds.append("timed out")
    return kinds


def _too_long_id() -> str:
    import random
    import string

    return "".join(random.choices(string.ascii_letters, k=20_000))  # incompressible


@pytest.mark.parametrize("api", ["sync", "async"])
def test_w4_failed_cancelled_timed_out_and_racing_calls_fail_no_call_after_them(
    provider: Any, api: str, caplog: pytest.LogCaptureFixture
) -> None:
    """W4: a few hundred calls on one saver, good ones among calls whose statements the server
    refuses (some of them mid-round-trip, before statements due to be prepared), calls
    cancelled mid-call (async), calls given up after the command timeout on a held lock, and
    double-submits (two runs of one thread at once): every good call, during and after them,
    succeeds, by this user and another."""
    import psycopg

    from threadkeep import ThreadkeepError, user_scope

    dsn = postgres_schema(uuid.uuid4().hex)
    name = f"tk-mixed-{uuid.uuid4().hex[:8]}"
    caplog.set_level(logging.INFO)
    outcomes: dict[str, list[Any]] = {"good": [], "after": []}
    rounds = 60

    def config(thread_id: str) -> Any:
        return {"configurable": {"thread_id": thread_id}}

    def kept(kind: str, outcome: Any) -> None:
        outcomes.setdefault(kind, []).append(outcome)

    with open_checkpointer("postgres", f"{dsn} application_name={name}", settings=MIXED) as saver:
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(POISON)
        build_agent(saver).invoke(turn_input(0), config("held"))

        @contextlib.contextmanager
        def held() -> Iterator[None]:
            """The thread 'held''s row locked by another connection meanwhile."""
            with psycopg.connect(dsn, autocommit=True) as holder:
                holder.execute("BEGIN")
                holder.execute("SELECT 1 FROM tk_threads WHERE thread_id = 'held' FOR UPDATE")
                yield
                holder.execute("ROLLBACK")

        # A graph per call: its fake model's script is a generator that two runs at once
        # (their nodes in threads) would step together. A call on the held thread runs with
        # durability "sync": it is given up at its first step that waits on the lock (each
        # try cut at the command timeout), where LangGraph's default would go on to give up
        # every later put of the turn in turn, some 3 s each.
        def call(thread_id: str, durability: Durability | None = None) -> Any:
            try:
                return build_agent(saver).invoke(turn_input(0), config(thread_id), durability=durability)
            except ThreadkeepError as error:
                return error

        async def acall(thread_id: str, durability: Durability | None = None) -> Any:
            try:
                graph = build_agent(saver)
                return await graph.ainvoke(turn_input(0), config(thread_id), durability=durability)
            except ThreadkeepError as error:
                return error

        async def cancelled(thread_id: str, steps: int | None) -> Any:
            task = asyncio.create_task(acall(thread_id))
            if steps is None:  # cancelled while its statement waits on the held row
                with admin() as watcher:
                    while lock_waiters(watcher, name) < 1 and not task.done():  # noqa: ASYNC110
                        await asyncio.sleep(0.01)
            else:  # cancelled at some step of its run
                for _ in range(steps):
                    await asyncio.sleep(0)
            task.cancel()
            return (await asyncio.gather(task, return_exceptions=True))[0]

        def mixed_sync() -> None:
            for r in range(rounds):
                kinds = _mixed_round(r)
                kept("bad", call(f"poison-{r}"))
                if "too long" in kinds:
                    kept("too long", call(_too_long_id()))
                if "racing" in kinds:
                    with concurrent.futures.ThreadPoolExecutor(2) as pool:
                        kept("racing", list(pool.map(call, [f"race-{r}"] * 2)))
                if "timed out" in kinds:
                    with held():
                        kept("timed out", call("held", "sync"))
                outcomes["good"].append(call(f"good-{r}"))
            with user_scope("bob"):
                outcomes["after"] = [call(f"after-{k}") for k in range(40)]

        async def mixed_async() -> None:
            for r in range(rounds):
                kinds = _mixed_round(r)
                kept("bad", await acall(f"poison-{r}"))
                if "too long" in kinds:
                    kept("too long", await acall(_too_long_id()))
                if "racing" in kinds:
                    kept("racing", await asyncio.gather(acall(f"race-{r}"), acall(f"race-{r}")))
                if "cancelled" in kinds:
                    kept("cancelled", await cancelled(f"cancel-{r}", r * 7 % 40))
                if "timed out" in kinds:
                    with held():
                        kept("timed out", await acall("held", "sync"))
                        kept("cancelled", await cancelled("held", None))
                good, bad = await asyncio.gather(acall(f"good-{r}"), acall(f"poison-x{r}"))
                outcomes["good"].append(good)
                kept("bad", bad)
            with user_scope("bob"):
                outcomes["after"] = list(await asyncio.gather(*(acall(f"after-{k}") for k in range(40))))

        if api == "sync":
            mixed_sync()
        else:
            asyncio.run(mixed_async())

    failed = [o for kind in ("good", "after") for o in outcomes[kind] if isinstance(o, BaseException)]
    assert failed == [], f"{len(failed)} good calls failed, the first: {failed[:1]}"
    assert all(isinstance(o, ThreadkeepError) for o in outcomes["bad"] + outcomes["too long"])
    assert all(isinstance(o, StorageError) for o in outcomes["timed out"])
    for pair in outcomes.get("racing", []):  # each run stored, or refused as stale
        assert all(isinstance(o, (dict, StaleStateError)) for o in pair), pair
    calls = sum(len(v) for v in outcomes.values()) + len(outcomes.get("racing", []))
    assert calls >= 200


def cfg(thread_id: str) -> Any:
    return {"configurable": {"thread_id": thread_id, "checkpoint_ns": ""}}


def _backends(name: str) -> list[int]:
    with admin() as conn:
        rows = conn.execute(
            "SELECT pid FROM pg_stat_activity WHERE application_name = %s", (name,)
        ).fetchall()
    return sorted(pid for (pid,) in rows)


def test_w4_a_busy_pool_keeps_its_connections(provider: Any) -> None:
    """A step that waits in vain for a free connection (the pool's one connection is held by
    a put queued on a lock) fails or retries, but the pool keeps its healthy connection: a
    busy pool is not a lost one, and is not replaced."""
    import psycopg
    from langgraph.checkpoint.base import empty_checkpoint

    dsn = postgres_schema(uuid.uuid4().hex)
    name = f"tk-busy-{uuid.uuid4().hex[:8]}"
    settings = Settings(
        pool_min_size=1,
        pool_max_size=1,
        pool_timeout_seconds=1,
        retry_backoff_seconds=0.05,
        step_deadline_seconds=3,
    )
    with open_checkpointer("postgres", f"{dsn} application_name={name}", settings=settings) as saver:
        config = saver.put(cfg("busy"), empty_checkpoint(), {"source": "input", "step": -1}, {})
        before = _backends(name)
        with psycopg.connect(dsn, autocommit=True) as holder:
            holder.execute("BEGIN")
            holder.execute("SELECT 1 FROM tk_threads WHERE thread_id = 'busy' FOR UPDATE")
            queued = concurrent.futures.ThreadPoolExecutor(1).submit(
                saver.put, config, empty_checkpoint(), {"source": "loop", "step": 0}, {}
            )
            time.sleep(0.3)
            with pytest.raises(StorageError):
                saver.get_tuple(cfg("other"))  # no connection to be had within the deadline
            holder.execute("COMMIT")
        queued.result(10)
        assert saver.get_tuple(cfg("busy")) is not None
        assert _backends(name) == before


def test_p6_an_open_waits_for_another_openers_migrations_past_the_command_timeout(provider: Any) -> None:
    """Opening a store waits for the schema lock another opener holds (migrating a large
    store) as long as it takes, not COMMAND_TIMEOUT_SECONDS: migrations run unbounded."""
    dsn = postgres_schema(uuid.uuid4().hex)
    settings = Settings(command_timeout_seconds=1, retry_backoff_seconds=0.05)
    with admin() as holder:
        holder.execute("SELECT pg_advisory_lock(7446327318420116991)")  # queries.LOCK_SCHEMA's key
        opening = concurrent.futures.ThreadPoolExecutor(1).submit(
            open_checkpointer, "postgres", dsn, settings=settings
        )
        time.sleep(6)  # longer than its three tries would take, were each cut at 1 s
        assert not opening.done()
        holder.execute("SELECT pg_advisory_unlock(7446327318420116991)")
    with opening.result(10) as saver:
        assert saver.get_tuple(cfg("nothing")) is None


def test_w4_a_try_given_up_is_closed_and_its_statement_cancelled(provider: Any) -> None:
    """A try that outlives its bound fails with NoAnswer, its connection closed (never lent
    again), and the statement it ran is cancelled on the server."""
    import psycopg

    from threadkeep.backends.postgres.bound import NoAnswer, bounded

    name = f"tk-given-up-{uuid.uuid4().hex[:8]}"
    with psycopg.connect(f"{POSTGRES_URL} application_name={name}", autocommit=True) as conn:
        with pytest.raises(NoAnswer, match=r"did not answer within 0\.3 s"), bounded(conn, 0.3):
            conn.execute("SELECT pg_sleep(30)")
        assert conn.closed
    until_no_backend(
        "application_name = %s AND state = 'active'", (name,), "the given-up statement still runs"
    )
