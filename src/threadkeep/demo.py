"""The demo: a scripted tool-calling conversation on the configured store (``threadkeep demo``).

When LangGraph's ``SqliteSaver`` is installed (``pip install langgraph-checkpoint-sqlite``),
it runs the same conversation on it in a temporary file, so the storage each needed can be
printed side by side.
"""

from __future__ import annotations

import sqlite3
import tempfile
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from langchain_core.runnables import RunnableConfig

from threadkeep.providers import open_checkpointer
from threadkeep.settings import Settings
from threadkeep.workload import build_agent, run_turns

__all__ = ["DemoReport", "HistoryRow", "run_demo"]

_LANGGRAPH_PAYLOAD = """
SELECT (SELECT coalesce(sum(length(checkpoint) + length(metadata)), 0) FROM checkpoints)
     + (SELECT coalesce(sum(length(value)), 0) FROM writes)
"""


@dataclass(frozen=True, slots=True)
class HistoryRow:
    """One checkpoint of the demo thread, newest first."""

    checkpoint_id: str
    step: int
    source: str
    messages: int
    last: str


@dataclass(frozen=True, slots=True)
class DemoReport:
    """What the demo did and measured."""

    provider: str
    location: str
    thread_id: str
    turns: int
    history: list[HistoryRow]
    threadkeep_bytes: int
    langgraph_bytes: int | None  # None: LangGraph's SqliteSaver is not installed


def _describe(message: Any) -> str:
    if message is None:
        return "-"
    calls = getattr(message, "tool_calls", None)
    if calls:
        return f"{type(message).__name__} calls {calls[0]['name']}({calls[0]['args']})"
    return f"{type(message).__name__}: {str(message.content)[:40]}..."


def run_demo(turns: int = 8, settings: Settings | None = None) -> DemoReport:
    """Run ``turns`` turns of the scripted agent on the configured store, and on SqliteSaver
    when it is installed."""
    settings = settings or Settings.from_env()
    thread_id = f"demo-{uuid.uuid4().hex[:8]}"
    config: RunnableConfig = {"configurable": {"thread_id": thread_id}}
    with open_checkpointer(settings=settings) as saver:
        run_turns(build_agent(saver), thread_id, turns)
        history = []
        for item in saver.list(config):
            messages = item.checkpoint["channel_values"].get("messages") or []
            history.append(
                HistoryRow(
                    checkpoint_id=item.checkpoint["id"],
                    step=int(item.metadata.get("step", 0)),
                    source=str(item.metadata.get("source", "")),
                    messages=len(messages),
                    last=_describe(messages[-1] if messages else None),
                )
            )
        ours = int(saver.stats(thread_id)["payload_bytes"])
        location = saver.backend.location()
    return DemoReport(
        provider=settings.provider,
        location=location,
        thread_id=thread_id,
        turns=turns,
        history=history,
        threadkeep_bytes=ours,
        langgraph_bytes=_langgraph_bytes(turns, thread_id),
    )


def _langgraph_bytes(turns: int, thread_id: str) -> int | None:
    """Bytes LangGraph's SqliteSaver stores for the same conversation (None: not installed)."""
    try:
        from langgraph.checkpoint.sqlite import SqliteSaver
    except ModuleNotFoundError:
        return None

    with tempfile.TemporaryDirectory() as folder:
        conn = sqlite3.connect(Path(folder) / "langgraph.sqlite", check_same_thread=False)
        try:
            run_turns(build_agent(SqliteSaver(conn)), thread_id, turns)
            return int(conn.execute(_LANGGRAPH_PAYLOAD).fetchone()[0])
        finally:
            conn.close()
