"""``threadkeep import``: threads written by real LangGraph graphs on LangGraph's own savers
(SqliteSaver, PostgresSaver, AsyncPostgresSaver) move into every kind of threadkeep store
whole, and read back the same through the graphs' own API."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest
from click.testing import CliRunner
from langchain_core.messages import HumanMessage
from langgraph.checkpoint.base import BaseCheckpointSaver
from langgraph.types import Command
from psycopg.conninfo import conninfo_to_dict

from tests.graphs import Driver, approval_graph, subgraph_graph
from tests.providers import POSTGRES_URL, Opener, postgres_probe, postgres_schema
from threadkeep import ThreadkeepSaver, open_checkpointer, operator_scope
from threadkeep.cli import main
from threadkeep.errors import StaleStateError
from threadkeep.migrate import import_threads, open_langgraph_saver, source_thread_ids, verify_threads
from threadkeep.workload import build_agent, turn_input

TARGETS = pytest.mark.providers("sqlite", "postgres", "redis", "tiered")
SOURCES = ["sqlite", "postgres", "postgres-async"]


# --- stores written by real graphs on LangGraph's savers ---------------------------------------


def _cfg(thread_id: str, checkpoint_id: str | None = None) -> dict[str, Any]:
    configurable = {"thread_id": thread_id}
    if checkpoint_id is not None:  # SqliteSaver's update_state needs the namespace with an id
        configurable.update(checkpoint_ns="", checkpoint_id=checkpoint_id)
    return {"configurable": configurable}


def _graphs(checkpointer: Any) -> dict[str, Any]:
    return {
        "tools": build_agent(checkpointer),
        "approval": approval_graph(checkpointer),
        "subgraph": subgraph_graph(checkpointer),
    }


def write_corpus(checkpointer: Any, driver: Driver) -> dict[str, str]:
    """Threads of every shape a LangGraph app leaves, written through ``driver``'s API on
    ``checkpointer``; returns thread id -> the graph that wrote it."""
    graphs = _graphs(checkpointer)
    threads: dict[str, str] = {}
    tools = graphs["tools"]
    # A tool loop: two turns of a model calling a tool three times each.
    for turn in range(2):
        driver.invoke(tools, turn_input(turn), _cfg("tool-loop"))
    threads["tool-loop"] = "tools"
    # Forks interleaved with the main line: time travel from two older checkpoints, an
    # update_state on a third, then each branch continued in turn, so the ids of the branches
    # alternate in the order they were written.
    driver.invoke(tools, turn_input(0), _cfg("forks"))
    history = driver.history(tools, _cfg("forks"))
    older = [snap.config["configurable"]["checkpoint_id"] for snap in history[2:6]]
    tip_b = driver.invoke(tools, turn_input(5), _cfg("forks", older[0])) and driver.get_state(
        tools, _cfg("forks")
    )
    tip_c = driver.invoke(tools, turn_input(6), _cfg("forks", older[2])) and driver.get_state(
        tools, _cfg("forks")
    )
    updated = driver.update_state(
        tools, _cfg("forks", older[3]), {"messages": [HumanMessage(content="an edit", id="edit-1")]}
    )
    for tip in (tip_b.config, tip_c.config, updated):
        driver.invoke(tools, turn_input(7), _cfg("forks", tip["configurable"]["checkpoint_id"]))
    threads["forks"] = "tools"
    # An interrupt answered, and one still waiting (its pending writes at the head).
    approval = graphs["approval"]
    driver.invoke(approval, {"request": "deploy", "answer": ""}, _cfg("approved"))
    driver.invoke(approval, Command(resume="yes"), _cfg("approved"))
    driver.invoke(approval, {"request": "rollback", "answer": ""}, _cfg("waiting"))
    threads["approved"] = threads["waiting"] = "approval"
    # A subgraph that interrupts (checkpoints in its own namespace), resumed; and one waiting.
    sub = graphs["subgraph"]
    driver.invoke(sub, {"topic": "tides", "notes": []}, _cfg("subgraph-done"))
    driver.invoke(sub, Command(resume="fine"), _cfg("subgraph-done"))
    driver.invoke(sub, {"topic": "winds", "notes": []}, _cfg("subgraph-waiting"))
    threads["subgraph-done"] = threads["subgraph-waiting"] = "subgraph"
    return threads


def sqlite_source(tmp_path: Path) -> tuple[str, dict[str, str]]:
    from langgraph.checkpoint.sqlite import SqliteSaver

    path = tmp_path / "langgraph.sqlite"
    with SqliteSaver.from_conn_string(str(path)) as saver:
        threads = write_corpus(saver, Driver("sync"))
    return str(path), threads


def postgres_url(unique: str) -> str:
    """A postgresql:// URL of a fresh schema (dropped at session end)."""
    dsn = postgres_schema(unique)
    schema = dsn.rsplit("search_path=", 1)[1].rstrip("'")
    # The test server and database, as the CLI takes them: a URL.
    parts = conninfo_to_dict(POSTGRES_URL)
    login = quote(str(parts.get("user", "postgres")))
    if parts.get("password"):
        login += ":" + quote(str(parts["password"]))
    server = f"{parts.get('host', '127.0.0.1')}:{parts.get('port', 5432)}"
    options = quote(f"-csearch_path={schema}")
    return f"postgresql://{login}@{server}/{parts.get('dbname', 'test')}?options={options}"


