"""Issue 3's benchmark: the conversation on Postgres and Redis, next to LangGraph's
``AsyncPostgresSaver`` and to floors (the least a store can do per step).

    ./dev bench servers --runs 3

Stores (every Postgres store on a pool of at most 8 connections):

- ``langgraph-postgres``: LangGraph's ``AsyncPostgresSaver``.
- ``threadkeep-postgres``, ``threadkeep-redis``: threadkeep's providers.
- ``threadkeep-pg-z256``: the Postgres provider with ``INLINE_COMPRESS_BYTES=256`` (values
  over 256 bytes stored zstd-compressed; the default is 65536, SPEC C5).
- ``floor-postgres``: one INSERT of the whole encoded state per step, one transaction each;
  a load is one SELECT of the newest row plus decoding it.
- ``floor-redis``: one SET of the whole encoded state per step; a load is one GET plus decoding.
- ``floor-graph`` (throughput only): LangGraph's ``InMemorySaver`` keeping the live objects,
  nothing encoded or sent: what the graph itself costs.

Reported: bytes stored after K turns; per-call ``put``/``put_writes``/``get_tuple`` median
and p99 over a K=40 conversation; a cold load (a new saver instance reading the newest state
of the finished 40-turn thread, the median of 15: its pool open, its caches empty, the tables ANALYZEd as
autovacuum would have them in service); and the throughput of 32 conversations running at
once, 10 and 40 turns long, with each ``put``'s and ``get_tuple``'s median and p99 latency
in those runs, the CPU time per turn of this process and of the local
Postgres and Redis server processes (read from ``/proc``; shown as ``-`` elsewhere); with
``--freeze-gc``, each throughput run starts after ``gc.freeze()`` (docs/operations.md). Each
store starts after a Postgres ``CHECKPOINT``, so what the store before it wrote is not
flushed while this one is measured.
"""

from __future__ import annotations

import asyncio
import gc
import os
import statistics
import time
import uuid
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import psycopg
from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import (
    BaseCheckpointSaver,
    ChannelVersions,
    Checkpoint,
    CheckpointMetadata,
    CheckpointTuple,
)
from psycopg.conninfo import make_conninfo
from psycopg_pool import AsyncConnectionPool

from bench.timing import instrument, median_ms, percentile_ms
from threadkeep import Settings, open_checkpointer
from threadkeep.codec.serde import build_serde
from threadkeep.workload import build_agent, turn_input

POSTGRES = "host=127.0.0.1 user=postgres dbname=test"
REDIS = "redis://127.0.0.1:6379/0"
POOL = 8
# Fresh saver instances per cold load measurement (the median is kept).
COLD_LOADS = 15
STORES = (
    "langgraph-postgres",
    "threadkeep-postgres",
    "threadkeep-pg-z256",
    "threadkeep-redis",
    "floor-postgres",
    "floor-redis",
)
# Stores measured only for throughput.
THROUGHPUT_ONLY = ("floor-graph",)
SERVER_PROCESSES = ("postgres", "redis-server")
# The Postgres provider's settings, by store name.
PG_SETTINGS = {
    "threadkeep-postgres": Settings(pool_max_size=POOL),
    "threadkeep-pg-z256": Settings(pool_max_size=POOL, inline_compress_bytes=256),
}
SERDE = build_serde()
THREADKEEP_TABLES = (
    "tk_threads",
    "tk_checkpoints",
    "tk_blobs",
    "tk_writes",
    "tk_messages",
    "tk_message_links",
)


