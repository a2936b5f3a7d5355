"""SPEC W1-W3: atomic steps, optimistic concurrency, user isolation, on every provider."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from typing import Annotated, Any, TypedDict

import pytest
from langchain_core.runnables import RunnableConfig, RunnableLambda
from langgraph.graph import END, START, StateGraph
from langgraph.types import Command, interrupt

from tests.graphs import Driver, approval_graph
from tests.providers import Opener
from threadkeep import StaleStateError, StorageError, StorageForbiddenError, operator_scope, user_scope
from threadkeep.workload import build_agent, turn_input


def cfg(thread_id: str, **extra: Any) -> RunnableConfig:
    return {"configurable": {"thread_id": thread_id, **extra}}


def checkpoint_ids(saver: Any, thread_id: str, **extra: Any) -> list[str]:
    return [t.checkpoint["id"] for t in saver.list(cfg(thread_id, **extra))]


# --- W1 -------------------------------------------------------------------------------------


def _interrupted_put(original: Any, before_request: int, interrupted: list[bool]) -> Any:
    """A put program that fails right before it would send request number ``before_request``
    (and records whether it got that far)."""

    def put(step: Any) -> Iterator[Any]:
        program = original(step)
        reply = None
        sent = 0
        while True:
            try:
                request = program.send(reply)
            except StopIteration as done:
                return done.value
            if sent == before_request:
                program.close()
                interrupted.append(True)
                raise RuntimeError("the connection died mid-step")
            reply = yield request
            sent += 1

    return put


def test_w1_a_step_that_fails_midway_stores_nothing(saver: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """Whatever request a step fails before, none of its checkpoint, values or messages remain.

    (SQL stores commit at the end of the transaction; Redis writes the whole step in its
    last request, one atomic script. Tiered: the step fails inside its durable write, and
    the cache, written only after it, still serves the previous state.)
    """
    graph = build_agent(saver)
    graph.invoke(turn_input(0), cfg("atomic"))
    head = saver.get_tuple(cfg("atomic"))
    before = dict(saver.stats())
    store = getattr(saver.backend, "durable", saver.backend)
    original = store.put
    for position in range(10):
        interrupted: list[bool] = []
        monkeypatch.setattr(store, "put", _interrupted_put(original, position, interrupted))
        failure: BaseException | None = None
        try:
            graph.invoke(turn_input(1), cfg("atomic"))
        except (RuntimeError, StorageError) as error:
            failure = error
        monkeypatch.undo()
        if not interrupted:  # the step has fewer requests: it completed, as it should
            assert failure is None
            assert position > 0
            break
        assert "mid-step" in str(failure)
        after = saver.stats()
        # pending writes are LangGraph's separate put_writes call, and each stores at most
        # the one message it wrote (by reference); the step itself left nothing
        for key in ("threads", "checkpoints", "channel_values"):
            assert after[key] == before[key], (position, key)
        assert after["messages"] - before["messages"] <= after["writes"] - before["writes"], position
        assert (
            saver.get_tuple(cfg("atomic")).checkpoint["channel_values"] == head.checkpoint["channel_values"]
        )


# --- W2 -------------------------------------------------------------------------------------


class Race(TypedDict):
    log: Annotated[list[str], lambda a, b: a + b]


def racing_graph(saver: Any, barrier: Any, first_done: Any) -> Any:
    """``approve`` pauses for a human; two runs then resume it at the same time.

    Both resumed runs load the same head and meet at ``barrier`` before either writes; run
    ``B`` then waits until run ``A`` has finished, so ``A`` always writes first.
    """

    def approve(state: Race, config: RunnableConfig) -> dict[str, Any]:
        answer = interrupt("approve?")
        barrier.wait(timeout=10)
        if config["configurable"]["racer"] == "B":
            first_done.wait(timeout=10)
        return {"log": [f"{config['configurable']['racer']}:{answer}"]}

    async def aapprove(state: Race, config: RunnableConfig) -> dict[str, Any]:
        answer = interrupt("approve?")
        await barrier.wait()
        if config["configurable"]["racer"] == "B":
            await first_done.wait()
        return {"log": [f"{config['configurable']['racer']}:{answer}"]}

    builder = StateGraph(Race)
    builder.add_node("approve", RunnableLambda(approve, aapprove))
    builder.add_node("ship", lambda state: {"log": ["shipped"]})
    builder.add_edge(START, "approve")
    builder.add_edge("approve", "ship")
    builder.add_edge("ship", END)
    return builder.compile(checkpointer=saver)


def race_sync(saver: Any, thread_id: str) -> dict[str, Any]:
    """Resume the paused thread from two threads at once, through the sync API."""
    first_done = threading.Event()
    graph = racing_graph(saver, threading.Barrier(2), first_done)
    outcome: dict[str, Any] = {}

    def run(racer: str) -> None:
        try:
            outcome[racer] = graph.invoke(Command(resume=racer.lower()), cfg(thread_id, racer=racer))
        except Exception as exc:
            outcome[racer] = exc
        finally:
            if racer == "A":
                first_done.set()

    threads = [threading.Thread(target=run, args=(racer,)) for racer in ("A", "B")]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    return outcome


async def race_async(saver: Any, thread_id: str) -> dict[str, Any]:
    """Resume the paused thread from two tasks at once, through the async API."""
    first_done = asyncio.Event()
    graph = racing_graph(saver, asyncio.Barrier(2), first_done)
    outcome: dict[str, Any] = {}

    async def run(racer: str) -> None:
        try:
            outcome[racer] = await graph.ainvoke(Command(resume=racer.lower()), cfg(thread_id, racer=racer))
        except Exception as exc:
            outcome[racer] = exc
        finally:
            if racer == "A":
                first_done.set()

    await asyncio.gather(run("A"), run("B"))
    return outcome


@pytest.mark.parametrize("api", ["sync", "async"])
def test_w2_racing_runs_loser_gets_stale_state_error(saver: Any, api: str) -> None:
    graph = racing_graph(saver, None, None)
    graph.invoke({"log": []}, cfg("order-7", racer="setup"))
    head = saver.get_tuple(cfg("order-7")).checkpoint["id"]
    before = checkpoint_ids(saver, "order-7")

    outcome = race_sync(saver, "order-7") if api == "sync" else asyncio.run(race_async(saver, "order-7"))

    assert outcome["A"]["log"] == ["A:a", "shipped"]
    error = outcome["B"]
    assert isinstance(error, StaleStateError)
    assert error.code == "STORAGE_CONFLICT_001"
    assert error.thread_id == "order-7"
    assert error.expected == head
    assert error.current != head
    # the loser stored nothing: only the winner's two checkpoints were added
    after = checkpoint_ids(saver, "order-7")
    assert len(after) == len(before) + 2
    assert all(t.metadata.get("racer") != "B" for t in saver.list(cfg("order-7")))
    # the thread is usable at once: the next run loads the true head
    again = graph.invoke({"log": ["again"]}, cfg("order-7", racer="next"))
    assert again["log"] == ["A:a", "shipped", "again"]
    assert again["__interrupt__"][0].value == "approve?"


def test_w2_put_from_a_stale_parent_is_refused_and_stores_nothing(saver: Any) -> None:
    graph = approval_graph(saver)
    graph.invoke({"request": "x", "answer": ""}, cfg("stale"))
    history = list(saver.list(cfg("stale")))
    head, older = history[0], history[1]
    checkpoint = dict(head.checkpoint, id="9" + head.checkpoint["id"][1:])
    with pytest.raises(StaleStateError) as refused:
        saver.put(older.config, checkpoint, {"source": "loop", "step": 9}, {})
    assert refused.value.expected == older.checkpoint["id"]
    assert refused.value.current == head.checkpoint["id"]
    assert refused.value.to_dict()["context"]["current_head"] == head.checkpoint["id"]
    assert len(list(saver.list(cfg("stale")))) == len(history)


def test_w2_forks_and_update_state_still_branch(saver: Any) -> None:
    driver = Driver("sync")
    graph = approval_graph(saver)
    driver.invoke(graph, {"request": "a", "answer": ""}, cfg("branch"))
    driver.invoke(graph, Command(resume="one"), cfg("branch"))
    paused = next(s for s in driver.history(graph, cfg("branch")) if s.next == ("ask",))
    # update_state on an older checkpoint, then a run from the new branch: no conflict
    forked = driver.update_state(graph, paused.config, {"answer": "two"}, as_node="ask")
    assert driver.invoke(graph, None, forked)["answer"] == "two!"
    # time travel: replay from before the question, then answer it differently
    start = next(s for s in driver.history(graph, cfg("branch")) if s.next == ("prepare",))
    assert "__interrupt__" in driver.invoke(graph, None, start.config)
    assert driver.invoke(graph, Command(resume="three"), cfg("branch"))["answer"] == "three!"


# --- W3 -------------------------------------------------------------------------------------


def test_w3_a_thread_belongs_to_its_first_writer(saver: Any) -> None:
    graph = approval_graph(saver)
    graph.invoke({"request": "a", "answer": ""}, cfg("t-alice", user_id="alice"))
    assert saver.get_tuple(cfg("t-alice", user_id="alice")) is not None
    with user_scope("alice"):
        assert saver.get_tuple(cfg("t-alice")) is not None


def test_w3_another_users_write_is_forbidden_and_stores_nothing(saver: Any) -> None:
    graph = approval_graph(saver)
    graph.invoke({"request": "a", "answer": ""}, cfg("t-owned", user_id="alice"))
    before = dict(saver.stats())
    with pytest.raises(StorageForbiddenError) as refused:
        graph.invoke({"request": "b", "answer": ""}, cfg("t-owned", user_id="mallory"))
    assert refused.value.code == "STORAGE_FORBIDDEN_001"
    head = saver.get_tuple(cfg("t-owned", user_id="alice"))
    with pytest.raises(StorageForbiddenError):
        saver.put_writes(
            {"configurable": {**head.config["configurable"], "user_id": "mallory"}}, [("x", 1)], "task"
        )
    assert dict(saver.stats()) == before


def test_w3_another_users_reads_and_lists_see_nothing(saver: Any) -> None:
    graph = approval_graph(saver)
    graph.invoke({"request": "a", "answer": ""}, cfg("t-private", user_id="alice"))
    graph.invoke({"request": "b", "answer": ""}, cfg("t-bob", user_id="bob"))
    assert saver.get_tuple(cfg("t-private", user_id="bob")) is None
    head_id = saver.get_tuple(cfg("t-private", user_id="alice")).checkpoint["id"]
    assert saver.get_tuple(cfg("t-private", user_id="bob", checkpoint_id=head_id)) is None
    assert list(saver.list(cfg("t-private", user_id="bob"))) == []
    with user_scope("bob"):
        threads = {t.config["configurable"]["thread_id"] for t in saver.list(None)}
    assert threads == {"t-bob"}


def test_w3_another_users_delete_and_copy_raise_and_touch_nothing(saver: Any) -> None:
    """Never a silent no-op (tests/contract/test_isolation.py covers each call, sync and async)."""
    graph = approval_graph(saver)
    graph.invoke({"request": "a", "answer": ""}, cfg("t-keep", user_id="alice"))
    count = len(checkpoint_ids(saver, "t-keep", user_id="alice"))
    with user_scope("bob"):
        with pytest.raises(StorageForbiddenError):
            saver.delete_thread("t-keep")
        with pytest.raises(StorageForbiddenError):
            saver.prune(["t-keep"], strategy="delete")
        with pytest.raises(StorageForbiddenError):
            saver.copy_thread("t-keep", "t-stolen")
        assert list(saver.list(cfg("t-stolen"))) == []
    assert len(checkpoint_ids(saver, "t-keep", user_id="alice")) == count
    with user_scope("alice"):
        assert list(saver.list(cfg("t-stolen"))) == []
    # nor may bob copy his thread onto alice's
    graph.invoke({"request": "b", "answer": ""}, cfg("t-bobs", user_id="bob"))
    with user_scope("bob"), pytest.raises(StorageForbiddenError):
        saver.copy_thread("t-bobs", "t-keep")


def test_w3_no_user_id_means_anonymous(saver: Any) -> None:
    graph = approval_graph(saver)
    graph.invoke({"request": "a", "answer": ""}, cfg("t-anon"))
    assert saver.get_tuple(cfg("t-anon", user_id="anonymous")) is not None
    assert saver.get_tuple(cfg("t-anon", user_id="alice")) is None


def test_w3_isolation_off_keys_threads_by_id_alone(open_saver: Opener) -> None:
    saver = open_saver(enforce_user_isolation=False)
    graph = approval_graph(saver)
    graph.invoke({"request": "a", "answer": ""}, cfg("t-shared", user_id="alice"))
    assert saver.get_tuple(cfg("t-shared", user_id="bob")) is not None
    graph.invoke(Command(resume="ok"), cfg("t-shared", user_id="bob"))
    assert saver.get_tuple(cfg("t-shared", user_id="alice")).checkpoint["channel_values"]["answer"] == "ok!"


def test_w3_operator_scope_sees_every_thread(saver: Any) -> None:
    graph = approval_graph(saver)
    graph.invoke({"request": "a", "answer": ""}, cfg("t-a", user_id="alice"))
    graph.invoke({"request": "b", "answer": ""}, cfg("t-b", user_id="bob"))
    with operator_scope():
        assert {t.config["configurable"]["thread_id"] for t in saver.list(None)} == {"t-a", "t-b"}
        saver.delete_thread("t-a")
    assert saver.get_tuple(cfg("t-a", user_id="alice")) is None
    assert saver.get_tuple(cfg("t-b", user_id="bob")) is not None


# --- closing --------------------------------------------------------------------------------


@pytest.mark.providers("sqlite", "postgres", "redis", "tiered")
def test_a_closed_saver_refuses_calls_and_keeps_what_it_stored(
    open_saver: Opener, caplog: pytest.LogCaptureFixture
) -> None:
    """A call on a closed saver fails with a ``StorageError`` that says so; it does not open
    new connections behind the application's back (pools nobody would close), nor pass for
    a failing cache (tiered)."""
    saver = open_saver()
    graph = approval_graph(saver)
    graph.invoke({"request": "a", "answer": ""}, cfg("t-closed"))
    saver.close()
    with pytest.raises(StorageError, match="is closed"):
        saver.get_tuple(cfg("t-closed"))
    with pytest.raises(StorageError, match="is closed"):
        asyncio.run(saver.aget_tuple(cfg("t-closed")))
    with pytest.raises(StorageError, match="is closed"):
        graph.invoke(Command(resume="ok"), cfg("t-closed"))
    saver.close()  # a second close is harmless
    assert not [record for record in caplog.records if record.levelname == "WARNING"]
    reopened = approval_graph(open_saver())  # the interrupted run resumes on a new saver
    assert reopened.invoke(Command(resume="ok"), cfg("t-closed"))["answer"] == "ok!"


@pytest.mark.providers("postgres", "redis", "tiered")
def test_aclose_also_closes_what_a_stopped_event_loop_holds(open_saver: Opener) -> None:
    """A saver used on two event loops, one of them stopped but not closed (a loop an
    application runs now and then with ``run_until_complete``), closes from the other with
    ``aclose()``: what the stopped loop holds is closed too, and nothing raises."""
    saver = open_saver()
    other = asyncio.new_event_loop()
    try:
        graph = approval_graph(saver)
        other.run_until_complete(graph.ainvoke({"request": "a", "answer": ""}, cfg("t-two-loops")))
        held = _held_per_loop(saver)
        assert held  # the other loop's pools or clients
        asyncio.run(saver.aclose())
        assert all(map(_is_closed, held))
        with pytest.raises(StorageError, match="is closed"):
            other.run_until_complete(saver.aget_tuple(cfg("t-two-loops")))
    finally:
        saver.close()  # what a failed assertion left open, while its loop is not closed
        other.close()


def _held_per_loop(saver: Any) -> list[Any]:
    """The pools (Postgres) and clients (Redis) the saver's engines hold per event loop."""
    engine = saver.backend.engine
    held: list[Any] = []
    for part in (engine.durable, engine.cache) if hasattr(engine, "durable") else (engine,):
        held.extend(getattr(part, "_async_pools", {}).values())
        held.extend(getattr(part, "_async_clients", {}).values())
    return held


