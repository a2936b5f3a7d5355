"""A worker process for fault tests: runs one graph on a tiered store, as a separate process.

    python -m tests.workers <job> <json options>

Jobs:
- ``slow``: run ``one -> slow -> three`` on a thread; ``slow`` writes the file ``marker`` and
  then waits for the file ``go`` (the test kills the process meanwhile, or creates ``go``).
- ``race``: run ``think`` (it appends the worker's name) on a thread, but after reading the
  thread's state write ``marker`` and wait for ``go``: two such workers hold the same head
  before either writes. Exits 3 on ``StaleStateError``.

- ``stop_after_commit``: run turn ``turn`` of the workload agent on a thread, but stop at its
  first cache write: once Postgres committed the step, write ``marker`` (the time, after the
  commit) and wait for ever (the test kills the process there).
- ``partition``: run turn 0, write ``marker``, wait for ``go`` (the test cuts this process's
  connection to Redis meanwhile), run turn 1, write ``done`` (the time, after its commits).
- ``poll``: read the thread's state (``get_state``) until it is checkpoint ``want_id`` or
  holds ``want_messages`` messages, at most ``deadline`` seconds; print every read as JSON
  ``[started, checkpoint id, messages]``.

Options: ``dsn``, ``cache_url``, ``cache_prefix``, ``thread``, ``marker``, ``go``, ``name``,
``done``, ``turn``, ``want_id``, ``want_messages``, ``deadline``.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Annotated, Any

from langgraph.graph import END, START, StateGraph
from typing_extensions import TypedDict

from threadkeep import Settings, StaleStateError, open_checkpointer
from threadkeep.backends.tiered.engine import Cached
from threadkeep.workload import build_agent, turn_input

STALE_EXIT = 3


class Log(TypedDict):
    log: Annotated[list[str], lambda left, right: left + right]


def _mark(path: str, text: str) -> None:
    """Write ``text`` to ``path`` whole: a test that sees the file (and may kill this
    process at once) reads all of it."""
    Path(path + ".part").write_text(text)
    os.replace(path + ".part", path)


def _wait_for(path: str, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not Path(path).exists():
        if time.monotonic() > deadline:
            raise TimeoutError(path)
        time.sleep(0.02)


def slow_graph(saver: Any, options: dict[str, Any]) -> Any:
    def one(state: Log) -> Log:
        return {"log": ["one"]}

    def slow(state: Log) -> Log:
        Path(options["marker"]).write_text("in slow")
        _wait_for(options["go"])
        return {"log": ["slow"]}

    def three(state: Log) -> Log:
        return {"log": ["three"]}

    builder = StateGraph(Log)
    for name, node in (("one", one), ("slow", slow), ("three", three)):
        builder.add_node(name, node)
    builder.add_edge(START, "one")
    builder.add_edge("one", "slow")
    builder.add_edge("slow", "three")
    builder.add_edge("three", END)
    return builder.compile(checkpointer=saver)


def log_graph(saver: Any, name: str) -> Any:
    """``think``: appends ``name`` to the log."""

    def think(state: Log) -> Log:
        return {"log": [name]}

    builder = StateGraph(Log)
    builder.add_node("think", think)
    builder.add_edge(START, "think")
    builder.add_edge("think", END)
    return builder.compile(checkpointer=saver)


def race_graph(saver: Any, options: dict[str, Any]) -> Any:
    """:func:`log_graph`, whose saver, once it has read the thread, waits for ``go``."""
    read = saver.get_tuple

    def get_tuple(config: Any) -> Any:
        found = read(config)
        Path(options["marker"]).write_text("ready")
        _wait_for(options["go"])
        return found

    saver.get_tuple = get_tuple
    return log_graph(saver, options["name"])


def open_store(options: dict[str, Any]) -> Any:
    return open_checkpointer(
        "tiered",
        options["dsn"],
        settings=Settings(cache_url=options["cache_url"]),
        cache_prefix=options["cache_prefix"],
        **{name: options[name] for name in ("cache_timeout",) if name in options},
    )


def stop_after_commit(saver: Any, options: dict[str, Any]) -> None:
    """Make the saver stop, for ever, at its first cache write of a state: after Postgres
    committed the step, before Redis has it."""
    engine = saver.backend.engine
    execute = engine._execute

    def stopping(request: Any) -> Any:
        if isinstance(request, Cached) and request.what == "write a state":
            _mark(options["marker"], json.dumps(time.time()))
            while True:
                time.sleep(60)
        return execute(request)

    engine._execute = stopping


def poll(saver: Any, options: dict[str, Any], config: Any) -> list[list[Any]]:
    """Read the state until it is the one wanted (or the deadline); every read, with when it
    started."""
    graph = build_agent(saver)
    reads: list[list[Any]] = []
    deadline = time.monotonic() + options["deadline"]
    while time.monotonic() < deadline:
        started = time.time()
        state = graph.get_state(config)
        checkpoint_id = state.config["configurable"]["checkpoint_id"]
        messages = len(state.values.get("messages", []))
        reads.append([started, checkpoint_id, messages])
        if checkpoint_id == options.get("want_id") or messages == options.get("want_messages"):
            break
        time.sleep(0.05)
    return reads


def main(job: str, options: dict[str, Any]) -> int:
    config = {"configurable": {"thread_id": options["thread"]}}
    with open_store(options) as saver:
        if job == "slow":
            slow_graph(saver, options).invoke({"log": []}, config, durability="sync")
            return 0
        if job == "stop_after_commit":
            stop_after_commit(saver, options)
            build_agent(saver).invoke(turn_input(options["turn"]), config, durability="sync")
            return 0
        if job == "partition":
            graph = build_agent(saver)
            graph.invoke(turn_input(0), config, durability="sync")
            Path(options["marker"]).write_text("turn 0")
            _wait_for(options["go"])
            graph.invoke(turn_input(1), config, durability="sync")
            _mark(options["done"], json.dumps(time.time()))
            return 0
        if job == "poll":
            print(json.dumps(poll(saver, options, config)))
            return 0
        try:
            race_graph(saver, options).invoke({"log": []}, config, durability="sync")
        except StaleStateError:
            return STALE_EXIT
        return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], json.loads(sys.argv[2])))
