"""SPEC S1-S3: messages stored once, unchanged channels not stored again, history limits."""

from __future__ import annotations

import threading
from typing import Any

from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, RemoveMessage, ToolMessage
from langgraph.graph import END, START, MessagesState, StateGraph

from tests.providers import SHARED_STORE, Opener, ProviderCase
from threadkeep.backends.sql.backend import SqlBackend
from threadkeep.workload import MESSAGES_PER_TURN, build_agent, run_turns


def cfg(thread_id: str, **extra: Any) -> dict[str, Any]:
    return {"configurable": {"thread_id": thread_id, **extra}}


def reply_graph(saver: Any, reply: Any) -> Any:
    """A graph of one node, ``reply``, on ``MessagesState``."""
    builder = StateGraph(MessagesState)
    builder.add_node("reply", reply)
    builder.add_edge(START, "reply")
    builder.add_edge("reply", END)
    return builder.compile(checkpointer=saver)


def echo_graph(saver: Any) -> Any:
    def reply(state: MessagesState) -> dict[str, Any]:
        return {"messages": [AIMessage(content=f"echo: {state['messages'][-1].content}")]}

    return reply_graph(saver, reply)


def test_s1_each_message_is_stored_once_per_thread(saver: Any) -> None:
    run_turns(build_agent(saver), "once", 4)
    assert saver.stats()["messages"] == 4 * MESSAGES_PER_TURN
    assert saver.stats()["checkpoints"] > 4 * MESSAGES_PER_TURN


def test_s1_storage_grows_linearly_with_the_conversation(open_saver: Opener) -> None:
    short, long = open_saver(fresh=True), open_saver(fresh=True)
    run_turns(build_agent(short), "short", 5)
    run_turns(build_agent(long), "long", 10)
    ratio = long.stats()["payload_bytes"] / short.stats()["payload_bytes"]
    # Twice the conversation, twice the bytes: not four times. The margin is for a tool's
    # message written before add_messages gives it an id (the sync API writes from a worker
    # thread): that write is stored whole, not by reference, so a run's bytes move by a few
    # messages (78,127 to 83,033 for five turns in four runs).
    assert 1.6 < ratio < 2.4


def test_s1_old_checkpoint_reads_back_its_messages_after_edits_and_removals(saver: Any) -> None:
    graph = echo_graph(saver)
    graph.invoke({"messages": [HumanMessage("hello", id="h1")]}, cfg("edits"))
    before = graph.get_state(cfg("edits"))
    original = before.values["messages"]
    assert [m.content for m in original] == ["hello", "echo: hello"]

    graph.update_state(cfg("edits"), {"messages": [HumanMessage("hello, edited", id="h1")]})
    graph.update_state(cfg("edits"), {"messages": [RemoveMessage(id=original[1].id)]})
    assert [m.content for m in graph.get_state(cfg("edits")).values["messages"]] == ["hello, edited"]

    assert graph.get_state(before.config).values["messages"] == original
    # and a fresh read of every checkpoint in the history decodes
    contents = [[m.content for m in s.values["messages"]] for s in graph.get_state_history(cfg("edits"))]
    assert contents[:3] == [["hello, edited"], ["hello, edited", "echo: hello"], ["hello", "echo: hello"]]


def test_s1_threads_never_share_messages_even_with_the_same_ids(saver: Any) -> None:
    graph = echo_graph(saver)
    graph.invoke({"messages": [HumanMessage("for alpha", id="same")]}, cfg("alpha"))
    graph.invoke({"messages": [HumanMessage("for beta", id="same")]}, cfg("beta"))
    graph.update_state(cfg("beta"), {"messages": [HumanMessage("beta rewrote it", id="same")]})
    alpha = graph.get_state(cfg("alpha")).values["messages"]
    beta = graph.get_state(cfg("beta")).values["messages"]
    assert [m.content for m in alpha] == ["for alpha", "echo: for alpha"]
    assert [m.content for m in beta] == ["beta rewrote it", "echo: for beta"]
    saver.delete_thread("beta")
    assert [m.content for m in graph.get_state(cfg("alpha")).values["messages"]] == [
        "for alpha",
        "echo: for alpha",
    ]


def test_s1_a_fork_stores_only_what_differs(saver: Any) -> None:
    graph = build_agent(saver)
    run_turns(graph, "fork", 2)
    stored = saver.stats()["messages"]
    first_turn_end = next(
        s for s in graph.get_state_history(cfg("fork")) if len(s.values["messages"]) == MESSAGES_PER_TURN
    )
    graph.invoke({"messages": [HumanMessage("a different second question")]}, first_turn_end.config)
    # the fork shares the first turn's messages; only its own turn is new
    assert saver.stats()["messages"] == stored + MESSAGES_PER_TURN