def _is_closed(held: Any) -> bool:
    """Whether a psycopg pool was closed, or a redis-py client's connections were."""
    if hasattr(held, "closed"):
        return bool(held.closed)
    pool = held.connection_pool
    connections = [*pool._available_connections, *pool._in_use_connections]
    return not any(connection.is_connected for connection in connections)


@pytest.mark.providers("postgres", "redis", "tiered")
def test_aclose_works_on_a_loop_whose_executor_has_shut_down(open_saver: Opener) -> None:
    """``aclose()`` on a loop that is ending (its default executor already shut down, as at
    the end of ``asyncio.run``) still closes the saver, and what another, stopped loop holds."""
    saver = open_saver()
    other, loop = asyncio.new_event_loop(), asyncio.new_event_loop()
    try:
        other.run_until_complete(
            approval_graph(saver).ainvoke({"request": "a", "answer": ""}, cfg("t-other"))
        )
        loop.run_until_complete(
            approval_graph(saver).ainvoke({"request": "b", "answer": ""}, cfg("t-ending"))
        )
        held = _held_per_loop(saver)
        assert len(held) >= 2  # both loops' pools or clients
        loop.run_until_complete(loop.shutdown_default_executor())
        loop.run_until_complete(saver.aclose())
        assert all(map(_is_closed, held))
        with pytest.raises(StorageError, match="is closed"):
            loop.run_until_complete(saver.aget_tuple(cfg("t-ending")))
    finally:
        saver.close()
        loop.close()
        other.close()


