"""The Postgres put as one statement: a put that continues its thread's head sets the head
in the thread's row (compare-and-set) and writes in the same statement; every other put, or
one whose set fails, takes the thread's lock as before."""

from __future__ import annotations

import threading
from typing import Any

import pytest
from langgraph.checkpoint.base import empty_checkpoint

from tests.backends.test_checkpoint_values import run_sql
from tests.providers import Opener
from threadkeep import StaleStateError, StorageForbiddenError
from threadkeep.backends.postgres import engine
from threadkeep.core.program import Sql
from threadkeep.workload import build_agent, run_turns

pytestmark = pytest.mark.providers("postgres")


def cfg(thread_id: str) -> dict[str, Any]:
    return {"configurable": {"thread_id": thread_id, "checkpoint_ns": ""}}


def heads(saver: Any) -> dict[str, str | None]:
    return dict(run_sql(saver, "SELECT thread_id, head FROM tk_threads"))


def newest(saver: Any, thread_id: str) -> str:
    return str(saver.get_tuple(cfg(thread_id)).checkpoint["id"])


def put(saver: Any, config: dict[str, Any], step: int, run_id: str = "run") -> dict[str, Any]:
    checkpoint = empty_checkpoint()
    checkpoint["channel_values"] = {"step": step}
    checkpoint["channel_versions"] = {"step": step}
    metadata = {"source": "loop", "step": step, "run_id": run_id}
    return dict(saver.put(config, checkpoint, metadata, {"step": step}))


@pytest.fixture
def round_trips(monkeypatch: pytest.MonkeyPatch) -> list[list[Any]]:
    """The statements of every round trip the Postgres engine sends (sync savers)."""
    sent: list[list[Any]] = []
    send = engine._send

    def recording(conn: Any, statements: list[Any], prepare: Any) -> list[Any]:
        sent.append(list(statements))
        return send(conn, statements, prepare)

    monkeypatch.setattr(engine, "_send", recording)
    return sent


def test_a_put_that_continues_the_head_is_one_statement(
    open_saver: Opener, round_trips: list[list[Any]]
) -> None:
    saver = open_saver()
    first = put(saver, cfg("t"), 1)  # a first put: locked, and it sets the head
    assert heads(saver) == {"t": first["configurable"]["checkpoint_id"]}
    round_trips.clear()
    second = put(saver, first, 2)
    assert len(round_trips) == 1
    assert len(round_trips[0]) == 1  # no BEGIN, no COMMIT: one statement is atomic
    assert heads(saver) == {"t": second["configurable"]["checkpoint_id"]}
    assert saver.get_tuple(cfg("t")).checkpoint["channel_values"] == {"step": 2}


def test_the_head_in_the_threads_row_is_its_newest_checkpoint(open_saver: Opener) -> None:
    saver = open_saver()
    run_turns(build_agent(saver), "a", 2)
    run_turns(build_agent(saver), "b", 1)
    assert heads(saver) == {"a": newest(saver, "a"), "b": newest(saver, "b")}


def test_a_stale_put_is_refused_after_the_head_moved(open_saver: Opener) -> None:
    saver = open_saver()
    parent = put(saver, cfg("t"), 1)
    winner = put(saver, parent, 2)
    with pytest.raises(StaleStateError):
        put(saver, parent, 3)
    assert heads(saver) == {"t": winner["configurable"]["checkpoint_id"]}
    put(saver, winner, 3)  # the thread goes on from its head


def test_deletes_by_run_and_copies_clear_the_head_and_the_next_put_sets_it(open_saver: Opener) -> None:
    saver = open_saver()
    first = put(saver, cfg("t"), 1, run_id="r1")
    second = put(saver, first, 2, run_id="r2")
    saver.delete_for_runs(["r2"])
    assert newest(saver, "t") == first["configurable"]["checkpoint_id"]
    assert heads(saver) == {"t": None}  # its head was deleted
    with pytest.raises(StaleStateError):
        put(saver, second, 3)  # the deleted checkpoint is no head to continue
    third = put(saver, first, 3)  # continues the head that is left: a locked put
    assert heads(saver) == {"t": third["configurable"]["checkpoint_id"]}

    saver.copy_thread("t", "copy")
    assert heads(saver)["copy"] is None
    fourth = put(saver, {"configurable": {**third["configurable"], "thread_id": "copy"}}, 4)
    assert heads(saver)["copy"] == fourth["configurable"]["checkpoint_id"] == newest(saver, "copy")


def _race(savers: list[Any], parent: dict[str, Any], step: int) -> list[Any]:
    """Two puts of a child of ``parent`` at once, one per saver: each one's config or error."""
    barrier = threading.Barrier(len(savers))
    outcomes: list[Any] = [None] * len(savers)

    def one(i: int) -> None:
        barrier.wait()
        try:
            outcomes[i] = put(savers[i], parent, 100 * step + i)
        except StaleStateError as error:
            outcomes[i] = error

    threads = [threading.Thread(target=one, args=(i,)) for i in range(len(savers))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return outcomes


def test_two_puts_racing_from_one_parent_one_wins_every_time(open_saver: Opener) -> None:
    """Both try the one-statement put at once: the compare-and-set lets one through; the
    other's set, re-checked once the first commits, fails, and its locked put is stale."""
    savers = [open_saver(), open_saver()]
    head = put(savers[0], cfg("race"), 0)
    for step in range(1, 21):
        outcomes = _race(savers, head, step)
        won = [o for o in outcomes if isinstance(o, dict)]
        assert len(won) == 1, outcomes
        assert sum(isinstance(o, StaleStateError) for o in outcomes) == 1
        head = won[0]
        assert heads(savers[0]) == {"race": head["configurable"]["checkpoint_id"]}
        assert newest(savers[0], "race") == head["configurable"]["checkpoint_id"]


def test_a_checkpoint_stored_without_moving_the_head_sends_the_put_to_the_lock(open_saver: Opener) -> None:
    """A writer that does not keep the head (an older version, a tool) stored a child of it:
    the claim sees the newer checkpoint and the locked put finds the parent stale."""
    saver = open_saver()
    parent = put(saver, cfg("t"), 1)
    child = put(saver, parent, 2)
    run_sql(
        saver,
        Sql("UPDATE tk_threads SET head = %(id)s", {"id": parent["configurable"]["checkpoint_id"]}),
        write=True,
    )
    with pytest.raises(StaleStateError):
        put(saver, parent, 3)
    assert newest(saver, "t") == child["configurable"]["checkpoint_id"]


def test_another_users_put_under_a_history_limit_deletes_nothing(open_saver: Opener) -> None:
    owner, limited = open_saver(), open_saver(state_history_limit=1)
    alice = {"configurable": {"thread_id": "t", "checkpoint_ns": "", "user_id": "alice"}}
    config = alice
    for step in range(1, 4):
        config = {"configurable": {**put(owner, config, step)["configurable"], "user_id": "alice"}}
    before = dict(owner.stats())
    mallory = {"configurable": {**config["configurable"], "user_id": "mallory"}}
    with pytest.raises(StorageForbiddenError):
        put(limited, mallory, 4)
    assert dict(owner.stats()) == before
    assert len(list(owner.list(alice))) == 3