class FloorSaver(BaseCheckpointSaver[str]):
    """The least a per-step store can do: the whole encoded state in one write, one read back.

    Not a usable checkpointer (no history, no pending writes): a yardstick.
    """

    def __init__(self, write: Callable[[str, bytes], Any], read: Callable[[str], Any]) -> None:
        super().__init__()
        self.write, self.read = write, read

    async def aput(
        self,
        config: RunnableConfig,
        checkpoint: Checkpoint,
        metadata: CheckpointMetadata,
        new_versions: ChannelVersions,
    ) -> RunnableConfig:
        thread_id = config["configurable"]["thread_id"]
        kind, data = SERDE.dumps_typed({"checkpoint": checkpoint, "metadata": dict(metadata)})
        await self.write(thread_id, kind.encode() + b"\0" + data)
        return {
            "configurable": {"thread_id": thread_id, "checkpoint_ns": "", "checkpoint_id": checkpoint["id"]}
        }

    async def aput_writes(
        self, config: RunnableConfig, writes: Sequence[tuple[str, Any]], task_id: str, task_path: str = ""
    ) -> None:
        return None

    async def aget_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        data = await self.read(config["configurable"]["thread_id"])
        if data is None:
            return None
        kind, payload = data.split(b"\0", 1)
        state = SERDE.loads_typed((kind.decode(), payload))
        return CheckpointTuple(config, state["checkpoint"], state["metadata"], None, [])


class LiveObjects:
    """A serializer that keeps values as they are: ``floor-graph`` stores live objects."""

    def dumps_typed(self, obj: Any) -> tuple[str, Any]:
        return "live", obj

    def loads_typed(self, data: tuple[str, Any]) -> Any:
        return data[1]


@asynccontextmanager
async def fresh_schema() -> AsyncIterator[tuple[str, str]]:
    """A new Postgres schema of our own and a connection string whose ``search_path`` is it;
    the schema is dropped on exit."""
    schema = f"tk_bench_{uuid.uuid4().hex[:10]}"
    async with await psycopg.AsyncConnection.connect(POSTGRES, autocommit=True) as admin:
        await admin.execute(f"CREATE SCHEMA {schema}")
    try:
        await flush()
        yield schema, f"{POSTGRES} options='-c search_path={schema}'"
    finally:
        async with await psycopg.AsyncConnection.connect(POSTGRES, autocommit=True) as admin:
            await admin.execute(f"DROP SCHEMA {schema} CASCADE")


@asynccontextmanager
async def fresh_database() -> AsyncIterator[tuple[str, str]]:
    """A new Postgres database of our own, its ``public`` schema and a connection string to
    it; the database is dropped on exit. Unlike a schema in a shared database, what other
    clients of the server do in their databases (their advisory locks) cannot reach it."""
    database = f"tk_bench_{uuid.uuid4().hex[:10]}"
    async with await psycopg.AsyncConnection.connect(POSTGRES, autocommit=True) as admin:
        await admin.execute(f"CREATE DATABASE {database}")
    try:
        await flush()
        yield "public", make_conninfo(POSTGRES, dbname=database)
    finally:
        async with await psycopg.AsyncConnection.connect(POSTGRES, autocommit=True) as admin:
            await admin.execute(f"DROP DATABASE {database} WITH (FORCE)")


async def flush() -> None:
    """A Postgres ``CHECKPOINT``: what was written and dropped before is flushed now, not while
    the next store is measured (a checkpoint in the middle of a cold load made it 1.5x slower)."""
    async with await psycopg.AsyncConnection.connect(POSTGRES, autocommit=True) as admin:
        await admin.execute("CHECKPOINT")


@asynccontextmanager
async def open_store(name: str) -> AsyncIterator[Store]:
    """A fresh store, in its own Postgres schema or under its own Redis key prefix."""
    async with fresh_schema() as (schema, dsn), open_store_in(name, schema, dsn) as store:
        yield store


