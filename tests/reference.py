"""Run one scenario on LangGraph's ``InMemorySaver`` and on a threadkeep store, and compare.

A scenario is a function of (recorder, checkpointer) that builds its graph on the
checkpointer, runs it as a user would and records what the user sees. Checkpoint ids, task
ids and interrupt ids are fresh on every run (time-based), so what is recorded leaves them
out: ``plain`` turns what LangGraph returns into values two runs can compare with ``==``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from langgraph.checkpoint.memory import InMemorySaver
from langgraph.types import Command, Interrupt, Send, StateSnapshot

from tests.graphs import Driver


def plain(value: Any) -> Any:
    """``value`` with what differs between two runs of one graph (ids) left out."""
    if isinstance(value, Interrupt):
        return ("interrupt", plain(value.value))
    if isinstance(value, StateSnapshot):
        return snapshot(value)
    if isinstance(value, Send):
        return ("send", value.node, plain(value.arg))
    if isinstance(value, Command):
        return ("command", plain(value.goto), plain(value.update), plain(value.resume))
    if isinstance(value, dict):
        # parallel tasks interrupt in the order they happen to finish
        return {
            key: sorted(plain(item), key=repr) if key == "__interrupt__" else plain(item)
            for key, item in value.items()
        }
    if isinstance(value, (list, tuple)):
        return [plain(item) for item in value]
    return value


def snapshot(state: StateSnapshot) -> dict[str, Any]:
    """What a user reads in a ``StateSnapshot``, ids left out (a subgraph's state, read with
    ``subgraphs=True``, included)."""
    return {
        "values": plain(state.values),
        "next": state.next,
        "source": (state.metadata or {}).get("source"),
        "step": (state.metadata or {}).get("step"),
        "tasks": sorted(
            (
                [
                    task.name,
                    plain(task.path[:1]),
                    plain(task.interrupts),
                    _substate(task.state),
                    plain(task.result),
                ]
                for task in state.tasks
            ),
            key=repr,
        ),
        "interrupts": sorted(plain(state.interrupts), key=repr),
        "has_parent": state.parent_config is not None,
    }


def _substate(state: Any) -> Any:
    """A task's subgraph state: read (``subgraphs=True``), or the config to read it with
    (whose namespace holds the task id)."""
    if isinstance(state, StateSnapshot):
        return snapshot(state)
    return None if state is None else "subgraph config"


def pending(writes: Any) -> list[tuple[str, str, Any]]:
    """Pending writes as a sorted list of (task kind, channel, value); task ids are
    per-run, so a task's writes are named by whether they are the null task's (input,
    ``Command.update``) or a node's."""
    rows = [
        ("null" if task_id == NULL_TASK_ID else "task", channel, plain(value))
        for task_id, channel, value in writes
    ]
    return sorted(rows, key=repr)


@dataclass
class Recorder:
    """Drives a graph through the sync or async API and records what the user sees."""

    driver: Driver
    durability: str = "async"
    seen: list[Any] = field(default_factory=list)

    def invoke(self, graph: Any, value: Any, config: Any, **kwargs: Any) -> Any:
        kwargs.setdefault("durability", self.durability)
        result = self.driver.invoke(graph, value, config, **kwargs)
        self.seen.append(("invoke", plain(result)))
        return result

    def stream(self, graph: Any, value: Any, config: Any, **kwargs: Any) -> list[Any]:
        kwargs.setdefault("durability", self.durability)
        if self.driver.api == "sync":
            chunks = list(graph.stream(value, config, **kwargs))
        else:

            async def collect() -> list[Any]:
                return [chunk async for chunk in graph.astream(value, config, **kwargs)]

            chunks = self._run(collect())
        self.seen.append(("stream", plain(chunks)))
        return chunks

    def state(self, graph: Any, config: Any, **kwargs: Any) -> StateSnapshot:
        state: StateSnapshot = self.driver.get_state(graph, config, **kwargs)
        self.seen.append(("state", snapshot(state)))
        return state

    def history(self, graph: Any, config: Any) -> list[StateSnapshot]:
        states = self.driver.history(graph, config)
        self.seen.append(("history", [snapshot(state) for state in states]))
        return states

    def pending_writes(self, checkpointer: Any, config: Any) -> None:
        """Record the pending writes of the checkpoint ``config`` names (the newest if none)."""
        if self.driver.api == "sync":
            found = checkpointer.get_tuple(config)
        else:
            found = self._run(checkpointer.aget_tuple(config))
        self.seen.append(("pending", None if found is None else pending(found.pending_writes)))

    def call(self, sync: Callable[[], Any], asynchronous: Callable[[], Any]) -> Any:
        """Call a checkpointer method through the API under test (``asynchronous`` returns
        the awaitable)."""
        return sync() if self.driver.api == "sync" else self._run(asynchronous())

    def _run(self, awaitable: Any) -> Any:
        if self.driver.runner is None:
            import asyncio

            self.driver.runner = asyncio.Runner()
        return self.driver.runner.run(awaitable)

    def note(self, what: str, value: Any) -> None:
        self.seen.append((what, plain(value)))


# The task id of writes no node made (input, ``Command.update``); private in LangGraph.
NULL_TASK_ID = "00000000-0000-0000-0000-000000000000"

Scenario = Callable[[Recorder, Any], None]


def compare_with_langgraph(
    scenario: Scenario, saver: Any, api: str, durability: str = "async", *, raises: bool = False
) -> list[Any]:
    """Run ``scenario`` on ``InMemorySaver`` and on ``saver``; assert the user saw the same
    on both, step by step, and return what was seen. An exception is part of what is seen;
    unless ``raises``, the scenario must run to its end on ``InMemorySaver``."""
    seen = []
    for checkpointer in (InMemorySaver(), saver):
        driver = Driver(api)
        recorder = Recorder(driver, durability)
        try:
            scenario(recorder, checkpointer)
        except Exception as exc:  # what LangGraph's saver raised too, at the same point
            recorder.seen.append(("raised", type(exc).__name__, str(exc)))
        finally:
            driver.close()
        seen.append(recorder.seen)
    expected, got = seen
    if not raises:
        assert expected[-1][0] != "raised", f"the scenario fails on InMemorySaver: {expected[-1]!r}"
    for step, (want, have) in enumerate(zip(expected, got, strict=False)):
        assert have == want, (
            f"step {step} differs from InMemorySaver:\n  langgraph:  {want!r}\n  threadkeep: {have!r}"
        )
    assert len(got) == len(expected), (
        f"threadkeep saw {got[len(expected) :]!r}, langgraph {expected[len(got) :]!r}"
    )
    return expected
