"""A worker process for fault tests: runs one graph on a tiered store, as a separate process.

    python -m tests.workers <job> <json options>

Jobs:
- ``slow``: run ``one -> slow -> three`` on a thread; ``slow`` writes the file ``marker`` and
  then waits for the file ``go`` (the test kills the process meanwhile, or creates ``go``).
- ``race``: run ``think`` (it appends the worker's name) on a thread, but after reading the
  thread's state write ``marker`` and wait for ``go``: two such workers hold the same head
  before either writes. Exits 3 on ``StaleStateError``.

Options: ``dsn``, ``cache_url``, ``cache_prefix``, ``thread``, ``marker``, ``go``, ``name``.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Annotated, Any

from langgraph.graph import END, START, StateGraph
from typing_extensions import TypedDict

from threadkeep import Settings, StaleStateError, open_checkpointer

STALE_EXIT = 3


class Log(TypedDict):
    log: Annotated[list[str], lambda left, right: left + right]


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
    )


def main(job: str, options: dict[str, Any]) -> int:
    config = {"configurable": {"thread_id": options["thread"]}}
    with open_store(options) as saver:
        if job == "slow":
            slow_graph(saver, options).invoke({"log": []}, config, durability="sync")
            return 0
        try:
            race_graph(saver, options).invoke({"log": []}, config, durability="sync")
        except StaleStateError:
            return STALE_EXIT
        return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], json.loads(sys.argv[2])))
