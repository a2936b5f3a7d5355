"""SV3: ``threadkeep threads list | show | history | diff`` on a store a real LangGraph graph
wrote (tool calls, an interrupt, a finished thread, a park where the provider holds them),
driven in-process with click's runner on sqlite and postgres."""

from __future__ import annotations

import base64
import datetime as dt
import json
import re
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo

import pytest
from click.testing import CliRunner, Result

from tests.graphs import approval_graph, cfg
from tests.providers import CASES, postgres_probe, postgres_schema, require
from threadkeep import Settings, ThreadkeepSaver, open_checkpointer, operator_scope, user_scope
from threadkeep.cli import main
from threadkeep.providers import facts_of
from threadkeep.threads import ThreadQuery
from threadkeep.views import diff_view, history_view, retention_view, state_view
from threadkeep.workload import build_agent, run_turns

# A zone with a half-hour offset and no daylight saving: a time printed in UTC (or in the
# machine's zone) cannot pass for it.
ZONE = "Asia/Kolkata"
OWNERS = {"a-1": "alice", "a-2": "alice", "b-1": "bob", "c-ask": "carol", "z-late": "alice"}


@dataclass
class Seeded:
    provider: str
    conn: str
    midway: float  # every thread but z-late was last written before this

    def open(self) -> ThreadkeepSaver:
        return open_checkpointer(self.provider, self.conn, settings=Settings())

    def args(self) -> list[str]:
        return ["--provider", self.provider, "--conn", self.conn]


