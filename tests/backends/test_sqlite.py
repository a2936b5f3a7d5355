"""What is specific to the SQLite store: one WAL file, restarts, several processes, the gate."""

from __future__ import annotations

import sqlite3
import subprocess
import sys
import textwrap
import threading
from pathlib import Path
from typing import Any

import pytest

from threadkeep import CheckpointStoreFormatError, Settings, StorageError, open_checkpointer
from threadkeep.backends.sql.backend import _statements, load_migrations
from threadkeep.backends.sql.programs import FORMAT_GENERATION
from threadkeep.workload import MESSAGES_PER_TURN, build_agent, run_turns

MIGRATIONS = load_migrations("threadkeep.backends.sqlite")


def open_at(path: Path, **options: Any) -> Any:
    return open_checkpointer("sqlite", str(path), settings=Settings(), **options)


def run_python(code: str, *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def test_a_migration_script_splits_on_line_ending_semicolons_outside_dollar_quotes() -> None:
    script = textwrap.dedent(
        """\
        -- a comment; not a statement
        CREATE TABLE a (x INTEGER);
        CREATE FUNCTION f() RETURNS INTEGER LANGUAGE plpgsql AS $body1$
        BEGIN
            RETURN 1;
        END
        $body1$;
        SELECT 'a;b' FROM a;
        """
    )
    statements = _statements(script)
    assert [statement.split()[0] for statement in statements] == ["--", "CREATE", "SELECT"]
    assert statements[1].endswith("$body1$")
    assert "RETURN 1;" in statements[1]


def test_p6_sqlite_store_is_one_file_in_wal_mode(tmp_path: Path) -> None:
    path = tmp_path / "nested" / "store.sqlite"
    with open_at(path) as saver:
        run_turns(build_agent(saver), "t", 1)
    assert path.is_file()
    conn = sqlite3.connect(path)
    assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    tables = {row[0] for row in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    assert {"tk_threads", "tk_checkpoints", "tk_messages", "tk_meta"} <= tables


WRITER = """
import sys
from threadkeep import Settings, open_checkpointer
from threadkeep.workload import build_agent, run_turns
with open_checkpointer("sqlite", sys.argv[1], settings=Settings()) as saver:
    run_turns(build_agent(saver), sys.argv[2], int(sys.argv[3]))
"""

READER = """
import sys
from threadkeep import Settings, open_checkpointer
with open_checkpointer("sqlite", sys.argv[1], settings=Settings()) as saver:
    state = saver.get_tuple({"configurable": {"thread_id": sys.argv[2]}})
    print(len(state.checkpoint["channel_values"]["messages"]) if state else "missing")
"""


def test_p6_sqlite_store_survives_a_process_restart(tmp_path: Path) -> None:
    path = str(tmp_path / "store.sqlite")
    written = run_python(WRITER, path, "kept", "2")
    assert written.returncode == 0, written.stderr
    read = run_python(READER, path, "kept")
    assert read.returncode == 0, read.stderr
    assert read.stdout.strip() == str(2 * MESSAGES_PER_TURN)


RACER = """
import sys, time, pathlib
from threadkeep import Settings, open_checkpointer
from threadkeep.workload import build_agent, run_turns
path, mine, other, folder = sys.argv[1], sys.argv[2], sys.argv[3], pathlib.Path(sys.argv[4])
with open_checkpointer("sqlite", path, settings=Settings()) as saver:
    (folder / f"ready-{mine}").touch()
    while not (folder / f"ready-{other}").exists():
        time.sleep(0.01)
    run_turns(build_agent(saver), mine, 4)
    (folder / f"done-{mine}").touch()
    while not (folder / f"done-{other}").exists():
        time.sleep(0.01)
    theirs = saver.get_tuple({"configurable": {"thread_id": other}})
    print(len(theirs.checkpoint["channel_values"]["messages"]))
"""


def test_p6_two_processes_write_and_read_each_others_threads(tmp_path: Path) -> None:
    path = str(tmp_path / "shared.sqlite")
    open_at(tmp_path / "shared.sqlite").close()  # create the schema once
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", textwrap.dedent(RACER), path, mine, other, str(tmp_path)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for mine, other in (("left", "right"), ("right", "left"))
    ]
    outputs = [proc.communicate(timeout=120) for proc in procs]
    for proc, (out, err) in zip(procs, outputs, strict=True):
        assert proc.returncode == 0, err
        assert out.strip() == str(4 * MESSAGES_PER_TURN)


def test_p6_a_store_of_another_generation_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "old.sqlite"
    open_at(path).close()
    conn = sqlite3.connect(path)
    conn.execute("UPDATE tk_meta SET value = '0' WHERE key = 'format_generation'")
    conn.commit()
    conn.close()
    with pytest.raises(CheckpointStoreFormatError, match="reset the checkpoint store") as refused:
        open_at(path)
    assert refused.value.context["found"] == "0"
    assert refused.value.context["expected"] == FORMAT_GENERATION


def test_p6_a_store_migrated_by_a_newer_version_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "newer.sqlite"
    open_at(path).close()
    conn = sqlite3.connect(path)
    conn.execute("INSERT INTO tk_migrations VALUES (?, 0)", (len(MIGRATIONS) + 1,))
    conn.commit()
    conn.close()
    newer = "at least as new as the one that migrated"
    with pytest.raises(CheckpointStoreFormatError, match=newer) as refused:
        open_at(path)
    assert refused.value.context["found"] == len(MIGRATIONS) + 1
    assert refused.value.context["expected"] == len(MIGRATIONS)


def test_p6_a_generation_1_store_is_read_as_it_is_and_recorded_as_current(tmp_path: Path) -> None:
    path = tmp_path / "gen1.sqlite"
    with open_at(path) as saver:
        run_turns(build_agent(saver), "t", 1)
    conn = sqlite3.connect(path)
    conn.execute("UPDATE tk_meta SET value = '1' WHERE key = 'format_generation'")
    conn.commit()
    with open_at(path) as saver:
        state = saver.get_tuple({"configurable": {"thread_id": "t"}})
        assert len(state.checkpoint["channel_values"]["messages"]) == MESSAGES_PER_TURN
        run_turns(build_agent(saver), "t", 1, first=1)
    # a version that reads only generation 1 now refuses the store instead of a value
    recorded = conn.execute("SELECT value FROM tk_meta WHERE key = 'format_generation'").fetchall()
    assert recorded == [(str(FORMAT_GENERATION),)] == [("3",)]
    conn.close()


def test_p6_langgraph_sqlite_saver_tables_in_the_same_file_are_left_alone(tmp_path: Path) -> None:
    """A file shared with LangGraph's SqliteSaver is not refused: only tk_ tables are ours."""
    from langgraph.checkpoint.sqlite import SqliteSaver

    path = tmp_path / "langgraph.sqlite"
    conn = sqlite3.connect(path, check_same_thread=False)
    run_turns(build_agent(SqliteSaver(conn)), "theirs", 1)
    before = conn.execute("SELECT count(*) FROM checkpoints").fetchone()[0]
    with open_at(path) as saver:
        run_turns(build_agent(saver), "ours", 1)
    assert conn.execute("SELECT count(*) FROM checkpoints").fetchone()[0] == before > 0
    conn.close()


def test_p6_checkpoints_without_a_recorded_generation_are_refused(tmp_path: Path) -> None:
    path = tmp_path / "unmarked.sqlite"
    with open_at(path) as saver:
        run_turns(build_agent(saver), "t", 1)
    conn = sqlite3.connect(path)
    conn.execute("DELETE FROM tk_meta")
    conn.commit()
    conn.close()
    with pytest.raises(CheckpointStoreFormatError):
        open_at(path)


def test_p6_concurrent_first_uses_converge_on_one_record(tmp_path: Path) -> None:
    path = tmp_path / "fresh.sqlite"
    errors: list[BaseException] = []

    def first_use() -> None:
        try:
            open_at(path).close()
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=first_use) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    conn = sqlite3.connect(path)
    assert conn.execute("SELECT value FROM tk_meta WHERE key = 'format_generation'").fetchall() == [
        (str(FORMAT_GENERATION),)
    ]
    assert conn.execute("SELECT count(*) FROM tk_migrations").fetchone()[0] == len(MIGRATIONS)


