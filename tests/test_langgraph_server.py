"""LangGraph's own server (``langgraph dev``, in-memory runtime) on threadkeep, driven with
``langgraph_sdk`` as a user would: ``"checkpointer": {"path":
"threadkeep.langgraph.checkpointer"}`` in ``langgraph.json`` and the store named by the
``LLM_PROVIDER_CHECKPOINT*`` settings. Each test starts a real server process on a free port
of 127.0.0.1 and checks the store itself after the server's deletes, copies and rollbacks."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import sqlite3
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from contextlib import closing, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.providers import POSTGRES_URL, postgres_probe, postgres_schema
from tests.servers import free_port

pytestmark = pytest.mark.slow

SRC = Path(__file__).resolve().parents[1] / "src"
START_TIMEOUT = 90.0  # seconds for the server to answer /ok (imports on a loaded machine)
WAIT = 60.0  # seconds any one step of a test may wait for the server

GRAPH = """
import os, time
from operator import add
from pathlib import Path
from typing import Annotated, NotRequired, TypedDict

from langgraph.graph import END, START, StateGraph
from langgraph.types import interrupt

GATES = Path(os.environ["TK_TEST_GATES"])


class State(TypedDict):
    log: Annotated[list[str], add]
    gate: NotRequired[str]
    ask: NotRequired[bool]


def work(state: State) -> dict:
    gate = state.get("gate")
    if gate:
        (GATES / f"{gate}.started").touch()
        deadline = time.monotonic() + 60
        while not (GATES / gate).exists():
            if time.monotonic() > deadline:
                raise TimeoutError(f"gate {gate} never opened")
            time.sleep(0.02)
    return {"log": [f"work:{gate or ''}"], "gate": ""}


def ask(state: State) -> dict:
    return {"log": [f"answer:{interrupt('question?')}"]}


builder = StateGraph(State)
builder.add_node("work", work)
builder.add_node("ask", ask)
builder.add_edge(START, "work")
builder.add_conditional_edges("work", lambda s: "ask" if s.get("ask") else END, ["ask", END])
builder.add_edge("ask", END)
graph = builder.compile()
"""

# The auth handler of LangGraph's docs: the bearer token names the user, and every thread is
# tagged with its owner and filtered by it. It tells threadkeep whom the request acts for.
AUTH = """
from langgraph_sdk import Auth

from threadkeep.langgraph import act_for

auth = Auth()


@auth.authenticate
async def authenticate(authorization: str | None) -> str:
    if not authorization or not authorization.startswith("Bearer "):
        raise Auth.exceptions.HTTPException(status_code=401, detail="no token")
    user = authorization.removeprefix("Bearer ")
    act_for(user)
    return user


@auth.on
async def owner_only(ctx: Auth.types.AuthContext, value: dict) -> dict:
    filters = {"owner": ctx.user.identity}
    if isinstance(value, dict):
        value.setdefault("metadata", {}).update(filters)
    return filters
"""

# A custom route (``http.app``): server code that serves no request of LangGraph's API, calling
# threadkeep on the server's store.
WEBAPP = """
import asyncio

from starlette.applications import Starlette
from starlette.responses import JSONResponse
from starlette.routing import Route

from threadkeep import StorageForbiddenError, open_checkpointer


async def thread(request):
    thread_id = request.path_params["thread_id"]
    saver = await asyncio.to_thread(open_checkpointer)
    try:
        if request.method == "DELETE":
            try:
                await saver.adelete_thread(thread_id)
            except StorageForbiddenError:
                return JSONResponse({"deleted": False}, status_code=403)
            return JSONResponse({"deleted": True})
        found = await saver.aget_tuple({"configurable": {"thread_id": thread_id, "checkpoint_ns": ""}})
        history = [t async for t in saver.alist({"configurable": {"thread_id": thread_id}})]
        return JSONResponse({"found": found is not None, "history": len(history)})
    finally:
        await saver.aclose()


