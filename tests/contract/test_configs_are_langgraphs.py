"""SPEC W2: nothing of the saver's shows in what LangGraph returns.

A user reads configs (``state.config``, ``parent_config``, what ``update_state`` returns),
metadata and values from snapshots, histories and stream events, and compares them with what
LangGraph's savers return. Each must be exactly LangGraph's: the same keys, the same shape,
no key of ours, whether the run followed the head or a checkpoint the caller named.
"""

from __future__ import annotations

import asyncio
import operator
from typing import Annotated, Any, TypedDict

import pytest
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.graph import END, START, StateGraph
from langgraph.types import Command, interrupt

from tests.graphs import Driver, cfg

STREAM_MODES = ["debug", "checkpoints", "values", "updates"]


class Request(TypedDict, total=False):
    topic: str
    answer: str
    notes: Annotated[list[str], operator.add]


class Notes(TypedDict):
    notes: Annotated[list[str], operator.add]


def review_graph(checkpointer: Any) -> Any:
    """plan -> research (a stateful subgraph) -> ask (pauses for a human) -> finish."""

    def read(state: Request) -> dict[str, Any]:
        return {"notes": [f"read {state['topic']} ({len(state['notes'])} before)"]}

    research = StateGraph(Request, output_schema=Notes)
    research.add_node("read", read)
    research.add_edge(START, "read")

    def plan(state: Request) -> dict[str, Any]:
        return {"notes": [f"plan {state['topic']}"]}

    def ask(state: Request) -> dict[str, Any]:
        return {"answer": interrupt(f"publish {state['topic']}?")}

    def finish(state: Request) -> dict[str, Any]:
        return {"notes": [f"{state['topic']}: {state['answer']}"]}

    builder = StateGraph(Request)
    builder.add_node("plan", plan)
    builder.add_node("research", research.compile(checkpointer=True))
    builder.add_node("ask", ask)
    builder.add_node("finish", finish)
    builder.add_edge(START, "plan")
    builder.add_edge("plan", "research")
    builder.add_edge("research", "ask")
    builder.add_edge("ask", "finish")
    builder.add_edge("finish", END)
    return builder.compile(checkpointer=checkpointer)


def stream(driver: Driver, graph: Any, value: Any, config: Any, **kwargs: Any) -> list[Any]:
    if driver.api == "sync":
        return list(graph.stream(value, config, **kwargs))

    async def collect() -> list[Any]:
        return [event async for event in graph.astream(value, config, **kwargs)]

    if driver.runner is None:
        driver.runner = asyncio.Runner()
    return driver.runner.run(collect())


def shape(value: Any) -> Any:
    """What a value looks like, ids and timestamps aside: its keys, recursively."""
    if isinstance(value, dict):
        return {key: shape(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [shape(item) for item in value]
    if hasattr(value, "_asdict"):  # StateSnapshot, PregelTask
        return {type(value).__name__: shape(value._asdict())}
    return type(value).__name__


def keys_of(value: Any) -> set[str]:
    """Every dict key inside ``value``."""
    if isinstance(value, dict):
        return {str(key) for key in value} | {k for item in value.values() for k in keys_of(item)}
    if isinstance(value, (list, tuple)):
        return {k for item in value for k in keys_of(item)}
    if hasattr(value, "_asdict"):
        return keys_of(value._asdict())
    return set()


def session(driver: Driver, graph: Any, saver: Any, durability: str) -> dict[str, Any]:
    """What a user reads while running, pausing, resuming, replaying and forking a thread."""
    thread = cfg("review")
    seen: dict[str, Any] = {}
    seen["first"] = stream(
        driver, graph, {"topic": "t0", "notes": []}, thread,
        stream_mode=STREAM_MODES, subgraphs=True, durability=durability,
    )  # fmt: skip
    seen["resume"] = stream(
        driver, graph, Command(resume="yes"), thread,
        stream_mode=STREAM_MODES, subgraphs=True, durability=durability,
    )  # fmt: skip
    driver.invoke(graph, {"topic": "t1"}, thread, durability=durability)
    history = driver.history(graph, thread)
    seen["history"] = history
    older = history[len(history) // 2]
    seen["addressed"] = driver.get_state(graph, older.config, subgraphs=True)
    seen["replay"] = stream(
        driver, graph, None, older.config,
        stream_mode=STREAM_MODES, subgraphs=True, durability=durability,
    )  # fmt: skip
    forked = driver.update_state(graph, older.config, {"topic": "forked"})
    seen["update_state"] = forked
    seen["fork"] = stream(
        driver, graph, None, forked, stream_mode=STREAM_MODES, subgraphs=True, durability=durability
    )
    seen["head"] = driver.get_state(graph, thread, subgraphs=True)
    by_namespace: dict[str, list[Any]] = {}
    for t in saver.list(thread):
        by_namespace.setdefault(t.config["configurable"]["checkpoint_ns"], []).append(
            (t.config, t.parent_config, t.metadata, t.checkpoint["channel_values"])
        )
    seen["saver"] = by_namespace
    addressed = saver.get_tuple(older.config)
    seen["get_tuple"] = (addressed.config, addressed.parent_config, addressed.metadata)
    return seen


@pytest.mark.parametrize("durability", ["sync", "async", "exit"])
def test_configs_metadata_and_events_are_langgraphs(driver: Driver, saver: Any, durability: str) -> None:
    ours = session(driver, review_graph(saver), saver, durability)
    reference = InMemorySaver()
    theirs = session(driver, review_graph(reference), reference, durability)
    assert not {key for key in keys_of(ours) if "threadkeep" in key}
    for part in theirs:
        assert keys_of(ours[part]) == keys_of(theirs[part]), part
        assert shape(ours[part]) == shape(theirs[part]), part


def test_an_addressed_checkpoint_reads_back_as_langgraph_returns_it(driver: Driver, saver: Any) -> None:
    graph = review_graph(saver)
    thread = cfg("exact")
    driver.invoke(graph, {"topic": "t0", "notes": []}, thread)
    driver.invoke(graph, Command(resume="yes"), thread)
    older = driver.history(graph, thread)[2]
    at = older.config["configurable"]["checkpoint_id"]
    exact = {"configurable": {"thread_id": "exact", "checkpoint_ns": "", "checkpoint_id": at}}

    state = driver.get_state(graph, older.config)
    assert state.config == exact
    assert state.parent_config == {
        "configurable": {
            "thread_id": "exact",
            "checkpoint_ns": "",
            "checkpoint_id": older.parent_config["configurable"]["checkpoint_id"],
        }
    }
    assert saver.get_tuple(older.config).config == exact
    assert driver.update_state(graph, older.config, {"topic": "again"})["configurable"].keys() == {
        "thread_id",
        "checkpoint_ns",
        "checkpoint_id",
    }
    # a run from the addressed checkpoint hands its events the configs LangGraph's savers do
    events = stream(driver, graph, None, exact, stream_mode="checkpoints")
    assert events[0]["parent_config"] == exact
    for event in events:
        assert event["config"]["configurable"].keys() == {"thread_id", "checkpoint_ns", "checkpoint_id"}