def postgres_source(api: str) -> tuple[str, dict[str, str]]:
    from langgraph.checkpoint.postgres import PostgresSaver
    from langgraph.checkpoint.postgres.aio import AsyncPostgresSaver

    url = postgres_url(uuid.uuid4().hex)
    if api == "sync":
        with PostgresSaver.from_conn_string(url) as saver:
            saver.setup()
            return url, write_corpus(saver, Driver("sync"))
    driver = Driver("async")
    try:
        manager = AsyncPostgresSaver.from_conn_string(url)
        driver.runner = asyncio.Runner()
        saver = driver.runner.run(manager.__aenter__())
        driver.runner.run(saver.setup())
        try:
            return url, write_corpus(saver, driver)
        finally:
            driver.runner.run(manager.__aexit__(None, None, None))
    finally:
        driver.close()


def make_source(kind: str, tmp_path: Path) -> tuple[str, dict[str, str]]:
    if kind == "sqlite":
        return sqlite_source(tmp_path)
    if reason := postgres_probe():
        pytest.skip(reason)
    return postgres_source("sync" if kind == "postgres" else "async")


# --- what a graph reads back -----------------------------------------------------------------


def _snapshot(snap: Any) -> dict[str, Any]:
    return {
        "values": snap.values,
        "next": snap.next,
        "config": snap.config["configurable"],
        "parent": None if snap.parent_config is None else snap.parent_config["configurable"],
        "metadata": snap.metadata,
        "created_at": snap.created_at,
        "tasks": [(t.id, t.name, t.path, t.error, t.interrupts, t.result) for t in snap.tasks],
        "interrupts": snap.interrupts,
    }


def _saver_view(saver: BaseCheckpointSaver[Any], thread_id: str) -> list[Any]:
    """Every checkpoint of every namespace: ids, parents, metadata, values, pending writes."""
    items = saver.list({"configurable": {"thread_id": thread_id}})
    return sorted(
        (
            (
                item.config["configurable"]["checkpoint_ns"],
                item.config["configurable"]["checkpoint_id"],
                None if item.parent_config is None else item.parent_config["configurable"]["checkpoint_id"],
                item.metadata,
                item.checkpoint["channel_values"],
                item.checkpoint["channel_versions"],
                item.pending_writes,
            )
            for item in items
        ),
        key=lambda row: (row[0], row[1]),
    )


def graph_view(checkpointer: Any, threads: dict[str, str]) -> dict[str, Any]:
    graphs = _graphs(checkpointer)
    view = {}
    for thread_id, name in threads.items():
        graph, config = graphs[name], _cfg(thread_id)
        view[thread_id] = {
            "state": _snapshot(graph.get_state(config, subgraphs=True)),
            "history": [_snapshot(snap) for snap in graph.get_state_history(config)],
            "stored": _saver_view(checkpointer, thread_id),
        }
    return view


def assert_same_threads(source: str, target: ThreadkeepSaver, threads: dict[str, str]) -> None:
    with open_langgraph_saver(source) as origin:
        expected = graph_view(origin, threads)
    with operator_scope():
        got = graph_view(target, threads)
    for thread_id in threads:
        assert got[thread_id] == expected[thread_id], thread_id


# --- the tests -------------------------------------------------------------------------------