def test_p6_reopening_applies_no_migration_twice(tmp_path: Path) -> None:
    path = tmp_path / "store.sqlite"
    open_at(path).close()
    open_at(path).close()
    conn = sqlite3.connect(path)
    assert conn.execute("SELECT version FROM tk_migrations").fetchall() == [(m.version,) for m in MIGRATIONS]


def test_c7_msgpack_codec_on_sqlite(tmp_path: Path) -> None:
    path = tmp_path / "msgpack.sqlite"
    settings = Settings(codec="msgpack")
    with open_checkpointer("sqlite", str(path), settings=settings) as saver:
        graph = build_agent(saver)
        run_turns(graph, "packed", 2)
        messages = graph.get_state({"configurable": {"thread_id": "packed"}}).values["messages"]
        assert len(messages) == 2 * MESSAGES_PER_TURN
    kinds = {row[0] for row in sqlite3.connect(path).execute("SELECT DISTINCT type FROM tk_messages")}
    assert kinds == {"msgpack"}


def test_c7_msgpack_codec_honours_the_strict_allowlist(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from langgraph.checkpoint.serde.jsonplus import JsonPlusSerializer

    strict = JsonPlusSerializer(allowed_msgpack_modules=None)
    with open_checkpointer(
        "sqlite", str(tmp_path / "strict.sqlite"), settings=Settings(codec="msgpack"), serde=strict
    ) as saver:
        allowed = saver.with_allowlist([("tests.backends.test_sqlite", "Marker")])
        inner = allowed.serde.inner  # type: ignore[attr-defined]
        assert ("tests.backends.test_sqlite", "Marker") in inner._allowed_msgpack_modules


def test_unwritable_location_is_a_clear_storage_error(tmp_path: Path) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    with pytest.raises(StorageError, match="writable path"):
        open_at(blocker / "store.sqlite")


def test_s1_a_list_whose_links_do_not_lead_to_its_tail_is_refused(tmp_path: Path) -> None:
    """A link names its message: one damaged (by hand, by a bug) so that it names another
    message of the thread must not be read as the list. A new reader refuses the state; a
    list from before the damaged link reads as written."""
    from threadkeep import CheckpointSerializationError

    path = tmp_path / "store.db"
    with open_at(path) as writer:
        run_turns(build_agent(writer), "t", 2)
    conn = sqlite3.connect(path)
    with conn:
        changed = conn.execute(
            "UPDATE tk_message_links SET digest = (SELECT digest FROM tk_message_links WHERE prev IS NULL)"
            " WHERE node = (SELECT node FROM tk_message_links AS l"
            " WHERE NOT EXISTS (SELECT 1 FROM tk_message_links AS n WHERE n.prev = l.node))"
        ).rowcount
        ids = conn.execute("SELECT checkpoint_id FROM tk_checkpoints ORDER BY checkpoint_id").fetchall()
        (early_id,) = ids[3]
    conn.close()
    assert changed == 1
    with (
        open_at(path) as reader,
        pytest.raises(CheckpointSerializationError, match="do not lead to the list's tail"),
    ):
        reader.get_tuple({"configurable": {"thread_id": "t"}})
    with open_at(path) as reader:
        early = reader.get_tuple({"configurable": {"thread_id": "t", "checkpoint_id": early_id}})
        assert early is not None
        assert len(early.checkpoint["channel_values"]["messages"]) == 3
