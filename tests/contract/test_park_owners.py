"""SPEC W3 with RT2-RT5: a thread's parks, finished mark and retention belong to its owner.

Another user's write (record or clear a park, mark the thread finished, start a run on it)
raises ``StorageForbiddenError`` and changes nothing; their reads (the thread's retention,
its live parks) see nothing. The owner, the operator, and everyone when isolation is off,
keep every operation. On every provider, sync and async.
"""

from __future__ import annotations

import operator
from typing import Annotated, Any, TypedDict

import pytest
from langgraph.graph import END, START, StateGraph
from langgraph.types import Command

from tests.providers import Opener
from threadkeep import StorageForbiddenError, ThreadRetention, ask, operator_scope, user_scope

T0 = 1_800_000_000.0
DEADLINE = T0 + 3600.0
THREAD = "alice-parked"
PARK = "|park-1"


class Clock:
    def __init__(self) -> None:
        self.now = T0

    def __call__(self) -> float:
        return self.now


class State(TypedDict):
    log: Annotated[list[str], operator.add]


def _step(state: State) -> dict[str, Any]:
    return {"log": ["step"]}


def _graph(saver: Any) -> Any:
    builder = StateGraph(State)
    builder.add_node("step", _step)
    builder.add_edge(START, "step")
    builder.add_edge("step", END)
    return builder.compile(checkpointer=saver)


def as_user(user: str, thread_id: str = THREAD) -> Any:
    return {"configurable": {"thread_id": thread_id, "user_id": user}}


def alices_parked_thread(saver: Any) -> None:
    """Alice's thread, with one live park, one checkpoint, and her declared retention."""
    _graph(saver).invoke({"log": []}, as_user("alice"))
    saver.record_park(THREAD, PARK, DEADLINE, config=as_user("alice"))


def parked(saver: Any) -> bool:
    with operator_scope():
        return saver.live_parks([THREAD], T0) == {THREAD}


def due(saver: Any) -> float | None:
    with operator_scope():
        found = saver.thread_retention(THREAD)
    assert found is not None
    return found[1]


def test_w3_rt5_another_user_cannot_clear_a_park_alice_still_can(open_saver: Opener) -> None:
    saver = open_saver(clock=Clock())
    alices_parked_thread(saver)
    with user_scope("bob"), pytest.raises(StorageForbiddenError) as refused:
        saver.clear_park(THREAD, PARK)
    assert refused.value.code == "STORAGE_FORBIDDEN_001"
    assert refused.value.context == {"thread_id": THREAD, "user_id": "bob"}
    with user_scope("alice"), pytest.raises(StorageForbiddenError):  # a config naming bob
        saver.clear_park(THREAD, PARK, config=as_user("bob"))
    with user_scope("bob"), pytest.raises(StorageForbiddenError):
        saver.record_park(THREAD, "|bobs", DEADLINE)
    assert parked(saver)
    saver.clear_park(THREAD, "|no-such-park", config=as_user("alice"))  # nothing to clear: no error
    saver.clear_park("nobodys-thread", PARK, config=as_user("bob"))
    assert parked(saver)
    with user_scope("alice"):
        saver.clear_park(THREAD, PARK)
    assert not parked(saver)


def test_w3_rt5_another_users_reads_of_parks_and_retention_see_nothing(open_saver: Opener) -> None:
    saver = open_saver(clock=Clock())
    alices_parked_thread(saver)
    saver.mark_finished([THREAD], config=as_user("alice"))
    with user_scope("bob"):
        assert saver.live_parks([THREAD], T0) == set()
        assert saver.thread_retention(THREAD) is None
    assert saver.thread_retention(THREAD, config=as_user("bob")) is None
    assert saver.thread_retention(THREAD) is None  # anonymous: not alice either
    with user_scope("alice"):
        assert saver.live_parks([THREAD], T0) == {THREAD}
        assert saver.thread_retention(THREAD) == saver.thread_retention(THREAD, config=as_user("alice"))
        found = saver.thread_retention(THREAD)
    assert found is not None
    assert found[1] == T0 + 1440 * 60
    with operator_scope():  # the sweep's view: every owner's
        assert saver.live_parks([THREAD], T0) == {THREAD}
        assert saver.thread_retention(THREAD) == found