@TARGETS
@pytest.mark.parametrize("source_kind", SOURCES)
def test_import_copies_every_thread_whole_into_every_store(
    source_kind: str, open_saver: Opener, tmp_path: Path
) -> None:
    source, threads = make_source(source_kind, tmp_path)
    target = open_saver()
    with open_langgraph_saver(source) as origin:
        assert source_thread_ids(origin) == sorted(threads)
        summary = import_threads(origin, target)
        assert verify_threads(origin, target) == []
    assert summary.threads == summary.threads_copied == len(threads)
    assert summary.skipped_threads == {}
    assert summary.checkpoints > 60
    assert summary.writes > 60
    assert_same_threads(source, target, threads)
    # The imported threads go on as LangGraph's would: a resume, a new turn, a fork.
    with operator_scope():
        graphs = _graphs(target)
        done = graphs["approval"].invoke(Command(resume="later"), _cfg("waiting"))
        assert done["answer"] == "later!"
        graphs["tools"].invoke(turn_input(9), _cfg("forks"))

    # Re-running copies nothing and finds everything in place.
    with open_langgraph_saver(source) as origin:
        again = import_threads(origin, target)
    assert (again.checkpoints, again.writes, again.threads_copied) == (0, 0, 0)
    assert again.skipped["checkpoints already in the store"] >= summary.checkpoints


def naive_copy(source: BaseCheckpointSaver[Any], target: ThreadkeepSaver, thread_id: str) -> None:
    """What a copier written against LangGraph's API alone does: each checkpoint in id order,
    put with its parent's config."""
    items = sorted(
        source.list(_cfg(thread_id)), key=lambda item: item.config["configurable"]["checkpoint_id"]
    )
    for item in items:
        config = item.parent_config or {
            "configurable": {
                "thread_id": thread_id,
                "checkpoint_ns": item.config["configurable"]["checkpoint_ns"],
            }
        }
        target.put(config, item.checkpoint, item.metadata, item.checkpoint["channel_versions"])


def test_a_naive_copy_loses_interleaved_branches_and_import_keeps_them(tmp_path: Path) -> None:
    source, _threads = sqlite_source(tmp_path)
    with open_langgraph_saver(source) as origin:
        with (
            open_checkpointer("sqlite", str(tmp_path / "naive.sqlite")) as naive,
            pytest.raises(StaleStateError),
        ):
            naive_copy(origin, naive, "forks")
        with open_checkpointer("sqlite", str(tmp_path / "tk.sqlite")) as target:
            summary = import_threads(origin, target, thread_ids=["forks"])
            assert summary.skipped_threads == {}
            assert verify_threads(origin, target, thread_ids=["forks"]) == []
            history = _saver_view(target, "forks")
    parents = [row[2] for row in history]
    # Branches: several checkpoints continue from the same parent.
    assert len(parents) - len(set(parents)) >= 3


@TARGETS
def test_import_for_a_user_gives_them_the_threads(open_saver: Opener, tmp_path: Path) -> None:
    source, threads = sqlite_source(tmp_path)
    target = open_saver()
    with open_langgraph_saver(source) as origin:
        import_threads(origin, target, user="alice")
        assert verify_threads(origin, target, user="alice") == []
        assert verify_threads(origin, target, user="bob") != []  # bob sees none of them
    alice = {"configurable": {"thread_id": "approved", "user_id": "alice"}}
    bob = {"configurable": {"thread_id": "approved", "user_id": "bob"}}
    assert target.get_tuple(alice) is not None
    assert target.get_tuple(bob) is None
    # Another user cannot import into alice's threads: those are skipped with the reason.
    with open_langgraph_saver(source) as origin:
        refused = import_threads(origin, target, user="bob")
    assert set(refused.skipped_threads) == set(threads)
    reason = refused.skipped_threads["approved"]
    assert "belongs to another user; user 'bob' may not write it" in reason
    assert "--user" in reason
    assert (refused.checkpoints, refused.writes) == (0, 0)


@pytest.mark.providers("sqlite", "tiered")
def test_import_into_a_store_with_a_history_limit_copies_what_it_keeps(
    open_saver: Opener, tmp_path: Path
) -> None:
    source, threads = sqlite_source(tmp_path)
    target = open_saver(state_history_limit=3)
    with open_langgraph_saver(source) as origin:
        summary = import_threads(origin, target)
        assert verify_threads(origin, target) == []
        again = import_threads(origin, target)
    assert summary.skipped["checkpoints beyond the store's state_history_limit"] > 0
    assert (again.checkpoints, again.writes) == (0, 0)
    with operator_scope():
        for thread_id in threads:
            namespaces: dict[str, int] = {}
            for row in _saver_view(target, thread_id):
                namespaces[row[0]] = namespaces.get(row[0], 0) + 1
            assert max(namespaces.values()) == 3


