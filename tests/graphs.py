"""Small real LangGraph graphs the contract suite runs, and a driver for both APIs.

Every graph test runs twice: through the sync API (``invoke``, ``get_state``, ...) and
through the async API (``ainvoke``, ``aget_state``, ...), with the same test code.
"""

from __future__ import annotations

import asyncio
import operator
from dataclasses import dataclass
from typing import Annotated, Any, TypedDict

from langgraph.graph import END, START, StateGraph
from langgraph.types import Send, interrupt


def cfg(thread_id: str, **extra: Any) -> Any:
    """A call's config: ``thread_id`` and any other ``configurable`` keys."""
    return {"configurable": {"thread_id": thread_id, **extra}}


@dataclass
class Driver:
    """Calls a compiled graph through its sync or its async API (on one event loop)."""

    api: str
    runner: asyncio.Runner | None = None

    def _call(self, graph: Any, name: str, *args: Any, **kwargs: Any) -> Any:
        if self.api == "sync":
            return getattr(graph, name)(*args, **kwargs)
        if self.runner is None:
            self.runner = asyncio.Runner()
        method = getattr(graph, "a" + name)
        if name == "get_state_history":

            async def collect() -> list[Any]:
                return [item async for item in method(*args, **kwargs)]

            return self.runner.run(collect())
        return self.runner.run(method(*args, **kwargs))

    def close(self) -> None:
        if self.runner is not None:
            self.runner.close()

    def invoke(self, graph: Any, value: Any, config: Any, **kwargs: Any) -> Any:
        return self._call(graph, "invoke", value, config, **kwargs)

    def get_state(self, graph: Any, config: Any, **kwargs: Any) -> Any:
        return self._call(graph, "get_state", config, **kwargs)

    def update_state(self, graph: Any, config: Any, values: Any, **kwargs: Any) -> Any:
        return self._call(graph, "update_state", config, values, **kwargs)

    def history(self, graph: Any, config: Any) -> list[Any]:
        return list(self._call(graph, "get_state_history", config))


class Approval(TypedDict):
    request: str
    answer: str


def approval_graph(checkpointer: Any) -> Any:
    """prepare -> ask (interrupts for a human answer) -> finish."""

    def prepare(state: Approval) -> dict[str, Any]:
        return {"request": state["request"].upper()}

    def ask(state: Approval) -> dict[str, Any]:
        return {"answer": interrupt(f"approve {state['request']}?")}

    def finish(state: Approval) -> dict[str, Any]:
        return {"answer": state["answer"] + "!"}

    builder = StateGraph(Approval)
    builder.add_node("prepare", prepare)
    builder.add_node("ask", ask)
    builder.add_node("finish", finish)
    builder.add_edge(START, "prepare")
    builder.add_edge("prepare", "ask")
    builder.add_edge("ask", "finish")
    builder.add_edge("finish", END)
    return builder.compile(checkpointer=checkpointer)


class Outer(TypedDict):
    topic: str
    notes: Annotated[list[str], operator.add]


def subgraph_graph(checkpointer: Any) -> Any:
    """A parent whose ``research`` node is a subgraph that pauses for a human."""

    def draft(state: Outer) -> dict[str, Any]:
        return {"notes": [f"draft on {state['topic']}"]}

    def review(state: Outer) -> dict[str, Any]:
        verdict = interrupt("review the draft")
        return {"notes": [f"review: {verdict}"]}

    inner = StateGraph(Outer)
    inner.add_node("draft", draft)
    inner.add_node("review", review)
    inner.add_edge(START, "draft")
    inner.add_edge("draft", "review")
    inner.add_edge("review", END)

    def publish(state: Outer) -> dict[str, Any]:
        return {"notes": ["published"]}

    outer = StateGraph(Outer)
    outer.add_node("research", inner.compile())
    outer.add_node("publish", publish)
    outer.add_edge(START, "research")
    outer.add_edge("research", "publish")
    outer.add_edge("publish", END)
    return outer.compile(checkpointer=checkpointer)


class Fan(TypedDict):
    items: list[int]
    results: Annotated[list[int], operator.add]


def fanout_graph(checkpointer: Any) -> Any:
    """``Send`` one task per item, gather their results."""

    def split(state: Fan) -> list[Send]:
        return [Send("square", {"items": [item], "results": []}) for item in state["items"]]

    def square(state: Fan) -> dict[str, Any]:
        return {"results": [state["items"][0] ** 2]}

    builder = StateGraph(Fan)
    builder.add_node("square", square)
    builder.add_conditional_edges(START, split, ["square"])
    builder.add_edge("square", END)
    return builder.compile(checkpointer=checkpointer)