app = Starlette(routes=[Route("/custom/threads/{thread_id}", thread, methods=["GET", "DELETE"])])
"""


def _langgraph_cli() -> str:
    found = shutil.which("langgraph", path=f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}")
    if found is None:
        message = 'langgraph-cli is not installed: pip install "langgraph-cli[inmem]" (./dev installs it)'
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(message)
        pytest.skip(message)
    return found


@dataclass
class Store:
    """Reads the store the server writes, directly (not through threadkeep)."""

    kind: str
    conn_string: str

    def rows(self, sql: str, *params: Any) -> list[tuple[Any, ...]]:
        if self.kind == "sqlite":
            with closing(sqlite3.connect(self.conn_string)) as conn:
                return conn.execute(sql.replace("%s", "?"), params).fetchall()
        import psycopg

        with psycopg.connect(self.conn_string, autocommit=True) as conn:
            return conn.execute(sql, params).fetchall()  # type: ignore[arg-type]

    def owner(self, thread_id: str) -> str | None:
        rows = self.rows("SELECT owner FROM tk_threads WHERE thread_id = %s", thread_id)
        return rows[0][0] if rows else None

    def checkpoints(self, thread_id: str) -> int:
        return self.rows(
            "SELECT count(*) FROM tk_checkpoints c JOIN tk_threads t ON t.tid = c.tid WHERE t.thread_id = %s",
            thread_id,
        )[0][0]

    def writes(self, thread_id: str) -> int:
        return self.rows(
            "SELECT count(*) FROM tk_writes w JOIN tk_threads t ON t.tid = w.tid WHERE t.thread_id = %s",
            thread_id,
        )[0][0]

    def run_checkpoints(self, run_id: str) -> int:
        return self.rows("SELECT count(*) FROM tk_checkpoints WHERE run_id = %s", run_id)[0][0]


@dataclass
class Server:
    url: str
    store: Store
    gates: Path

    def open_gate(self, name: str) -> None:
        (self.gates / name).touch()

    async def started(self, gate: str) -> None:
        """Wait until the run held at ``gate`` is inside its node."""
        await _until((self.gates / f"{gate}.started").exists, f"a run to reach gate {gate}")


async def _until(predicate: Any, what: str) -> None:
    deadline = time.monotonic() + WAIT
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.05)


@contextmanager
def langgraph_dev(tmp_path: Path, store: Store, *, auth: bool) -> Iterator[Server]:
    """``langgraph dev`` on 127.0.0.1:<free port> with threadkeep as its checkpointer; always
    stopped (its whole process group) when the block ends."""
    cli = _langgraph_cli()
    app = tmp_path / "app"
    gates = tmp_path / "gates"
    app.mkdir()
    gates.mkdir()
    (app / "graph.py").write_text(GRAPH)
    config: dict[str, Any] = {
        "dependencies": ["."],
        "graphs": {"agent": "./graph.py:graph"},
        "checkpointer": {"path": "threadkeep.langgraph.checkpointer"},
    }
    if auth:
        (app / "auth.py").write_text(AUTH)
        config["auth"] = {"path": "./auth.py:auth"}
        (app / "webapp.py").write_text(WEBAPP)
        config["http"] = {"app": "./webapp.py:app"}
    (app / "langgraph.json").write_text(json.dumps(config))
    port = free_port()
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(SRC), os.environ.get("PYTHONPATH")])),
        "LLM_PROVIDER_CHECKPOINT": store.kind,
        "LLM_PROVIDER_CHECKPOINT_CONN_STRING": store.conn_string,
        "TK_TEST_GATES": str(gates),
        # Offline: no analytics, version check, tracing or LangSmith calls.
        "LANGGRAPH_CLI_NO_ANALYTICS": "1",
        "LANGGRAPH_NO_VERSION_CHECK": "true",
        "LANGSMITH_TRACING": "false",
        "LANGCHAIN_TRACING_V2": "false",
    }
    env.pop("LANGSMITH_API_KEY", None)
    env.pop("LANGCHAIN_API_KEY", None)
    log_path = tmp_path / "langgraph-dev.log"
    with log_path.open("wb") as log:
        process = subprocess.Popen(
            [cli, "dev", "--host", "127.0.0.1", "--port", str(port), "--no-browser", "--no-reload"],
            cwd=app,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + START_TIMEOUT
        while True:
            if process.poll() is not None:
                raise AssertionError(f"langgraph dev exited ({process.returncode}):\n{log_path.read_text()}")
            try:
                if httpx.get(f"{url}/ok", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                raise AssertionError(
                    f"langgraph dev did not answer in {START_TIMEOUT}s:\n{log_path.read_text()}"
                )
            time.sleep(0.2)
        yield Server(url, store, gates)
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGTERM)
            try:
                process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait(timeout=20)
        # The server's own errors (a checkpointer call that raised) are in its log.
        errors = [line for line in log_path.read_text().splitlines() if "StorageForbidden" in line]
        assert not errors, "\n".join(errors)


@pytest.fixture(params=["sqlite", "postgres"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Store:
    if request.param == "sqlite":
        return Store("sqlite", str(tmp_path / "checkpoints.sqlite"))
    problem = postgres_probe()
    if problem is not None:
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(problem)
        pytest.skip(problem)
    assert POSTGRES_URL
    return Store("postgres", postgres_schema(uuid.uuid4().hex))


def _client(server: Server, user: str | None = None) -> Any:
    from langgraph_sdk import get_client

    headers = {"Authorization": f"Bearer {user}"} if user else None
    return get_client(url=server.url, headers=headers)


async def _finish(client: Any, thread_id: str, run_id: str) -> dict[str, Any]:
    await _until_status(client, thread_id, run_id, {"success", "error", "interrupted"})
    run: dict[str, Any] = await client.runs.get(thread_id, run_id)
    return run


async def _until_status(client: Any, thread_id: str, run_id: str, wanted: set[str]) -> None:
    deadline = time.monotonic() + WAIT
    while (await client.runs.get(thread_id, run_id))["status"] not in wanted:
        if time.monotonic() > deadline:
            raise AssertionError(f"run {run_id} never reached {wanted}")
        await asyncio.sleep(0.05)


async def _runs_interrupt_state_history_copy_delete(server: Server, client: Any, owner: str) -> str:
    """One thread's whole life through the server; returns the id of its copy."""
    store = server.store
    thread = (await client.threads.create())["thread_id"]
    first = await client.runs.wait(thread, "agent", input={"log": ["hi"], "ask": True})
    assert first["__interrupt__"][0]["value"] == "question?"
    state = await client.threads.get_state(thread)
    assert state["values"]["log"] == ["hi", "work:"]
    assert state["next"] == ["ask"]
    assert state["tasks"][0]["interrupts"][0]["value"] == "question?"

    resumed = await client.runs.wait(thread, "agent", command={"resume": "yes"})
    assert resumed["log"] == ["hi", "work:", "answer:yes"]
    state = await client.threads.get_state(thread)
    assert state["values"]["log"] == ["hi", "work:", "answer:yes"]
    assert state["next"] == []
    history = await client.threads.get_history(thread, limit=100)
    stored = store.checkpoints(thread)
    assert len(history) == stored >= 4
    assert history[0]["values"] == state["values"]
    assert store.owner(thread) == owner

    copy = (await client.threads.copy(thread))["thread_id"]
    copied = await client.threads.get_state(copy)
    assert copied["values"] == state["values"]
    assert len(await client.threads.get_history(copy, limit=100)) == stored
    assert store.checkpoints(copy) == stored
    assert store.owner(copy) == owner

    await client.threads.delete(thread)
    assert store.owner(thread) is None
    assert store.checkpoints(thread) == 0
    assert store.writes(thread) == 0
    assert store.checkpoints(copy) == stored  # the copy stands alone
    return str(copy)