@asynccontextmanager
async def open_store_in(name: str, schema: str, dsn: str) -> AsyncIterator[Store]:
    """The store ``name`` in ``schema`` (``dsn`` is its connection string, from :func:`fresh_schema`),
    or under a Redis key prefix of its own."""
    prefix = f"tkb{uuid.uuid4().hex[:8]}"
    closers: list[Callable[[], Any]] = []
    try:
        if name == "langgraph-postgres":
            from langgraph.checkpoint.postgres.aio import AsyncPostgresSaver
            from psycopg.rows import dict_row

            pool = AsyncConnectionPool(
                dsn,
                max_size=POOL,
                open=False,
                kwargs={"autocommit": True, "prepare_threshold": 0, "row_factory": dict_row},
            )
            await pool.open(wait=True)
            closers.append(pool.close)
            saver: Any = AsyncPostgresSaver(pool)  # type: ignore[arg-type]
            await saver.setup()
            yield Store(saver, schema, ["checkpoints", "checkpoint_blobs", "checkpoint_writes"], conninfo=dsn)
        elif name in PG_SETTINGS:
            saver = open_checkpointer("postgres", dsn, settings=PG_SETTINGS[name])
            closers.append(saver.aclose)
            yield Store(saver, schema, list(THREADKEEP_TABLES), conninfo=dsn)
        elif name == "threadkeep-tiered":
            saver = open_checkpointer(
                "tiered",
                dsn,
                settings=Settings(pool_max_size=POOL, cache_url=REDIS),
                cache_prefix=prefix,
            )
            closers.append(saver.aclose)
            closers.append(lambda: _redis_drop(prefix))
            yield Store(saver, schema, list(THREADKEEP_TABLES), prefix=prefix, conninfo=dsn)
        elif name == "threadkeep-redis":
            saver = open_checkpointer("redis", REDIS, settings=Settings(), key_prefix=prefix)
            closers.append(saver.aclose)
            closers.append(lambda: _redis_drop(prefix))
            yield Store(saver, prefix=prefix)
        elif name == "floor-postgres":
            pool = AsyncConnectionPool(dsn, max_size=POOL, open=False, kwargs={"autocommit": True})
            await pool.open(wait=True)
            closers.append(pool.close)
            async with pool.connection() as conn:
                await conn.execute(
                    "CREATE TABLE floor (thread_id TEXT, step BIGSERIAL, state BYTEA,"
                    " PRIMARY KEY (thread_id, step))"
                )

            async def write(thread_id: str, data: bytes) -> None:
                async with pool.connection() as conn, conn.transaction():
                    await conn.execute(
                        "INSERT INTO floor (thread_id, state) VALUES (%s, %s)", (thread_id, data)
                    )

            async def read(thread_id: str) -> bytes | None:
                async with pool.connection() as conn:
                    cursor = await conn.execute(
                        "SELECT state FROM floor WHERE thread_id = %s ORDER BY step DESC LIMIT 1",
                        (thread_id,),
                    )
                    row = await cursor.fetchone()
                    return None if row is None else row[0]

            yield Store(FloorSaver(write, read), schema, ["floor"], conninfo=dsn)
        elif name == "floor-redis":
            import redis.asyncio

            client = redis.asyncio.Redis.from_url(REDIS)
            closers.append(client.aclose)
            closers.append(lambda: _redis_drop(prefix))

            async def set_(thread_id: str, data: bytes) -> None:
                await client.set(f"{prefix}:{thread_id}", data)

            async def get(thread_id: str) -> bytes | None:
                return await client.get(f"{prefix}:{thread_id}")  # type: ignore[no-any-return]

            yield Store(FloorSaver(set_, get), prefix=prefix)
        elif name == "floor-graph":
            from langgraph.checkpoint.memory import InMemorySaver

            yield Store(InMemorySaver(serde=LiveObjects()))
        else:
            raise ValueError(name)
    finally:
        for close in reversed(closers):
            result = close()
            if asyncio.iscoroutine(result):
                await result


@dataclass
class Store:
    """A store under test: its saver, and where its bytes live (Postgres tables, in the
    database ``conninfo`` names, or Redis keys)."""

    saver: Any
    schema: str = ""
    tables: list[str] = field(default_factory=list)
    prefix: str = ""
    conninfo: str = POSTGRES

    async def size(self) -> int:
        """Bytes stored: ``pg_total_relation_size`` of the tables, or ``MEMORY USAGE`` of the keys."""
        if not self.schema:
            return await _redis_bytes(self.prefix)
        async with await psycopg.AsyncConnection.connect(self.conninfo, autocommit=True) as conn:
            total = 0
            for table in self.tables:
                cursor = await conn.execute("SELECT pg_total_relation_size(%s)", (f"{self.schema}.{table}",))
                total += (await cursor.fetchone())[0]  # type: ignore[index]
            return total

    async def analyze(self) -> None:
        """Give Postgres statistics on the tables, as autovacuum would in a store in service."""
        async with await psycopg.AsyncConnection.connect(self.conninfo, autocommit=True) as conn:
            for table in self.tables:
                await conn.execute(f"ANALYZE {self.schema}.{table}")


