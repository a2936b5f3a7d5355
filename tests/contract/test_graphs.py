"""SPEC P3: real LangGraph graphs run on every provider, through the sync and async APIs."""

from __future__ import annotations

from typing import Any

from langchain_core.messages import AIMessage, HumanMessage, ToolMessage
from langgraph.types import Command

from tests.graphs import Driver, approval_graph, cfg, fanout_graph, subgraph_graph
from threadkeep.workload import MESSAGES_PER_TURN, TOOL_ROUND_TRIPS, build_agent, turn_input

# the input checkpoint, the input step, then one per node run (agent, tools, ..., agent)
CHECKPOINTS_PER_TURN = 2 + 2 * TOOL_ROUND_TRIPS + 1


def test_p3_tool_calling_agent_over_many_turns(driver: Driver, saver: Any) -> None:
    graph = build_agent(saver)
    for turn in range(6):
        driver.invoke(graph, turn_input(turn), cfg("chat"))
    messages = driver.get_state(graph, cfg("chat")).values["messages"]
    assert len(messages) == 6 * MESSAGES_PER_TURN
    first_turn = [type(m) for m in messages[:MESSAGES_PER_TURN]]
    assert first_turn == [HumanMessage] + [AIMessage, ToolMessage] * TOOL_ROUND_TRIPS + [AIMessage]
    assert messages[1].tool_calls[0]["name"] == "lookup"
    assert messages[2].tool_call_id == messages[1].tool_calls[0]["id"]
    assert len(messages[2].content) == 1500
    history = driver.history(graph, cfg("chat"))
    assert history[0].values["messages"] == messages
    assert len(history) == 6 * CHECKPOINTS_PER_TURN
    assert history[-1].values == {"messages": []}


def test_p3_interrupt_then_resume(driver: Driver, saver: Any) -> None:
    graph = approval_graph(saver)
    first = driver.invoke(graph, {"request": "refund", "answer": ""}, cfg("approval"))
    assert first["__interrupt__"][0].value == "approve REFUND?"
    paused = driver.get_state(graph, cfg("approval"))
    assert paused.next == ("ask",)
    assert paused.tasks[0].interrupts[0].value == "approve REFUND?"

    done = driver.invoke(graph, Command(resume="yes"), cfg("approval"))
    assert done == {"request": "REFUND", "answer": "yes!"}
    assert driver.get_state(graph, cfg("approval")).next == ()


def test_p3_subgraph_pauses_and_resumes_in_its_namespace(driver: Driver, saver: Any) -> None:
    graph = subgraph_graph(saver)
    driver.invoke(graph, {"topic": "tides", "notes": []}, cfg("research"))
    state = driver.get_state(graph, cfg("research"), subgraphs=True)
    assert state.next == ("research",)
    inner = state.tasks[0].state
    assert inner.values["notes"] == ["draft on tides"]
    assert inner.next == ("review",)
    namespaces = {t.config["configurable"]["checkpoint_ns"] for t in saver.list(cfg("research"))}
    assert "" in namespaces
    assert any(ns.startswith("research:") for ns in namespaces)

    done = driver.invoke(graph, Command(resume="looks good"), cfg("research"))
    assert done["notes"] == ["draft on tides", "review: looks good", "published"]


def test_p3_send_fans_out_and_gathers(driver: Driver, saver: Any) -> None:
    graph = fanout_graph(saver)
    done = driver.invoke(graph, {"items": [1, 2, 3, 4], "results": []}, cfg("fan"))
    assert sorted(done["results"]) == [1, 4, 9, 16]
    assert sorted(driver.get_state(graph, cfg("fan")).values["results"]) == [1, 4, 9, 16]


def test_p3_time_travel_branches_from_an_older_checkpoint(driver: Driver, saver: Any) -> None:
    graph = build_agent(saver)
    for turn in range(3):
        driver.invoke(graph, turn_input(turn), cfg("travel"))
    history = driver.history(graph, cfg("travel"))
    after_first = next(s for s in history if s.next == () and len(s.values["messages"]) == MESSAGES_PER_TURN)
    branched = driver.invoke(graph, turn_input(7), after_first.config)
    messages = branched["messages"]
    assert len(messages) == 2 * MESSAGES_PER_TURN
    assert messages[:MESSAGES_PER_TURN] == after_first.values["messages"]
    assert messages[MESSAGES_PER_TURN].content == turn_input(7)["messages"][0].content
    # the new branch is now the head; the old branch is still in the history
    assert driver.get_state(graph, cfg("travel")).values["messages"] == messages
    assert any(
        len(s.values["messages"]) == 3 * MESSAGES_PER_TURN for s in driver.history(graph, cfg("travel"))
    )


def test_p3_update_state_then_continue(driver: Driver, saver: Any) -> None:
    graph = approval_graph(saver)
    driver.invoke(graph, {"request": "upgrade", "answer": ""}, cfg("upd"))
    driver.update_state(graph, cfg("upd"), {"answer": "approved by admin"}, as_node="ask")
    updated = driver.get_state(graph, cfg("upd"))
    assert updated.values["answer"] == "approved by admin"
    assert updated.next == ("finish",)
    assert updated.metadata["source"] == "update"
    done = driver.invoke(graph, None, cfg("upd"))
    assert done["answer"] == "approved by admin!"


def test_p3_update_state_on_an_older_checkpoint_branches(driver: Driver, saver: Any) -> None:
    graph = approval_graph(saver)
    driver.invoke(graph, {"request": "a", "answer": ""}, cfg("fork"))
    driver.invoke(graph, Command(resume="first"), cfg("fork"))
    old = next(s for s in driver.history(graph, cfg("fork")) if s.next == ("ask",))
    forked = driver.update_state(graph, old.config, {"answer": "second"}, as_node="ask")
    assert driver.get_state(graph, cfg("fork")).values["answer"] == "second"
    done = driver.invoke(graph, None, forked)
    assert done["answer"] == "second!"