async def _double_texting(server: Server, client: Any) -> None:
    """reject, enqueue, interrupt and rollback, each with a first run held inside its node."""
    from langgraph_sdk.errors import ConflictError

    store = server.store

    async def held(gate: str) -> tuple[str, str]:
        thread = (await client.threads.create())["thread_id"]
        run = await client.runs.create(thread, "agent", input={"log": ["first"], "gate": gate})
        await server.started(gate)
        return thread, run["run_id"]

    # reject: the second run is refused while the first runs; the first completes.
    thread, first = await held("reject")
    with pytest.raises(ConflictError):
        await client.runs.create(
            thread, "agent", input={"log": ["second"], "gate": ""}, multitask_strategy="reject"
        )
    server.open_gate("reject")
    assert (await _finish(client, thread, first))["status"] == "success"
    assert (await client.threads.get_state(thread))["values"]["log"] == ["first", "work:reject"]

    # enqueue: the second run waits for the first, then runs on its state.
    thread, first = await held("enqueue")
    second = await client.runs.create(
        thread, "agent", input={"log": ["second"], "gate": ""}, multitask_strategy="enqueue"
    )
    server.open_gate("enqueue")
    assert (await _finish(client, thread, first))["status"] == "success"
    assert (await _finish(client, thread, second["run_id"]))["status"] == "success"
    assert (await client.threads.get_state(thread))["values"]["log"] == [
        "first",
        "work:enqueue",
        "second",
        "work:",
    ]

    # interrupt: the first run is stopped (its checkpoints stay), the second runs.
    thread, first = await held("interrupt")
    second = await client.runs.create(
        thread, "agent", input={"log": ["second"], "gate": ""}, multitask_strategy="interrupt"
    )
    assert (await _finish(client, thread, second["run_id"]))["status"] == "success"
    server.open_gate("interrupt")
    assert (await client.runs.get(thread, first))["status"] == "interrupted"
    assert store.run_checkpoints(first) > 0
    assert (await client.threads.get_state(thread))["values"]["log"][-2:] == ["second", "work:"]

    # rollback: the first run is deleted, with its checkpoints in the store.
    thread, first = await held("rollback")
    # (the run's checkpoints are stored in the background while its node runs)
    await _until(lambda: store.run_checkpoints(first) > 0, "the first run's checkpoints")
    second = await client.runs.create(
        thread, "agent", input={"log": ["second"], "gate": ""}, multitask_strategy="rollback"
    )
    assert (await _finish(client, thread, second["run_id"]))["status"] == "success"
    server.open_gate("rollback")
    assert store.run_checkpoints(first) == 0
    assert store.run_checkpoints(second["run_id"]) > 0
    assert (await client.threads.get_state(thread))["values"]["log"] == ["second", "work:"]

    # rollback of a run a client is streaming: the server keeps the run until its worker stops
    # it, and the worker deletes its checkpoints outside any request.
    thread = (await client.threads.create())["thread_id"]
    stream = client.runs.stream(
        thread, "agent", input={"log": ["first"], "gate": "streamed"}, stream_mode="values"
    )
    metadata = await anext(stream)
    assert metadata.event == "metadata"
    first = metadata.data["run_id"]
    drained = asyncio.create_task(_drain(stream))
    await server.started("streamed")
    await _until(lambda: store.run_checkpoints(first) > 0, "the streamed run's checkpoints")
    second = await client.runs.create(
        thread, "agent", input={"log": ["second"], "gate": ""}, multitask_strategy="rollback"
    )
    assert (await _finish(client, thread, second["run_id"]))["status"] == "success"
    server.open_gate("streamed")
    await asyncio.wait_for(drained, WAIT)
    await _until(lambda: store.run_checkpoints(first) == 0, "the rolled-back run's checkpoints to go")
    assert (await client.threads.get_state(thread))["values"]["log"] == ["second", "work:"]


