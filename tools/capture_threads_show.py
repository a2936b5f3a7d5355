"""Write docs/cli-threads-show.txt: what ``threadkeep threads show`` prints for a short
support conversation with one tool call, as the README shows it.

    TZ=Europe/Berlin python tools/capture_threads_show.py

A real LangGraph graph (a scripted chat model, no network) writes the thread into a fresh
SQLite store in a temporary folder; the CLI then shows it, in process.
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path
from typing import Any

from click.testing import CliRunner
from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
from langchain_core.messages import AIMessage, HumanMessage
from langchain_core.tools import tool
from langgraph.graph import END, START, MessagesState, StateGraph
from langgraph.prebuilt import ToolNode, tools_condition

from threadkeep import Settings, open_checkpointer, user_scope
from threadkeep.cli import main

OUT = Path(__file__).resolve().parent.parent / "docs" / "cli-threads-show.txt"


@tool
def order_status(order_id: str) -> str:
    """Where an order is."""
    return f"order {order_id}: shipped 2026-12-04 with DHL, parcel 00340434161094042557, due Monday"


def _graph(checkpointer: Any) -> Any:
    model = GenericFakeChatModel(
        messages=iter(
            [
                AIMessage(
                    content="Let me look that order up.",
                    tool_calls=[{"name": "order_status", "args": {"order_id": "1042"}, "id": "call-7f3a"}],
                ),
                AIMessage(
                    content="Order 1042 left our warehouse on 4 December with DHL (parcel "
                    "00340434161094042557) and should reach you on Monday."
                ),
            ]
        )
    )

    def agent(state: MessagesState) -> dict[str, Any]:
        return {"messages": [model.invoke(state["messages"])]}

    builder = StateGraph(MessagesState)
    builder.add_node("agent", agent)
    builder.add_node("tools", ToolNode([order_status]))
    builder.add_edge(START, "agent")
    builder.add_conditional_edges("agent", tools_condition, {"tools": "tools", END: END})
    builder.add_edge("tools", "agent")
    return builder.compile(checkpointer=checkpointer)


def main_() -> int:
    with tempfile.TemporaryDirectory() as folder:
        path = str(Path(folder) / "checkpoints.sqlite")
        with open_checkpointer("sqlite", path, settings=Settings()) as saver, user_scope("alice"):
            question = HumanMessage(content="Hi, where is my order 1042?")
            _graph(saver).invoke({"messages": [question]}, {"configurable": {"thread_id": "support-1042"}})
        command = ["threads", "show", "support-1042", "--provider", "sqlite", "--conn", path]
        result = CliRunner().invoke(main, command)
    if result.exit_code != 0:
        sys.stderr.write(result.output)
        return result.exit_code
    OUT.write_text("$ threadkeep threads show support-1042\n" + result.stdout)
    print(f"wrote {OUT}")
    return 0


if __name__ == "__main__":
    sys.exit(main_())
