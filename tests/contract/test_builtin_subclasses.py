"""Issue 34.3: what LangGraph's savers store, we store: subclasses of builtins (SPEC C1).

langchain-core's ``message.text`` is a ``TextAccessor``, a ``str`` subclass, and tools often
return it. A subclass of ``str``, ``int``, ``float``, ``list``, ``tuple`` or ``dict`` is stored
and reads back as that builtin, as LangGraph's own savers return it. Each graph runs on every
provider, through the sync and async APIs, under every durability, and is compared with
LangGraph's ``InMemorySaver`` running the same graph.
"""

from __future__ import annotations

import collections
from typing import Annotated, Any, NamedTuple, TypedDict

from langchain_core.messages import AIMessage, AnyMessage, HumanMessage, ToolMessage
from langchain_core.tools import tool
from langgraph.checkpoint.base import BaseCheckpointSaver
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.graph import END, START, StateGraph
from langgraph.graph.message import add_messages
from langgraph.prebuilt import ToolNode
from langgraph.types import Command, interrupt

from tests.graphs import Driver, cfg


class Chat(TypedDict):
    messages: Annotated[list[AnyMessage], add_messages]
    summary: str


@tool
def summarize(topic: str) -> str:
    """Summarize a topic."""
    return AIMessage(f"{topic} in short").text  # a TextAccessor


def _agent(state: Chat) -> dict[str, Any]:
    if isinstance(state["messages"][-1], ToolMessage):
        return {"messages": [AIMessage("done")], "summary": state["messages"][-1].text}
    call = {"name": "summarize", "args": {"topic": "tides"}, "id": "call-1"}
    return {"messages": [AIMessage("", tool_calls=[call])]}


def tool_graph(checkpointer: BaseCheckpointSaver[Any]) -> Any:
    """agent -> tools -> agent: the tool and the agent return ``message.text``."""
    builder = StateGraph(Chat)
    builder.add_node("agent", _agent)
    builder.add_node("tools", ToolNode([summarize]))
    builder.add_edge(START, "agent")
    builder.add_conditional_edges(
        "agent", lambda state: "tools" if state["messages"][-1].tool_calls else END, ["tools", END]
    )
    builder.add_edge("tools", "agent")
    return builder.compile(checkpointer=checkpointer)


def without_ids(values: dict[str, Any]) -> dict[str, Any]:
    """``values`` with each message's random id left out (the savers run separate graphs)."""
    messages = [message.model_copy(update={"id": None}) for message in values.get("messages", [])]
    return {**values, "messages": messages}


def test_tool_returning_message_text_is_stored_as_str(
    driver: Driver, durability: str, saver: BaseCheckpointSaver[Any]
) -> None:
    reference = InMemorySaver()
    runs = []
    for checkpointer in (reference, saver):
        graph = tool_graph(checkpointer)
        done = driver.invoke(
            graph, {"messages": [HumanMessage("hi")], "summary": ""}, cfg("t"), durability=durability
        )
        state = driver.get_state(graph, cfg("t"))
        history = [without_ids(s.values) for s in driver.history(graph, cfg("t"))]
        runs.append((without_ids(done), state.values, history))

    (expected_done, expected_values, expected_history), (done, values, history) = runs
    assert done == expected_done
    assert without_ids(values) == without_ids(expected_values)
    assert history == expected_history
    assert values["summary"] == "tides in short"
    assert type(values["summary"]) is str
    tool_message = values["messages"][2]
    assert type(tool_message) is ToolMessage
    assert tool_message.content == "tides in short"
    assert type(tool_message.content) is str


class Point(NamedTuple):
    x: int
    y: int


class Score(int):
    pass


class Label(str):
    pass


class Tags(list[str]):
    pass


class Scores(TypedDict):
    label: str
    score: int
    tags: list[str]
    point: tuple[int, int]
    counts: dict[str, int]
    order: dict[str, int]
    answer: str


def _tally(state: Scores) -> dict[str, Any]:
    return {
        "label": Label(AIMessage("tally").text),
        "score": Score(7),
        "tags": Tags(["a", "b"]),
        "point": Point(1, 2),
        "counts": collections.Counter("abca"),
        "order": collections.OrderedDict(z=1, a=2),
    }


def _ask(state: Scores) -> dict[str, Any]:
    return {"answer": interrupt(f"accept {state['label']}?")}


def scores_graph(checkpointer: BaseCheckpointSaver[Any]) -> Any:
    """tally (returns builtin subclasses) -> ask (pauses, so the values are read back)."""
    builder = StateGraph(Scores)
    builder.add_node("tally", _tally)
    builder.add_node("ask", _ask)
    builder.add_edge(START, "tally")
    builder.add_edge("tally", "ask")
    builder.add_edge("ask", END)
    return builder.compile(checkpointer=checkpointer)


def test_builtin_subclasses_read_back_as_the_builtin(
    driver: Driver, durability: str, saver: BaseCheckpointSaver[Any]
) -> None:
    reference = InMemorySaver()
    runs = []
    for checkpointer in (reference, saver):
        graph = scores_graph(checkpointer)
        empty = {
            "label": "",
            "score": 0,
            "tags": [],
            "point": (0, 0),
            "counts": {},
            "order": {},
            "answer": "",
        }
        driver.invoke(graph, empty, cfg("t"), durability=durability)
        paused = driver.get_state(graph, cfg("t"))
        done = driver.invoke(graph, Command(resume="yes"), cfg("t"), durability=durability)
        runs.append((paused, done))

    (expected_paused, expected_done), (paused, done) = runs
    # A named tuple LangGraph's savers rebuild by importing its class, or, under
    # LANGGRAPH_STRICT_MSGPACK, return as a dict of its fields; ours is the tuple.
    for values in (expected_paused.values, expected_done):
        assert values.pop("point") in ((1, 2), {"x": 1, "y": 2})
    for values in (paused.values, done):
        point = values.pop("point")
        assert type(point) is tuple
        assert point == (1, 2)
    assert paused.values == expected_paused.values
    assert paused.next == expected_paused.next == ("ask",)
    assert done == expected_done
    values = driver.get_state(graph, cfg("t")).values
    assert {name: type(value) for name, value in values.items()} == {
        "label": str,
        "score": int,
        "tags": list,
        "point": tuple,
        "counts": dict,
        "order": dict,
        "answer": str,
    }
    assert values["label"] == "tally"
    assert values["point"] == (1, 2)
    assert values["counts"] == {"a": 2, "b": 1, "c": 1}
    assert list(values["order"]) == ["z", "a"]
