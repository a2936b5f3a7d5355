"""SPEC W2: time travel and forks branch in every namespace, stateful subgraphs included.

Each graph keeps state in stateful subgraphs (``checkpointer=True``): a subgraph node, a
subgraph node the graph loops through, a subgraph a node calls in a loop, two subgraph nodes
in parallel, three nested levels. A thread runs
three times, then replays a checkpoint of its second run, forks it with ``update_state``,
runs new input from it, and continues from the head. Every answer, and every namespace's
history, must be LangGraph's ``InMemorySaver``'s on the same graph; racing runs that meet in
a subgraph's namespace still conflict.
"""

from __future__ import annotations

import asyncio
import operator
import threading
from collections.abc import Callable
from typing import Annotated, Any, TypedDict

import pytest
from langchain_core.runnables import RunnableLambda
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.graph import END, START, StateGraph

from tests.graphs import Driver, cfg
from threadkeep import StaleStateError


class Topic(TypedDict):
    topic: str


class Notes(TypedDict):
    notes: Annotated[list[str], operator.add]


class Memory(TypedDict):
    """A subgraph's own state: its notes outlive each call (a stateful subgraph)."""

    topic: str
    notes: Annotated[list[str], operator.add]


class Outer(TypedDict, total=False):
    topic: str
    rounds: int
    notes: Annotated[list[str], operator.add]


def remembering(name: str, inner: Any = None) -> Any:
    """A stateful subgraph: each call notes the topic and how many notes it held before, so
    what it returns shows which of its checkpoints it continued from. ``inner`` nests one
    more stateful subgraph under it."""

    def note(state: Memory) -> dict[str, Any]:
        return {"notes": [f"{name}:{state['topic']}#{len(state['notes']) + 1}"]}

    builder = StateGraph(Memory, input_schema=Topic, output_schema=Notes)
    builder.add_node("note", note)
    builder.add_edge(START, "note")
    if inner is None:
        builder.add_edge("note", END)
    else:
        builder.add_node("deeper", inner)
        builder.add_edge("note", "deeper")
        builder.add_edge("deeper", END)
    return builder.compile(checkpointer=True)


def plan(state: Outer) -> dict[str, Any]:
    return {"notes": [f"plan:{state['topic']}"], "rounds": 0}


def subgraph_node(checkpointer: Any) -> Any:
    builder = StateGraph(Outer)
    builder.add_node("plan", plan)
    builder.add_node("sub_node", remembering("sub"))
    builder.add_edge(START, "plan")
    builder.add_edge("plan", "sub_node")
    builder.add_edge("sub_node", END)
    return builder.compile(checkpointer=checkpointer)


def subgraph_in_a_loop(checkpointer: Any) -> Any:
    def tick(state: Outer) -> dict[str, Any]:
        return {"rounds": state["rounds"] + 1}

    def again(state: Outer) -> str:
        return "sub_node" if state["rounds"] < 2 else END

    builder = StateGraph(Outer)
    builder.add_node("plan", plan)
    builder.add_node("sub_node", remembering("loop"))
    builder.add_node("tick", tick)
    builder.add_edge(START, "plan")
    builder.add_edge("plan", "sub_node")
    builder.add_edge("sub_node", "tick")
    builder.add_conditional_edges("tick", again, ["sub_node", END])
    return builder.compile(checkpointer=checkpointer)


def subgraph_called_in_a_loop(checkpointer: Any) -> Any:
    """A node that calls one stateful subgraph once per item (namespaces ``call``,
    ``call|1``)."""
    sub = remembering("called")

    def call(state: Outer) -> dict[str, Any]:
        return {
            "notes": [n for i in range(2) for n in sub.invoke({"topic": f"{state['topic']}.{i}"})["notes"]]
        }

    async def acall(state: Outer) -> dict[str, Any]:
        notes: list[str] = []
        for i in range(2):
            notes += (await sub.ainvoke({"topic": f"{state['topic']}.{i}"}))["notes"]
        return {"notes": notes}

    builder = StateGraph(Outer)
    builder.add_node("plan", plan)
    builder.add_node("call", RunnableLambda(call, acall))
    builder.add_edge(START, "plan")
    builder.add_edge("plan", "call")
    builder.add_edge("call", END)
    return builder.compile(checkpointer=checkpointer)


