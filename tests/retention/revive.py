"""A writer that keeps re-running old threads while a sweep deletes them (SPEC SW5, SW8).

Used in-process (a thread of the test) and as another process::

    python -m tests.retention.revive <json options>

Options: ``store`` (see :func:`open_store`), ``threads`` (the ids to re-run, in turn),
``mode`` (``sync`` or ``async``), ``acks`` (a file: one JSON line per acknowledged put, its
thread, namespace and checkpoint id), ``stop`` (a file: the writer stops once it exists).

Each re-run starts its thread as an owner does (``start_threads``: out of the finished set,
its waiting clock restarted), then runs one step of a one-node graph. A put that returned
is acknowledged: its checkpoint must still be there after the sweep. A run whose thread was
deleted between its load and its put fails with ``StaleStateError`` (nothing stored), as it
should; the writer goes on to the next.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from langgraph.graph import END, START, StateGraph
from typing_extensions import TypedDict

from threadkeep import Settings, StaleStateError, ThreadkeepSaver, open_checkpointer

SETTINGS = Settings(retention_waiting_minutes=7 * 24 * 60, retention_finished_minutes=24 * 60)


class Count(TypedDict):
    n: int


def _step(state: Count) -> Count:
    return {"n": state["n"] + 1}


def graph(saver: ThreadkeepSaver) -> Any:
    builder = StateGraph(Count)
    builder.add_node("step", _step)
    builder.add_edge(START, "step")
    builder.add_edge("step", END)
    return builder.compile(checkpointer=saver)


def open_store(store: dict[str, str], clock: Callable[[], float] = time.time) -> ThreadkeepSaver:
    """Open the store ``store`` names: ``{"provider": ..., "location": ..., "prefix": ...,
    "cache_url": ...}`` (a SQLite path, a Postgres DSN, a Redis URL)."""
    provider = store["provider"]
    options: dict[str, Any] = {"clock": clock}
    settings = SETTINGS
    if provider == "redis":
        options["key_prefix"] = store["prefix"]
    if provider == "tiered":
        options["cache_prefix"] = store["prefix"]
        settings = settings.with_values(cache_url=store["cache_url"])
    return open_checkpointer(provider, store["location"], settings=settings, **options)


def acknowledging(saver: ThreadkeepSaver, acks: list[dict[str, str]]) -> ThreadkeepSaver:
    """``saver``, recording in ``acks`` the config of every put it acknowledged."""
    put, aput = saver.put, saver.aput

    def ack(config: Any) -> Any:
        conf = config["configurable"]
        acks.append({k: conf[k] for k in ("thread_id", "checkpoint_ns", "checkpoint_id")})
        return config

    saver.put = lambda *args, **kwargs: ack(put(*args, **kwargs))  # type: ignore[method-assign]

    async def aput_acked(*args: Any, **kwargs: Any) -> Any:
        return ack(await aput(*args, **kwargs))

    saver.aput = aput_acked  # type: ignore[method-assign]
    return saver


def revive(saver: ThreadkeepSaver, threads: list[str], mode: str, stop: Callable[[], bool]) -> None:
    """Re-run ``threads`` in turn until ``stop()``; sync or async (``mode``)."""
    app = graph(saver)

    def config(thread_id: str) -> Any:
        return {"configurable": {"thread_id": thread_id}}

    if mode == "sync":
        for thread_id in itertools.cycle(threads):
            if stop():
                return
            saver.start_threads([thread_id])
            with contextlib.suppress(StaleStateError):  # its delete came between load and put
                app.invoke({"n": 0}, config(thread_id))

    async def arevive() -> None:
        for thread_id in itertools.cycle(threads):
            if stop():
                return
            await saver.astart_threads([thread_id])
            with contextlib.suppress(StaleStateError):
                await app.ainvoke({"n": 0}, config(thread_id))

    asyncio.run(arevive())


class AckFile(list[dict[str, str]]):
    """The acknowledged puts, each also written to ``path`` as it comes."""

    def __init__(self, path: str) -> None:
        super().__init__()
        self.file = Path(path).open("a")  # noqa: SIM115 (closed by main)

    def append(self, ack: dict[str, str]) -> None:
        super().append(ack)
        self.file.write(json.dumps(ack) + "\n")
        self.file.flush()


def main(options: dict[str, Any]) -> int:
    acks = AckFile(options["acks"])
    stop = Path(options["stop"])
    with open_store(options["store"]) as saver, acks.file:
        revive(acknowledging(saver, acks), options["threads"], options["mode"], stop.exists)
    return 0


if __name__ == "__main__":
    sys.exit(main(json.loads(sys.argv[1])))