def test_s1_two_channels_holding_one_message_list_read_back(open_saver: Opener) -> None:
    """One list in two channels is stored once and read back into both, by a reader that
    walks it (a new saver) as by the writer."""
    from langgraph.checkpoint.base import create_checkpoint, empty_checkpoint

    saver = open_saver()
    messages = [HumanMessage(f"m{i}", id=str(i)) for i in range(3)]
    checkpoint = create_checkpoint(empty_checkpoint(), None, 0)
    checkpoint["channel_values"] = {"a": messages, "b": list(messages)}
    checkpoint["channel_versions"] = {"a": "00001", "b": "00001"}
    stored = saver.put(
        cfg("twice"), checkpoint, {"source": "input", "step": -1}, {"a": "00001", "b": "00001"}
    )
    reader = open_saver() if saver.facts.survives_restart else saver
    for found in (reader.get_tuple(stored), saver.get_tuple(stored)):
        assert found is not None
        assert found.checkpoint["channel_values"] == {"a": messages, "b": messages}
    assert saver.stats()["messages"] == 3


def test_s1_messages_a_task_writes_read_back_exactly_and_are_stored_once(open_saver: Opener) -> None:
    from langgraph.checkpoint.base import empty_checkpoint

    saver = open_saver()
    first = empty_checkpoint()
    stored = saver.put(cfg("w"), first, {"source": "input", "step": -1}, {})
    listed = [
        AIMessage("calling", id="a1", tool_calls=[{"name": "f", "args": {"x": 1}, "id": "c1"}]),
        ToolMessage("result", tool_call_id="c1", id="t1"),
    ]
    single = AIMessage("done", id="a2")
    unnamed = [HumanMessage("no id yet")]  # add_messages will give it one: stored whole
    writes = [("messages", listed), ("messages", single), ("messages", unnamed), ("other", [single])]
    saver.put_writes(stored, writes, task_id="task")

    # a second saver on the same store reads with nothing cached (memory: one saver, one store)
    reader = open_saver() if saver.facts.survives_restart else saver
    for found in (reader.get_tuple(stored), next(iter(reader.list(stored))), saver.get_tuple(stored)):
        assert found is not None
        assert found.pending_writes == [("task", channel, value) for channel, value in writes]
        assert type(found.pending_writes[1][2]) is AIMessage  # a single message stays single
        assert found.pending_writes[0][2][0].tool_calls == listed[0].tool_calls

    # the next checkpoint's history holds the written messages: each is stored once
    second = empty_checkpoint()
    second["channel_values"] = {"messages": [*listed, single]}
    second["channel_versions"] = {"messages": saver.get_next_version(None, None)}
    saver.put(stored, second, {"source": "loop", "step": 0}, dict(second["channel_versions"]))
    assert saver.stats()["messages"] == 3
    reread = open_saver() if saver.facts.survives_restart else saver
    assert reread.get_tuple(cfg("w")).checkpoint["channel_values"]["messages"] == [*listed, single]


def test_s1_a_late_write_to_a_pruned_checkpoint_stores_none_of_its_messages(open_saver: Opener) -> None:
    from langgraph.checkpoint.base import empty_checkpoint

    saver = open_saver(state_history_limit=1)
    first = saver.put(cfg("late"), empty_checkpoint(), {"source": "input", "step": -1}, {})
    saver.put(first, empty_checkpoint(), {"source": "loop", "step": 0}, {})  # prunes the first
    before = saver.stats()
    saver.put_writes(first, [("messages", [AIMessage("too late", id="late-1")])], task_id="task")
    after = saver.stats()
    assert (after["writes"], after["messages"]) == (before["writes"], before["messages"])


def test_s1_a_thread_resumed_from_the_store_stores_each_model_reply_once(saver: Any) -> None:
    """Each turn starts from the state it reads back (decoded objects); a model's reply
    carries token usage, and must encode back to the bytes it was stored as."""

    def reply(state: MessagesState) -> dict[str, Any]:
        usage = {"input_tokens": 3, "output_tokens": 2, "total_tokens": 5}
        return {"messages": [AIMessage(content=f"echo {len(state['messages'])}", usage_metadata=usage)]}

    graph = reply_graph(saver, reply)
    for turn in range(4):
        graph.invoke({"messages": [HumanMessage(f"turn {turn}")]}, cfg("resumed"))
    assert saver.stats()["messages"] == 8


