"""Issue 4's benchmark: the tiered provider next to our Postgres provider and LangGraph's
``AsyncPostgresSaver``, 32 conversations at once.

    ./dev bench tiered --runs 3

Each run starts 32 conversations of the issue-3 workload at once on a fresh store of each
kind (pools of at most 8 connections) and records, around the saver's calls as the graphs
make them:

- ``put``, ``put_writes`` and ``get_tuple`` medians and p99s, and the write time per step
  (every ``put`` and ``put_writes`` of the run, divided by the number of checkpoints);
- the Postgres statements the run sent, counted client-side at psycopg's cursor, so every
  saver is counted alike: the *read queries* (statements sent by the saver's reads,
  ``get_tuple`` and ``list``: the state loads a cache exists to absorb), and every statement
  split into those that modify nothing and those that write (a put's own reads, such as the
  head check of optimistic concurrency, are the durable write's and the same in both tiers);
- turns per second.

After the run, a quiet load: the newest state of each of the 32 threads, read one at a time
(3 passes; the tiered provider serves each from its cache). Next to it, the floor of such a
load: one Redis ``GET`` of the same state encoded as one value, plus decoding it.
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import gc
import statistics
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import psycopg
import redis.asyncio
from langchain_core.runnables import RunnableConfig

from bench.servers import REDIS, SERDE, conversation, open_store
from bench.timing import instrument, median_ms, percentile_ms

STORES = ("langgraph-postgres", "threadkeep-postgres", "threadkeep-tiered")
PASSES = 3
_WRITES = ("INSERT", "UPDATE", "DELETE")
_IN_READ: contextvars.ContextVar[bool] = contextvars.ContextVar("in_read", default=False)


@dataclass
class StatementCount:
    of_reads: int = 0  # sent by get_tuple and list
    modifying_nothing: int = 0
    writing: int = 0

    def count(self, sql: Any) -> None:
        text = sql if isinstance(sql, str) else str(sql)
        if _IN_READ.get():
            self.of_reads += 1
        if any(word in text.upper() for word in _WRITES):
            self.writing += 1
        else:
            self.modifying_nothing += 1


def mark_reads(saver: Any) -> None:
    """Make the statements ``saver``'s ``aget_tuple`` sends count as read queries (``alist``
    is not called by a graph run)."""
    saver.aget_tuple = _reading(saver.aget_tuple)


def _reading(method: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(method)
    async def reading(*args: Any, **kwargs: Any) -> Any:
        token = _IN_READ.set(True)
        try:
            return await method(*args, **kwargs)
        finally:
            _IN_READ.reset(token)

    return reading


@contextmanager
def counting_statements() -> Iterator[StatementCount]:
    """Count every statement any async psycopg cursor sends while the block runs."""
    counts = StatementCount()
    execute, executemany = psycopg.AsyncCursor.execute, psycopg.AsyncCursor.executemany

    async def counted_execute(self: Any, query: Any, *args: Any, **kwargs: Any) -> Any:
        counts.count(query)
        return await execute(self, query, *args, **kwargs)

    async def counted_executemany(self: Any, query: Any, *args: Any, **kwargs: Any) -> Any:
        counts.count(query)
        return await executemany(self, query, *args, **kwargs)

    psycopg.AsyncCursor.execute = counted_execute  # type: ignore[method-assign]
    psycopg.AsyncCursor.executemany = counted_executemany  # type: ignore[method-assign]
    try:
        yield counts
    finally:
        psycopg.AsyncCursor.execute = execute  # type: ignore[method-assign]
        psycopg.AsyncCursor.executemany = executemany  # type: ignore[method-assign]


async def one_run(name: str, conversations: int, turns: int) -> dict[str, Any]:
    gc.collect()
    threads = [f"c{i}" for i in range(conversations)]
    async with open_store(name) as store:
        saver = store.saver
        record = instrument(saver)
        mark_reads(saver)
        with counting_statements() as counts:
            start = time.perf_counter()
            await asyncio.gather(*(conversation(saver, thread, turns) for thread in threads))
            elapsed = time.perf_counter() - start
        steps = len(record["aput"])
        result: dict[str, Any] = {
            "throughput": conversations * turns / elapsed,
            "write_per_step": (sum(record["aput"]) + sum(record["aput_writes"])) / steps * 1000,
            "pg_read_queries": counts.of_reads,
            "pg_modifying_nothing": counts.modifying_nothing,
            "pg_writing": counts.writing,
            "loads": len(record["aget_tuple"]),
            "steps": steps,
        }
        for call in ("aput", "aput_writes", "aget_tuple"):
            result[call] = median_ms(record[call])
            result[f"{call}_p99"] = percentile_ms(record[call], 0.99)
        result["quiet_load"] = await quiet_load(saver, threads)
        if name == "threadkeep-tiered":
            result["floor_load"] = await floor_load(saver, threads, store.prefix)
    return result


async def quiet_load(saver: Any, threads: list[str]) -> float:
    """Median time to read each thread's newest state, one read at a time."""
    samples = []
    for _ in range(PASSES):
        for thread in threads:
            start = time.perf_counter()
            state = await saver.aget_tuple(_config(thread))
            samples.append(time.perf_counter() - start)
            assert state is not None
    return median_ms(samples)


