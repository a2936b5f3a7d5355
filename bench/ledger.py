"""What the tool-call ledger (SPEC TM5) costs per tool call.

    ./dev bench ledger --runs 5 --calls 300 --ledger-turns 10 [--stores sqlite,postgres]

Measured per store (default ``sqlite`` and ``postgres``; ``--stores`` takes any of
``memory,sqlite,postgres,redis,tiered``), each on a fresh store (a SQLite file in a temporary
folder, WAL, ``synchronous=NORMAL``; a new Postgres schema; a new Redis key prefix):

- ``call``: ``begin_tool_call`` then ``end_tool_call`` with a 1.5 KB string result (the
  workload's tool result), ``--calls`` calls one after another on one thread, through the
  sync and the async API: the median over ``--runs`` runs of the mean wall time per call (and
  the client CPU time of this process per call).
- the Postgres server's own floor, for scale: a ``SELECT 1`` round trip, and a one-row INSERT
  committed with and without waiting for its WAL flush;
- ``turn``: the workload's agent (three tool calls a turn, ``threadkeep.workload``), ``--ledger-turns``
  turns on a new thread, its tools node running each call plainly or between
  ``begin_tool_call`` and ``end_tool_call`` (what a replay-safe tool does on its first run),
  the two alternating run by run: the median wall time per turn of each, and what the ledger
  adds per tool call, ``(with - without) / tool calls``.
"""

from __future__ import annotations

import asyncio
import statistics
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import psycopg
from langchain_core.messages import AIMessage, ToolMessage
from langchain_core.runnables import RunnableConfig
from langgraph.graph import MessagesState

from bench.servers import POSTGRES, REDIS
from threadkeep import Settings, ThreadkeepSaver, open_checkpointer
from threadkeep.workload import TOOL_ROUND_TRIPS, build_agent, lookup, turn_input, words

STORES = ("memory", "sqlite", "postgres", "redis", "tiered")
RESULT = words(1, 1500)


@contextmanager
def opened(store: str) -> Iterator[ThreadkeepSaver]:
    """A saver on a fresh, empty store; dropped afterwards."""
    unique = uuid.uuid4().hex[:10]
    schema = f"tk_bench_ledger_{unique}"
    dsn = f"{POSTGRES} options='-c search_path={schema}'"
    if store in ("postgres", "tiered"):
        with psycopg.connect(POSTGRES, autocommit=True) as admin:
            admin.execute(f"CREATE SCHEMA {schema}")
    try:
        with tempfile.TemporaryDirectory() as folder:
            if store == "memory":
                saver = open_checkpointer("memory")
            elif store == "sqlite":
                saver = open_checkpointer("sqlite", str(Path(folder) / "bench.sqlite"))
            elif store == "postgres":
                saver = open_checkpointer("postgres", dsn)
            elif store == "redis":
                saver = open_checkpointer("redis", REDIS, key_prefix=f"tkbl{unique}")
            else:
                settings = Settings().with_values(cache_url=REDIS)
                saver = open_checkpointer("tiered", dsn, settings=settings, cache_prefix=f"tkblc{unique}")
            with saver:
                yield saver
                if store in ("redis", "tiered"):
                    saver.backend.reset()  # type: ignore[attr-defined]  # its own keys only
    finally:
        if store in ("postgres", "tiered"):
            with psycopg.connect(POSTGRES, autocommit=True) as admin:
                admin.execute(f"DROP SCHEMA {schema} CASCADE")


def _timed(run: Callable[[], None], count: int) -> tuple[float, float]:
    """Wall and process CPU time per ``count`` of one ``run()``, in ms."""
    wall, cpu = time.perf_counter(), time.process_time()
    run()
    return (time.perf_counter() - wall) * 1000 / count, (time.process_time() - cpu) * 1000 / count


def calls_sync(saver: ThreadkeepSaver, thread: str, count: int) -> None:
    config: RunnableConfig = {"configurable": {"thread_id": thread}}
    for i in range(count):
        saver.begin_tool_call(config, "m", f"c{i}", "lookup")
        saver.end_tool_call(config, "m", f"c{i}", result=RESULT)


async def calls_async(saver: ThreadkeepSaver, thread: str, count: int) -> None:
    config: RunnableConfig = {"configurable": {"thread_id": thread}}
    for i in range(count):
        await saver.abegin_tool_call(config, "m", f"c{i}", "lookup")
        await saver.aend_tool_call(config, "m", f"c{i}", result=RESULT)


def measure_calls(saver: ThreadkeepSaver, runs: int, count: int) -> dict[str, tuple[float, float]]:
    out: dict[str, tuple[float, float]] = {}
    calls_sync(saver, "warm", 20)  # connections, prepared statements
    sync = [_timed(lambda: calls_sync(saver, uuid.uuid4().hex, count), count) for _ in range(runs)]
    with asyncio.Runner() as runner:
        runner.run(calls_async(saver, "warm-async", 20))
        asyncs = [
            _timed(lambda: runner.run(calls_async(saver, uuid.uuid4().hex, count)), count)
            for _ in range(runs)
        ]
    for api, found in (("sync", sync), ("async", asyncs)):
        out[api] = (statistics.median(w for w, _ in found), statistics.median(c for _, c in found))
    return out