class Stop(Exception):
    pass


@TARGETS
def test_an_interrupted_import_resumes(open_saver: Opener, tmp_path: Path) -> None:
    source, threads = sqlite_source(tmp_path)
    target = open_saver()

    def stop_after(count: int) -> Callable[[int, int, str], None]:
        def progress(done: int, total: int, thread_id: str) -> None:
            if done == count:
                raise Stop

        return progress

    with open_langgraph_saver(source) as origin:
        with pytest.raises(Stop):
            import_threads(origin, target, progress=stop_after(3))
        # A thread cut in the middle: only its first checkpoints and none of their writes.
        partial = sorted(
            origin.list(_cfg("subgraph-done")), key=lambda i: i.config["configurable"]["checkpoint_id"]
        )
        for item in partial[:3]:
            ns = item.config["configurable"]["checkpoint_ns"]
            parent = item.parent_config
            config = {"configurable": {"thread_id": "subgraph-done", "checkpoint_ns": ns}}
            if parent is not None:
                config["configurable"]["checkpoint_id"] = parent["configurable"]["checkpoint_id"]
            with operator_scope():
                target.put(config, item.checkpoint, item.metadata, item.checkpoint["channel_versions"])
        resumed = import_threads(origin, target)
        assert verify_threads(origin, target) == []
    assert resumed.skipped["checkpoints already in the store"] > 3
    assert resumed.checkpoints > 0
    assert resumed.writes > 0
    assert_same_threads(source, target, threads)


@pytest.mark.providers("sqlite")
def test_an_import_killed_mid_way_resumes(provider: Any, tmp_path: Path) -> None:
    source, threads = sqlite_source(tmp_path)
    store = tmp_path / "killed.sqlite"
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(
            [str(Path(__file__).parents[1] / "src"), os.environ.get("PYTHONPATH", "")]
        ),
        "LLM_PROVIDER_CHECKPOINT": "sqlite",
        "LLM_PROVIDER_CHECKPOINT_CONN_STRING": str(store),
    }
    # A child that imports, and is killed by signal 9 once it has imported two threads.
    script = (
        "import os, signal\n"
        "from threadkeep import open_checkpointer\n"
        "from threadkeep.migrate import import_threads, open_langgraph_saver\n"
        "def progress(done, total, thread):\n"
        "    if done == 2: os.kill(os.getpid(), signal.SIGKILL)\n"
        f"with open_langgraph_saver({source!r}) as origin, open_checkpointer() as saver:\n"
        "    import_threads(origin, saver, progress=progress)\n"
    )
    child = subprocess.run(
        [sys.executable, "-c", script], check=False, env=env, capture_output=True, text=True
    )
    assert child.returncode == -9, child.stderr
    with open_checkpointer("sqlite", str(store)) as target, open_langgraph_saver(source) as origin:
        with operator_scope():
            held = {item.config["configurable"]["thread_id"] for item in target.list(None)}
        assert 0 < len(held) < len(threads)
        resumed = import_threads(origin, target)
        assert resumed.skipped["checkpoints already in the store"] > 0
        assert verify_threads(origin, target) == []


