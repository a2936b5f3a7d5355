"""W1 for SQL stores: a step that fails after writing every row, before COMMIT, leaves nothing."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import pytest

from tests.providers import Opener
from threadkeep import StorageError
from threadkeep.core.program import END_TRANSACTION, Program, Sql
from threadkeep.workload import MESSAGES_PER_TURN, build_agent, turn_input

CONFIG = {"configurable": {"thread_id": "atomic"}}


def _one_turn(saver: Any) -> tuple[Any, dict[str, Any], Any]:
    """A graph on ``saver`` that ran one turn, what the store held then, and its head."""
    graph = build_agent(saver)
    graph.invoke(turn_input(0), CONFIG)
    return graph, dict(saver.stats()), saver.get_tuple(CONFIG)


@pytest.mark.providers("memory", "sqlite", "postgres")
def test_w1_sql_step_failing_before_commit_rolls_back(
    open_saver: Opener, monkeypatch: pytest.MonkeyPatch
) -> None:
    saver = open_saver()
    # The locked put (a put as one statement commits with its only statement: see below)
    monkeypatch.setattr(saver.backend.dialect, "claimed_put", None)
    graph, before, head = _one_turn(saver)
    original = saver.backend.put

    def put_then_fail(step: Any) -> Iterator[Any]:
        yield from original(step)  # every row of the step is written ...
        raise RuntimeError("the connection died before COMMIT")  # ... then the step fails

    monkeypatch.setattr(saver.backend, "put", put_then_fail)
    with pytest.raises((RuntimeError, StorageError), match="before COMMIT"):
        graph.invoke(turn_input(1), CONFIG)
    monkeypatch.undo()

    after = saver.stats()
    for key in ("threads", "checkpoints", "channel_values"):
        assert after[key] == before[key], key
    # the turn's tasks go on while the put fails ("async" durability): their pending writes
    # store the message each wrote (by reference), and nothing of the failed put is left
    assert after["messages"] - before["messages"] <= after["writes"] - before["writes"]
    assert saver.get_tuple(CONFIG).checkpoint["id"] == head.checkpoint["id"]


@pytest.mark.providers("postgres")
def test_w1_a_put_as_one_statement_that_fails_midway_stores_nothing(
    open_saver: Opener, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The one-statement put sets the head, then writes messages, links and the checkpoint:
    a row that fails after the head is set takes the whole statement back with it."""
    saver = open_saver()
    graph, before, head = _one_turn(saver)
    dialect = saver.backend.dialect
    claimed_put = dialect.claimed_put
    claims: list[bool] = []

    def failing_row(common: Any, rows: Any, keep: Any) -> Any:
        claims.append(True)
        broken = {**rows, "message": [*rows["message"], {"digest": b"x", "type": None, "value": b""}]}
        return claimed_put(common, broken, keep)  # a NULL type: the last message row fails

    monkeypatch.setattr(dialect, "claimed_put", failing_row)
    with pytest.raises(StorageError):
        graph.invoke(turn_input(1), CONFIG)
    monkeypatch.undo()

    assert claims  # the put went as one statement
    after = saver.stats()
    for key in ("threads", "checkpoints", "channel_values"):
        assert after[key] == before[key], key
    assert saver.get_tuple(CONFIG).checkpoint["id"] == head.checkpoint["id"]
    graph.invoke(turn_input(1), CONFIG)  # the head was not moved: the thread goes on
    assert len(saver.get_tuple(CONFIG).checkpoint["channel_values"]["messages"]) == 2 * MESSAGES_PER_TURN


@pytest.mark.providers("sqlite", "postgres")
def test_p6_a_schema_program_commits_each_step_it_ends(open_saver: Opener) -> None:
    """``setup`` (and ``asetup``) commits at each END_TRANSACTION a schema program yields: a
    step that fails after it takes back only its own writes (each migration of an upgrade
    commits on its own)."""
    engine = open_saver().backend.engine

    def steps(table: str) -> Program[None]:
        yield Sql(f"CREATE TABLE {table} (n INTEGER)", {})
        yield Sql(f"INSERT INTO {table} (n) VALUES (1)", {})
        yield END_TRANSACTION
        yield Sql(f"INSERT INTO {table} (n) VALUES (2)", {})
        raise RuntimeError("the second step fails")

    def rows(table: str) -> Program[list[Any]]:
        return [tuple(row) for row in (yield Sql(f"SELECT n FROM {table}", {}))]

    with pytest.raises((RuntimeError, StorageError), match="the second step fails"):
        engine.setup(lambda: steps("tk_probe_sync"))
    assert engine.setup(lambda: rows("tk_probe_sync")) == [(1,)]
    with pytest.raises((RuntimeError, StorageError), match="the second step fails"):
        asyncio.run(engine.asetup(lambda: steps("tk_probe_async")))
    assert engine.setup(lambda: rows("tk_probe_async")) == [(1,)]
