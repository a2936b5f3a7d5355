"""The ambient scope (SPEC W3; docs/isolation.md, "LangGraph's server"): whom calls that name
no user act for while threadkeep.langgraph serves LangGraph's server, without the server."""

from __future__ import annotations

import asyncio
import sys
import types
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.contract.test_isolation import cfg, owners, start
from tests.graphs import approval_graph
from threadkeep import ANONYMOUS, StorageForbiddenError, open_checkpointer, operator_scope, user_scope
from threadkeep.core.identity import OPERATOR, Ambient, ambient_scope
from threadkeep.langgraph import act_for, checkpointer, server_scope


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


# --- threadkeep.langgraph: whom the server's calls act for (docs/isolation.md) ---------------

SRC = Path(__file__).resolve().parents[1] / "src" / "threadkeep"


def test_threadkeep_uses_no_module_of_langgraph_api() -> None:
    """langgraph-api documents no Python module: threadkeep neither imports one nor looks one up
    (in ``sys.modules``), so no release of the server can change whom a call acts for."""
    users = sorted(
        str(path.relative_to(SRC)) for path in SRC.rglob("*.py") if "langgraph_api" in path.read_text()
    )
    assert users == []


@pytest.fixture
def server_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The settings LangGraph's server would open threadkeep.langgraph.checkpointer with."""
    path = tmp_path / "server.sqlite"
    monkeypatch.setenv("LLM_PROVIDER_CHECKPOINT", "sqlite")
    monkeypatch.setenv("LLM_PROVIDER_CHECKPOINT_CONN_STRING", str(path))
    return path


async def _run(saver: Any, thread_id: str, **configurable: Any) -> str:
    """A run's steps, as the server's worker runs them: the run's config names the run and, with
    custom auth, its ``langgraph_auth_user``."""
    run_id = str(uuid.uuid4())
    graph = approval_graph(saver)
    await graph.ainvoke({"request": thread_id, "answer": ""}, cfg(thread_id, run_id=run_id, **configurable))
    return run_id


def _user(identity: str) -> dict[str, Any]:
    return {"identity": identity, "permissions": []}


async def test_server_code_outside_a_request_acts_for_no_user(
    server_env: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A custom route, a websocket or a background task of the server names no user: it reads
    and deletes only the anonymous owner's threads, never another user's."""
    # What the server's own accessor says outside any request: no auth context.
    outside = types.ModuleType("langgraph_api.utils")
    outside.get_auth_ctx = lambda: None  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "langgraph_api.utils", outside)
    async with checkpointer() as saver:
        await _run(saver, "alices", langgraph_auth_user=_user("alice"))
        await _run(saver, "nobodys")
        assert await saver.aget_tuple(cfg("alices")) is None
        assert [t async for t in saver.alist(cfg("alices"))] == []
        with pytest.raises(StorageForbiddenError):
            await saver.adelete_thread("alices")
        with pytest.raises(StorageForbiddenError):
            await saver.acopy_thread("alices", "stolen")
        with pytest.raises(StorageForbiddenError):
            await saver.aprune(["alices"], strategy="delete")
        assert await saver.aget_tuple(cfg("nobodys")) is not None
    with open_checkpointer("sqlite", str(server_env)) as store:
        assert owners(store, "alices", "nobodys", "stolen") == {"alices": "alice", "nobodys": ANONYMOUS}


async def test_act_for_makes_the_request_act_for_its_user(server_env: Path) -> None:
    async def request(user: object, *calls: Any) -> list[Any]:
        """One request of the server, in its own context: the auth handler, then its calls."""

        async def serve() -> list[Any]:
            act_for(user)
            return [await call() for call in calls]

        return await asyncio.create_task(serve())

    async with checkpointer() as saver:
        await _run(saver, "alices", langgraph_auth_user=_user("alice"))
        await _run(saver, "bobs", langgraph_auth_user=_user("bob"))
        found, listed = await request(
            "alice", lambda: saver.aget_tuple(cfg("alices")), lambda: _listed(saver, "alices")
        )
        assert found is not None
        assert listed > 0
        # The user the handler authenticated wins over a user_id the client put in the config.
        assert await request(_user("bob"), lambda: saver.aget_tuple(cfg("alices", user_id="alice"))) == [None]
        with pytest.raises(StorageForbiddenError):
            await request("bob", lambda: saver.adelete_thread("alices"))
        await request("alice", lambda: saver.acopy_thread("alices", "alices-copy"))
        await request("alice", lambda: saver.adelete_thread("alices"))
        # An unauthenticated user (empty identity) is no user: the anonymous owner.
        assert await request("", lambda: saver.aget_tuple(cfg("bobs"))) == [None]
        assert server_scope() is None  # each request's user stays in its own context
    with open_checkpointer("sqlite", str(server_env)) as store:
        assert owners(store, "alices", "alices-copy", "bobs") == {"alices-copy": "alice", "bobs": "bob"}


async def _listed(saver: Any, thread_id: str) -> int:
    return len([t async for t in saver.alist(cfg(thread_id))])


async def test_rollback_cleanup_outside_a_request_deletes_only_runs_the_server_ran(server_env: Path) -> None:
    """The server's worker deletes a run cancelled by ``multitask_strategy="rollback"`` outside any
    request, naming no user: for a run whose steps this server ran, for that run's user; any other
    run is refused as for no user."""
    async with checkpointer() as saver:
        await _run(saver, "alices", langgraph_auth_user=_user("alice"))
        rolled_back = await _run(saver, "alices", langgraph_auth_user=_user("alice"))
        with user_scope("bob"):  # bob's run, written through threadkeep but not by the server
            not_the_servers = await _run(saver.saver, "bobs")
        kept = await _listed_as(saver, "alices", "alice")
        await saver.adelete_for_runs([rolled_back])
        assert 0 < await _listed_as(saver, "alices", "alice") < kept
        with pytest.raises(StorageForbiddenError):
            await saver.adelete_for_runs([not_the_servers])
        # In a request, the request's user decides, whoever ran the run.
        first = await _run(saver, "alices", langgraph_auth_user=_user("alice"))

        async def bobs_request() -> None:
            act_for("bob")
            await saver.adelete_for_runs([first])

        with pytest.raises(StorageForbiddenError):
            await asyncio.create_task(bobs_request())
    with open_checkpointer("sqlite", str(server_env)) as store, user_scope("bob"):
        assert len(list(store.list(cfg("bobs")))) > 0


async def _listed_as(saver: Any, thread_id: str, user: str) -> int:
    with user_scope(user):
        return await _listed(saver, thread_id)
