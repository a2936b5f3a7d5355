"""Issue 34.1: graphs whose state uses LangGraph's ``DeltaChannel`` (langgraph 1.2) behave on
every provider as on LangGraph's ``InMemorySaver``: sync and async, under every durability.

A delta field stores only a snapshot every few updates; between snapshots its value is rebuilt
from the writes of the checkpoint's ancestors. So these graphs also check that what keeps a
store small (messages stored once, SPEC S1) and what removes history (``prune``, the history
limit, ``delete_for_runs``) or copies it (``copy_thread``) leave a delta field readable.
"""

from __future__ import annotations

import asyncio
import operator
import secrets
import uuid
from collections.abc import Callable
from typing import Annotated, Any, TypedDict

import pytest
from langchain_core.messages import AIMessage, AnyMessage, HumanMessage
from langgraph.channels.delta import DeltaChannel
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.graph import END, START, StateGraph
from langgraph.types import Command, Send, interrupt

from tests.graphs import Driver, cfg
from tests.providers import Opener
from threadkeep import StorageForbiddenError, user_scope


def extend(state: list[Any], batches: list[list[Any]]) -> list[Any]:
    """A batching-invariant reducer: appends each batch of items, in order."""
    out = list(state)
    for batch in batches:
        out.extend(batch)
    return out


class Chat(TypedDict):
    # snapshots at different cadences, so most checkpoints rebuild one field or both
    log: Annotated[list[str], DeltaChannel(extend, snapshot_frequency=3)]
    messages: Annotated[list[AnyMessage], DeltaChannel(extend, snapshot_frequency=2)]


def chat_graph(checkpointer: Any, state: type[Any] = Chat) -> Any:
    """reply (writes both delta fields) -> confirm (interrupts for a human answer)."""

    def reply(state: dict[str, Any]) -> dict[str, Any]:
        turn = len(state["messages"])
        return {"log": [f"reply {turn}"], "messages": [AIMessage(f"answer {turn}", id=f"ai-{turn}")]}

    def confirm(state: dict[str, Any]) -> dict[str, Any]:
        return {"log": [f"confirmed {interrupt('confirm?')}"]}

    builder = StateGraph(state)
    builder.add_node("reply", reply)
    builder.add_node("confirm", confirm)
    builder.add_edge(START, "reply")
    builder.add_edge("reply", "confirm")
    builder.add_edge("confirm", END)
    return builder.compile(checkpointer=checkpointer)


def ask(turn: int) -> dict[str, Any]:
    return {"log": [f"ask {turn}"], "messages": [HumanMessage(f"question {turn}", id=f"human-{turn}")]}


class Plain(TypedDict):
    log: Annotated[list[str], operator.add]
    messages: Annotated[list[AnyMessage], DeltaChannel(extend, snapshot_frequency=2)]


def plain_graph(checkpointer: Any) -> Any:
    """The chat graph with ``log`` switched to a plain ``operator.add`` reducer."""

    def reply(state: Plain) -> dict[str, Any]:
        return {"log": [f"plain {len(state['log'])}"]}

    builder = StateGraph(Plain)
    builder.add_node("reply", reply)
    builder.add_edge(START, "reply")
    builder.add_edge("reply", END)
    return builder.compile(checkpointer=checkpointer)


class Notes(TypedDict):
    notes: Annotated[list[str], DeltaChannel(extend, snapshot_frequency=2)]


def nested_graph(checkpointer: Any) -> Any:
    """A parent whose ``research`` node is a subgraph with a delta field that pauses."""

    def draft(state: Notes) -> dict[str, Any]:
        return {"notes": [f"draft {len(state['notes'])}"]}

    def review(state: Notes) -> dict[str, Any]:
        return {"notes": [f"review: {interrupt('review?')}"]}

    inner = StateGraph(Notes)
    inner.add_node("draft", draft)
    inner.add_node("review", review)
    inner.add_edge(START, "draft")
    inner.add_edge("draft", "review")
    inner.add_edge("review", END)

    def publish(state: Notes) -> dict[str, Any]:
        return {"notes": ["published"]}

    outer = StateGraph(Notes)
    outer.add_node("research", inner.compile())
    outer.add_node("publish", publish)
    outer.add_edge(START, "research")
    outer.add_edge("research", "publish")
    outer.add_edge("publish", END)
    return outer.compile(checkpointer=checkpointer)


def seen(driver: Driver, graph: Any, config: Any) -> dict[str, Any]:
    """What a user reads of a thread: its state and its whole history (values, next)."""
    state = driver.get_state(graph, config, subgraphs=True)
    return {
        "values": state.values,
        "next": state.next,
        "tasks": [(t.name, t.state.values if t.state else None) for t in state.tasks],
        "history": [
            (h.values, h.next, h.metadata.get("counters_since_delta_snapshot"))
            for h in driver.history(graph, config)
        ],
    }


