"""What users of LangGraph's own savers reported going wrong, checked on every provider.

Each test names the report it comes from; threadkeep's code handled each already, and these
tests keep it so.
"""

from __future__ import annotations

import asyncio
import enum
from typing import Any

from langchain_core.messages import HumanMessage
from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import empty_checkpoint

from threadkeep import operator_scope
from threadkeep.workload import MESSAGES_PER_TURN, build_agent, run_turns, turn_input


def cfg(thread_id: str, **extra: Any) -> RunnableConfig:
    return {"configurable": {"thread_id": thread_id, "checkpoint_ns": "", **extra}}


def _checkpoint(values: dict[str, Any]) -> Any:
    checkpoint = empty_checkpoint()
    checkpoint["channel_values"] = values
    checkpoint["channel_versions"] = dict.fromkeys(values, 1)
    return checkpoint


def test_nul_characters_in_state_and_metadata_read_back(saver: Any) -> None:
    """langgraph#1878: AsyncPostgresSaver failed on state holding a NUL character
    ("unsupported Unicode escape sequence"), which Postgres's jsonb cannot hold. A message, a
    channel value and a nested metadata value holding one read back exactly; a list filtered
    on metadata, with or without one, finds what it should and fails on nothing."""
    values = {"messages": [HumanMessage(content="a\x00b", id="m1")], "note": "x\x00y"}
    checkpoint = _checkpoint(values)
    metadata = {"source": "input", "step": -1, "tag": "t\x00u", "info": {"x": "a\x00b"}}
    stored = saver.put(cfg("nul"), checkpoint, metadata, {"messages": 1, "note": 1})
    read = saver.get_tuple(stored)
    assert read.checkpoint["channel_values"] == values
    assert read.metadata["info"] == {"x": "a\x00b"}
    assert read.metadata["tag"] == "tu"  # LangGraph drops NUL from top-level metadata strings

    def listed(**wanted: Any) -> list[str]:
        return [item.checkpoint["id"] for item in saver.list(cfg("nul"), filter=wanted)]

    assert listed(source="input") == [checkpoint["id"]]
    assert listed(info={"x": "a\x00b"}) == [checkpoint["id"]]
    assert listed(tag="tu") == [checkpoint["id"]]
    assert listed(tag="t\x00u") == []  # as stored: without its NUL
    assert listed(info={"x": "ab"}) == []
    assert listed(info={"x": "a\ufffdb"}) == []  # what Postgres compares the NUL as, in SQL


def test_putting_a_checkpoint_again_keeps_its_pending_writes(saver: Any) -> None:
    """langgraphjs#1996: a put of a checkpoint that already had pending writes hid them. A
    step replayed after a lost reply puts the same checkpoint again: its writes stay."""
    checkpoint = _checkpoint({"note": "a"})
    stored = saver.put(cfg("again"), checkpoint, {"source": "loop", "step": 0}, {"note": 1})
    saver.put_writes(stored, [("note", "b")], "task-1")
    again = saver.put(cfg("again"), checkpoint, {"source": "loop", "step": 0}, {"note": 1})
    assert again["configurable"]["checkpoint_id"] == checkpoint["id"]
    read = saver.get_tuple(stored)
    assert [(task, channel, value) for task, channel, value in read.pending_writes] == [
        ("task-1", "note", "b")
    ]


def test_thread_ids_with_the_characters_keys_and_queries_use_work(saver: Any) -> None:
    """langgraphjs#2012: thread ids holding characters a store uses in its keys or queries
    (a Redis hash tag's braces, separators, quotes, wildcards) broke reads. Each id keeps its
    own conversation, lists and deletes."""
    ids = ["a}{b:c", "{tag}", "x*y?[z]", 'it\'s "quoted"', "with space", "线程", "%(name)s", "a\\b"]
    graph = build_agent(saver)
    for turn, thread_id in enumerate(ids):
        run_turns(graph, thread_id, 1, first=turn)
    for turn, thread_id in enumerate(ids):
        state = saver.get_tuple(cfg(thread_id))
        assert state is not None, thread_id
        messages = state.checkpoint["channel_values"]["messages"]
        assert len(messages) == MESSAGES_PER_TURN
        assert messages[0].content.startswith(f"Turn {turn}:"), thread_id
    with operator_scope():
        listed = {item.config["configurable"]["thread_id"] for item in saver.list(None)}
    assert set(ids) <= listed
    saver.delete_thread(ids[0])
    assert saver.get_tuple(cfg(ids[0])) is None
    assert all(saver.get_tuple(cfg(thread_id)) is not None for thread_id in ids[1:])


