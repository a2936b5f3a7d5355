"""SV3 (this issue's part): the CLI, driven in-process with click's runner."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest
from click.testing import CliRunner

from threadkeep import Settings, open_checkpointer
from threadkeep.cli import main


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


def test_sv3_a_bad_setting_is_one_clear_line_and_exit_1(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LLM_PROVIDER_CHECKPOINT_TTL_MINUTES", "60")
    result = CliRunner().invoke(main, ["store", "check"])
    assert result.exit_code == 1
    assert "LLM_PROVIDER_CHECKPOINT_TTL_MINUTES" in result.output