async def _redis_bytes(prefix: str) -> int:
    import redis.asyncio

    client = redis.asyncio.Redis.from_url(REDIS)
    total = 0
    async for key in client.scan_iter(match=f"{prefix}:*", count=1000):
        total += await client.memory_usage(key) or 0
    await client.aclose()
    return total


async def _redis_drop(prefix: str) -> None:
    import redis.asyncio

    client = redis.asyncio.Redis.from_url(REDIS)
    async for key in client.scan_iter(match=f"{prefix}:*", count=1000):
        await client.delete(key)
    await client.aclose()


async def conversation(saver: Any, thread_id: str, turns: int, first: int = 0) -> None:
    graph = build_agent(saver)
    for turn in range(first, first + turns):
        await graph.ainvoke(turn_input(turn), {"configurable": {"thread_id": thread_id}})


async def one_run(name: str, turns: tuple[int, ...]) -> dict[str, Any]:
    """Sizes at each K, per-call latencies over the longest conversation, then a cold load."""
    gc.collect()
    result: dict[str, Any] = {}
    async with open_store(name) as store:
        saver = store.saver
        record = instrument(saver)
        done = 0
        for k in turns:
            await conversation(saver, "bench", k - done, first=done)
            done = k
            result[f"bytes@{k}"] = await store.size()
        for call in ("aput", "aput_writes", "aget_tuple"):
            result[call] = median_ms(record[call])
            result[f"{call}_p99"] = percentile_ms(record[call], 0.99)
        if store.schema:
            await store.analyze()
        result["cold_load"] = await cold_load(name, saver)
    return result


async def cold_load(name: str, saver: Any) -> float:
    """A new saver instance on the same store reads the newest state of the finished thread."""
    config: RunnableConfig = {"configurable": {"thread_id": "bench"}}
    # Each state read is let go after its clock stops: freeing one (its 320 messages) costs
    # 0.1-0.3 ms, which the load after it would otherwise count.
    if name.startswith("floor"):
        samples = []
        for _ in range(COLD_LOADS):
            start = time.perf_counter()
            state = await saver.aget_tuple(config)
            samples.append(time.perf_counter() - start)
            del state
        return median_ms(samples)
    samples = []
    for _ in range(COLD_LOADS):
        fresh = await _fresh_instance(name, saver)
        await fresh.aget_tuple({"configurable": {"thread_id": "warm-up"}})  # connections open, caches empty
        start = time.perf_counter()
        state = await fresh.aget_tuple(config)
        samples.append(time.perf_counter() - start)
        assert state is not None
        del state
        if hasattr(fresh, "aclose"):
            await fresh.aclose()
    return median_ms(samples)


async def _fresh_instance(name: str, saver: Any) -> Any:
    if name == "langgraph-postgres":
        from langgraph.checkpoint.postgres.aio import AsyncPostgresSaver
        from psycopg.rows import dict_row

        pool = AsyncConnectionPool(
            saver.conn.conninfo,
            max_size=POOL,
            open=False,
            kwargs={"autocommit": True, "prepare_threshold": 0, "row_factory": dict_row},
        )
        await pool.open(wait=True)
        fresh = AsyncPostgresSaver(pool)  # type: ignore[arg-type]
        fresh.aclose = pool.close  # type: ignore[attr-defined]
        return fresh
    if name in PG_SETTINGS:
        return open_checkpointer("postgres", saver.backend.engine.conninfo, settings=PG_SETTINGS[name])
    return open_checkpointer("redis", REDIS, settings=Settings(), key_prefix=saver.backend.space.prefix)


