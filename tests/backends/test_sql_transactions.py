"""W1 for SQL stores: a step that fails after writing every row, before COMMIT, leaves nothing."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from tests.providers import Opener
from threadkeep import StorageError
from threadkeep.workload import build_agent, turn_input


@pytest.mark.providers("memory", "sqlite", "postgres")
def test_w1_sql_step_failing_before_commit_rolls_back(
    open_saver: Opener, monkeypatch: pytest.MonkeyPatch
) -> None:
    saver = open_saver()
    config = {"configurable": {"thread_id": "atomic"}}
    graph = build_agent(saver)
    graph.invoke(turn_input(0), config)
    before = dict(saver.stats())
    head = saver.get_tuple(config)
    original = saver.backend.put

    def put_then_fail(step: Any) -> Iterator[Any]:
        yield from original(step)  # every row of the step is written ...
        raise RuntimeError("the connection died before COMMIT")  # ... then the step fails

    monkeypatch.setattr(saver.backend, "put", put_then_fail)
    with pytest.raises((RuntimeError, StorageError), match="before COMMIT"):
        graph.invoke(turn_input(1), config)
    monkeypatch.undo()

    after = saver.stats()
    for key in ("threads", "checkpoints", "channel_values"):
        assert after[key] == before[key], key
    # the turn's tasks go on while the put fails ("async" durability): their pending writes
    # store the message each wrote (by reference), and nothing of the failed put is left
    assert after["messages"] - before["messages"] <= after["writes"] - before["writes"]
    assert saver.get_tuple(config).checkpoint["id"] == head.checkpoint["id"]
