"""Issue 34.2: a node's error reads back as LangGraph's own savers return it (SPEC C4).

LangGraph's serializer stores an exception as its ``repr()`` text, so after a node raises,
``state.tasks[i].error`` and the pending error write are that ``str``. Each graph runs on
every provider, through the sync and async APIs, under every durability, and is compared
with LangGraph's ``InMemorySaver`` running the same graph.
"""

from __future__ import annotations

import operator
from typing import Annotated, Any, TypedDict

import pytest
from langgraph.checkpoint.base import BaseCheckpointSaver
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.graph import END, START, StateGraph

from tests.graphs import Driver, cfg
from threadkeep import CheckpointedException


class Job(TypedDict):
    text: str
    done: Annotated[list[str], operator.add]


class StepFailed(Exception):
    """An application error with attributes, raised from a lower-level one."""

    def __init__(self, step: str, attempts: int) -> None:
        super().__init__(f"step {step} failed after {attempts} attempts")
        self.step = step
        self.attempts = attempts


def _too_large(state: Job) -> dict[str, Any]:
    if len(state["text"]) > 5:
        raise ValueError("Input is too large")
    return {"done": ["checked"]}


def _fetch(state: Job) -> dict[str, Any]:
    try:
        raise TimeoutError("upstream timed out")
    except TimeoutError as timeout:
        raise StepFailed("fetch", 3) from timeout


def checker_graph(checkpointer: BaseCheckpointSaver[Any]) -> Any:
    """prepare -> check (raises when the text is too long)."""
    builder = StateGraph(Job)
    builder.add_node("prepare", lambda state: {"done": ["prepared"]})
    builder.add_node("check", _too_large)
    builder.add_edge(START, "prepare")
    builder.add_edge("prepare", "check")
    builder.add_edge("check", END)
    return builder.compile(checkpointer=checkpointer)


def fetch_graph(checkpointer: BaseCheckpointSaver[Any]) -> Any:
    builder = StateGraph(Job)
    builder.add_node("fetch", _fetch)
    builder.add_edge(START, "fetch")
    builder.add_edge("fetch", END)
    return builder.compile(checkpointer=checkpointer)


def run_failing(driver: Driver, graph: Any, value: Any, thread: str, durability: str) -> Exception:
    with pytest.raises(Exception) as caught:
        driver.invoke(graph, value, cfg(thread), durability=durability)
    assert isinstance(caught.value, Exception)
    return caught.value


def error_writes(saver: BaseCheckpointSaver[Any], thread: str) -> list[tuple[str, Any]]:
    """The (channel, value) pending writes of the thread's head checkpoint (task ids differ
    between savers: they derive from checkpoint ids)."""
    found = saver.get_tuple(cfg(thread))  # type: ignore[arg-type]
    assert found is not None
    return sorted((channel, value) for _, channel, value in found.pending_writes or [])


def test_task_error_is_the_text_langgraph_returns(
    driver: Driver, durability: str, saver: BaseCheckpointSaver[Any]
) -> None:
    reference = InMemorySaver()
    outcomes = []
    for checkpointer in (reference, saver):
        graph = checker_graph(checkpointer)
        raised = run_failing(driver, graph, {"text": "much too long", "done": []}, "t", durability)
        assert type(raised) is ValueError
        state = driver.get_state(graph, cfg("t"))
        outcomes.append((state, error_writes(checkpointer, "t")))

    (expected, expected_writes), (state, writes) = outcomes
    (task,) = state.tasks
    assert task.error == "ValueError('Input is too large')"
    assert "too large" in task.error
    assert isinstance(task.error, str)
    assert state.values == expected.values
    assert state.next == expected.next == ("check",)
    assert [(t.name, t.error) for t in state.tasks] == [(t.name, t.error) for t in expected.tasks]
    assert writes == expected_writes
    assert ("__error__", "ValueError('Input is too large')") in writes


def test_record_of_the_error_stays_available(
    driver: Driver, durability: str, saver: BaseCheckpointSaver[Any]
) -> None:
    reference = InMemorySaver()
    errors = []
    for checkpointer in (reference, saver):
        graph = fetch_graph(checkpointer)
        raised = run_failing(driver, graph, {"text": "x", "done": []}, "t", durability)
        assert type(raised) is StepFailed
        (task,) = driver.get_state(graph, cfg("t")).tasks
        errors.append(task.error)

    expected, error = errors
    assert error == expected == "StepFailed('step fetch failed after 3 attempts')"
    record = CheckpointedException.of(error)
    assert record is not None
    assert record.id == [*__name__.split("."), "StepFailed"]
    assert record.message == "step fetch failed after 3 attempts"
    assert record.kwargs == {"step": "fetch", "attempts": 3}
    assert record.cause is not None
    assert record.cause.id == ["builtins", "TimeoutError"]
    assert record.cause.message == "upstream timed out"


def test_fixed_input_resumes_and_history_keeps_the_error(
    driver: Driver, durability: str, saver: BaseCheckpointSaver[Any]
) -> None:
    reference = InMemorySaver()
    runs = []
    for checkpointer in (reference, saver):
        graph = checker_graph(checkpointer)
        run_failing(driver, graph, {"text": "much too long", "done": []}, "t", durability)
        driver.update_state(graph, cfg("t"), {"text": "short"})
        done = driver.invoke(graph, None, cfg("t"), durability=durability)
        history = driver.history(graph, cfg("t"))
        runs.append((done, [(s.next, s.values, [(t.name, t.error) for t in s.tasks]) for s in history]))

    (expected_done, expected_history), (done, history) = runs
    assert done == expected_done == {"text": "short", "done": ["prepared", "checked"]}
    assert history == expected_history
    failed = [errors for _, _, errors in history if any(error for _, error in errors)]
    assert failed == [[("check", "ValueError('Input is too large')")]]