async def throughput(
    name: str, conversations: int, turns: int, *, freeze_gc: bool = False
) -> dict[str, float]:
    """Turns per second with ``conversations`` conversations running at once, and the CPU
    milliseconds per turn of this process and of the servers. With ``freeze_gc``, the
    objects alive before the run (the imported libraries', mostly) are moved out of the
    collector's reach first (``gc.freeze()``), as an application may do after it starts."""
    gc.collect()
    if freeze_gc:
        gc.freeze()
    try:
        return await _throughput(name, conversations, turns)
    finally:
        if freeze_gc:
            gc.unfreeze()


async def _throughput(name: str, conversations: int, turns: int) -> dict[str, float]:
    async with open_store(name) as store:
        saver = store.saver
        record = instrument(saver)
        start, cpu, server = time.perf_counter(), time.process_time(), server_cpu()
        await asyncio.gather(*(conversation(saver, f"c{i}", turns) for i in range(conversations)))
        elapsed, done = time.perf_counter() - start, conversations * turns
        server_after = server_cpu()
        measured = {
            "turns_per_s": done / elapsed,
            "client_ms": (time.process_time() - cpu) * 1000 / done,
            "server_ms": float("nan")
            if server is None or server_after is None
            else (server_after - server) * 1000 / done,
        }
        # Each call's latency while every conversation runs at once: the event loop shared by
        # all of them, the pool's connections taken in turn.
        for call in ("aput", "aget_tuple"):
            if record[call]:
                measured[f"{call}_p50"] = median_ms(record[call])
                measured[f"{call}_p99"] = percentile_ms(record[call], 0.99)
        return measured


def server_cpu() -> float | None:
    """CPU seconds the local Postgres and Redis server processes have used (their own, and
    their reaped children's), from ``/proc``; None where there is no ``/proc``."""
    if not os.path.isdir("/proc/self"):
        return None
    ticks = 0
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/stat") as stat:
                line = stat.read()
        except OSError:  # gone since the listing
            continue
        name, fields = line[line.index("(") + 1 : line.rindex(")")], line[line.rindex(")") + 2 :].split()
        if name.startswith(SERVER_PROCESSES):
            ticks += sum(int(field) for field in fields[11:15])  # utime, stime, cutime, cstime
    return ticks / os.sysconf("SC_CLK_TCK")


def main(
    runs: int = 3,
    turns: tuple[int, ...] = (5, 10, 20, 40),
    conversations: int = 32,
    conversation_turns: tuple[int, ...] = (10, 40),
    freeze_gc: bool = False,
) -> dict[str, Any]:
    return asyncio.run(_main(runs, turns, conversations, conversation_turns, freeze_gc))


async def _main(
    runs: int,
    turns: tuple[int, ...],
    conversations: int,
    conversation_turns: tuple[int, ...],
    freeze_gc: bool,
) -> dict[str, Any]:
    samples: dict[str, list[dict[str, Any]]] = {name: [] for name in (*STORES, *THROUGHPUT_ONLY)}
    for _ in range(runs):
        for name in STORES:
            samples[name].append(await one_run(name, turns))
        for name in THROUGHPUT_ONLY:
            samples[name].append({})
        for length in conversation_turns:
            for name in (*STORES, *THROUGHPUT_ONLY):
                measured = await throughput(name, conversations, length, freeze_gc=freeze_gc)
                samples[name][-1][f"throughput@{length}"] = measured["turns_per_s"]
                samples[name][-1][f"client_ms@{length}"] = measured["client_ms"]
                samples[name][-1][f"server_ms@{length}"] = measured["server_ms"]
                for call in ("aput", "aget_tuple"):
                    for stat in ("p50", "p99"):
                        if f"{call}_{stat}" in measured:
                            samples[name][-1][f"{call}_{stat}@{length}"] = measured[f"{call}_{stat}"]
    results = {
        name: {key: statistics.median(s[key] for s in runs_of) for key in runs_of[0]}
        for name, runs_of in samples.items()
    }
    report(results, turns, conversations, conversation_turns)
    if freeze_gc:
        print("(each throughput run started after gc.freeze(); run without --freeze-gc for the defaults)")
    return results