def parallel_subgraphs(checkpointer: Any) -> Any:
    def join(state: Outer) -> dict[str, Any]:
        return {"notes": [f"join:{len(state['notes'])}"]}

    builder = StateGraph(Outer)
    builder.add_node("plan", plan)
    builder.add_node("left", remembering("left"))
    builder.add_node("right", remembering("right"))
    builder.add_node("join", join)
    builder.add_edge(START, "plan")
    builder.add_edge("plan", "left")
    builder.add_edge("plan", "right")
    builder.add_edge(["left", "right"], "join")
    builder.add_edge("join", END)
    return builder.compile(checkpointer=checkpointer)


def nested_subgraphs(checkpointer: Any) -> Any:
    builder = StateGraph(Outer)
    builder.add_node("plan", plan)
    builder.add_node("sub_node", remembering("outer", remembering("middle", remembering("inner"))))
    builder.add_edge(START, "plan")
    builder.add_edge("plan", "sub_node")
    builder.add_edge("sub_node", END)
    return builder.compile(checkpointer=checkpointer)


GRAPHS: dict[str, Callable[[Any], Any]] = {
    "subgraph-node": subgraph_node,
    "subgraph-in-a-loop": subgraph_in_a_loop,
    "subgraph-called-in-a-loop": subgraph_called_in_a_loop,
    "parallel-subgraphs": parallel_subgraphs,
    "three-levels": nested_subgraphs,
}


def state_shape(snapshot: Any) -> tuple[Any, ...]:
    return (
        snapshot.metadata["source"],
        snapshot.metadata["step"],
        snapshot.next,
        snapshot.values,
        sorted(snapshot.config["configurable"]),
        None if snapshot.parent_config is None else sorted(snapshot.parent_config["configurable"]),
    )


def namespaces(saver: Any, thread_id: str) -> dict[str, list[tuple[Any, ...]]]:
    """Every namespace's history, newest first: what each checkpoint holds and why."""
    found: dict[str, list[tuple[Any, ...]]] = {}
    for saved in saver.list(cfg(thread_id)):
        found.setdefault(saved.config["configurable"]["checkpoint_ns"], []).append(
            (
                saved.metadata.get("source"),
                saved.metadata.get("step"),
                saved.checkpoint["channel_values"].get("notes"),
            )
        )
    return found


def time_travel(driver: Driver, graph: Any, saver: Any, durability: str) -> dict[str, Any]:
    """Three runs, then a replay, a fork and new input from a checkpoint of the second run
    taken before its subgraphs ran (its last, under durability "exit"), then a run from the
    head."""
    thread = cfg("travel")
    seen: dict[str, Any] = {}
    for run in range(3):
        seen[f"run {run}"] = driver.invoke(graph, {"topic": f"t{run}"}, thread, durability=durability)
    second_run = [s for s in driver.history(graph, thread) if s.values.get("topic") == "t1"]
    before_subgraphs = [s for s in second_run if s.next and s.next[0] != "plan"]
    # durability "exit" keeps only the run's last checkpoint: new input from it still
    # replays every subgraph from the checkpoint it held then
    target = before_subgraphs[-1] if before_subgraphs else second_run[0]
    seen["replay"] = driver.invoke(graph, None, target.config, durability=durability)
    forked = driver.update_state(graph, target.config, {"topic": "forked"})
    seen["fork config"] = sorted(forked["configurable"])
    seen["fork"] = driver.invoke(graph, None, forked, durability=durability)
    seen["new input"] = driver.invoke(graph, {"topic": "again"}, target.config, durability=durability)
    seen["head"] = driver.invoke(graph, {"topic": "t3"}, thread, durability=durability)
    seen["state"] = state_shape(driver.get_state(graph, thread))
    seen["history"] = [state_shape(s) for s in driver.history(graph, thread)]
    seen["namespaces"] = namespaces(saver, "travel")
    return seen