@pytest.mark.providers("postgres", "redis", "tiered")
def test_close_closes_what_a_loop_running_in_another_thread_holds(open_saver: Opener) -> None:
    """``close()`` from one thread, while another thread's event loop keeps running (a
    server's loop): that loop closes what it holds, between its other callbacks."""
    saver = open_saver()
    loop = asyncio.new_event_loop()
    runner = threading.Thread(target=loop.run_forever)
    runner.start()
    try:
        graph = approval_graph(saver)
        asyncio.run_coroutine_threadsafe(
            graph.ainvoke({"request": "a", "answer": ""}, cfg("t-running")), loop
        ).result(30)
        held = _held_per_loop(saver)
        assert held
        saver.close()
        deadline = time.monotonic() + 10  # a guard against a hang only
        while not all(map(_is_closed, held)):
            assert time.monotonic() < deadline, "what the running loop held was never closed"
            time.sleep(0.01)
        with pytest.raises(StorageError, match="is closed"):
            asyncio.run_coroutine_threadsafe(saver.aget_tuple(cfg("t-running")), loop).result(30)
    finally:
        saver.close()
        loop.call_soon_threadsafe(loop.stop)
        runner.join(30)
        if not loop.is_running():
            loop.close()


@pytest.mark.providers("postgres", "redis", "tiered")
def test_a_sync_close_inside_a_coroutine_closes_that_loops_pool_when_the_loop_ends(
    open_saver: Opener,
) -> None:
    """``close()`` (not ``aclose()``) called from a coroutine, just before ``asyncio.run``'s
    main coroutine returns: the loop's pool or client is still closed, as the runner ends."""
    saver = open_saver()
    held: list[Any] = []

    async def main() -> None:
        await approval_graph(saver).ainvoke({"request": "a", "answer": ""}, cfg("t-sync-close"))
        held.extend(_held_per_loop(saver))
        saver.close()

    asyncio.run(main())
    assert held
    assert all(map(_is_closed, held))