@pytest.fixture
def configured_store(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = tmp_path / "configured.sqlite"
    monkeypatch.setenv("LLM_PROVIDER_CHECKPOINT", "sqlite")
    monkeypatch.setenv("LLM_PROVIDER_CHECKPOINT_CONN_STRING", str(path))
    return path


@pytest.mark.parametrize("source_kind", ["sqlite", "postgres"])
def test_cli_import_json_and_verify(source_kind: str, configured_store: Path, tmp_path: Path) -> None:
    source, threads = make_source(source_kind, tmp_path)
    first = CliRunner().invoke(main, ["import", source, "--json", "--verify", "--user", "carol"])
    assert first.exit_code == 0, first.output
    summary = json.loads(first.stdout)
    assert summary["threads"] == summary["threads_copied"] == len(threads)
    assert summary["checkpoints_copied"] > 60
    assert summary["writes_copied"] > 60
    assert summary["threads_skipped"] == {}
    assert summary["verified"] is True
    assert summary["mismatches"] == []
    assert "importing threads" in first.stderr

    again = CliRunner().invoke(main, ["import", source, "--json"])
    # Without --user the import acts for the anonymous owner: carol's threads are refused.
    assert again.exit_code == 1
    assert set(json.loads(again.stdout)["threads_skipped"]) == set(threads)

    rerun = CliRunner().invoke(main, ["import", source, "--user", "carol", "--verify"])
    assert rerun.exit_code == 0, rerun.output
    assert "checkpoints copied: 0" in rerun.stdout
    assert "every thread matches the source" in rerun.stdout
    with open_checkpointer() as target:
        assert_same_threads(source, target, threads)


def test_cli_import_refusals_name_what_to_do(configured_store: Path, tmp_path: Path) -> None:
    missing = CliRunner().invoke(main, ["import", str(tmp_path / "nope.sqlite")])
    assert missing.exit_code == 2  # a bad SOURCE: invalid input
    assert "no SQLite file" in missing.stderr
    assert "postgresql://" in missing.stderr
    other = tmp_path / "other.sqlite"
    other.write_bytes(b"")
    refused = CliRunner().invoke(main, ["import", str(other)])
    assert refused.exit_code == 2
    assert "not a file LangGraph's SqliteSaver wrote" in refused.stderr
    if postgres_probe() is None:
        empty = CliRunner().invoke(main, ["import", postgres_url(uuid.uuid4().hex)])
        assert empty.exit_code == 2
        assert "holds no LangGraph PostgresSaver tables" in empty.stderr


def test_import_without_langgraphs_saver_names_the_pip_install(tmp_path: Path) -> None:
    script = (
        "import sys\n"
        "class Refuse:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name.startswith('langgraph.checkpoint.sqlite'): raise ModuleNotFoundError(name=name)\n"
        "sys.meta_path.insert(0, Refuse())\n"
        "from threadkeep.migrate import open_langgraph_saver\n"
        f"with open_langgraph_saver({str(tmp_path / 'x.sqlite')!r}): pass\n"
    )
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parents[1] / "src")}
    child = subprocess.run(
        [sys.executable, "-c", script], check=False, env=env, capture_output=True, text=True
    )
    assert "MissingExtraError" in child.stderr
    assert "pip install 'threadkeep[migrate]'" in child.stderr


@pytest.fixture(scope="module")
def thousand_threads(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A SqliteSaver file of 1,000 threads of the approval graph: half answered, half waiting."""
    from langgraph.checkpoint.sqlite import SqliteSaver

    path = tmp_path_factory.mktemp("thousand") / "langgraph.sqlite"
    with SqliteSaver.from_conn_string(str(path)) as saver:
        graph = approval_graph(saver)
        for number in range(1000):
            config = _cfg(f"t{number:04}")
            graph.invoke({"request": f"r{number}", "answer": ""}, config)
            if number % 2:
                graph.invoke(Command(resume="ok"), config)
    return str(path)


@pytest.mark.slow
@TARGETS
def test_import_a_thousand_threads(thousand_threads: str, open_saver: Opener) -> None:
    target = open_saver()
    with open_langgraph_saver(thousand_threads) as origin:
        started = time.perf_counter()
        summary = import_threads(origin, target)
        took = time.perf_counter() - started
        print(
            f"\nimported {summary.threads} threads, {summary.checkpoints} checkpoints, "
            f"{summary.writes} writes in {took:.1f} s"
        )
        assert summary.threads_copied == 1000
        assert summary.skipped_threads == {}
        started = time.perf_counter()
        assert verify_threads(origin, target) == []
        print(f"verified in {time.perf_counter() - started:.1f} s")


def test_verify_names_every_difference(configured_store: Path, tmp_path: Path) -> None:
    source, _threads = sqlite_source(tmp_path)
    assert CliRunner().invoke(main, ["import", source]).exit_code == 0
    with open_checkpointer() as target, operator_scope():
        # The store's copy moves on (a new turn), and gains a write the source lacks.
        _graphs(target)["approval"].invoke(Command(resume="no"), _cfg("waiting"))
        first = min(
            target.list(_cfg("approved")), key=lambda item: item.config["configurable"]["checkpoint_id"]
        )
        target.put_writes(first.config, [("answer", "forged")], "forged-task")
    checked = CliRunner().invoke(main, ["import", source, "--verify"])
    assert checked.exit_code == 1
    assert "'waiting' ns '': latest checkpoint differs" in checked.stdout
    assert (
        f"'approved' ns '' checkpoint {first.config['configurable']['checkpoint_id']}: pending_writes differs"
        in (checked.stdout)
    )