@pytest.mark.parametrize("durability", ["sync", "async", "exit"])
@pytest.mark.parametrize("shape", list(GRAPHS))
def test_replay_and_fork_through_stateful_subgraphs(
    driver: Driver, saver: Any, shape: str, durability: str
) -> None:
    build = GRAPHS[shape]
    ours = time_travel(driver, build(saver), saver, durability)
    reference = InMemorySaver()
    theirs = time_travel(driver, build(reference), reference, durability)
    for key in theirs:
        assert ours[key] == theirs[key], key


# --- racing runs still conflict in a subgraph's namespace ------------------------------------


def racing_through_a_subgraph(saver: Any, barrier: Any) -> Any:
    """Both racers load the same head in the subgraph's namespace before either writes
    there; under durability "exit" a subgraph's namespace is the first either writes in."""

    def wait(state: Memory) -> dict[str, Any]:
        barrier.wait(timeout=10)
        return {"notes": [state["topic"]]}

    async def await_(state: Memory) -> dict[str, Any]:
        await barrier.wait()
        return {"notes": [state["topic"]]}

    inner = StateGraph(Memory, input_schema=Topic, output_schema=Notes)
    inner.add_node("wait", RunnableLambda(wait, await_))
    inner.add_edge(START, "wait")
    builder = StateGraph(Outer)
    builder.add_node("sub_node", inner.compile(checkpointer=True))
    builder.add_edge(START, "sub_node")
    return builder.compile(checkpointer=saver)


@pytest.mark.parametrize("api", ["sync", "async"])
def test_runs_racing_from_the_same_head_still_conflict_in_a_subgraph(saver: Any, api: str) -> None:
    racers = ("A", "B")
    if api == "sync":
        graph = racing_through_a_subgraph(saver, threading.Barrier(1))
        graph.invoke({"topic": "setup"}, cfg("race"), durability="exit")
        graph = racing_through_a_subgraph(saver, threading.Barrier(2))
        outcome: dict[str, Any] = {}

        def run(racer: str) -> None:
            try:
                outcome[racer] = graph.invoke({"topic": racer}, cfg("race"), durability="exit")
            except Exception as exc:
                outcome[racer] = exc

        threads = [threading.Thread(target=run, args=(racer,)) for racer in racers]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=30)
        results = [outcome[racer] for racer in racers]
    else:

        async def race() -> list[Any]:
            graph = racing_through_a_subgraph(saver, asyncio.Barrier(1))
            await graph.ainvoke({"topic": "setup"}, cfg("race"), durability="exit")
            graph = racing_through_a_subgraph(saver, asyncio.Barrier(2))
            runs = [graph.ainvoke({"topic": racer}, cfg("race"), durability="exit") for racer in racers]
            return list(await asyncio.gather(*runs, return_exceptions=True))

        results = asyncio.run(race())

    # The racer whose subgraph wrote second is refused there. (Its parent then saves its
    # failed run's last checkpoint, as LangGraph does under durability "exit", and that
    # put races the winner's in the root namespace: either may be refused there.)
    in_subgraph = [
        r
        for r in results
        if isinstance(r, StaleStateError) and r.to_dict()["context"]["checkpoint_ns"] == "sub_node"
    ]
    assert len(in_subgraph) == 1, results
    assert all(isinstance(r, (dict, StaleStateError)) for r in results), results
    stored = namespaces(saver, "race")["sub_node"]
    assert [notes for _, _, notes in stored[:1]] in ([["setup", racer]] for racer in racers)
    assert len(stored) == 2  # the setup run's and the winner's: the loser stored nothing there
