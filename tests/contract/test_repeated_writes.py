"""Writes of one key twice in one ``put_writes``, as LangGraph's savers take them (issue 34.7).

LangGraph keys a write by (task id, idx): idx is the write's position for a regular channel,
``WRITES_IDX_MAP``'s for a special one (error, interrupt, resume, ...). A node that calls
``interrupt()`` twice and then returns sends its task's writes with two ``__resume__``
writes among the regular ones; a special write is overwritten (the last one wins), a
regular one is stored once (the first one stays). Every scenario runs on the provider and
on ``InMemorySaver``, through the sync and async APIs and under each durability, and what
the user sees must be the same.
"""

from __future__ import annotations

import operator
from typing import Annotated, Any, TypedDict

from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import empty_checkpoint
from langgraph.graph import END, START, StateGraph
from langgraph.types import Command, interrupt

from tests.graphs import cfg
from tests.reference import NULL_TASK_ID, Recorder, compare_with_langgraph


class Form(TypedDict, total=False):
    name: str
    answers: Annotated[list[str], operator.add]
    note: str
    notes: Annotated[list[str], operator.add]


def _one_question(checkpointer: Any) -> Any:
    def ask(state: Form) -> dict[str, Any]:
        return {"answers": [interrupt(f"name for {state['name']}?")]}

    builder = StateGraph(Form)
    builder.add_node("ask", ask)
    builder.add_edge(START, "ask")
    builder.add_edge("ask", END)
    return builder.compile(checkpointer=checkpointer)


def _questions(checkpointer: Any, count: int) -> Any:
    """One node that asks ``count`` questions in a row (each resume re-runs it)."""

    def ask(state: Form) -> dict[str, Any]:
        return {"answers": [interrupt(f"question {n}") for n in range(count)]}

    def close(state: Form) -> dict[str, Any]:
        return {"note": f"{state.get('note', '')}+closed"}

    builder = StateGraph(Form)
    builder.add_node("ask", ask)
    builder.add_node("close", close)
    builder.add_edge(START, "ask")
    builder.add_edge("ask", "close")
    builder.add_edge("close", END)
    return builder.compile(checkpointer=checkpointer)


def _parallel_questions(checkpointer: Any) -> Any:
    """Two nodes in one step, each asking two questions."""

    def left(state: Form) -> dict[str, Any]:
        return {"answers": [interrupt("left 1"), interrupt("left 2")]}

    def right(state: Form) -> dict[str, Any]:
        return {"answers": [interrupt("right 1"), interrupt("right 2")]}

    builder = StateGraph(Form)
    builder.add_node("left", left)
    builder.add_node("right", right)
    builder.add_edge(START, "left")
    builder.add_edge(START, "right")
    builder.add_edge("left", END)
    builder.add_edge("right", END)
    return builder.compile(checkpointer=checkpointer)


def _subgraph_questions(checkpointer: Any) -> Any:
    """A parent whose ``form`` node is a subgraph whose node asks two questions."""

    def ask(state: Form) -> dict[str, Any]:
        return {"answers": [interrupt("inner 1"), interrupt("inner 2")]}

    inner = StateGraph(Form)
    inner.add_node("ask", ask)
    inner.add_edge(START, "ask")
    inner.add_edge("ask", END)

    def done(state: Form) -> dict[str, Any]:
        return {"note": f"done with {len(state['answers'])}"}

    outer = StateGraph(Form)
    outer.add_node("form", inner.compile())
    outer.add_node("done", done)
    outer.add_edge(START, "form")
    outer.add_edge("form", "done")
    outer.add_edge("done", END)
    return outer.compile(checkpointer=checkpointer)


def _look(run: Recorder, graph: Any, checkpointer: Any, config: RunnableConfig) -> None:
    state = run.state(graph, config, subgraphs=True)
    run.pending_writes(checkpointer, state.config)
    run.history(graph, config)


def test_resume_with_update_of_a_single_interrupt(api: str, durability: str, saver: Any) -> None:
    def scenario(run: Recorder, checkpointer: Any) -> None:
        graph, config = _one_question(checkpointer), cfg("one")
        run.invoke(graph, {"name": "ada"}, config)
        _look(run, graph, checkpointer, config)
        run.invoke(graph, Command(resume="Ada", update={"note": "checked"}), config)
        _look(run, graph, checkpointer, config)

    compare_with_langgraph(scenario, saver, api, durability)


def test_resume_with_update_of_several_interrupts_in_one_node(api: str, durability: str, saver: Any) -> None:
    """The resume that lets the node finish stores its writes with one resume write per
    question it asked: the case a SQL upsert of the whole list refused."""

    def scenario(run: Recorder, checkpointer: Any) -> None:
        graph, config = _questions(checkpointer, 3), cfg("three")
        run.invoke(graph, {"name": "ada"}, config)
        for answer in ("a", "b", "c"):
            run.invoke(graph, Command(resume=answer, update={"notes": [f"after {answer}"]}), config)
            _look(run, graph, checkpointer, config)

    seen = compare_with_langgraph(scenario, saver, api, durability)
    final = [item for kind, item in seen if kind == "invoke"][-1]
    assert final["answers"] == ["a", "b", "c"]
    assert final["note"] == "+closed"