async def test_a_paused_list_does_not_hold_up_writes(saver: Any) -> None:
    """langgraph#8558: an ``alist`` iteration left paused blocked writes to the store. A
    list taken one item at a time, then left, lets a write to the same thread through."""
    graph = build_agent(saver)
    for turn in range(2):
        await graph.ainvoke(turn_input(turn), {"configurable": {"thread_id": "paused"}})
    listing = saver.alist(cfg("paused"))
    first = await anext(listing)
    assert first is not None
    await asyncio.wait_for(graph.ainvoke(turn_input(2), {"configurable": {"thread_id": "paused"}}), 30)
    state = await saver.aget_tuple(cfg("paused"))
    assert len(state.checkpoint["channel_values"]["messages"]) == 3 * MESSAGES_PER_TURN
    await listing.aclose()


class Mode(enum.Enum):
    """An enum a run's metadata may hold."""

    FAST = "fast"


def test_a_metadata_filter_finds_the_same_checkpoints_on_every_store(saver: Any) -> None:
    """LangGraph's own savers answer a metadata filter each their own way: ``InMemorySaver``
    by Python's equality (``True == 1``), ``PostgresSaver`` by jsonb containment (a filter
    ``{"a": {"b": 1}}`` finds ``{"a": {"b": 1, "c": 2}}``). Every threadkeep store compares
    values as it stores them, equal as JSON values: nested values whole, ``1`` the same as
    ``1.0``, a boolean only a boolean, a tuple only a tuple, an enum only an enum. A filter
    metadata could not hold is refused, naming its value, on every store."""
    import pytest

    from threadkeep import CheckpointSerializationError

    checkpoint = _checkpoint({})
    metadata = {
        "source": "input",
        "step": -1,
        "a": {"b": 1, "c": 2},
        "n": 1,
        "l": [1, 2],
        "t": (1, 2),
        "f": 1.5,
        "m": Mode.FAST,
    }
    saver.put(cfg("filters"), checkpoint, metadata, {})

    def found(**wanted: Any) -> bool:
        listed = [item.checkpoint["id"] for item in saver.list(cfg("filters"), filter=wanted)]
        return listed == [checkpoint["id"]]

    assert found(a={"b": 1, "c": 2}, n=1, l=[1, 2], t=(1, 2), f=1.5, m=Mode.FAST)
    assert found(a={"c": 2.0, "b": 1}, n=1.0)
    assert not found(a={"b": 1})  # a part of a nested value
    assert not found(l=[1])
    assert not found(l=[2, 1])
    assert not found(l=(1, 2))  # a tuple is not a list
    assert not found(t=[1, 2])
    assert not found(n=True)  # equal to 1 in Python, not in JSON
    assert not found(n="1")
    assert not found(m="fast")  # the enum's value is not the enum
    assert not found(missing=None)
    with pytest.raises(CheckpointSerializationError, match=r"filter\.n: float nan"):
        list(saver.list(cfg("filters"), filter={"n": float("nan")}))

    # Metadata whose one key starts with "~" is stored in the codec's escaped form of such a
    # dict; a filter finds it on every store all the same.
    escaped = _checkpoint({})
    saver.put(cfg("escaped"), escaped, {"~run": "r1"}, {})
    listed = [item.checkpoint["id"] for item in saver.list(cfg("escaped"), filter={"~run": "r1"})]
    assert listed == [escaped["id"]]
    assert not list(saver.list(cfg("escaped"), filter={"~run": "r2"}))