# Redis only: a Postgres pool abandoned with its loop has pending worker tasks, which
# complain as they are collected (PerLoop's path is the same for both).
@pytest.mark.providers("redis")
def test_close_after_a_loop_was_closed_without_ending_its_tasks(open_saver: Opener) -> None:
    """A loop an application closed without cancelling its tasks (``run_until_complete``,
    then ``close()``) took what it held with it: ``close()`` later raises nothing and still
    closes what another, stopped loop holds."""
    saver = open_saver()
    gone, other = asyncio.new_event_loop(), asyncio.new_event_loop()
    try:
        gone.run_until_complete(approval_graph(saver).ainvoke({"request": "a", "answer": ""}, cfg("t-gone")))
        other.run_until_complete(approval_graph(saver).ainvoke({"request": "b", "answer": ""}, cfg("t-kept")))
        held = [resource for loop, resource in _held_by_loop(saver) if loop is other]
        assert held
        gone.close()
        saver.close()
        assert all(map(_is_closed, held))
    finally:
        saver.close()
        gone.close()
        other.close()


def _held_by_loop(saver: Any) -> list[tuple[Any, Any]]:
    engine = saver.backend.engine
    held: list[tuple[Any, Any]] = []
    for part in (engine.durable, engine.cache) if hasattr(engine, "durable") else (engine,):
        for per_loop in (getattr(part, "_async_pools", None), getattr(part, "_async_clients", None)):
            if per_loop is not None:
                held.extend(per_loop._listed())
    return held


@pytest.mark.providers("sqlite", "postgres", "tiered")
def test_delete_for_runs_reads_only_the_threads_of_its_runs(open_saver: Opener) -> None:
    """LangGraph's server deletes a run's checkpoints at every rollback: the stores that
    index runs find the run's threads by that index, never by reading every thread."""
    saver = open_saver()
    graph = build_agent(saver)
    for thread_id in ("other-1", "other-2", "mine"):
        graph.invoke(turn_input(0), {"configurable": {"thread_id": thread_id, "run_id": f"run-{thread_id}"}})
    pages: list[Any] = []
    list_page = saver.backend.list_page

    def recorded(query: Any, *args: Any) -> Any:
        pages.append(query.thread_id)
        return list_page(query, *args)

    saver.backend.list_page = recorded  # type: ignore[method-assign]
    saver.delete_for_runs(["run-mine"])
    assert set(pages) == {"mine"}  # before: a read of every thread (None) first
    assert saver.get_tuple({"configurable": {"thread_id": "mine"}}) is None
    assert saver.get_tuple({"configurable": {"thread_id": "other-1"}}) is not None
