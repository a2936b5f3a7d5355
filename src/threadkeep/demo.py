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

from langchain_core.messages import AIMessage
from langchain_core.runnables import RunnableConfig

from threadkeep.providers import open_checkpointer
from threadkeep.settings import Settings
from threadkeep.workload import build_agent, run_turns

__all__ = ["DemoReport", "HistoryRow", "TurnsReport", "run_demo", "run_turns_demo"]

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


# Turns (docs/turns.md): a tool that fails once, and a turn cut off after its side effect --------


class _Crash(BaseException):
    """Stands for the process dying: nothing of the turn runs after it (a BaseException, so
    no handler of the turn's own catches it)."""


@dataclass(frozen=True, slots=True)
class TurnsReport:
    """What the turns demo showed: the lines to print, and the payments made."""

    lines: list[str]
    charges: int


def _payment_agent(faults: dict[str, int], charges: list[str]) -> Any:
    """The turns demo's agent: it pays an invoice with ``charge``, which times out while
    ``faults["timeouts"]`` lasts and dies after paying while ``faults["crashes"]`` does;
    ``charges`` collects the idempotency key of every payment made."""
    from langchain_core.messages import ToolMessage
    from langchain_core.tools import tool
    from langgraph.graph import START, MessagesState, StateGraph
    from langgraph.prebuilt import ToolNode, tools_condition

    from threadkeep.turns import current_idempotency_key, replay_safe

    @replay_safe
    def processor(amount: int) -> str:
        charges.append(current_idempotency_key())
        return f"receipt {len(charges)} for {amount}"

    @tool
    def charge(amount: int) -> str:
        """Charge the customer's card ``amount`` cents."""
        if faults["timeouts"]:
            faults["timeouts"] -= 1
            raise TimeoutError("the card processor did not answer")
        receipt = processor(amount)
        if faults["crashes"]:
            faults["crashes"] -= 1
            raise _Crash  # the payment went through; the step's checkpoint never comes
        return receipt

    def agent(state: MessagesState) -> dict[str, Any]:
        last = state["messages"][-1]
        if isinstance(last, ToolMessage):
            return {"messages": [AIMessage(content=f"Paid: {last.content}.")]}
        call = {"name": "charge", "args": {"amount": 500}, "id": f"call-{uuid.uuid4().hex[:6]}"}
        return {"messages": [AIMessage(content="", tool_calls=[call])]}

    builder = StateGraph(MessagesState)
    builder.add_node("agent", agent)
    builder.add_node("tools", ToolNode([charge]))
    builder.add_edge(START, "agent")
    builder.add_conditional_edges("agent", tools_condition)
    builder.add_edge("tools", "agent")
    return builder


def run_turns_demo(settings: Settings | None = None) -> TurnsReport:
    """Two turns on the configured store: one whose tool fails once (rolled back and retried),
    and one cut off after its payment went through, then resumed by a new manager (as after a
    restart): the tool-call ledger returns the recorded payment instead of paying again."""
    from threadkeep.turns import TurnManager

    settings = settings or Settings.from_env()
    lines: list[str] = []
    charges: list[str] = []
    faults = {"timeouts": 1, "crashes": 0}
    builder = _payment_agent(faults, charges)
    with tempfile.TemporaryDirectory() as folder:
        turn_settings = settings.with_values(
            resume_enabled=True, resume_state_path=str(Path(folder) / "resumable.json")
        )
        user = f"demo-{uuid.uuid4().hex[:6]}"
        with open_checkpointer(settings=settings) as saver:
            turns = TurnManager(builder, saver, settings=turn_settings)
            result = turns.run_turn(user, "Pay my invoice")
            for failure in result.failures:
                error = f"{type(failure.error).__name__}: {failure.error}"
                lines.append(f"turn 1, attempt {failure.attempt}: {error}")
                lines.append("  rolled back to the decision before the call; the model was told what failed")
            lines.append(f"turn 1, attempt {result.attempts}: {result.response}")
            faults["crashes"] = 1
            try:
                turns.run_turn(user, "Pay my next invoice")
            except _Crash:
                lines.append("turn 2: cut off after the card was charged, before the step's checkpoint")
        with open_checkpointer(settings=settings) as saver:  # a new saver and manager, as after a restart
            turns = TurnManager(builder, saver, settings=turn_settings)
            resumable = turns.has_resumable_turn(user)
            result = turns.resume_last_turn(user)
            how = "restarted from its message (the store kept nothing)" if result.restarted else "resumed"
            lines.append(f"turn 2 {how} (has_resumable_turn: {resumable}): {result.response}")
    lines.append(f"the card processor charged {len(charges)} time(s) for the two turns' payments")
    return TurnsReport(lines, len(charges))
