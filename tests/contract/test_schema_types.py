"""Issue 34.4: the graph's own schema types round-trip without registration (SPEC C1).

A graph's state or input schema is a pydantic model or dataclass of the user's own: defined
in their module, or inside a function (a test, a graph factory), or a parametrized generic
model. Those types, and the models, dataclasses and enums their fields hold, are stored and
read back as themselves; anything else outside C1 stays refused with its path. Each graph
runs on every provider, through the sync and async APIs, under every durability, and is
compared with LangGraph's ``InMemorySaver`` running the same graph: the same steps, the same
results, except where LangGraph's savers cannot rebuild a class (one defined inside a
function, a parametrized generic model) and return its fields as a dict; there the values
read back are the values the graph wrote.
"""

# No `from __future__ import annotations`: the classes defined inside the tests annotate their
# fields with one another, which LangGraph resolves only from real annotations.
import dataclasses
import enum
import pathlib
from typing import Any, Generic, TypedDict, TypeVar

import pytest
from langgraph.checkpoint.base import BaseCheckpointSaver
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.graph import END, START, StateGraph
from langgraph.types import Command, interrupt
from pydantic import BaseModel

from tests.graphs import Driver, cfg
from threadkeep import CheckpointSerializationError

T = TypeVar("T")


def review_graph(checkpointer: BaseCheckpointSaver[Any], state_schema: type[Any], **schemas: Any) -> Any:
    """review (pauses for a verdict) -> record: the state is read back before each node."""

    def review(state: Any) -> dict[str, Any]:
        return {"verdict": interrupt("approve?")}

    def record(state: Any) -> dict[str, Any]:
        return {"verdict": state.verdict + "!"}

    builder = StateGraph(state_schema, **schemas)
    builder.add_node("review", review)
    builder.add_node("record", record)
    builder.add_edge(START, "review")
    builder.add_edge("review", "record")
    builder.add_edge("record", END)
    return builder.compile(checkpointer=checkpointer)


@dataclasses.dataclass
class Run:
    paused: Any  # the state while the graph waits for its verdict
    done: Any  # what invoke returned after the resume
    history: list[Any]  # get_state_history, newest first


def run_both(driver: Driver, durability: str, saver: BaseCheckpointSaver[Any], build: Any, first: Any) -> Run:
    """Run ``build(checkpointer)`` on LangGraph's InMemorySaver and on ``saver``: invoke with
    ``first``, read the paused state, resume. Both take the same steps; ``saver``'s run."""
    runs = []
    for checkpointer in (InMemorySaver(), saver):
        graph = build(checkpointer)
        driver.invoke(graph, first, cfg("t"), durability=durability)
        paused = driver.get_state(graph, cfg("t"))
        done = driver.invoke(graph, Command(resume="ok"), cfg("t"), durability=durability)
        runs.append(Run(paused, done, driver.history(graph, cfg("t"))))
    expected, run = runs
    assert run.paused.next == expected.paused.next
    assert [s.next for s in run.history] == [s.next for s in expected.history]
    assert [sorted(s.values) for s in run.history] == [sorted(s.values) for s in expected.history]
    return run


def fields(model: BaseModel) -> dict[str, Any]:
    """The channel values a pydantic state holds: its fields, not copied or dumped."""
    return {name: getattr(model, name) for name in type(model).model_fields}


class Priority(enum.Enum):
    LOW = "low"
    HIGH = "high"


class Page(BaseModel, Generic[T]):
    items: list[T]
    cursor: int


@dataclasses.dataclass
class Line:
    sku: str
    priority: Priority


class Customer(BaseModel):
    name: str
    tier: Priority


class Order(BaseModel):
    customer: Customer
    lines: Page[Line]
    verdict: str = ""


def test_module_schema_with_a_generic_model_field(
    driver: Driver, durability: str, saver: BaseCheckpointSaver[Any]
) -> None:
    order = Order(
        customer=Customer(name="ada", tier=Priority.HIGH),
        lines=Page[Line](items=[Line("a-1", Priority.LOW)], cursor=1),
    )
    run = run_both(driver, durability, saver, lambda c: review_graph(c, Order), order)
    assert run.paused.next == ("review",)
    assert run.paused.values == fields(order)
    assert run.done == {**fields(order), "verdict": "ok!"}
    assert run.history[0].values == run.done
    lines = run.paused.values["lines"]
    assert type(lines) is Page[Line]
    assert lines.items == [Line("a-1", Priority.LOW)]
    assert type(lines.items[0].priority) is Priority
    assert type(run.paused.values["customer"]) is Customer


def test_schemas_defined_inside_a_function(
    driver: Driver, durability: str, saver: BaseCheckpointSaver[Any]
) -> None:
    class Stage(enum.Enum):
        DRAFT = 1
        FINAL = 2

    @dataclasses.dataclass
    class Note:
        text: str
        stage: Stage

    class Author(BaseModel):
        name: str
        notes: list[Note]

    class Draft(BaseModel):
        author: Author
        stage: Stage
        verdict: str = ""

    draft = Draft(author=Author(name="ada", notes=[Note("n", Stage.DRAFT)]), stage=Stage.FINAL)
    run = run_both(driver, durability, saver, lambda c: review_graph(c, Draft), draft)
    assert run.paused.values == fields(draft)
    assert run.done == {**fields(draft), "verdict": "ok!"}
    assert run.history[0].values == run.done
    author = run.paused.values["author"]
    assert type(author) is Author
    assert type(author.notes[0]) is Note
    assert author.notes[0].stage is Stage.DRAFT
    assert run.paused.values["stage"] is Stage.FINAL


def test_input_schema_dataclass_defined_inside_a_function(
    driver: Driver, durability: str, saver: BaseCheckpointSaver[Any]
) -> None:
    @dataclasses.dataclass
    class Request:
        topic: str
        priority: Priority

    class State(TypedDict):
        topic: str
        priority: Priority
        verdict: str

    def review(state: State) -> dict[str, Any]:
        return {"verdict": interrupt(f"approve {state['topic']}?")}

    def build(checkpointer: BaseCheckpointSaver[Any]) -> Any:
        builder = StateGraph(State, input_schema=Request)
        builder.add_node("review", review)
        builder.add_edge(START, "review")
        builder.add_edge("review", END)
        return builder.compile(checkpointer=checkpointer)

    run = run_both(driver, durability, saver, build, Request("tides", Priority.HIGH))
    assert run.paused.values == {"topic": "tides", "priority": Priority.HIGH}
    assert run.done == {"topic": "tides", "priority": Priority.HIGH, "verdict": "ok"}
    assert run.history[0].values == run.done


class Upload(BaseModel):
    name: str
    path: pathlib.Path
    verdict: str = ""


def test_a_type_outside_c1_in_a_schema_is_still_refused_with_its_path(
    driver: Driver, durability: str, saver: BaseCheckpointSaver[Any]
) -> None:
    graph = review_graph(saver, Upload)
    with pytest.raises(CheckpointSerializationError) as caught:
        driver.invoke(graph, Upload(name="a", path=pathlib.Path("/tmp/a")), cfg("t"), durability=durability)
    assert caught.value.path is not None
    assert caught.value.path.endswith(".path")
    assert "pathlib" in caught.value.reason