def values_of(output: dict[str, Any]) -> dict[str, Any]:
    """A run's output with its interrupts as their values (their ids name checkpoints)."""
    return {k: [i.value for i in v] if k == "__interrupt__" else v for k, v in output.items()}


def same_as_langgraph(driver: Driver, saver: Any, scenario: Callable[[Any], Any]) -> Any:
    """Runs ``scenario`` (given a checkpointer, returns what it saw) on ``saver`` and on
    LangGraph's InMemorySaver, asserts both saw the same, and returns it."""
    expected = scenario(InMemorySaver())
    got = scenario(saver)
    assert got == expected
    return got


def chat_turns(driver: Driver, graph: Any, thread: str, turns: int, durability: str) -> None:
    for turn in range(turns):
        driver.invoke(graph, ask(turn), cfg(thread), durability=durability)
        driver.invoke(graph, Command(resume=f"yes {turn}"), cfg(thread), durability=durability)


def test_delta_fields_run_pause_and_resume(driver: Driver, saver: Any, durability: str) -> None:
    def scenario(checkpointer: Any) -> Any:
        graph = chat_graph(checkpointer)
        paused = driver.invoke(graph, ask(0), cfg("t"), durability=durability)
        before = seen(driver, graph, cfg("t"))
        chat_turns(driver, graph, "t", 4, durability)
        return paused["__interrupt__"][0].value, before, seen(driver, graph, cfg("t"))

    _, _, after = same_as_langgraph(driver, saver, scenario)
    assert after["values"]["log"][-1] == "confirmed yes 3"
    assert len(after["values"]["messages"]) == 10  # 5 questions (one asked twice), 5 answers


class Fan(TypedDict):
    log: Annotated[list[str], DeltaChannel(extend, snapshot_frequency=4)]


def fan_graph(checkpointer: Any) -> Any:
    """Three parallel nodes and a Send fan-out write one delta field in the same steps: the
    field is rebuilt from their writes in the order LangGraph applied them."""

    def branch(name: str) -> Any:
        return lambda state: {"log": [f"{name} {len(state['log'])}"]}

    def fan_out(state: Fan) -> list[Send]:
        return [Send("item", {"log": [f"send {i}"]}) for i in range(3)]

    builder = StateGraph(Fan)
    for name in ("a", "b", "c"):
        builder.add_node(name, branch(name))
        builder.add_edge(START, name)
    builder.add_node("item", lambda state: {"log": [f"item {state['log'][-1]}"]})
    builder.add_conditional_edges("a", fan_out, ["item"])
    builder.add_edge("item", END)
    return builder.compile(checkpointer=checkpointer)


def test_parallel_writes_to_a_delta_field(driver: Driver, saver: Any, durability: str) -> None:
    def scenario(checkpointer: Any) -> Any:
        graph = fan_graph(checkpointer)
        for turn in range(3):
            driver.invoke(graph, {"log": [f"turn {turn}"]}, cfg("t"), durability=durability)
        return seen(driver, graph, cfg("t"))

    after = same_as_langgraph(driver, saver, scenario)
    assert len(after["values"]["log"]) == 3 * 7


