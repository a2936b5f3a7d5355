"""SPEC W3 (issue 36 item 2): who a call acts for, on every provider."""

from __future__ import annotations

import uuid
from typing import Any

import pytest
from langchain_core.runnables import RunnableConfig
from langgraph.types import Command

from tests.graphs import approval_graph
from threadkeep import (
    ANONYMOUS,
    StorageForbiddenError,
    operator_scope,
    user_scope,
)


def cfg(thread_id: str, **extra: Any) -> RunnableConfig:
    return {"configurable": {"thread_id": thread_id, **extra}}


def owners(saver: Any, *thread_ids: str) -> dict[str, str]:
    with operator_scope():
        return {thread.thread_id: thread.owner for thread in saver.threads_named(list(thread_ids))}


def start(saver: Any, thread_id: str, **configurable: Any) -> str:
    """Run the approval graph up to its interrupt; returns the run id its checkpoints carry
    (as LangGraph's server passes it: in ``configurable``, which metadata copies)."""
    run_id = str(uuid.uuid4())
    graph = approval_graph(saver)
    graph.invoke({"request": thread_id, "answer": ""}, cfg(thread_id, run_id=run_id, **configurable))
    return run_id


# --- item 2 (identity): LangGraph's server's user, and an empty user id ---------------------


class _ServerUser:
    """What LangGraph's server puts in ``langgraph_auth_user``: an object with ``identity``
    (the server's proxy of ``langgraph_sdk.auth.types.BaseUser``)."""

    def __init__(self, identity: str) -> None:
        self.identity = identity
        self.is_authenticated = True
        self.permissions: list[str] = []


@pytest.mark.parametrize("form", ["object", "dict"])
def test_w3_langgraph_auth_user_isolates_two_users(saver: Any, form: str) -> None:
    def server(identity: str) -> dict[str, Any]:
        user = _ServerUser(identity) if form == "object" else {"identity": identity, "permissions": []}
        # as the server sends it: its user, and an empty user_id (a client's user_id would
        # not override the authenticated identity)
        return {"langgraph_auth_user": user, "user_id": ""}

    start(saver, "t-alice", **server("alice"))
    start(saver, "t-bob", **{**server("bob"), "user_id": "alice"})
    assert owners(saver, "t-alice", "t-bob") == {"t-alice": "alice", "t-bob": "bob"}
    assert saver.get_tuple(cfg("t-alice", **server("alice"))) is not None
    assert saver.get_tuple(cfg("t-alice", **server("bob"))) is None
    assert list(saver.list(cfg("t-alice", **server("bob")))) == []
    assert saver.get_tuple(cfg("t-alice", user_id="alice")) is not None
    with pytest.raises(StorageForbiddenError):
        start(saver, "t-alice", **server("bob"))
    approval_graph(saver).invoke(Command(resume="yes"), cfg("t-alice", **server("alice")))
    assert saver.get_tuple(cfg("t-alice", user_id="alice")).checkpoint["channel_values"]["answer"] == "yes!"
    # an unauthenticated user's identity is "": no user
    start(saver, "t-nobody", **server(""))
    assert owners(saver, "t-nobody") == {"t-nobody": ANONYMOUS}


def test_w3_an_empty_user_id_is_no_user(saver: Any) -> None:
    start(saver, "t-empty", user_id="")
    with user_scope("carol"):
        start(saver, "t-scoped", user_id="")
    assert owners(saver, "t-empty", "t-scoped") == {"t-empty": ANONYMOUS, "t-scoped": "carol"}
    assert saver.get_tuple(cfg("t-empty", user_id="")) is not None
    assert saver.get_tuple(cfg("t-empty")) is not None
    assert saver.get_tuple(cfg("t-empty", user_id="carol")) is None
    assert saver.get_tuple(cfg("t-scoped", user_id=None)) is None  # no scope here: anonymous
