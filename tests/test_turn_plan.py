"""A turn's decisions without a graph or a store (threadkeep.turns.plan)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from langchain_core.messages import AIMessage, HumanMessage, ToolMessage

from threadkeep.turns.plan import (
    ToolFailure,
    failed_results,
    failure_note,
    rollback_target,
    unanswered_calls,
)


@dataclass
class Snapshot:
    """What rollback_target reads of LangGraph's StateSnapshot."""

    values: dict[str, Any]
    next: tuple[str, ...]
    metadata: dict[str, Any] = field(default_factory=lambda: {"source": "loop"})


def call(call_id: str, name: str = "charge", **args: Any) -> dict[str, Any]:
    return {"name": name, "args": args, "id": call_id, "type": "tool_call"}


HUMAN = HumanMessage("pay", id="h")
LOOKUP = AIMessage("", tool_calls=[call("look", "lookup", query="x")], id="a1")
LOOKED = ToolMessage("found", tool_call_id="look", id="t1")
PAY = AIMessage("", tool_calls=[call("pay", amount=5)], id="a2")
FAILED = ToolMessage("declined", tool_call_id="pay", status="error", id="t2")


def history(*states: tuple[list[Any], tuple[str, ...]]) -> list[Snapshot]:
    """Snapshots newest first, from (messages, next) oldest first, after the input checkpoint."""
    found = [Snapshot({}, ("__start__",), {"source": "input"})]
    found += [Snapshot({"messages": messages}, nxt) for messages, nxt in states]
    return found[::-1]


BEFORE_CALL = ([HUMAN, LOOKUP, LOOKED], ("agent",))
ISSUED = ([HUMAN, LOOKUP, LOOKED, PAY], ("tools",))


def test_two_steps_land_before_the_call_whether_the_failed_result_was_stored_or_not() -> None:
    raised = history(([HUMAN], ("agent",)), ([HUMAN, LOOKUP], ("tools",)), BEFORE_CALL, ISSUED)
    stored = history(
        ([HUMAN], ("agent",)),
        ([HUMAN, LOOKUP], ("tools",)),
        BEFORE_CALL,
        ISSUED,
        ([HUMAN, LOOKUP, LOOKED, PAY, FAILED], ("agent",)),
    )
    for found in (raised, stored):
        target = rollback_target(found, {"pay"}, 2, "messages")
        assert target is not None
        assert target.values["messages"] == [HUMAN, LOOKUP, LOOKED]


def test_more_steps_go_further_back_to_a_clean_decision_point() -> None:
    found = history(([HUMAN], ("agent",)), ([HUMAN, LOOKUP], ("tools",)), BEFORE_CALL, ISSUED)
    target = rollback_target(found, {"pay"}, 3, "messages")
    assert target is not None
    assert target.values["messages"] == [HUMAN]  # the lookup's call is not a clean point


def test_no_clean_point_that_far_back_means_a_restart() -> None:
    found = history(([HUMAN], ("agent",)), ([HUMAN, PAY], ("tools",)))
    assert rollback_target(found, {"pay"}, 3, "messages") is None
    assert rollback_target(found, {"unknown"}, 2, "messages") is None


def test_one_step_keeps_the_call() -> None:
    found = history(([HUMAN], ("agent",)), ([HUMAN, PAY], ("tools",)))
    target = rollback_target(found, {"pay"}, 1, "messages")
    assert target is not None
    assert target.values["messages"] == [HUMAN, PAY]


def test_failed_results_and_unanswered_calls() -> None:
    chunk = {"tools": {"messages": [LOOKED, FAILED]}, "__interrupt__": ()}
    assert failed_results(chunk, "messages") == [FAILED]
    both = AIMessage("", tool_calls=[call("a"), call("b")])
    assert [c["id"] for c in unanswered_calls([HUMAN, both, ToolMessage("x", tool_call_id="a")])] == ["b"]


def test_the_note_names_the_call_the_error_and_what_succeeded() -> None:
    failure = ToolFailure(
        1, (call("pay", amount=5),), ValueError("declined"), ((call("look", "lookup", query="x"), "found"),)
    )
    note = failure_note(failure)
    assert "charge(amount=5) failed: ValueError: declined" in note
    assert 'lookup(query="x") succeeded and returned: found' in note