async def _drain(stream: Any) -> None:
    async for _ in stream:
        pass


async def test_langgraph_dev_with_default_settings(tmp_path: Path, store: Store) -> None:
    with langgraph_dev(tmp_path, store, auth=False) as server:
        client = _client(server)
        await _runs_interrupt_state_history_copy_delete(server, client, owner="anonymous")
        await _double_texting(server, client)


async def test_langgraph_dev_with_custom_auth_keeps_users_apart(tmp_path: Path, store: Store) -> None:
    with langgraph_dev(tmp_path, store, auth=True) as server:
        alice, bob = _client(server, "alice"), _client(server, "bob")
        alices_copy = await _runs_interrupt_state_history_copy_delete(server, alice, owner="alice")
        bobs_copy = await _runs_interrupt_state_history_copy_delete(server, bob, owner="bob")
        assert store.owner(alices_copy) == "alice"
        assert store.owner(bobs_copy) == "bob"
        # The server's own authorization hides each user's threads from the other...
        from langgraph_sdk.errors import NotFoundError

        with pytest.raises(NotFoundError):
            await bob.threads.get_state(alices_copy)
        # ... and the store holds each thread under its owner: a run's steps, its rollback
        # (a call without a config) act for the run's user.
        await _double_texting(server, alice)
        owners = {row[0] for row in store.rows("SELECT owner FROM tk_threads")}
        assert owners == {"alice", "bob"}
        # The user the handler authenticated wins over a user_id the client merges into the
        # state read's config.
        named = await alice.threads.get_state(alices_copy, checkpoint={"checkpoint_ns": "", "user_id": "bob"})
        assert named["values"]["log"] == ["hi", "work:", "answer:yes"]
        # A custom route serves no request of the API: it acts for no user, and neither reads
        # nor deletes a user's thread.
        stored = store.checkpoints(alices_copy)
        async with httpx.AsyncClient(base_url=server.url, timeout=WAIT) as http:
            assert (await http.get(f"/custom/threads/{alices_copy}")).json() == {"found": False, "history": 0}
            refused = await http.delete(f"/custom/threads/{alices_copy}")
        assert refused.status_code == 403
        assert store.checkpoints(alices_copy) == stored
