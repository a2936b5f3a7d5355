"""The views of a checkpoint (SPEC SV1, SV3) that the API, the CLI and the inspector show."""

from __future__ import annotations

import base64
import json
from typing import Any

from langchain_core.messages import AIMessage, HumanMessage, SystemMessage, ToolMessage
from langgraph.graph import START, MessagesState, StateGraph

from tests.retention.test_retention import cfg, interrupting_graph
from threadkeep import Settings, open_checkpointer
from threadkeep.views import MAX_STRING, diff_view, history_view, jsonable, message_view, state_view


def chat(saver: Any) -> Any:
    def bot(state: MessagesState) -> dict[str, Any]:
        return {
            "messages": [
                AIMessage("looking", tool_calls=[{"id": "c1", "name": "search", "args": {"q": "tea"}}]),
                ToolMessage("no result", tool_call_id="c1", status="error"),
                AIMessage([{"type": "text", "text": "sorry"}, {"type": "image_url", "image_url": "x"}]),
            ]
        }

    builder = StateGraph(MessagesState)
    builder.add_node("bot", bot)
    builder.add_edge(START, "bot")
    return builder.compile(checkpointer=saver)


def test_sv1_state_view_shows_a_chat_as_messages() -> None:
    with open_checkpointer("memory", settings=Settings()) as saver:
        chat(saver).invoke({"messages": [HumanMessage("find tea", id="h1")]}, cfg("t"))
        head = saver.get_tuple(cfg("t"))
        assert head is not None
        view = state_view(head)
    json.dumps(view, allow_nan=False)  # JSON as it is
    assert view["thread_id"] == "t"
    assert view["checkpoint_id"] == head.checkpoint["id"]
    assert view["step"] == 1
    assert view["source"] == "loop"
    assert view["next"] == []  # the run ended
    assert view["messages_channel"] == "messages"
    assert "messages" not in view["values"]
    assert [(m["type"], m["content"]) for m in view["messages"]] == [
        ("human", "find tea"),
        ("ai", "looking"),
        ("tool", "no result"),
        ("ai", "sorry\n[image_url]"),
    ]
    assert view["messages"][1]["tool_calls"] == [{"id": "c1", "name": "search", "args": {"q": "tea"}}]
    assert view["messages"][2]["tool_call_id"] == "c1"
    assert view["messages"][2]["status"] == "error"
    assert isinstance(view["created_at"], float)


def test_sv1_state_view_shows_the_pending_interrupt_and_next_node() -> None:
    with open_checkpointer("memory", settings=Settings()) as saver:
        interrupting_graph(saver).invoke({"log": []}, cfg("asking"))
        head, first = list(saver.list(cfg("asking")))
    view = state_view(head)
    assert view["next"] == ["wait"]
    assert [i["value"] for i in view["interrupts"]] == ["continue?"]
    assert view["values"] == {"log": []}
    assert view["parent_id"] == first.checkpoint["id"]
    assert state_view(first)["next"] == ["__start__"]
    row = history_view(head)
    assert set(row) >= {"checkpoint_id", "parent_id", "created_at", "step", "source", "writes"}
    assert [w["channel"] for w in row["writes"]] == ["__interrupt__"]
    assert "continue?" in row["writes"][0]["preview"]


def test_sv1_diff_names_the_changed_channel_and_the_added_messages() -> None:
    with open_checkpointer("memory", settings=Settings()) as saver:
        graph = chat(saver)
        graph.invoke({"messages": [HumanMessage("one", id="h1")]}, cfg("t"))
        before = saver.get_tuple(cfg("t"))
        graph.invoke({"messages": [HumanMessage("two", id="h2")]}, cfg("t"))
        after = saver.get_tuple(cfg("t"))
    assert before is not None
    assert after is not None
    diff = diff_view(before, after)
    assert diff["a"] == before.checkpoint["id"]
    assert diff["b"] == after.checkpoint["id"]
    assert diff["changed"] == ["messages"]
    change = diff["channels"]["messages"]
    assert [m["content"] for m in change["messages_added"]][:1] == ["two"]
    assert change["messages_removed"] == []
    assert diff_view(after, after)["channels"] == {}


def test_sv1_jsonable_is_total_and_bounded() -> None:
    class Odd:
        def __repr__(self) -> str:
            raise RuntimeError("no repr")

    value = jsonable(
        {
            1: b"\x00" * 5000,
            "nan": float("nan"),
            "odd": Odd(),
            "long": "y" * (MAX_STRING + 10),
            "many": list(range(1000)),
            "deep": [[[[[[[[[[[[[[["x"]]]]]]]]]]]]]]],
            "msg": SystemMessage("be brief"),
        }
    )
    text = json.dumps(value, allow_nan=False)
    assert value["1"]["size"] == 5000
    assert value["1"]["truncated"] is True
    assert base64.b64decode(value["1"]["$bytes"]).startswith(b"\x00")
    assert value["nan"] == "nan"
    assert value["odd"]["type"].endswith("Odd")
    assert value["long"].endswith("…[+10 chars]")
    assert value["many"][-1] == "…[+800 items]"
    assert value["msg"]["type"] == "system"
    assert len(text) < 20_000


def test_sv1_message_view_reads_message_dicts() -> None:
    view = message_view({"role": "assistant", "content": "hi", "tool_calls": [
        {"id": "x", "function": {"name": "f", "arguments": '{"a": 1}'}}
    ]})  # fmt: skip
    assert view["type"] == "ai"
    assert view["tool_calls"] == [{"id": "x", "name": "f", "args": '{"a": 1}'}]
    assert message_view(42)["type"] == "unknown"