def test_s1_a_node_editing_a_loaded_message_in_place_has_the_edit_stored(
    open_saver: Opener, provider: ProviderCase
) -> None:
    def reply(state: MessagesState) -> dict[str, Any]:
        state["messages"][0].content += " (seen)"  # in place, on the state the run loaded
        return {"messages": [AIMessage(content=f"echo {len(state['messages'])}")]}

    saver = open_saver()
    graph = reply_graph(saver, reply)
    for turn in range(3):
        graph.invoke({"messages": [HumanMessage(f"turn {turn}")]}, cfg("edit-loaded"))
    expected = "turn 0 (seen) (seen) (seen)"
    assert graph.get_state(cfg("edit-loaded")).values["messages"][0].content == expected
    if provider.name in SHARED_STORE:
        fresh = open_saver().get_tuple(cfg("edit-loaded"))  # a reader with nothing in memory
        assert fresh.checkpoint["channel_values"]["messages"][0].content == expected


class PutEncodings:
    """Counts the messages a saver's ``put`` encodes (a task's writes encode theirs too)."""

    def __init__(self, saver: Any) -> None:
        self.messages = 0
        putting = threading.local()  # puts run on LangGraph's background threads
        inner, put = saver.serde, saver.put
        counter = self

        class Counting:
            def dumps_typed(self, obj: Any) -> tuple[str, bytes]:
                counter.messages += getattr(putting, "on", False) and isinstance(obj, BaseMessage)
                return inner.dumps_typed(obj)  # type: ignore[no-any-return]

            def loads_typed(self, data: tuple[str, bytes]) -> Any:
                return inner.loads_typed(data)

        def counted_put(*args: Any, **kwargs: Any) -> Any:
            putting.on = True
            try:
                return put(*args, **kwargs)
            finally:
                putting.on = False

        saver.serde, saver.put = Counting(), counted_put


def test_s1_a_run_resuming_its_thread_encodes_only_its_new_messages(saver: Any) -> None:
    """Each turn reads the thread back (new objects) and puts those messages again with its
    own: the puts encode only the turn's own messages, however long the thread."""
    graph = build_agent(saver)
    run_turns(graph, "resume", 5)  # 40 messages: whole blocks of the memo and a partial one
    encodings = PutEncodings(saver)
    run_turns(graph, "resume", 1, first=5)
    assert encodings.messages == MESSAGES_PER_TURN
    assert saver.stats()["messages"] == 6 * MESSAGES_PER_TURN


def test_s1_a_run_editing_a_long_loaded_history_in_place_has_the_edits_stored(
    open_saver: Opener, provider: ProviderCase
) -> None:
    """A node edits messages of the history its run loaded, in place: one early in a long
    list (in a whole block of what the saver remembers of the read), one near its end."""

    def reply(state: MessagesState) -> dict[str, Any]:
        history = state["messages"]
        if len(history) > 40:
            history[1].additional_kwargs.setdefault("seen", []).append(len(history))
            history[-3].content += " (seen)"
        return {"messages": [AIMessage(f"echo {len(history)}.{i}") for i in range(20)]}

    saver = open_saver()
    graph = reply_graph(saver, reply)
    for turn in range(4):
        graph.invoke({"messages": [HumanMessage(f"turn {turn}")]}, cfg("edit-long"))
    for reader in [saver, open_saver()] if provider.name in SHARED_STORE else [saver]:
        messages = reader.get_tuple(cfg("edit-long")).checkpoint["channel_values"]["messages"]
        assert messages[1].additional_kwargs == {"seen": [43, 64]}
        assert messages[40].content == "echo 22.18 (seen)"
        assert messages[61].content == "echo 43.18 (seen)"


def test_s2_unchanged_channels_are_not_stored_again(saver: Any) -> None:
    from langgraph.checkpoint.base import empty_checkpoint

    first = empty_checkpoint()
    first["channel_values"] = {"big": "x" * 10_000, "counter": 1}
    first["channel_versions"] = {"big": 1, "counter": 1}
    stored = saver.put(cfg("s2"), first, {"source": "input", "step": -1}, {"big": 1, "counter": 1})
    second = empty_checkpoint()
    second["channel_values"] = {"big": "x" * 10_000, "counter": 2}
    second["channel_versions"] = {"big": 1, "counter": 2}
    saver.put(stored, second, {"source": "loop", "step": 0}, {"counter": 2})
    assert saver.stats()["channel_values"] == 3
    assert saver.get_tuple(cfg("s2")).checkpoint["channel_values"] == {"big": "x" * 10_000, "counter": 2}


