"""SPEC SV1/SV3, issue 38 item 2: ``threads()`` lists a store's threads from an index.

Newest write first, paged by a cursor that neither repeats nor skips a thread while others
are written between pages; filtered by owner, status, write time and metadata; a user sees
only their own threads, the operator every thread; deleted and swept threads are gone; a
cursor the listing did not write is refused. On every provider, sync and async.
"""

from __future__ import annotations

import asyncio
import operator
from typing import Annotated, Any, TypedDict

import pytest
from langgraph.graph import END, START, StateGraph
from langgraph.types import interrupt

from tests.providers import Opener
from threadkeep import (
    ConfigurationError,
    StorageForbiddenError,
    operator_scope,
    sweep_checkpoints,
    user_scope,
)
from threadkeep.core.retention import PlatformRetention
from threadkeep.threads import Cursor, ThreadPage, ThreadQuery

T0 = 1_800_000_000.0


class Clock:
    def __init__(self) -> None:
        self.now = T0

    def __call__(self) -> float:
        return self.now


class State(TypedDict):
    log: Annotated[list[str], operator.add]


def _step(state: State) -> dict[str, Any]:
    return {"log": ["step"]}


def _asking(state: State) -> dict[str, Any]:
    return {"log": [f"answer {interrupt('go on?')}"]}


def _graph(saver: Any, node: Any = _step) -> Any:
    builder = StateGraph(State)
    builder.add_node("step", node)
    builder.add_edge(START, "step")
    builder.add_edge("step", END)
    return builder.compile(checkpointer=saver)


def config(user: str, thread_id: str, **extra: Any) -> Any:
    return {"configurable": {"thread_id": thread_id, "user_id": user}, "metadata": extra}


def write(saver: Any, clock: Clock, user: str, thread_id: str, node: Any = _step, **metadata: Any) -> None:
    clock.now += 10
    _graph(saver, node).invoke({"log": []}, config(user, thread_id, **metadata))


def listing(saver: Any, api: str, query: ThreadQuery | None = None) -> ThreadPage:
    if api == "sync":
        return saver.threads(query)  # type: ignore[no-any-return]
    return asyncio.run(saver.athreads(query))  # type: ignore[no-any-return]


def ids(page: ThreadPage) -> list[str]:
    return [thread.thread_id for thread in page.threads]


def every_page(saver: Any, api: str, query: ThreadQuery, between: Any = None) -> list[str]:
    seen: list[str] = []
    cursor = None
    while True:
        page = listing(saver, api, ThreadQuery(**{**_fields(query), "cursor": cursor}))
        seen += ids(page)
        if page.next_cursor is None:
            return seen
        cursor = Cursor.decode(page.next_cursor.encode())  # as a client hands it back
        if between is not None:
            between()


def _fields(query: ThreadQuery) -> dict[str, Any]:
    return {name: getattr(query, name) for name in query.__slots__}  # type: ignore[attr-defined]


def test_pages_newest_first_without_repeats_or_gaps_while_threads_are_written(
    open_saver: Opener, api: str
) -> None:
    clock = Clock()
    saver = open_saver(clock=clock)
    for i in range(7):
        write(saver, clock, "alice", f"t{i}")
    fresh: list[str] = []

    def another() -> None:
        fresh.append(f"new{len(fresh)}")
        write(saver, clock, "alice", fresh[-1])

    with user_scope("alice"):
        seen = every_page(saver, api, ThreadQuery(limit=2), between=another)
        assert seen == [f"t{i}" for i in reversed(range(7))]  # the new ones went to the front
        first = listing(saver, api, ThreadQuery(limit=50))
    assert ids(first) == [*reversed(fresh), *(f"t{i}" for i in reversed(range(7)))]
    assert [t.written_at for t in first.threads] == sorted(
        (t.written_at for t in first.threads), reverse=True
    )
    assert first.next_cursor is None


def test_a_user_sees_only_their_threads_and_the_operator_sees_all(open_saver: Opener, api: str) -> None:
    clock = Clock()
    saver = open_saver(clock=clock)
    write(saver, clock, "alice", "a1")
    write(saver, clock, "bob", "b1")
    write(saver, clock, "alice", "a2")
    with user_scope("alice"):
        page = listing(saver, api)
        assert ids(page) == ["a2", "a1"]
        assert {t.owner for t in page.threads} == {"alice"}
        assert ids(listing(saver, api, ThreadQuery(owner="alice"))) == ["a2", "a1"]
        with pytest.raises(StorageForbiddenError) as refused:
            listing(saver, api, ThreadQuery(owner="bob"))
        assert "alice" in str(refused.value)
        assert "bob" in str(refused.value)
    with user_scope("bob"):
        assert ids(listing(saver, api)) == ["b1"]
    with user_scope("carol"):
        assert listing(saver, api).threads == []
    with operator_scope():
        assert ids(listing(saver, api)) == ["a2", "b1", "a1"]
        assert ids(listing(saver, api, ThreadQuery(owner="bob"))) == ["b1"]


