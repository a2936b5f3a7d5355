"""SPEC W3, RT2 on Redis: a mark and its entry in the finished set stay the owner's.

The finished set is one key for all threads (another Redis Cluster slot than any thread's),
so a start or a mark is a script on the thread's keys plus a command on the set. Whatever
another user does between the two, no user's start takes another's mark out of the set,
and no user's mark makes the sweep delete another's thread.
"""

from __future__ import annotations

import contextlib
import operator
from collections.abc import Callable, Iterator
from typing import Annotated, Any, TypedDict

import pytest
from langgraph.graph import END, START, StateGraph

from tests.providers import Opener
from threadkeep import StorageForbiddenError, operator_scope, sweep_checkpoints, user_scope

pytestmark = pytest.mark.providers("redis", "redis-cluster")

T0 = 1_800_000_000.0
DAY = 86_400.0


class Clock:
    def __init__(self) -> None:
        self.now = T0

    def __call__(self) -> float:
        return self.now


class State(TypedDict):
    log: Annotated[list[str], operator.add]


def write(saver: Any, thread_id: str, user: str) -> None:
    builder = StateGraph(State)
    builder.add_node("step", lambda state: {"log": ["step"]})
    builder.add_edge(START, "step")
    builder.add_edge("step", END)
    builder.compile(checkpointer=saver).invoke(
        {"log": []}, {"configurable": {"thread_id": thread_id, "user_id": user}}
    )


def before_request(
    original: Callable[..., Any], position: int, action: Callable[[], None]
) -> Callable[..., Any]:
    """``original``'s programs, with ``action`` run (by another saver) right before the
    program sends request number ``position``."""

    def program(*args: Any, **kwargs: Any) -> Iterator[Any]:
        inner = original(*args, **kwargs)
        reply, sent = None, 0
        while True:
            try:
                request = inner.send(reply)
            except StopIteration as done:
                return done.value
            if sent == position:
                action()
            reply = yield request
            sent += 1

    return program


def owner_of(saver: Any, thread_id: str) -> str | None:
    with operator_scope():
        found = saver.threads_named([thread_id])
    return found[0].owner if found else None


def test_w3_rt2_another_users_start_never_takes_a_mark_out_of_the_finished_set(
    open_saver: Opener, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Alice writes and marks a thread while Bob's start on the same id is between its
    requests: either Bob got the thread first (Alice is refused), or Bob is refused and
    Alice's mark stands, in the set the sweep pages through."""
    clock = Clock()
    bob, alice = open_saver(clock=clock), open_saver(clock=clock)
    alices = []
    for position in range(3):
        thread_id = f"contested-{position}"

        def alice_marks(thread_id: str = thread_id) -> None:
            try:
                write(alice, thread_id, "alice")
            except StorageForbiddenError:
                return  # bob's start made the thread his first
            alice.mark_finished([thread_id], config={"configurable": {"user_id": "alice"}})

        monkeypatch.setattr(
            bob.backend, "start_thread", before_request(bob.backend.start_thread, position, alice_marks)
        )
        refused = False
        with user_scope("bob"):
            try:
                bob.start_threads([thread_id])
            except StorageForbiddenError:
                refused = True
        monkeypatch.undo()
        owner = owner_of(alice, thread_id)
        assert refused == (owner == "alice"), (position, owner)
        if owner == "alice":
            alices.append(thread_id)
            with user_scope("alice"):
                assert alice.thread_retention(thread_id) is not None
                assert alice.thread_retention(thread_id)[1] == T0 + DAY
    assert alices, "alice never got a thread: the test interleaved nothing"
    clock.now = T0 + DAY + 1
    result = sweep_checkpoints(alice)
    assert result.finished_swept == len(alices)
    assert [owner_of(alice, thread_id) for thread_id in alices] == [None] * len(alices)


def test_w3_rt2_a_mark_never_lands_on_another_users_thread_of_the_same_id(
    open_saver: Opener, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Bob marks his thread while, between the mark's requests, it is deleted and Alice
    starts a thread of the same id: Alice's thread is not marked, and the sweep at Bob's
    due time keeps it."""
    clock = Clock()
    bob, alice = open_saver(clock=clock), open_saver(clock=clock)
    replaced = []
    for position in range(3):
        thread_id = f"reused-{position}"
        write(bob, thread_id, "bob")

        def alice_takes_the_id(thread_id: str = thread_id) -> None:
            with operator_scope():
                alice.delete_thread(thread_id)
            write(alice, thread_id, "alice")
            replaced.append(thread_id)

        monkeypatch.setattr(
            bob.backend,
            "mark_finished",
            before_request(bob.backend.mark_finished, position, alice_takes_the_id),
        )
        # Refused if the id was alice's by the time the mark reached it.
        with user_scope("bob"), contextlib.suppress(StorageForbiddenError):
            bob.mark_finished([thread_id])
        monkeypatch.undo()
    assert replaced
    for thread_id in replaced:
        assert owner_of(alice, thread_id) == "alice"
        with user_scope("alice"):
            assert alice.thread_retention(thread_id) is not None
            assert alice.thread_retention(thread_id)[1] is None, thread_id  # never marked
    clock.now = T0 + DAY + 1
    sweep_checkpoints(alice)
    assert [owner_of(alice, thread_id) for thread_id in replaced] == ["alice"] * len(replaced)
