"""SPEC W3 (issue 36 items 2 and 3): who a call acts for, no silent no-op on another user's
thread, and handing anonymous threads to their users; on every provider, sync and async."""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from langchain_core.runnables import RunnableConfig
from langgraph.types import Command

from tests.graphs import approval_graph
from threadkeep import (
    ANONYMOUS,
    InvalidInputError,
    StorageForbiddenError,
    open_checkpointer,
    operator_scope,
    user_scope,
)
from threadkeep.cli import main

API = ["sync", "async"]


def cfg(thread_id: str, **extra: Any) -> RunnableConfig:
    return {"configurable": {"thread_id": thread_id, **extra}}


def call(saver: Any, api: str, name: str, *args: Any, **kwargs: Any) -> Any:
    """``saver.name(...)``, or its async twin run to completion."""
    if api == "sync":
        return getattr(saver, name)(*args, **kwargs)
    return asyncio.run(getattr(saver, f"a{name}")(*args, **kwargs))


def history(saver: Any, thread_id: str, user: str) -> list[tuple[str, str, dict[str, Any]]]:
    """Every checkpoint of a thread as its owner reads it: namespace, id and values."""
    return [
        (t.config["configurable"]["checkpoint_ns"], t.checkpoint["id"], t.checkpoint["channel_values"])
        for t in saver.list(cfg(thread_id, user_id=user))
    ]


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


# --- item 3: another user's thread is refused, and nothing changes --------------------------


@pytest.mark.parametrize("api", API)
def test_w3_another_users_delete_copy_prune_raise_and_change_nothing(saver: Any, api: str) -> None:
    alices_run = start(saver, "t-alice", user_id="alice")
    bobs_run = start(saver, "t-bob", user_id="bob")
    alice_before, bob_before = history(saver, "t-alice", "alice"), history(saver, "t-bob", "bob")
    stats_before = saver.stats()
    attempts: list[tuple[str, tuple[Any, ...], dict[str, Any], str]] = [
        ("delete_thread", ("t-alice",), {}, "delete"),
        ("prune", (["t-alice"],), {"strategy": "keep_latest"}, "prune"),
        ("prune", (["t-alice"],), {"strategy": "delete"}, "prune"),
        # bob's own thread first: a refusal on any thread prunes none
        ("prune", (["t-bob", "t-alice"],), {"strategy": "keep_latest"}, "prune"),
        ("prune", (["t-bob", "t-alice"],), {"strategy": "delete"}, "prune"),
        ("delete_for_runs", ([alices_run],), {}, "delete runs on"),
        ("delete_for_runs", ([bobs_run, alices_run],), {}, "delete runs on"),
        ("copy_thread", ("t-alice", "t-stolen"), {}, "copy"),
        ("copy_thread", ("t-bob", "t-alice"), {}, "copy onto"),
    ]
    with user_scope("bob"):
        for name, args, kwargs, action in attempts:
            with pytest.raises(StorageForbiddenError) as refused:
                call(saver, api, name, *args, **kwargs)
            assert refused.value.code == "STORAGE_FORBIDDEN_001"
            assert refused.value.context == {"thread_id": "t-alice", "user_id": "bob", "action": action}
            assert "operator_scope" in refused.value.message, refused.value.message
    assert history(saver, "t-alice", "alice") == alice_before
    assert history(saver, "t-bob", "bob") == bob_before
    assert owners(saver, "t-alice", "t-bob", "t-stolen") == {"t-alice": "alice", "t-bob": "bob"}
    assert saver.stats() == stats_before
    # the owner, and the operator, still act
    with user_scope("alice"):
        call(saver, api, "copy_thread", "t-alice", "t-alice-copy")
    assert len(history(saver, "t-alice-copy", "alice")) == len(alice_before)
    with operator_scope():
        call(saver, api, "delete_for_runs", [alices_run, bobs_run])
        call(saver, api, "delete_thread", "t-alice-copy")
    assert history(saver, "t-alice", "alice") == history(saver, "t-bob", "bob") == []


@pytest.mark.parametrize("api", API)
def test_w3_a_missing_thread_is_no_error_and_creates_nothing(saver: Any, api: str) -> None:
    """As LangGraph's savers have it: deleting, pruning or copying a thread the store does not
    hold, or deleting runs that stored nothing, does nothing and raises nothing."""
    start(saver, "t-alice", user_id="alice")
    before = saver.stats()
    with user_scope("bob"):
        assert call(saver, api, "delete_thread", "t-none") is None
        call(saver, api, "prune", ["t-none"], strategy="keep_latest")
        call(saver, api, "prune", ["t-none"], strategy="delete")
        call(saver, api, "delete_for_runs", [str(uuid.uuid4())])
        call(saver, api, "copy_thread", "t-none", "t-target")
    assert owners(saver, "t-none", "t-target") == {}
    assert saver.stats() == before


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