def agent(saver: ThreadkeepSaver, ledger: bool) -> Any:
    """The workload's agent with a tools node of our own: each call run plainly, or between
    begin_tool_call and end_tool_call (a recorded result is returned without running)."""

    def tools(state: MessagesState, config: RunnableConfig) -> dict[str, Any]:
        message = state["messages"][-1]
        assert isinstance(message, AIMessage)
        out = []
        for call in message.tool_calls:
            if ledger:
                entry = saver.begin_tool_call(config, message.id or "", call["id"] or "", call["name"])
                if entry.status == "succeeded":
                    result = entry.result
                else:
                    result = lookup.invoke(call["args"])
                    saver.end_tool_call(config, message.id or "", call["id"] or "", result=result)
            else:
                result = lookup.invoke(call["args"])
            out.append(ToolMessage(result, tool_call_id=call["id"], name=call["name"]))
        return {"messages": out}

    return build_agent(saver, tools=tools)


def measure_turns(saver: ThreadkeepSaver, runs: int, turns: int) -> dict[str, float]:
    per_turn: dict[bool, list[float]] = {False: [], True: []}
    for run in range(runs + 1):  # the first pair warms up
        for ledger in (False, True) if run % 2 else (True, False):
            graph, config = agent(saver, ledger), {"configurable": {"thread_id": uuid.uuid4().hex}}
            start = time.perf_counter()
            for turn in range(turns):
                graph.invoke(turn_input(turn), config)
            if run:
                per_turn[ledger].append((time.perf_counter() - start) * 1000 / turns)
    without, with_ = statistics.median(per_turn[False]), statistics.median(per_turn[True])
    return {"without": without, "with": with_, "per_call": (with_ - without) / TOOL_ROUND_TRIPS}


def postgres_floor(count: int) -> dict[str, float]:
    """What the server itself costs on this machine: the median of ``count`` round trips of
    ``SELECT 1``, and of one-row INSERTs each committed on its own, durable (waiting for its
    WAL flush) and not (``synchronous_commit = off``), in ms."""
    out: dict[str, float] = {}
    schema = f"tk_bench_floor_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(POSTGRES, autocommit=True) as conn:
        conn.execute(f"CREATE SCHEMA {schema}")
        try:
            conn.execute(f"CREATE TABLE {schema}.floor (a integer)")
            insert = f"INSERT INTO {schema}.floor VALUES (1)"
            for name, sql, setting in (
                ("round trip", "SELECT 1", "on"),
                ("durable commit", insert, "on"),
                ("commit, no flush wait", insert, "off"),
            ):
                conn.execute(f"SET synchronous_commit = {setting}")
                times = []
                for _ in range(count):
                    start = time.perf_counter()
                    conn.execute(sql)
                    times.append((time.perf_counter() - start) * 1000)
                out[name] = statistics.median(times)
        finally:
            conn.execute(f"DROP SCHEMA {schema} CASCADE")
    return out


def main(
    runs: int = 5, calls: int = 300, turns: int = 10, stores: tuple[str, ...] = ("sqlite", "postgres")
) -> dict[str, Any]:
    """Measure each store in ``stores``; print the tables; the results, by store (and
    ``postgres-floor``: the server's own costs)."""
    unknown = set(stores) - set(STORES)
    if unknown:
        raise SystemExit(f"unknown stores {sorted(unknown)}; choose from {', '.join(STORES)}")
    results: dict[str, Any] = {}
    for store in stores:
        with opened(store) as saver:
            found = measure_calls(saver, runs, calls)
            per_turn = measure_turns(saver, runs, turns)
        (sync_wall, sync_cpu), (async_wall, async_cpu) = found["sync"], found["async"]
        results[store] = {
            "sync_wall": sync_wall,
            "sync_cpu": sync_cpu,
            "async_wall": async_wall,
            "async_cpu": async_cpu,
            "turn_without": per_turn["without"],
            "turn_with": per_turn["with"],
            "per_call": per_turn["per_call"],
        }
    if "postgres" in stores or "tiered" in stores:
        results["postgres-floor"] = postgres_floor(calls)
    report(results, runs, calls, turns)
    return results


def report(results: dict[str, Any], runs: int, calls: int, turns: int) -> None:
    stores = [name for name in results if name in STORES]
    print(f"begin_tool_call + end_tool_call, {calls} calls, median of {runs} runs (ms per call)")
    print(f"{'store':10}{'sync wall':>11}{'sync cpu':>10}{'async wall':>12}{'async cpu':>11}")
    for store in stores:
        r = results[store]
        print(
            f"{store:10}{r['sync_wall']:11.3f}{r['sync_cpu']:10.3f}{r['async_wall']:12.3f}{r['async_cpu']:11.3f}"
        )
    if "postgres-floor" in results:
        floor = results["postgres-floor"]
        print("postgres itself, median ms: " + ", ".join(f"{name} {ms:.3f}" for name, ms in floor.items()))
    print()
    print(f"the workload's agent, {turns} turns of {TOOL_ROUND_TRIPS} tool calls, median of {runs} runs")
    print(f"{'store':10}{'ms/turn without':>17}{'ms/turn with':>14}{'ledger ms/call':>16}")
    for store in stores:
        r = results[store]
        print(f"{store:10}{r['turn_without']:17.3f}{r['turn_with']:14.3f}{r['per_call']:16.3f}")
