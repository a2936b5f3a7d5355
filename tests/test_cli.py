"""SV3 (this issue's part): the CLI, driven in-process with click's runner."""

from __future__ import annotations

import sqlite3
import uuid
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from threadkeep import ConfigurationError, Settings, open_checkpointer
from threadkeep.cli import main
from threadkeep.workload import build_agent, run_turns

LANGGRAPH_SQLITE_TABLES = ("checkpoints", "writes")
LANGGRAPH_POSTGRES_TABLES = ("checkpoint_migrations", "checkpoints", "checkpoint_blobs", "checkpoint_writes")


@pytest.fixture
def store_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = tmp_path / "cli.sqlite"
    monkeypatch.setenv("LLM_PROVIDER_CHECKPOINT", "sqlite")
    monkeypatch.setenv("LLM_PROVIDER_CHECKPOINT_CONN_STRING", str(path))
    return path


def test_sv3_demo_runs_on_the_configured_store_and_compares_sizes(store_path: Path) -> None:
    result = CliRunner().invoke(main, ["demo", "--turns", "3"])
    assert result.exit_code == 0, result.output
    assert f"store: sqlite at {store_path}" in result.output
    assert "27 checkpoints" in result.output
    assert "LangGraph SqliteSaver" in result.output
    assert "x more)" in result.output
    with open_checkpointer(settings=Settings.from_env()) as saver:
        assert saver.stats()["threads"] == 1


def test_issue37_demo_shows_a_rollback_and_a_resumed_turn_that_pays_once(store_path: Path) -> None:
    result = CliRunner().invoke(main, ["demo", "--turns", "1"])
    assert result.exit_code == 0, result.output
    assert "turn 1, attempt 1: TimeoutError: the card processor did not answer" in result.output
    assert "rolled back to the decision before the call" in result.output
    assert "turn 1, attempt 2: Paid: receipt 1 for 500." in result.output
    assert "turn 2 resumed (has_resumable_turn: True): Paid: receipt 2 for 500." in result.output
    assert "the card processor charged 2 time(s)" in result.output


def test_sv3_store_check_reports_a_ready_store(store_path: Path) -> None:
    CliRunner().invoke(main, ["demo", "--turns", "1"])
    result = CliRunner().invoke(main, ["store", "check"])
    assert result.exit_code == 0, result.output
    assert "ready" in result.output
    assert "checkpoints:" in result.output


def test_sv3_store_check_and_reset_of_a_store_in_another_format(store_path: Path) -> None:
    open_checkpointer(settings=Settings.from_env()).close()
    conn = sqlite3.connect(store_path)
    conn.execute("UPDATE tk_meta SET value = '999' WHERE key = 'format_generation'")
    conn.commit()
    conn.close()

    checked = CliRunner().invoke(main, ["store", "check", "--json"])
    assert checked.exit_code == 3
    assert '"ready": false' in checked.output
    assert "threadkeep store reset" in checked.output

    refused = CliRunner().invoke(main, ["demo", "--turns", "1"])
    assert refused.exit_code == 3
    assert "reset the checkpoint store" in refused.output

    declined = CliRunner().invoke(main, ["store", "reset"], input="n\n")
    assert declined.exit_code == 1
    assert CliRunner().invoke(main, ["store", "check"]).exit_code == 3

    reset = CliRunner().invoke(main, ["store", "reset", "--yes"])
    assert reset.exit_code == 0, reset.output
    assert CliRunner().invoke(main, ["store", "check"]).exit_code == 0
    assert CliRunner().invoke(main, ["demo", "--turns", "1"]).exit_code == 0