@pytest.fixture(autouse=True)
def local_zone(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setenv("TZ", ZONE)
    time.tzset()
    yield
    monkeypatch.undo()
    time.tzset()


def _seed(provider: str, conn: str) -> Seeded:
    with open_checkpointer(provider, conn, settings=Settings()) as saver:
        with user_scope("alice"):
            run_turns(build_agent(saver), "a-1", 2)
            run_turns(build_agent(saver), "a-2", 1)
        with user_scope("bob"):
            run_turns(build_agent(saver), "b-1", 1)
            saver.mark_finished(["b-1"])
        with user_scope("carol"):
            approval_graph(saver).invoke({"request": "refund 40 EUR", "answer": ""}, cfg("c-ask"))
        if facts_of(provider).holds_parked_runs:
            with user_scope("alice"):
                saver.record_park("a-2", "question-1", time.time() + 7200)
        time.sleep(0.05)
        midway = time.time()
        time.sleep(0.05)
        with user_scope("alice"):
            run_turns(build_agent(saver), "z-late", 1)
    return Seeded(provider, conn, midway)


@pytest.fixture(params=["sqlite", "postgres"])
def seeded(request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Seeded:
    if request.param == "postgres":
        require(CASES["postgres"], postgres_probe())
        conn = postgres_schema(uuid.uuid4().hex)
    else:
        conn = str(tmp_path / "threads.sqlite")
    store = _seed(request.param, conn)
    monkeypatch.setenv("LLM_PROVIDER_CHECKPOINT", store.provider)
    monkeypatch.setenv("LLM_PROVIDER_CHECKPOINT_CONN_STRING", store.conn)
    return store


def run(*args: str) -> Result:
    return CliRunner().invoke(main, ["threads", *args])


def ok_json(*args: str) -> Any:
    result = run(*args, "--json")
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def local(when: float) -> str:
    return dt.datetime.fromtimestamp(when, ZoneInfo(ZONE)).strftime("%Y-%m-%d %H:%M:%S")


def newest(store: Seeded, thread_id: str) -> Any:
    with store.open() as saver, operator_scope():
        return saver.get_tuple({"configurable": {"thread_id": thread_id, "checkpoint_ns": ""}})


def checkpoints(store: Seeded, thread_id: str) -> list[Any]:
    with store.open() as saver, operator_scope():
        return list(saver.list({"configurable": {"thread_id": thread_id, "checkpoint_ns": ""}}))


# --- list ---------------------------------------------------------------------------------------


def test_sv3_threads_list_shows_each_thread_with_owner_status_local_times_and_last_message(
    seeded: Seeded,
) -> None:
    result = run("list")
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert lines[0].split() == ["THREAD", "OWNER", "STATUS", "LAST", "WRITE", "DUE", "LAST", "MESSAGE"]
    with seeded.open() as saver, operator_scope():
        page = saver.threads(ThreadQuery())
    assert page.threads[0].thread_id == "z-late"  # newest write first
    assert {row.thread_id: row.owner for row in page.threads} == OWNERS
    for row in page.threads:
        line = next(line for line in lines if line.startswith(row.thread_id + " "))
        assert f" {row.owner} " in line
        assert f" {row.status} " in line
        assert local(row.written_at) in line
    statuses = {row.thread_id: row.status for row in page.threads}
    assert statuses["b-1"] == "finished"
    assert statuses["c-ask"] == "interrupted"
    assert statuses["a-2"] == ("parked" if facts_of(seeded.provider).holds_parked_runs else "waiting")
    # the preview: the agent's answer closing a turn, and the question of the interrupted run
    assert "ai: " in next(line for line in lines if line.startswith("a-1 "))
    assert "IST (UTC+0530)" in result.stdout
    assert "--cursor" not in result.stdout  # one page holds them all
    # due: a week ahead (the waiting horizon) as a local time; a day ahead (finished) relative
    due = next(row.due for row in page.threads if row.thread_id == "a-1")
    assert due is not None
    waiting = next(line for line in lines if line.startswith("a-1 "))
    assert dt.datetime.fromtimestamp(due, ZoneInfo(ZONE)).strftime("%Y-%m-%d %H:%M") in waiting
    assert re.search(r" in 2[34] h ", next(line for line in lines if line.startswith("b-1 ")))


def test_sv3_threads_list_json_is_the_listing_page(seeded: Seeded) -> None:
    with seeded.open() as saver, operator_scope():
        expected = saver.threads(ThreadQuery()).to_dict()
    assert ok_json("list") == json.loads(json.dumps(expected))


def test_sv3_threads_list_pages_with_the_cursor_cover_every_thread_once(seeded: Seeded) -> None:
    seen: list[str] = []
    cursor: str | None = None
    for _ in range(10):
        page = ok_json("list", "--limit", "2", *(["--cursor", cursor] if cursor else []))
        assert len(page["threads"]) <= 2
        seen += [row["thread_id"] for row in page["threads"]]
        cursor = page["next_cursor"]
        if cursor is None:
            break
    assert sorted(seen) == sorted(OWNERS)

    first = run("list", "--limit", "2")
    assert first.exit_code == 0, first.output
    hint = first.stdout.splitlines()[-1]
    assert hint.startswith("more: the same command with --cursor ")
    second = run("list", "--limit", "2", "--cursor", hint.split()[-1])
    assert second.exit_code == 0, second.output
    shown = {line.split()[0] for line in [*first.stdout.splitlines(), *second.stdout.splitlines()] if line}
    assert shown >= set(seen[:4])


def test_sv3_threads_list_filters_by_status_user_time_and_metadata(seeded: Seeded) -> None:
    def ids(*args: str) -> set[str]:
        return {row["thread_id"] for row in ok_json("list", *args)["threads"]}

    assert ids("--status", "finished") == {"b-1"}
    assert ids("--status", "interrupted") == {"c-ask"}
    assert ids("--user", "alice") == {"a-1", "a-2", "z-late"}
    assert ids("--user", "nobody") == set()
    midway = dt.datetime.fromtimestamp(seeded.midway).isoformat()  # naive: read as local time
    assert ids("--since", midway) == {"z-late"}
    assert ids("--before", midway) == set(OWNERS) - {"z-late"}
    assert ids("--since", "1h") == set(OWNERS)
    step = newest(seeded, "a-1").metadata["step"]
    expected = {thread for thread in OWNERS if newest(seeded, thread).metadata.get("step") == step}
    assert "a-1" in expected
    assert ids("--metadata", f"step={step}", "--metadata", "source=loop") == expected


# --- show ---------------------------------------------------------------------------------------


def test_sv3_threads_show_prints_the_conversation_with_tool_calls_and_results(seeded: Seeded) -> None:
    result = run("show", "a-1")
    assert result.exit_code == 0, result.output
    out = result.stdout
    assert out.startswith("thread a-1\n")
    assert "  status      waiting" in out
    assert "  spared by   nothing: the sweep deletes it once due" in out
    assert "conversation: 16 message(s)" in out
    assert "[1] human\n    Turn 0: " in out
    assert '-> lookup(query="turn 0 question 0")  [call-0-0]' in out
    assert "] tool lookup <- [call-0-0]" in out
    assert "--full]" in out  # a long tool result is cut
    assert local(state_view(newest(seeded, "a-1"))["created_at"]) in out
    whole = run("show", "a-1", "--full")
    assert "--full]" not in whole.stdout


def test_sv3_threads_show_json_is_the_state_and_retention_views(seeded: Seeded) -> None:
    for thread_id in ("c-ask", "a-2", "b-1"):
        shown = ok_json("show", thread_id)
        with seeded.open() as saver, operator_scope():
            head = newest(seeded, thread_id)
            retention = saver.thread_retention(thread_id)
            assert retention is not None
            now = saver.clock()
            parked = thread_id in saver.live_parks([thread_id], now)
            row = saver.thread_row(thread_id)
            kept = retention_view(head, *retention, saver.retention, now=now, parked=parked, row=row)
            listed = {t.thread_id: t for t in saver.threads(ThreadQuery(limit=50)).threads}[thread_id]
        assert shown == json.loads(json.dumps({"state": state_view(head), "retention": kept}))
        # the same due time, waiting clock and status as the listing (and the sweep) count
        assert (kept["due"], kept["written_at"], kept["status"]) == (
            listed.due,
            listed.written_at,
            listed.status,
        )
    assert ok_json("show", "c-ask")["state"]["interrupts"][0]["value"] == "approve REFUND 40 EUR?"
    assert ok_json("show", "c-ask")["retention"]["status"] == "interrupted"
    assert ok_json("show", "b-1")["retention"]["status"] == "finished"
    if facts_of(seeded.provider).holds_parked_runs:
        assert ok_json("show", "a-2")["retention"]["spared_by"] == ["park"]


def test_sv3_threads_show_as_a_user_sees_only_that_users_threads(seeded: Seeded) -> None:
    assert run("show", "a-1", "--user", "alice").exit_code == 0
    other = run("show", "a-1", "--user", "bob")
    assert other.exit_code == 4
    assert "no thread 'a-1'" in other.stderr


# --- history and diff ---------------------------------------------------------------------------


def test_sv3_threads_history_pages_newest_first_as_history_views(seeded: Seeded) -> None:
    every = checkpoints(seeded, "a-1")
    assert len(every) == 18
    rows: list[Any] = []
    cursor: str | None = None
    while True:
        page = ok_json("history", "a-1", "--limit", "7", *(["--cursor", cursor] if cursor else []))
        assert set(page) == {"checkpoints", "next_cursor"}
        rows += page["checkpoints"]
        cursor = page["next_cursor"]
        if cursor is None:
            break
    assert rows == json.loads(json.dumps([history_view(item) for item in every]))

    table = run("history", "a-1", "--limit", "3")
    assert table.exit_code == 0, table.output
    lines = table.stdout.splitlines()
    assert lines[0].split() == ["STEP", "SOURCE", "TIME", "CHECKPOINT", "WRITES"]
    newest_row = history_view(every[0])
    assert lines[1].split()[:2] == [str(newest_row["step"]), newest_row["source"]]
    assert local(newest_row["created_at"]) in lines[1]
    assert lines[-1] == f"more: the same command with --cursor {history_view(every[2])['checkpoint_id']}"
    assert "messages: " in table.stdout  # the writes made from a checkpoint


def test_sv3_threads_diff_shows_the_messages_a_turn_added(seeded: Seeded) -> None:
    every = checkpoints(seeded, "a-1")
    older, newer = every[9], every[0]  # the end of turn 0 and the end of turn 1
    a, b = (item.config["configurable"]["checkpoint_id"] for item in (older, newer))
    assert ok_json("diff", "a-1", a, b) == json.loads(json.dumps(diff_view(older, newer)))
    result = run("diff", "a-1", a, b)
    assert result.exit_code == 0, result.output
    assert f"  from {a}" in result.stdout
    assert f"  to   {b}" in result.stdout
    assert "messages (changed)" in result.stdout
    assert "  + human: Turn 1: " in result.stdout
    assert "  + ai [calls lookup]: " in result.stdout
    assert "  + tool lookup: " in result.stdout


# --- exit codes and the store flags -------------------------------------------------------------


def test_sv3_threads_exit_codes_missing_thread_4_bad_input_2(seeded: Seeded) -> None:
    for args in (["show", "nope"], ["history", "nope"], ["diff", "nope", "x", "y"]):
        missing = run(*args)
        assert missing.exit_code == 4, missing.output
        assert "no thread 'nope'" in missing.stderr
    a = checkpoints(seeded, "a-1")[0].config["configurable"]["checkpoint_id"]
    gone = run("diff", "a-1", a, "not-a-checkpoint")
    assert gone.exit_code == 4
    assert "no checkpoint 'not-a-checkpoint' of thread 'a-1'" in gone.stderr

    bad = run("list", "--cursor", "not-a-cursor")
    assert bad.exit_code == 2
    assert "is not one a thread listing returned" in bad.stderr
    assert "--cursor" in bad.stderr
    assert run("history", "a-1", "--cursor", "not-a-checkpoint").exit_code == 2
    assert run("list", "--since", "yesterday").exit_code == 2
    assert run("list", "--metadata", "novalue").exit_code == 2
    assert run("list", "--status", "asleep").exit_code == 2


def test_sv3_threads_invalid_filters_and_cursors_exit_2_as_the_help_promises(seeded: Seeded) -> None:
    # A metadata filter the store refuses is a ConfigurationError (kind "invalid"): usage, 2.
    nan = run("list", "--metadata", "a=NaN")
    assert nan.exit_code == 2, nan.output
    assert "filter.a" in nan.stderr
    assert "NaN" in nan.stderr
    for raw in ('[NaN,"a-1"]', '[Infinity,"a-1"]', '[1,"\\u0000"]'):
        cursor = base64.urlsafe_b64encode(raw.encode()).decode()
        refused = run("list", "--cursor", cursor)
        assert refused.exit_code == 2, (raw, refused.output)
        assert "is not one a thread listing returned" in refused.stderr


def test_sv3_threads_provider_and_conn_flags_override_the_settings(
    seeded: Seeded, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("LLM_PROVIDER_CHECKPOINT", "sqlite")
    monkeypatch.setenv("LLM_PROVIDER_CHECKPOINT_CONN_STRING", str(tmp_path / "empty.sqlite"))
    assert ok_json("list")["threads"] == []
    assert run("show", "a-1").exit_code == 4
    assert {row["thread_id"] for row in ok_json("list", *seeded.args())["threads"]} == set(OWNERS)
    assert ok_json("show", "a-1", *seeded.args())["state"]["thread_id"] == "a-1"


def test_sv3_threads_an_unreachable_store_exits_5(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LLM_PROVIDER_CHECKPOINT_RETRY_ATTEMPTS", "1")
    monkeypatch.setenv("LLM_PROVIDER_CHECKPOINT_POOL_TIMEOUT_SECONDS", "2")
    monkeypatch.setenv("LLM_PROVIDER_CHECKPOINT_CONNECT_TIMEOUT_SECONDS", "2")
    result = run("list", "--provider", "postgres", "--conn", "host=127.0.0.1 port=1 user=x dbname=x")
    assert result.exit_code == 5, result.output
    assert result.stderr.startswith("error: [STORAGE_")
