"""SPEC W4 on a real Postgres: killed connections are retried; an outage fails the run visibly
and leaves nothing half-written."""

from __future__ import annotations

import logging
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from tests.providers import POSTGRES_URL, postgres_schema
from tests.servers import TcpProxy
from threadkeep import Settings, StorageError, open_checkpointer
from threadkeep.workload import TOOL_ROUND_TRIPS, build_agent, run_turns, turn_input

pytestmark = [pytest.mark.providers("postgres"), pytest.mark.slow]
MESSAGES_PER_TURN = 2 + 2 * TOOL_ROUND_TRIPS
CHECKPOINTS_PER_TURN = MESSAGES_PER_TURN + 1
FAST_RETRIES = Settings(retry_backoff_seconds=0.05, pool_timeout_seconds=1, connect_timeout_seconds=1)


def admin() -> Any:
    import psycopg

    return psycopg.connect(POSTGRES_URL, autocommit=True)


@pytest.fixture
def proxy() -> Iterator[TcpProxy]:
    import psycopg

    port = int(psycopg.conninfo.conninfo_to_dict(POSTGRES_URL).get("port") or 5432)
    proxy = TcpProxy(port).accept()
    yield proxy
    proxy.close()


def through(proxy: TcpProxy, dsn: str, name: str) -> str:
    return f"{dsn} host=127.0.0.1 port={proxy.port} application_name={name}"


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

    dsn = postgres_schema(uuid.uuid4().hex)
    cuts = {"left": 2}
    original = pg._send

    def cutting(conn: Any, statements: list[Any], prepare: Any) -> Any:
        # In the middle of a put's transaction, after its first round trip (BEGIN, the thread
        # locked), the network dies before the rows and the COMMIT go out.
        reply = original(conn, statements, prepare)
        if cuts["left"] and any(isinstance(s, pg.Sql) and "FOR UPDATE OF t" in s.sql for s in statements):
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