async def floor_load(saver: Any, threads: list[str], prefix: str) -> float:
    """Median time of one ``GET`` of a thread's newest state (checkpoint, metadata and
    pending writes encoded as one value) plus decoding it."""
    client = redis.asyncio.Redis.from_url(REDIS)
    try:
        for thread in threads:
            state = await saver.aget_tuple(_config(thread))
            kind, data = SERDE.dumps_typed(
                {"checkpoint": state.checkpoint, "metadata": state.metadata, "writes": state.pending_writes}
            )
            await client.set(f"{prefix}:floor:{thread}", kind.encode() + b"\0" + data)
        samples = []
        for _ in range(PASSES):
            for thread in threads:
                start = time.perf_counter()
                value = await client.get(f"{prefix}:floor:{thread}")
                kind, payload = value.split(b"\0", 1)
                SERDE.loads_typed((kind.decode(), payload))
                samples.append(time.perf_counter() - start)
        return median_ms(samples)
    finally:
        await client.aclose()


def _config(thread: str) -> RunnableConfig:
    return {"configurable": {"thread_id": thread}}


def main(runs: int = 3, conversations: int = 32, turns: int = 10) -> dict[str, Any]:
    return asyncio.run(_main(runs, conversations, turns))


async def _main(runs: int, conversations: int, turns: int) -> dict[str, Any]:
    samples: dict[str, list[dict[str, Any]]] = {name: [] for name in STORES}
    for _ in range(runs):
        for name in STORES:
            samples[name].append(await one_run(name, conversations, turns))
    results = {
        name: {key: statistics.median(s[key] for s in runs_of) for key in runs_of[0]}
        for name, runs_of in samples.items()
    }
    report(results, conversations, turns)
    return results


def report(results: dict[str, Any], conversations: int, turns: int) -> None:
    lg, pg, tiered = (results[name] for name in STORES)
    print(f"\n{conversations} conversations of {turns} turns at once (medians of the runs)")
    print(
        f"{'store':22}{'put':>16}{'put_writes':>16}{'get_tuple':>16}{'write/step':>12}"
        f"{'quiet load':>12}{'turns/s':>9}"
    )
    for name in STORES:
        r = results[name]
        print(
            f"{name:22}{r['aput']:>8.3f}/{r['aput_p99']:<7.3f}{r['aput_writes']:>8.3f}/{r['aput_writes_p99']:<7.3f}"
            f"{r['aget_tuple']:>8.3f}/{r['aget_tuple_p99']:<7.3f}{r['write_per_step']:>12.3f}"
            f"{r['quiet_load']:>12.3f}{r['throughput']:>9.1f}"
        )
    print(f"{'floor (GET + decode)':22}{tiered['floor_load']:>84.3f}")
    print("\nPostgres statements during the run (client-side count)")
    print(f"{'store':22}{'loads':>8}{'read queries':>14}{'modifying nothing':>19}{'writing':>9}")
    for name in STORES:
        r = results[name]
        print(
            f"{name:22}{r['loads']:>8.0f}{r['pg_read_queries']:>14.0f}{r['pg_modifying_nothing']:>19.0f}"
            f"{r['pg_writing']:>9.0f}"
        )
    print("\nthreadkeep-tiered")
    print(
        f"  load during the run (get_tuple median): {lg['aget_tuple'] / tiered['aget_tuple']:.1f}x faster"
        f" than langgraph-postgres"
    )
    print(f"  quiet load: {lg['quiet_load'] / tiered['quiet_load']:.1f}x faster than langgraph-postgres,")
    print(f"              {tiered['quiet_load'] / tiered['floor_load']:.2f}x the GET + decode floor's time")
    print(f"  write per step: {tiered['write_per_step'] / pg['write_per_step']:.2f}x threadkeep-postgres's")
    print(
        f"  Postgres read queries: {tiered['pg_read_queries']:.0f} against {pg['pg_read_queries']:.0f}"
        f" ({1 - tiered['pg_read_queries'] / pg['pg_read_queries']:.1%} fewer)"
    )