def test_w3_rt2_another_user_cannot_mark_or_start_a_thread_alice_still_can(open_saver: Opener) -> None:
    saver = open_saver(clock=Clock())
    alices_parked_thread(saver)
    _graph(saver).invoke({"log": []}, as_user("bob", "bobs-own"))
    with user_scope("bob"), pytest.raises(StorageForbiddenError) as refused:
        saver.mark_finished([THREAD])
    assert refused.value.context == {"thread_id": THREAD, "user_id": "bob"}
    with pytest.raises(StorageForbiddenError):
        saver.mark_finished(["bobs-own", THREAD], config=as_user("bob"))
    assert due(saver) is None  # alice's thread is still waiting
    if saver.facts.name != "redis":  # one transaction: the refusal marks nothing at all
        assert saver.thread_retention("bobs-own", config=as_user("bob")) == (ThreadRetention(), None)
    assert saver.mark_finished([THREAD, "nobodys-thread"], config=as_user("alice")) == {
        THREAD: T0 + 1440 * 60
    }
    with user_scope("bob"), pytest.raises(StorageForbiddenError):
        saver.start_threads([THREAD])
    assert due(saver) == T0 + 1440 * 60  # still marked: bob's start took nothing out
    assert parked(saver)
    saver.start_threads([THREAD], config=as_user("alice"))
    assert due(saver) is None


async def test_w3_rt5_async_parks_marks_and_retention_check_the_owner(open_saver: Opener) -> None:
    saver = open_saver(clock=Clock())
    await _graph(saver).ainvoke({"log": []}, as_user("alice"))
    with user_scope("bob"), pytest.raises(StorageForbiddenError):
        await saver.amark_finished([THREAD])
    assert due(saver) is None
    await saver.arecord_park(THREAD, PARK, DEADLINE, config=as_user("alice"))
    with user_scope("bob"):
        with pytest.raises(StorageForbiddenError):
            await saver.aclear_park(THREAD, PARK)
        with pytest.raises(StorageForbiddenError):
            await saver.arecord_park(THREAD, "|bobs", DEADLINE)
        with pytest.raises(StorageForbiddenError):
            await saver.astart_threads([THREAD])
        assert await saver.athread_retention(THREAD) is None
    assert parked(saver)
    assert await saver.amark_finished([THREAD], config=as_user("alice")) == {THREAD: T0 + 1440 * 60}
    found = await saver.athread_retention(THREAD, config=as_user("alice"))
    assert found is not None
    assert found[1] == T0 + 1440 * 60
    await saver.aclear_park(THREAD, PARK, config=as_user("alice"))
    assert not parked(saver)


def test_w3_isolation_off_parks_and_marks_are_keyed_by_thread_alone(open_saver: Opener) -> None:
    saver = open_saver(clock=Clock(), enforce_user_isolation=False)
    alices_parked_thread(saver)
    with user_scope("bob"):
        assert saver.live_parks([THREAD], T0) == {THREAD}
        assert saver.mark_finished([THREAD]) == {THREAD: T0 + 1440 * 60}
        assert saver.thread_retention(THREAD) is not None
        saver.clear_park(THREAD, PARK)
    assert not parked(saver)


@pytest.mark.providers("postgres", "redis", "tiered")
def test_w3_rt5_ask_clears_its_park_as_the_runs_user(open_saver: Opener) -> None:
    """ask() acts for the user its run's config names, whatever scope the caller is in."""
    saver = open_saver(clock=Clock())

    def wait(state: State) -> dict[str, Any]:
        return {"log": [str(ask("approve?", deadline=DEADLINE))]}

    builder = StateGraph(State)
    builder.add_node("wait", wait)
    builder.add_edge(START, "wait")
    builder.add_edge("wait", END)
    graph = builder.compile(checkpointer=saver)
    with user_scope("bob"):
        graph.invoke({"log": []}, as_user("alice"))
        assert saver.live_parks([THREAD], T0) == set()
        assert graph.invoke(Command(resume="yes"), as_user("alice"))["log"] == ["yes"]
    assert not parked(saver)


def test_w3_the_sweeps_own_calls_are_the_operators(open_saver: Opener) -> None:
    """Deleting, listing and probing any user's threads is the sweep's: a user is refused."""
    saver = open_saver()
    alices_parked_thread(saver)
    with operator_scope():
        (alice,) = saver.threads_named([THREAD])
    calls = {
        "delete_threads": lambda: saver.delete_threads([alice]),
        "threads_named": lambda: saver.threads_named([THREAD]),
        "interrupted": lambda: saver.interrupted([THREAD]),
    }
    with user_scope("bob"):
        for name, call in calls.items():
            with pytest.raises(StorageForbiddenError, match=f"{name} acts on every user's threads"):
                call()
    assert saver.get_tuple(as_user("alice")) is not None  # nothing deleted
    with operator_scope():
        assert saver.interrupted([THREAD]) == set()
        assert saver.delete_threads([alice]) == [THREAD]
    assert saver.get_tuple(as_user("alice")) is None