def report(
    results: dict[str, Any], turns: tuple[int, ...], conversations: int, conversation_turns: tuple[int, ...]
) -> None:
    lg, ours = results["langgraph-postgres"], results["threadkeep-postgres"]
    print("\nBytes stored after K turns on one thread")
    print("(Postgres: pg_total_relation_size of the store's tables; Redis: MEMORY USAGE of its keys)")
    print(f"{'store':22}" + "".join(f"{f'K={k}':>13}" for k in turns))
    for name in STORES:
        print(f"{name:22}" + "".join(f"{results[name][f'bytes@{k}']:>13,.0f}" for k in turns))
    k = turns[-1]
    print(f"\nPer-call latency over the K={k} conversation (ms; median / p99), and a cold load (ms)")
    print(f"{'store':22}{'put':>16}{'put_writes':>16}{'get_tuple':>16}{'cold load':>11}")
    for name in STORES:
        r = results[name]
        print(
            f"{name:22}{r['aput']:>8.3f}/{r['aput_p99']:<7.3f}{r['aput_writes']:>8.3f}/{r['aput_writes_p99']:<7.3f}"
            f"{r['aget_tuple']:>8.3f}/{r['aget_tuple_p99']:<7.3f}{r['cold_load']:>11.3f}"
        )
    print(f"\nThroughput: turns per second, {conversations} conversations at once;")
    print("CPU ms per turn: this process (the graph and the saver's client) / the servers")
    print(f"{'store':22}" + "".join(f"{f'{n} turns each':>26}" for n in conversation_turns))
    for name in (*STORES, *THROUGHPUT_ONLY):
        r = results[name]
        print(
            f"{name:22}"
            + "".join(
                f"{r[f'throughput@{n}']:>10.1f} ({r[f'client_ms@{n}']:6.2f} / {r[f'server_ms@{n}']:5.2f})"
                for n in conversation_turns
            )
        )
    print(f"\nPer-call latency in the {conversations}-conversation runs (ms; median / p99)")
    print(f"{'store':22}" + "".join(f"{f'{n} turns: put':>20}{'get_tuple':>16}" for n in conversation_turns))
    for name in STORES:
        r = results[name]
        print(
            f"{name:22}"
            + "".join(
                f"{r[f'aput_p50@{n}']:>11.2f}/{r[f'aput_p99@{n}']:<8.2f}"
                f"{r[f'aget_tuple_p50@{n}']:>7.2f}/{r[f'aget_tuple_p99@{n}']:<8.2f}"
                for n in conversation_turns
            )
        )
    print("\nthreadkeep-postgres against langgraph-postgres")
    print(f"  bytes at K={k}: {lg[f'bytes@{k}'] / ours[f'bytes@{k}']:.1f}x smaller", end="")
    z256 = results["threadkeep-pg-z256"][f"bytes@{k}"]
    print(f" ({lg[f'bytes@{k}'] / z256:.1f}x with values over 256 B compressed)")
    print(f"  put median: {ours['aput'] / lg['aput']:.2f} of its time")
    print(f"  cold load: {lg['cold_load'] / ours['cold_load']:.2f}x faster")
    graph = results["floor-graph"]
    for n in conversation_turns:
        print(f"  throughput, {n}-turn conversations: {ours[f'throughput@{n}'] / lg[f'throughput@{n}']:.2f}x")
        mine, theirs = saver_cpu_ms(ours, graph, n), saver_cpu_ms(lg, graph, n)
        print(
            f"  saver CPU per turn, {n}-turn conversations (client beyond the graph's own, plus servers):"
            f" {mine:.1f} vs {theirs:.1f} ms (LangGraph's / ours: {theirs / mine:.2f}x)"
        )
    redis, floor = results["threadkeep-redis"], results["floor-redis"]
    print(f"threadkeep-redis cold load: {redis['cold_load'] / floor['cold_load']:.2f}x the raw-GET floor's")


def saver_cpu_ms(store: dict[str, Any], graph: dict[str, Any], turns: int) -> float:
    """The CPU a saver costs per turn: this process's beyond what the graph alone takes
    (``floor-graph``), plus the servers'."""
    return float(store[f"client_ms@{turns}"] - graph[f"client_ms@{turns}"] + store[f"server_ms@{turns}"])
