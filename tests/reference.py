"""Run one scenario on LangGraph's ``InMemorySaver`` and on a threadkeep store, and compare.

A scenario is a function of (recorder, checkpointer) that builds its graph on the
checkpointer, runs it as a user would and records what the user sees. Checkpoint ids, task
ids and interrupt ids are fresh on every run (time-based), so what is recorded leaves them
out: ``plain`` turns what LangGraph returns into values two runs can compare with ``==``.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from langchain_core.messages import BaseMessage
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.types import Command, Interrupt, Send, StateSnapshot

from tests.graphs import Driver

# Ids made afresh on every run: checkpoint and task ids (UUIDs), interrupt ids (32 hex
# digits), and the ids add_messages gives to messages that have none.
_FRESH_ID = re.compile(
    r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}|\b[0-9a-f]{32}\b|lc_run--[-0-9a-f]+"
)
# Keys whose values are wall-clock times (and LangGraph's own __pregel_* objects, such as
# the checkpointer, in a subgraph's config); and the branch marker of ours in configs, which
# issue 34.6 removes (its own tests check that configs carry nothing of ours).
_IGNORED_KEYS = frozenset({"ts", "timestamp", "created_at"})


def plain(value: Any) -> Any:
    """``value`` with what differs between two runs of one graph (fresh ids, times) left out."""
    if isinstance(value, str):
        return _FRESH_ID.sub("<id>", value)
    if isinstance(value, BaseMessage):
        # add_messages gives an id-less message its id in place, racing the background
        # put_writes that stores the node's write: either may come first, on any saver
        fields = value.model_dump()
        fields["id"] = fields["id"] or "<id>"
        return (type(value).__name__, plain(fields))
    if isinstance(value, BaseException):
        return ("error", type(value).__name__)
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
            plain(key): sorted(plain(item), key=repr) if key == "__interrupt__" else plain(item)
            for key, item in value.items()
            if key not in _IGNORED_KEYS and not str(key).startswith("__pregel_")
        }
    if isinstance(value, (list, tuple)):
        return [plain(item) for item in value]
    if isinstance(value, (set, frozenset)):
        return sorted((plain(item) for item in value), key=repr)
    return value


def snapshot(state: StateSnapshot) -> dict[str, Any]:
    """What a user reads in a ``StateSnapshot``, ids left out (a subgraph's state, read with
    ``subgraphs=True``, included)."""
    return {
        "values": plain(state.values),
        "next": state.next,
        "metadata": plain(state.metadata),
        "config": plain(state.config),
        "parent_config": plain(state.parent_config),
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
        (
            "null" if task_id == NULL_TASK_ID else "task",
            channel,
            plain(value),
        )
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
            f"step {step} ({want[0]}) differs from InMemorySaver at {_difference(want, have)}:\n"
            f"  langgraph:  {want!r}\n  threadkeep: {have!r}"
        )
    assert len(got) == len(expected), (
        f"threadkeep saw {got[len(expected) :]!r}, langgraph {expected[len(got) :]!r}"
    )
    return expected


def _difference(want: Any, have: Any, path: str = "") -> str:
    """Where ``have`` first differs from ``want``, and the two values there."""
    if isinstance(want, dict) and isinstance(have, dict):
        for key in [*want, *(k for k in have if k not in want)]:
            if want.get(key, _MISSING) != have.get(key, _MISSING):
                return _difference(want.get(key, _MISSING), have.get(key, _MISSING), f"{path}[{key!r}]")
    elif isinstance(want, (list, tuple)) and isinstance(have, (list, tuple)) and len(want) == len(have):
        for index, (a, b) in enumerate(zip(want, have, strict=True)):
            if a != b:
                return _difference(a, b, f"{path}[{index}]")
    return f"{path or 'top'}: {want!r} != {have!r}"


_MISSING = "<missing>"
