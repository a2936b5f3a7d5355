"""A turn's decisions, free of I/O: what failed, where to roll back to, what to tell the model.

The :class:`~threadkeep.turns.TurnManager` runs a graph and reads its checkpoints; every
choice it makes from what it read is a function here, tested without a graph or a store.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, ToolCall, ToolMessage

from threadkeep.errors import ToolCallError

__all__ = [
    "ToolFailure",
    "clean_decision_point",
    "describe_call",
    "failed_results",
    "failure_note",
    "input_messages",
    "issuing_index",
    "response_text",
    "rollback_target",
    "tool_results",
    "unanswered_calls",
]

# How much of a tool's error or result a note to the model quotes.
_QUOTED = 500


@dataclass(frozen=True, slots=True)
class ToolFailure:
    """One failure of a turn (SPEC TM2).

    Attributes:
        attempt: The attempt it ended (1: the turn's first run).
        calls: The tool calls that failed, as the model issued them (``name``, ``args``,
            ``id``); empty when the failure was not a tool call's (a model's error).
        error: What failed: the exception the run raised, or a :class:`ToolCallError`
            (``TOOL_RESULT_001``) for a tool that returned an error result.
        succeeded: Other calls of the same assistant message that returned a result,
            with it: the model is told, so that it need not call them again.
    """

    attempt: int
    calls: tuple[ToolCall, ...]
    error: BaseException
    succeeded: tuple[tuple[ToolCall, str], ...] = field(default=())

    @property
    def tool_failure(self) -> bool:
        """Whether a tool call failed (else the failure was elsewhere: a model's error)."""
        return bool(self.calls)


def input_messages(value: Any, key: str) -> list[BaseMessage] | None:
    """The messages of a turn's input: a string is one human message; ``None`` for an input
    that is a state mapping (its ``key`` is used as it is)."""
    if isinstance(value, str):
        return [HumanMessage(content=value)]
    if isinstance(value, BaseMessage):
        return [value]
    if isinstance(value, Mapping):
        return None
    return list(value)


def _messages(values: Any, key: str) -> list[Any]:
    found = values.get(key) if isinstance(values, Mapping) else getattr(values, key, None)
    if found is None:
        return []
    if isinstance(found, BaseMessage):
        return [found]
    return list(found) if isinstance(found, list | tuple) else []


def _updates(chunk: Mapping[str, Any]) -> Iterable[Any]:
    """The state updates of one ``stream_mode="updates"`` chunk (one per node that ran)."""
    for node, update in chunk.items():
        if node.startswith("__"):  # __interrupt__, ...
            continue
        yield from update if isinstance(update, list | tuple) else (update,)


def tool_results(chunk: Mapping[str, Any], key: str) -> list[ToolMessage]:
    """The tool results (``ToolMessage``) a step's updates hold."""
    return [
        message
        for update in _updates(chunk)
        for message in _messages(update, key)
        if isinstance(message, ToolMessage)
    ]


def failed_results(chunk: Mapping[str, Any], key: str) -> list[ToolMessage]:
    """The error results (``ToolMessage`` with ``status="error"``) a step's updates hold."""
    return [message for message in tool_results(chunk, key) if message.status == "error"]


def unanswered_calls(messages: Sequence[Any]) -> list[ToolCall]:
    """The tool calls of the last assistant message that no tool message answers."""
    for index in range(len(messages) - 1, -1, -1):
        message = messages[index]
        if isinstance(message, AIMessage):
            answered = {m.tool_call_id for m in messages[index + 1 :] if isinstance(m, ToolMessage)}
            return [call for call in message.tool_calls if call.get("id") not in answered]
    return []


def issuing_index(history: Sequence[Any], call_ids: set[str], key: str) -> int | None:
    """Where, in ``history`` (state snapshots, newest first), the assistant message that
    issued ``call_ids`` became the newest message: the checkpoint the failed step ran from."""
    for index, snapshot in enumerate(history):
        messages = _messages(snapshot.values, key)
        last = messages[-1] if messages else None
        if isinstance(last, AIMessage) and {call.get("id") for call in last.tool_calls} & call_ids:
            return index
    return None


def clean_decision_point(snapshot: Any, key: str) -> bool:
    """Whether a checkpoint is one the turn can continue from with a new decision: written by
    a step of the graph (not its input), with more to run, and no tool call left
    unanswered and no failed result as its last message."""
    metadata = snapshot.metadata or {}
    if metadata.get("source") != "loop" or not snapshot.next:
        return False
    messages = _messages(snapshot.values, key)
    if not messages:
        return False
    last = messages[-1]
    if isinstance(last, ToolMessage) and last.status == "error":
        return False
    return not unanswered_calls(messages)


def rollback_target(history: Sequence[Any], call_ids: set[str], steps: int, key: str) -> Any | None:
    """The checkpoint a turn rolls back to after ``call_ids`` failed (SPEC TM2), or ``None``
    when there is none: the turn then restarts on its thread.

    ``history`` is the thread's state snapshots, newest first. Counting back from the
    failure, step 1 undoes the failed result and step 2 the call itself (the checkpoint that
    issued it), so ``steps=2`` lands on the checkpoint before the call; further steps go
    further back, and from there the target is the newest clean decision point at or before
    it. Whether the failed step's own checkpoint was stored does not change the target: it
    is found from the checkpoint that issued the call. ``steps=1`` keeps the call: the
    target is the checkpoint that issued it, and the step runs again as it was.
    """
    issued = issuing_index(history, call_ids, key)
    if issued is None:
        return None
    if steps <= 1:
        return history[issued]
    for snapshot in history[issued + steps - 1 :]:
        if clean_decision_point(snapshot, key):
            return snapshot
    return None


def describe_call(call: ToolCall) -> str:
    """``name(arg=value, ...)``, as a note to the model names a call."""
    args = ", ".join(
        f"{name}={json.dumps(value, default=str)}" for name, value in (call.get("args") or {}).items()
    )
    return f"{call.get('name')}({args})"


def _quoted(text: str) -> str:
    return text if len(text) <= _QUOTED else text[:_QUOTED] + " ..."


def _error_text(error: BaseException) -> str:
    if isinstance(error, ToolCallError):
        return error.message
    return f"{type(error).__name__}: {error}"


def failure_note(failure: ToolFailure) -> str:
    """What the model is told after a rollback: which call failed and how, that it was undone,
    and which calls of the same message succeeded (with their results)."""
    calls = ", ".join(describe_call(call) for call in failure.calls)
    which = "The tool call" if len(failure.calls) == 1 else "One of the tool calls"
    lines = [
        f"{which} {calls} failed: {_quoted(_error_text(failure.error))}.",
        "That attempt was undone: the call and its result are not part of this conversation.",
    ]
    for call, result in failure.succeeded:
        lines.append(f"In the same attempt, {describe_call(call)} succeeded and returned: {_quoted(result)}")
    lines.append("Choose how to go on: another way, or the same call only if it can now succeed.")
    return "\n".join(lines)


def response_text(messages: Sequence[Any]) -> str:
    """The turn's response: the text of its last assistant message ("" if it has none)."""
    for message in reversed(messages):
        if isinstance(message, AIMessage):
            return message.text
    return ""