def test_s3_history_limit_keeps_the_newest_checkpoints(open_saver: Opener) -> None:
    saver = open_saver(state_history_limit=3)
    graph = build_agent(saver)
    run_turns(graph, "limited", 2)
    kept = list(saver.list(cfg("limited", checkpoint_ns="")))
    assert len(kept) == 3
    # messages still referenced are never pruned
    assert len(graph.get_state(cfg("limited")).values["messages"]) == 2 * MESSAGES_PER_TURN
    assert saver.stats()["messages"] == 2 * MESSAGES_PER_TURN
    # pending writes of a pruned checkpoint went with it
    assert saver.stats()["writes"] == sum(len(t.pending_writes or []) for t in kept)
    # and pruning keeps only the channel values the kept checkpoints refer to (a SQL store
    # keeps no row for an emptied channel; Redis keeps a marker)
    sql = isinstance(getattr(saver.backend, "durable", saver.backend), SqlBackend)
    referenced = {
        (c, str(v))
        for t in kept
        for c, v in t.checkpoint["channel_versions"].items()
        if c in t.checkpoint["channel_values"] or not sql
    }
    assert saver.stats()["channel_values"] == len(referenced)


def test_s3_an_update_of_a_checkpoint_the_limit_removed_meanwhile_keeps_every_value(
    open_saver: Opener,
) -> None:
    """An update of an older checkpoint (``update_state``) while the run goes on: by the
    time its put lands, the history limit has removed its parent and the values only that
    parent named. The values the update keeps from its parent are stored again, not lost."""
    from langgraph.checkpoint.base import empty_checkpoint

    def checkpoint(values: dict[str, str], versions: dict[str, str]) -> Any:
        made = empty_checkpoint()
        made["channel_values"], made["channel_versions"] = values, versions
        return made

    saver = open_saver(state_history_limit=1)
    big = "x" * 2000  # large enough to be a value of its own, not kept in the row
    first = saver.put(
        cfg("updated"),
        checkpoint({"a": "a1" + big, "b": "b1"}, {"a": "1", "b": "1"}),
        {"step": 0},
        {"a": "1", "b": "1"},
    )
    saver.put(first, checkpoint({"a": "a2" + big, "b": "b1"}, {"a": "2", "b": "1"}), {"step": 1}, {"a": "2"})
    update = checkpoint({"a": "a1" + big, "b": "b2"}, {"a": "1", "b": "2"})
    stored = saver.put(first, update, {"source": "update", "step": 1}, {"b": "2"})
    assert saver.get_tuple(stored).checkpoint["channel_values"] == {"a": "a1" + big, "b": "b2"}


def test_s3_history_limit_keeps_large_values_a_kept_checkpoint_names(open_saver: Opener) -> None:
    from langgraph.checkpoint.base import empty_checkpoint

    # "fixed" is written once, by a checkpoint the limit prunes, and named by every later one;
    # "step" (too large for a checkpoint's row) changes at every step.
    saver = open_saver(state_history_limit=2)
    config: Any = cfg("large")
    for step in range(1, 6):
        checkpoint = empty_checkpoint()
        checkpoint["channel_values"] = {"fixed": "f" * 2_000, "step": str(step) * 2_000}
        checkpoint["channel_versions"] = {"fixed": 1, "step": step}
        new_versions = {"step": step, "fixed": 1} if step == 1 else {"step": step}
        config = saver.put(config, checkpoint, {"source": "loop", "step": step}, new_versions)
    kept = list(saver.list(cfg("large")))
    assert [t.metadata["step"] for t in kept] == [5, 4]
    for t, step in zip(kept, (5, 4), strict=True):
        assert t.checkpoint["channel_values"] == {"fixed": "f" * 2_000, "step": str(step) * 2_000}
    if isinstance(getattr(saver.backend, "durable", saver.backend), SqlBackend):
        assert saver.stats()["channel_values"] == 3  # fixed@1, step@4, step@5


def test_s3_history_is_unlimited_by_default(saver: Any) -> None:
    run_turns(build_agent(saver), "unlimited", 2)
    assert len(list(saver.list(cfg("unlimited", checkpoint_ns="")))) == 2 * (MESSAGES_PER_TURN + 1)
