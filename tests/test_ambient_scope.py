"""The ambient scope (SPEC W3; docs/isolation.md, "LangGraph's server"): whom calls that name
no user act for while threadkeep.langgraph serves LangGraph's server, without the server."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.contract.test_isolation import cfg, owners, start
from threadkeep import ANONYMOUS, StorageForbiddenError, open_checkpointer, operator_scope, user_scope
from threadkeep.core.identity import OPERATOR, Ambient, ambient_scope
from threadkeep.langgraph import server_scope


@pytest.fixture
def saver(tmp_path: Path) -> Iterator[Any]:
    with open_checkpointer("sqlite", str(tmp_path / "store.sqlite")) as opened:
        yield opened


def test_calls_naming_no_user_act_in_the_ambient_scope(saver: Any) -> None:
    current: list[Ambient] = ["alice"]
    with ambient_scope(lambda: current[0]):
        start(saver, "a")  # a run whose config names no user
        assert saver.get_tuple(cfg("a")) is not None
        current[0] = "bob"
        start(saver, "b")
        assert saver.get_tuple(cfg("a")) is None  # bob's request reads none of alice's threads
        with pytest.raises(StorageForbiddenError):
            saver.delete_thread("a")
        saver.copy_thread("b", "b2")  # a copy is its requester's
        current[0] = ""  # a request with no user: the anonymous owner
        start(saver, "c")
        current[0] = None  # the source knows no scope: as without one
        start(saver, "d")
        assert owners(saver, "a", "b", "b2", "c", "d") == {
            "a": "alice",
            "b": "bob",
            "b2": "bob",
            "c": ANONYMOUS,
            "d": ANONYMOUS,
        }
        # The user the server authenticated wins over a user_id the client put in a config
        # (LangGraph's server merges request fields into configurable) ...
        current[0] = "bob"
        assert saver.get_tuple(cfg("a", user_id="alice")) is None
        with pytest.raises(StorageForbiddenError):
            start(saver, "a", user_id="alice")
        # ... and an enclosing scope (code of the application's own) comes before it.
        with user_scope("alice"):
            assert saver.get_tuple(cfg("a")) is not None
            saver.delete_for_runs([])
            saver.delete_thread("a")
        assert owners(saver, "a") == {}
        # The operator (the server's own work outside any request) acts on any owner's thread.
        current[0] = OPERATOR
        saver.delete_thread("b")
        assert owners(saver, "b", "b2") == {"b2": "bob"}
    # Closed: calls act for the anonymous owner again.
    with pytest.raises(StorageForbiddenError):
        saver.delete_thread("b2")
    with operator_scope():
        saver.delete_thread("b2")


def test_server_scope_outside_the_server_is_no_scope() -> None:
    assert server_scope() is None