# --- handing anonymous threads to their users -----------------------------------------------


@pytest.mark.parametrize("api", API)
def test_w3_assign_owner_hands_anonymous_threads_to_their_user(saver: Any, api: str) -> None:
    start(saver, "t-old-1")
    start(saver, "t-old-2")
    start(saver, "t-old-3")
    start(saver, "t-bob", user_id="bob")
    old = history(saver, "t-old-1", ANONYMOUS)
    assert saver.get_tuple(cfg("t-old-1")) is not None  # read (tiered: now in the cache)

    with pytest.raises(StorageForbiddenError, match="operator_scope"):
        call(saver, api, "assign_owner", ["t-old-1"], "alice")
    with user_scope("alice"), pytest.raises(StorageForbiddenError, match="operator_scope"):
        call(saver, api, "assign_owner", ["t-old-1"], "alice")
    with operator_scope():
        before = call(saver, api, "assign_owner", ["t-old-1", "t-old-2", "t-none"], "alice")
        assert before == {"t-old-1": ANONYMOUS, "t-old-2": ANONYMOUS, "t-none": None}
        # again: already alice's
        assert call(saver, api, "assign_owner", ["t-old-1"], "alice") == {"t-old-1": "alice"}
        # bob's thread is not taken without force, and then nothing is
        with pytest.raises(StorageForbiddenError, match="force") as refused:
            call(saver, api, "assign_owner", ["t-old-3", "t-bob"], "alice")
        assert refused.value.context == {"user_id": "alice", "owners": {"t-bob": "bob"}}
        with pytest.raises(InvalidInputError, match="user is empty"):
            call(saver, api, "assign_owner", ["t-old-3"], "")
    assert owners(saver, "t-old-1", "t-old-2", "t-old-3", "t-bob", "t-none") == {
        "t-old-1": "alice",
        "t-old-2": "alice",
        "t-old-3": ANONYMOUS,
        "t-bob": "bob",
    }
    # alice now holds the whole history, and continues it; the anonymous owner sees nothing
    assert history(saver, "t-old-1", "alice") == old
    assert saver.get_tuple(cfg("t-old-1")) is None
    assert list(saver.list(cfg("t-old-1"))) == []
    approval_graph(saver).invoke(Command(resume="ok"), cfg("t-old-1", user_id="alice"))
    assert saver.get_tuple(cfg("t-old-1", user_id="alice")).checkpoint["channel_values"]["answer"] == "ok!"
    # force takes another user's thread
    with operator_scope():
        assert call(saver, api, "assign_owner", ["t-bob"], "alice", force=True) == {"t-bob": "bob"}
    assert saver.get_tuple(cfg("t-bob", user_id="bob")) is None
    assert saver.get_tuple(cfg("t-bob", user_id="alice")) is not None


def test_w3_cli_assign_owner(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``threadkeep threads assign-owner``, in process, on the configured store (a thin
    adapter over ``assign_owner``: the contract tests above cover every provider)."""
    monkeypatch.setenv("LLM_PROVIDER_CHECKPOINT", "sqlite")
    monkeypatch.setenv("LLM_PROVIDER_CHECKPOINT_CONN_STRING", str(tmp_path / "owners.sqlite"))
    with open_checkpointer() as saver:
        start(saver, "t-1")
        start(saver, "t-2")
        start(saver, "t-bob", user_id="bob")

    done = CliRunner().invoke(main, ["threads", "assign-owner", "t-1", "t-2", "--user", "alice"])
    assert done.exit_code == 0, done.output
    assert "t-1: 'anonymous' -> 'alice'" in done.output
    assert "t-2: 'anonymous' -> 'alice'" in done.output

    refused = CliRunner().invoke(main, ["threads", "assign-owner", "t-bob", "--user", "alice"])
    assert refused.exit_code == 1
    assert "STORAGE_FORBIDDEN_001" in refused.output
    assert "--force" in refused.output

    missing = CliRunner().invoke(
        main, ["threads", "assign-owner", "t-none", "t-bob", "--user", "alice", "--force", "--json"]
    )
    assert missing.exit_code == 4, missing.output
    assert '"t-bob": "bob"' in missing.output
    assert '"t-none": null' in missing.output

    with open_checkpointer() as saver:
        assert owners(saver, "t-1", "t-2", "t-bob") == {"t-1": "alice", "t-2": "alice", "t-bob": "alice"}
        assert saver.get_tuple(cfg("t-1", user_id="alice")) is not None