def test_sv3_a_bad_setting_is_one_clear_line_and_exit_2(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LLM_PROVIDER_CHECKPOINT_TTL_MINUTES", "60")
    result = CliRunner().invoke(main, ["store", "check"])
    assert result.exit_code == 2  # invalid input: the usage code the help promises
    assert "LLM_PROVIDER_CHECKPOINT_TTL_MINUTES" in result.output


# --- reset touches threadkeep's own tables only (issue 36 item 5) -------------------------------


def _rows(conn: Any, tables: tuple[str, ...]) -> dict[str, list[Any]]:
    """Every row of ``tables``, in a stable order, to compare before and after."""
    return {table: sorted(map(repr, conn.execute(f"SELECT * FROM {table}").fetchall())) for table in tables}


def test_store_reset_keeps_langgraph_sqlite_saver_tables_in_the_same_file(store_path: Path) -> None:
    from langgraph.checkpoint.sqlite import SqliteSaver

    with open_checkpointer(settings=Settings.from_env()) as saver:
        run_turns(build_agent(saver), "ours", 2)
    conn = sqlite3.connect(store_path, check_same_thread=False)
    theirs = SqliteSaver(conn)
    for thread in ("theirs-1", "theirs-2"):
        run_turns(build_agent(theirs), thread, 3)
    before = _rows(conn, LANGGRAPH_SQLITE_TABLES)
    assert len(before["checkpoints"]) == 54
    assert before["writes"]

    reset = CliRunner().invoke(main, ["store", "reset", "--yes"])
    assert reset.exit_code == 0, reset.output

    assert _rows(conn, LANGGRAPH_SQLITE_TABLES) == before
    assert len(list(theirs.list({"configurable": {"thread_id": "theirs-1"}}))) == 27
    tables = {row[0] for row in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    assert tables == set(LANGGRAPH_SQLITE_TABLES)
    conn.close()
    # and threadkeep starts afresh beside them
    assert CliRunner().invoke(main, ["store", "check"]).exit_code == 0


@pytest.mark.postgres
def test_store_reset_keeps_langgraph_postgres_saver_tables_in_the_same_schema(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import psycopg
    from langgraph.checkpoint.postgres import PostgresSaver

    from tests.providers import CASES, postgres_probe, postgres_schema, require

    require(CASES["postgres"], postgres_probe())
    dsn = postgres_schema(uuid.uuid4().hex)
    monkeypatch.setenv("LLM_PROVIDER_CHECKPOINT", "postgres")
    monkeypatch.setenv("LLM_PROVIDER_CHECKPOINT_CONN_STRING", dsn)
    with open_checkpointer(settings=Settings.from_env()) as saver:
        run_turns(build_agent(saver), "ours", 2)
    with PostgresSaver.from_conn_string(dsn) as theirs:
        theirs.setup()
        for thread in ("theirs-1", "theirs-2"):
            run_turns(build_agent(theirs), thread, 3)
    with psycopg.connect(dsn, autocommit=True) as conn:
        before = _rows(conn, LANGGRAPH_POSTGRES_TABLES)
    assert len(before["checkpoints"]) == 54
    assert before["checkpoint_writes"]

    reset = CliRunner().invoke(main, ["store", "reset", "--yes"])
    assert reset.exit_code == 0, reset.output

    with psycopg.connect(dsn, autocommit=True) as conn:
        assert _rows(conn, LANGGRAPH_POSTGRES_TABLES) == before
        tables = {
            row[0]
            for row in conn.execute("SELECT tablename FROM pg_tables WHERE schemaname = current_schema()")
        }
        functions = conn.execute(
            "SELECT count(*) FROM pg_proc WHERE pronamespace = current_schema()::regnamespace"
        ).fetchone()
    assert tables == set(LANGGRAPH_POSTGRES_TABLES)
    assert functions == (0,)
    with PostgresSaver.from_conn_string(dsn) as theirs:
        assert len(list(theirs.list({"configurable": {"thread_id": "theirs-2"}}))) == 27


def test_a_postgres_store_without_a_connection_string_is_refused_naming_the_setting(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for variable in ("LLM_PROVIDER_CHECKPOINT_CONN_STRING", "DATABASE_URL", "PGDATABASE", "PGUSER"):
        monkeypatch.delenv(variable, raising=False)
    monkeypatch.setenv("LLM_PROVIDER_CHECKPOINT", "postgres")
    # Should libpq's defaults be used after all, they lead nowhere (port 1 refuses at once),
    # never to a real database on this machine; and the attempt is short.
    monkeypatch.setenv("PGHOST", "127.0.0.1")
    monkeypatch.setenv("PGPORT", "1")
    quick = {"retry_attempts": 1, "pool_timeout_seconds": 2, "connect_timeout_seconds": 2}
    for provider in ("postgres", "tiered"):
        settings = Settings.from_env().with_values(cache_url="redis://127.0.0.1:1/0", **quick)
        with pytest.raises(ConfigurationError) as refused:
            open_checkpointer(provider, settings=settings)
        assert type(refused.value) is ConfigurationError
        assert "LLM_PROVIDER_CHECKPOINT_CONN_STRING (or DATABASE_URL)" in refused.value.message
        assert refused.value.context["variable"] == "LLM_PROVIDER_CHECKPOINT_CONN_STRING"
    monkeypatch.setenv("LLM_PROVIDER_CHECKPOINT_POOL_TIMEOUT_SECONDS", "2")
    monkeypatch.setenv("LLM_PROVIDER_CHECKPOINT_RETRY_ATTEMPTS", "1")
    checked = CliRunner().invoke(main, ["store", "check"])
    assert checked.exit_code == 2
    assert "LLM_PROVIDER_CHECKPOINT_CONN_STRING" in checked.output