def test_statuses_due_times_and_the_status_filter(open_saver: Opener, api: str) -> None:
    clock = Clock()
    platform = PlatformRetention()
    saver = open_saver(clock=clock)
    write(saver, clock, "alice", "waiting")
    write(saver, clock, "alice", "finished")
    write(saver, clock, "alice", "interrupted", node=_asking)
    write(saver, clock, "alice", "parked", node=_asking)
    saver.record_park("parked", "|p1", T0 + 3600, config=config("alice", "parked"))
    saver.record_park("parked", "|p2", T0 + 7200, config=config("alice", "parked"))
    marked = saver.mark_finished(["finished"], config=config("alice", "finished"))
    with user_scope("alice"):
        page = listing(saver, api)
        by_id = {t.thread_id: t for t in page.threads}
        assert {name: t.status for name, t in by_id.items()} == {
            "waiting": "waiting",
            "finished": "finished",
            "interrupted": "interrupted",
            "parked": "parked",
        }
        assert by_id["parked"].parked_until == T0 + 7200
        assert by_id["waiting"].parked_until is None
        assert by_id["finished"].due == marked["finished"]
        waiting = by_id["waiting"]
        assert waiting.due == pytest.approx(waiting.written_at + 60 * platform.waiting_minutes)
        for status in ("waiting", "finished", "interrupted", "parked"):
            assert ids(listing(saver, api, ThreadQuery(status=status))) == [status]  # type: ignore[arg-type]
    with operator_scope():  # the sweep's own view agrees: its interrupts filter spares it
        assert saver.interrupted(["interrupted", "waiting", "finished"]) == {"interrupted"}
    # the run resumed: no longer interrupted
    _graph(saver, _asking).invoke(_resume(), config("alice", "interrupted"))
    with user_scope("alice"):
        assert by_status(listing(saver, api))["interrupted"] == "waiting"
        assert ids(listing(saver, api, ThreadQuery(status="interrupted"))) == []


def _resume() -> Any:
    from langgraph.types import Command

    return Command(resume="yes")


def by_status(page: ThreadPage) -> dict[str, str]:
    return {t.thread_id: t.status for t in page.threads}


def test_filters_by_write_time_and_metadata(open_saver: Opener, api: str) -> None:
    clock = Clock()
    saver = open_saver(clock=clock)
    write(saver, clock, "alice", "old", topic="cats")
    write(saver, clock, "alice", "mid", topic="dogs")
    write(saver, clock, "alice", "new", topic="cats", rank=2)
    with user_scope("alice"):
        times = {t.thread_id: t.written_at for t in listing(saver, api).threads}
        assert ids(listing(saver, api, ThreadQuery(written_after=times["mid"]))) == ["new", "mid"]
        assert ids(listing(saver, api, ThreadQuery(written_before=times["mid"]))) == ["old"]
        assert ids(listing(saver, api, ThreadQuery(metadata={"topic": "cats"}))) == ["new", "old"]
        assert ids(listing(saver, api, ThreadQuery(metadata={"topic": "cats", "rank": 2}))) == ["new"]
        assert ids(listing(saver, api, ThreadQuery(metadata={"topic": "birds"}))) == []
        shown = listing(saver, api, ThreadQuery(metadata={"rank": 2})).threads[0].metadata
        assert shown["topic"] == "cats"
        assert shown["rank"] == 2
        assert every_page(saver, api, ThreadQuery(metadata={"topic": "cats"}, limit=1)) == ["new", "old"]


def test_deleted_and_swept_threads_are_gone(open_saver: Opener, api: str) -> None:
    clock = Clock()
    saver = open_saver(clock=clock)
    write(saver, clock, "alice", "kept")
    write(saver, clock, "alice", "deleted")
    write(saver, clock, "alice", "swept")
    with user_scope("alice"):
        saver.delete_thread("deleted")
        assert ids(listing(saver, api)) == ["swept", "kept"]
    due = saver.mark_finished(["swept"], config=config("alice", "swept"))["swept"]
    clock.now = due + 1
    with operator_scope():
        sweep_checkpoints(saver)
        assert ids(listing(saver, api)) == ["kept"]


@pytest.mark.parametrize("cursor", ["nope", "W10", Cursor(1.0, "x").encode()[:-2] + "!!"])
def test_a_cursor_it_did_not_write_is_refused(cursor: str) -> None:
    with pytest.raises(ConfigurationError) as refused:
        Cursor.decode(cursor)
    assert "next_cursor" in str(refused.value)


def test_one_threads_row_is_the_listings_row(open_saver: Opener, api: str) -> None:
    """``thread_row`` (the retention view's source) reads what the listing shows of a thread;
    None for another user's thread, or on a store that cannot read one row (Redis)."""
    from threadkeep.core.listing import summarize

    clock = Clock()
    saver = open_saver(clock=clock)
    write(saver, clock, "alice", "waiting")
    write(saver, clock, "alice", "interrupted", node=_asking)
    write(saver, clock, "bob", "finished")
    saver.mark_finished(["finished"], config=config("bob", "finished"))
    clock.now += 10
    saver.start_threads(["waiting"], config=config("alice", "waiting"))  # a run starts: the clock moves

    def row(thread_id: str) -> Any:
        return saver.thread_row(thread_id) if api == "sync" else asyncio.run(saver.athread_row(thread_id))

    with operator_scope():
        listed = {t.thread_id: t for t in listing(saver, api).threads}
        if saver.facts.name == "redis":
            assert row("waiting") is None
            return
        for thread_id, shown in listed.items():
            assert summarize(row(thread_id), saver.retention) == shown
        assert listed["waiting"].written_at == T0 + 40
    with user_scope("alice"):
        assert row("finished") is None  # bob's
        assert row("nobody") is None