def test_resume_by_interrupt_id_of_parallel_nodes(api: str, durability: str, saver: Any) -> None:
    def scenario(run: Recorder, checkpointer: Any) -> None:
        graph, config = _parallel_questions(checkpointer), cfg("parallel")
        run.invoke(graph, {"name": "ada"}, config)
        for round_ in range(2):
            pending = run.state(graph, config).interrupts
            answers = {item.id: f"{item.value} answered" for item in pending}
            run.invoke(graph, Command(resume=answers, update={"notes": [f"round {round_}"]}), config)
            _look(run, graph, checkpointer, config)

    seen = compare_with_langgraph(scenario, saver, api, durability)
    final = [item for kind, item in seen if kind == "invoke"][-1]
    assert sorted(final["answers"]) == [
        "left 1 answered",
        "left 2 answered",
        "right 1 answered",
        "right 2 answered",
    ]


def test_resume_with_update_of_interrupts_inside_a_subgraph(api: str, durability: str, saver: Any) -> None:
    def scenario(run: Recorder, checkpointer: Any) -> None:
        graph, config = _subgraph_questions(checkpointer), cfg("sub")
        run.invoke(graph, {"name": "ada"}, config)
        _look(run, graph, checkpointer, config)
        for answer in ("x", "y"):
            run.invoke(graph, Command(resume=answer, update={"notes": [answer]}), config)
            _look(run, graph, checkpointer, config)

    seen = compare_with_langgraph(scenario, saver, api, durability)
    final = [item for kind, item in seen if kind == "invoke"][-1]
    assert final["answers"] == ["x", "y"]
    assert final["note"] == "done with 2"


def test_put_writes_with_repeated_keys(api: str, saver: Any) -> None:
    """Direct ``put_writes``: a special channel twice in one call keeps its last value; a
    regular write of a (task, idx) already stored stays, a special one is replaced; the
    null task's writes accumulate as LangGraph resends them."""

    def scenario(run: Recorder, checkpointer: Any) -> None:
        metadata = {"source": "input", "step": -1, "parents": {}}
        thread: RunnableConfig = {"configurable": {"thread_id": "direct", "checkpoint_ns": ""}}
        config = run.call(
            lambda: checkpointer.put(thread, empty_checkpoint(), metadata, {}),
            lambda: checkpointer.aput(thread, empty_checkpoint(), metadata, {}),
        )
        calls: list[tuple[list[tuple[str, Any]], str]] = [
            ([("__interrupt__", ["first"]), ("__interrupt__", ["second"])], "specials"),
            ([("a", 1), ("__resume__", ["x"]), ("__resume__", ["x", "y"]), ("b", 2)], "mixed"),
            ([("a", 10), ("__resume__", ["z"]), ("c", 3)], "mixed"),
            ([("note", "u"), ("__resume__", "one")], NULL_TASK_ID),
            ([("note", "u"), ("extra", "v"), ("__resume__", "two"), ("__resume__", "three")], NULL_TASK_ID),
            ([("a", 1), ("a", 2), ("a", 3)], "same channel"),
        ]
        for writes, task_id in calls:
            run.call(
                lambda w=writes, t=task_id: checkpointer.put_writes(config, w, t),  # type: ignore[misc]
                lambda w=writes, t=task_id: checkpointer.aput_writes(config, w, t),  # type: ignore[misc]
            )
            found = run.call(lambda: checkpointer.get_tuple(config), lambda: checkpointer.aget_tuple(config))
            by_task = sorted(
                ("null" if t == NULL_TASK_ID else t, c, repr(v)) for t, c, v in found.pending_writes
            )
            run.note("pending", by_task)

    seen = compare_with_langgraph(scenario, saver, api)
    final = seen[-1][1]
    assert ["mixed", "__resume__", "['z']"] in final
    assert ["mixed", "a", "1"] in final
    assert ["mixed", "a", "10"] not in final
    assert ["null", "__resume__", "'three'"] in final
    assert [["same channel", "a", repr(n)] for n in (1, 2, 3)] == [w for w in final if w[0] == "same channel"]


def test_prepare_writes_gives_every_store_each_key_once() -> None:
    """The sans-I/O core decides once for every store: one row per (task, idx), a repeated
    special channel with its last value in its first place."""
    from langgraph.checkpoint.serde.jsonplus import JsonPlusSerializer

    from threadkeep.core.records import prepare_writes

    config: RunnableConfig = {"configurable": {"thread_id": "t", "checkpoint_ns": "", "checkpoint_id": "1"}}
    writes = [("a", 1), ("__resume__", ["x"]), ("b", 2), ("__resume__", ["x", "y"]), ("__error__", "e")]
    step = prepare_writes(
        config, writes, "task", "", JsonPlusSerializer(), isolate=False, history_limit=None, now=0.0
    )
    serde = JsonPlusSerializer()
    rows = [(row.idx, row.channel, serde.loads_typed((row.type, row.value))) for row in step.rows]
    assert rows == [(0, "a", 1), (-4, "__resume__", ["x", "y"]), (2, "b", 2), (-1, "__error__", "e")]
