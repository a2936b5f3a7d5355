"""A scripted tool-calling agent: the conversation the demo, the tests and the benchmarks run.

Each turn is a user message, three tool round trips (an assistant message of about 400 bytes
that calls ``lookup``, and a tool result of about 1.5 KB), then an answer. The chat model is
LangChain's ``GenericFakeChatModel``: no network, the same words every run.
"""

from __future__ import annotations

import itertools
import random
import zlib
from collections.abc import Iterator
from typing import Any

from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
from langchain_core.messages import AIMessage, HumanMessage
from langchain_core.runnables import RunnableConfig
from langchain_core.tools import tool
from langgraph.checkpoint.base import BaseCheckpointSaver
from langgraph.graph import END, START, MessagesState, StateGraph
from langgraph.graph.state import CompiledStateGraph
from langgraph.prebuilt import ToolNode, tools_condition

__all__ = ["MESSAGES_PER_TURN", "TOOL_ROUND_TRIPS", "build_agent", "run_turns", "turn_input", "words"]

TOOL_ROUND_TRIPS = 3
# A turn adds the question, a tool call and its result per round trip, and the answer.
MESSAGES_PER_TURN = 2 + 2 * TOOL_ROUND_TRIPS
_VOCABULARY = (
    "order",
    "invoice",
    "shipment",
    "refund",
    "customer",
    "account",
    "balance",
    "address",
    "parcel",
    "warehouse",
    "carrier",
    "delivery",
    "tracking",
    "payment",
    "card",
    "subscription",
    "renewal",
    "discount",
    "coupon",
    "ticket",
    "escalation",
    "priority",
    "status",
    "pending",
    "approved",
    "declined",
    "region",
    "currency",
    "amount",
    "quantity",
    "product",
)


def words(seed: int, size: int) -> str:
    """About ``size`` bytes of plain text, the same for the same seed."""
    rng = random.Random(seed)
    out: list[str] = []
    length = 0
    while length < size:
        word = rng.choice(_VOCABULARY)
        out.append(word)
        length += len(word) + 1
    text = " ".join(out)[:size]
    return text[:-1] + "." if text.endswith(" ") else text


@tool
def lookup(query: str) -> str:
    """Look a query up in the back office and return what it says (about 1.5 KB)."""
    return words(zlib.crc32(query.encode()), 1500)


def _script() -> Iterator[AIMessage]:
    for turn in itertools.count():
        for trip in range(TOOL_ROUND_TRIPS):
            yield AIMessage(
                content=words(turn * 10 + trip, 400),
                tool_calls=[
                    {
                        "name": "lookup",
                        "args": {"query": f"turn {turn} question {trip}"},
                        "id": f"call-{turn}-{trip}",
                        "type": "tool_call",
                    }
                ],
            )
        yield AIMessage(content=words(turn * 10 + 9, 300))


def build_agent(
    checkpointer: BaseCheckpointSaver[Any] | None, *, tools: Any = None
) -> CompiledStateGraph[Any, Any, Any, Any]:
    """A ``MessagesState`` agent whose fake model calls ``lookup`` three times per turn.

    ``tools``: the node that runs the calls (default: LangGraph's ``ToolNode([lookup])``).
    """
    model = GenericFakeChatModel(messages=_script())

    def agent(state: MessagesState) -> dict[str, Any]:
        return {"messages": [model.invoke(state["messages"])]}

    builder = StateGraph(MessagesState)
    builder.add_node("agent", agent)
    builder.add_node("tools", tools if tools is not None else ToolNode([lookup]))
    builder.add_edge(START, "agent")
    builder.add_conditional_edges("agent", tools_condition, {"tools": "tools", END: END})
    builder.add_edge("tools", "agent")
    return builder.compile(checkpointer=checkpointer)


def turn_input(turn: int) -> dict[str, Any]:
    """The user message that opens turn ``turn``."""
    return {"messages": [HumanMessage(content=f"Turn {turn}: " + words(turn * 10 + 7, 200))]}


def run_turns(
    graph: CompiledStateGraph[Any, Any, Any, Any], thread_id: str, turns: int, *, first: int = 0
) -> None:
    """Run ``turns`` turns of the conversation on ``thread_id``."""
    config: RunnableConfig = {"configurable": {"thread_id": thread_id}}
    for turn in range(first, first + turns):
        graph.invoke(turn_input(turn), config)