def test_delta_fields_replay_and_fork(driver: Driver, saver: Any, durability: str) -> None:
    def scenario(checkpointer: Any) -> Any:
        graph = chat_graph(checkpointer)
        chat_turns(driver, graph, "t", 3, durability)
        history = driver.history(graph, cfg("t"))
        past = history[len(history) // 2].config
        replayed = driver.invoke(graph, None, past, durability=durability)
        forked = driver.update_state(graph, past, {"log": ["edited"]})
        resumed = driver.invoke(graph, None, forked, durability=durability)
        return values_of(replayed), values_of(resumed), seen(driver, graph, cfg("t"))

    _, resumed, _ = same_as_langgraph(driver, saver, scenario)
    assert "edited" in resumed["log"]


def test_delta_fields_update_state(driver: Driver, saver: Any, durability: str) -> None:
    def scenario(checkpointer: Any) -> Any:
        graph = chat_graph(checkpointer)
        chat_turns(driver, graph, "t", 2, durability)
        driver.update_state(graph, cfg("t"), {"log": ["by hand"], "messages": [AIMessage("note", id="n")]})
        driver.update_state(graph, cfg("t"), {"log": ["again"]}, as_node="reply")
        return seen(driver, graph, cfg("t"))

    after = same_as_langgraph(driver, saver, scenario)
    assert after["values"]["log"][-2:] == ["by hand", "again"]


def test_delta_field_in_a_subgraph(driver: Driver, saver: Any, durability: str) -> None:
    def scenario(checkpointer: Any) -> Any:
        graph = nested_graph(checkpointer)
        steps = []
        for turn in range(3):
            driver.invoke(graph, {"notes": [f"topic {turn}"]}, cfg("t"), durability=durability)
            steps.append(seen(driver, graph, cfg("t")))
            driver.invoke(graph, Command(resume=f"ok {turn}"), cfg("t"), durability=durability)
        steps.append(seen(driver, graph, cfg("t")))
        return steps

    steps = same_as_langgraph(driver, saver, scenario)
    assert steps[0]["tasks"][0][1]["notes"][-1].startswith("draft")
    assert steps[-1]["values"]["notes"][-1] == "published"


def test_switching_a_field_from_delta_to_plain_reducer(driver: Driver, saver: Any, durability: str) -> None:
    def scenario(checkpointer: Any) -> Any:
        chat_turns(driver, chat_graph(checkpointer), "t", 2, durability)
        graph = plain_graph(checkpointer)
        for _ in range(2):
            driver.invoke(graph, {"log": ["plain input"]}, cfg("t"), durability=durability)
        return seen(driver, graph, cfg("t"))

    after = same_as_langgraph(driver, saver, scenario)
    assert after["values"]["log"][0] == "ask 0"
    assert after["values"]["log"][-1].startswith("plain")


class PlainChat(TypedDict):
    log: Annotated[list[str], operator.add]
    messages: Annotated[list[AnyMessage], operator.add]


def test_messages_through_a_delta_field_are_stored_once(
    driver: Driver, open_saver: Opener, durability: str
) -> None:
    # Incompressible questions; the same conversation through plain fields (whose message
    # lists are stored once, S1) is the yardstick: delta snapshots holding the questions
    # again (one every 2 updates here) would more than double the bytes.
    questions = [HumanMessage(secrets.token_hex(2000), id=f"human-{turn}") for turn in range(6)]
    stored = {}
    for name, state in (("delta", Chat), ("plain", PlainChat)):
        saver = open_saver(fresh=True)
        graph = chat_graph(saver, state)
        for question in questions:
            driver.invoke(graph, {"log": ["ask"], "messages": [question]}, cfg("t"), durability=durability)
            driver.invoke(graph, Command(resume="yes"), cfg("t"), durability=durability)
        messages = driver.get_state(graph, cfg("t")).values["messages"]
        assert len(messages) == 12
        stored[name] = saver.stats("t")
        assert stored[name]["messages"] == len({m.id for m in messages})
    assert stored["delta"]["payload_bytes"] < stored["plain"]["payload_bytes"] * 1.25


def test_prune_keep_latest_leaves_delta_fields_readable(driver: Driver, saver: Any, durability: str) -> None:
    def scenario(checkpointer: Any) -> Any:
        graph = chat_graph(checkpointer)
        chat_turns(driver, graph, "t", 3, durability)
        driver.invoke(graph, ask(3), cfg("t"), durability=durability)  # paused
        return driver.get_state(graph, cfg("t")).values

    expected = scenario(InMemorySaver())
    assert scenario(saver) == expected
    graph = chat_graph(saver)
    driver._call(saver, "prune", ["t"])  # type: ignore[arg-type]
    state = driver.get_state(graph, cfg("t"))
    assert state.values == expected
    assert state.next == ("confirm",)
    done = driver.invoke(graph, Command(resume="after prune"), cfg("t"), durability=durability)
    assert done["log"] == [*expected["log"], "confirmed after prune"]


def test_prune_keep_latest_leaves_a_paused_subgraph_readable(
    driver: Driver, saver: Any, durability: str
) -> None:
    def scenario(checkpointer: Any, prune: bool) -> Any:
        graph = nested_graph(checkpointer)
        for turn in range(2):
            driver.invoke(graph, {"notes": [f"topic {turn}"]}, cfg("t"), durability=durability)
            driver.invoke(graph, Command(resume=f"ok {turn}"), cfg("t"), durability=durability)
        driver.invoke(graph, {"notes": ["topic 2"]}, cfg("t"), durability=durability)  # paused inside
        if prune:
            driver._call(checkpointer, "prune", ["t"])
        paused = seen(driver, graph, cfg("t"))
        done = driver.invoke(graph, Command(resume="ok 2"), cfg("t"), durability=durability)
        return paused["values"], paused["tasks"], done

    assert scenario(saver, prune=True) == scenario(InMemorySaver(), prune=False)


def test_copy_thread_leaves_delta_fields_readable(driver: Driver, saver: Any, durability: str) -> None:
    graph = chat_graph(saver)
    chat_turns(driver, graph, "t", 3, durability)
    expected = seen(driver, graph, cfg("t"))
    driver._call(saver, "copy_thread", "t", "copy")  # type: ignore[arg-type]
    assert seen(driver, graph, cfg("copy")) == expected
    chat_turns(driver, graph, "copy", 1, durability)
    assert (
        driver.get_state(graph, cfg("copy")).values["log"][: len(expected["values"]["log"])]
        == (expected["values"]["log"])
    )


def test_delete_for_runs_leaves_later_runs_readable(driver: Driver, saver: Any, durability: str) -> None:
    graph = chat_graph(saver)
    first_run = str(uuid.uuid4())
    for turn in range(2):
        config = {"configurable": {"thread_id": "t", "run_id": first_run}}
        driver.invoke(graph, ask(turn), config, durability=durability)
        driver.invoke(graph, Command(resume=f"yes {turn}"), config, durability=durability)
    driver.invoke(graph, ask(2), cfg("t"), durability=durability)  # a later run, paused
    expected = seen(driver, graph, cfg("t"))
    stored = saver.stats("t")["checkpoints"]
    driver._call(saver, "delete_for_runs", [first_run])  # type: ignore[arg-type]
    assert driver.get_state(graph, cfg("t")).values == expected["values"]
    assert saver.stats("t")["checkpoints"] < stored  # what no later checkpoint reads is gone
    done = driver.invoke(graph, Command(resume="after delete"), cfg("t"), durability=durability)
    assert done["log"] == [*expected["values"]["log"], "confirmed after delete"]


def test_history_limit_leaves_delta_fields_readable(
    driver: Driver, open_saver: Opener, durability: str
) -> None:
    def scenario(checkpointer: Any) -> Any:
        graph = chat_graph(checkpointer)
        chat_turns(driver, graph, "t", 6, durability)
        history = driver.history(graph, cfg("t"))
        return [(h.values, h.next) for h in history]

    expected = scenario(InMemorySaver())
    kept = scenario(open_saver(state_history_limit=3))
    # the newest 3 read back as LangGraph's own saver reads them; the store keeps the older
    # ones their delta fields are rebuilt from, and no more
    assert kept[:3] == expected[:3]
    assert 3 < len(kept) < len(expected)


@pytest.mark.parametrize("api", ["sync", "async"])
def test_another_users_delete_for_runs_and_prune_of_delta_threads_are_refused(saver: Any, api: str) -> None:
    """SPEC W3 beside what delta fields keep: another user's ``delete_for_runs`` and
    ``prune`` on threads with delta fields raise and change nothing; each owner's own calls
    still keep what its delta fields are rebuilt from."""

    def call(name: str, *args: Any, **kwargs: Any) -> Any:
        if api == "sync":
            return getattr(saver, name)(*args, **kwargs)
        return asyncio.run(getattr(saver, f"a{name}")(*args, **kwargs))

    def mine(user: str, **extra: Any) -> dict[str, Any]:
        return {"configurable": {"thread_id": f"t-{user}", "user_id": user, **extra}}

    driver, graph, runs = Driver("sync"), chat_graph(saver), {}
    for user in ("alice", "bob"):
        runs[user] = str(uuid.uuid4())
        for turn in range(2):
            driver.invoke(graph, ask(turn), mine(user, run_id=runs[user]))
            driver.invoke(graph, Command(resume=f"yes {turn}"), mine(user, run_id=runs[user]))
        driver.invoke(graph, ask(2), mine(user))  # a later run, paused
    before = {user: seen(driver, graph, mine(user)) for user in runs}
    stats = saver.stats()
    with user_scope("bob"):
        for name, args, kwargs in [
            ("delete_for_runs", ([runs["bob"], runs["alice"]],), {}),
            ("prune", (["t-bob", "t-alice"],), {"strategy": "keep_latest"}),
        ]:
            with pytest.raises(StorageForbiddenError) as refused:
                call(name, *args, **kwargs)
            assert refused.value.context["thread_id"] == "t-alice"
    assert saver.stats() == stats
    assert {user: seen(driver, graph, mine(user)) for user in runs} == before
    for user, run_id in runs.items():
        stored = saver.stats(f"t-{user}")["checkpoints"]
        with user_scope(user):
            call("delete_for_runs", [run_id])
            call("prune", [f"t-{user}"], strategy="keep_latest")
        assert saver.stats(f"t-{user}")["checkpoints"] < stored
        assert driver.get_state(graph, mine(user)).values == before[user]["values"]
        done = driver.invoke(graph, Command(resume="after"), mine(user))
        assert done["log"] == [*before[user]["values"]["log"], "confirmed after"]
