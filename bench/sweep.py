"""Issue 5's benchmark (SPEC SW8): sweeping 100,000 expired threads off Postgres while another
process keeps writing live threads.

    ./dev bench sweep --threads 100000 --runs 3

Each run seeds a fresh Postgres schema with N expired threads of 3 checkpoints each (with
their channel values, pending writes and messages: a thread as a short agent run leaves it),
half of them marked finished long ago and half waiting past the waiting horizon. A writer
process runs the issue-3 conversation on live threads all along and records each ``put``'s
latency. The sweep runs in a process of its own, which reports its peak resident memory.

Reported: threads swept per second; the sweep process's peak RSS at N and at N/4 (flat
memory: the same peak for four times the threads); and the writer's p99 ``put`` latency in
the seconds before the sweep and during it.
"""

from __future__ import annotations

import multiprocessing as mp
import resource
import statistics
import time
import uuid
from typing import Any

import psycopg

from bench.servers import POSTGRES
from bench.timing import instrument, percentile_ms
from threadkeep import Settings, open_checkpointer
from threadkeep.sweep import sweep_checkpoints
from threadkeep.workload import build_agent, turn_input

DAY = 86_400.0
BASELINE_SECONDS = 15.0

# N threads, 3 checkpoints each with 2 channel values, 2 pending writes and 3 messages with
# their links; created 30 days ago. Even tids are marked finished (due 29 days ago).
SEED = (
    """INSERT INTO tk_threads (thread_id, owner, active_at, finished_due)
    SELECT 'expired-' || n, 'anonymous', %(then)s,
           CASE WHEN n %% 2 = 0 THEN %(then)s + 86400 END
    FROM generate_series(1, %(threads)s) AS n""",
    """INSERT INTO tk_checkpoints (tid, checkpoint_ns, checkpoint_id, parent_id, run_id, created_at,
                                checkpoint, metadata)
    SELECT t.tid, '', 'cp' || k, CASE WHEN k > 1 THEN 'cp' || (k - 1) END, 'run-' || t.tid, %(then)s,
           '{"v": 4, "channel_versions": {"messages": "1", "step": "1"}}'::jsonb, '{"step": 1}'::jsonb
    FROM tk_threads AS t, generate_series(1, 3) AS k WHERE t.thread_id LIKE 'expired-%%'""",
    """INSERT INTO tk_blobs (tid, checkpoint_ns, channel, version, type, value)
    SELECT t.tid, '', c, '1', 'json', convert_to(repeat('x', 300), 'UTF8')
    FROM tk_threads AS t, unnest(ARRAY['messages', 'step']) AS c WHERE t.thread_id LIKE 'expired-%%'""",
    """INSERT INTO tk_writes (tid, checkpoint_ns, checkpoint_id, task_id, idx, task_path, channel,
                           type, value)
    SELECT t.tid, '', 'cp3', 'task', i, '', 'messages', 'json', convert_to(repeat('w', 200), 'UTF8')
    FROM tk_threads AS t, generate_series(0, 1) AS i WHERE t.thread_id LIKE 'expired-%%'""",
    """INSERT INTO tk_messages (tid, digest, type, value)
    SELECT t.tid, decode(md5(t.tid || '-' || m), 'hex'), 'json', convert_to(repeat('m', 800), 'UTF8')
    FROM tk_threads AS t, generate_series(1, 3) AS m WHERE t.thread_id LIKE 'expired-%%'""",
    """INSERT INTO tk_message_links (tid, node, prev, digest)
    SELECT t.tid, decode(md5('n' || t.tid || '-' || m), 'hex'), NULL, decode(md5(t.tid || '-' || m), 'hex')
    FROM tk_threads AS t, generate_series(1, 3) AS m WHERE t.thread_id LIKE 'expired-%%'""",
)
TABLES = ("tk_threads", "tk_checkpoints", "tk_blobs", "tk_writes", "tk_messages", "tk_message_links")


def _dsn(schema: str) -> str:
    return f"{POSTGRES} options='-c search_path={schema}'"


def seed(schema: str, threads: int) -> None:
    open_checkpointer("postgres", _dsn(schema), settings=Settings()).close()  # the schema
    with psycopg.connect(_dsn(schema), autocommit=True) as conn:
        then = time.time() - 30 * DAY
        for statement in SEED:
            conn.execute(statement, {"then": then, "threads": threads})  # type: ignore[arg-type]
        for table in TABLES:
            conn.execute(f"VACUUM ANALYZE {table}")  # type: ignore[arg-type]


def writer(schema: str, stop: Any, out: Any) -> None:
    """Keep running conversations on live threads; send back (time, put latency) pairs."""
    saver = open_checkpointer("postgres", _dsn(schema), settings=Settings())
    record = instrument(saver)
    graph = build_agent(saver)
    samples: list[tuple[float, float]] = []
    turn = 0
    while not stop.is_set():
        start = len(record["put"])
        graph.invoke(turn_input(turn), {"configurable": {"thread_id": f"live-{turn // 5}"}})
        now = time.time()
        samples.extend((now, latency) for latency in record["put"][start:])
        turn += 1
    saver.close()
    out.put(samples)


def sweeper(schema: str, out: Any) -> None:
    """Run one sweep; send back its result, its duration and this process's peak RSS."""
    with open_checkpointer("postgres", _dsn(schema), settings=Settings()) as saver:
        start = time.perf_counter()
        result = sweep_checkpoints(saver)
        elapsed = time.perf_counter() - start
    peak_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    out.put((result.swept_count, result.finished_swept, result.waiting_swept, elapsed, peak_kib))


def one_run(threads: int, with_writer: bool = True) -> dict[str, float]:
    schema = f"tk_sweep_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(POSTGRES, autocommit=True) as conn:
        conn.execute(f"CREATE SCHEMA {schema}")  # type: ignore[arg-type]
    ctx = mp.get_context("spawn")
    try:
        seed(schema, threads)
        stop, samples_out, sweep_out = ctx.Event(), ctx.Queue(), ctx.Queue()
        live = ctx.Process(target=writer, args=(schema, stop, samples_out)) if with_writer else None
        if live is not None:
            live.start()
            time.sleep(BASELINE_SECONDS)
        began = time.time()
        sweep = ctx.Process(target=sweeper, args=(schema, sweep_out))
        sweep.start()
        swept, finished, waiting, elapsed, peak_kib = sweep_out.get()
        sweep.join()
        ended = time.time()
        result = {
            "swept": swept,
            "finished_swept": finished,
            "waiting_swept": waiting,
            "threads_per_second": swept / elapsed,
            "peak_rss_mib": peak_kib / 1024,
        }
        if live is not None:
            stop.set()
            samples = samples_out.get()
            live.join()
            before = [lat for at, lat in samples if began - BASELINE_SECONDS + 3 <= at < began]
            during = [lat for at, lat in samples if began <= at <= ended]
            result.update(
                p99_before_ms=percentile_ms(before, 0.99),
                p99_during_ms=percentile_ms(during, 0.99),
                puts_before=len(before),
                puts_during=len(during),
            )
        return result
    finally:
        with psycopg.connect(POSTGRES, autocommit=True) as conn:
            conn.execute(f"DROP SCHEMA {schema} CASCADE")  # type: ignore[arg-type]


def main(runs: int = 3, threads: int = 100_000) -> dict[str, Any]:
    full = [one_run(threads) for _ in range(runs)]
    quarter = one_run(threads // 4, with_writer=False)
    median = {key: statistics.median(run[key] for run in full) for key in full[0]}
    report(median, quarter, threads, runs)
    return {"runs": full, "median": median, "quarter": quarter}


def report(median: dict[str, float], quarter: dict[str, float], threads: int, runs: int) -> None:
    print(f"\nSweep of {threads:,} expired threads on Postgres with a live writer (median of {runs} runs)")
    print(
        f"  swept {median['swept']:,.0f} ({median['finished_swept']:,.0f} finished, "
        f"{median['waiting_swept']:,.0f} waiting) at {median['threads_per_second']:,.0f} threads/s"
    )
    print(
        f"  sweep process peak RSS: {median['peak_rss_mib']:.1f} MiB for {threads:,} threads, "
        f"{quarter['peak_rss_mib']:.1f} MiB for {threads // 4:,}"
    )
    ratio = median["p99_during_ms"] / median["p99_before_ms"]
    print(
        f"  live writer put p99: {median['p99_before_ms']:.1f} ms before the sweep, "
        f"{median['p99_during_ms']:.1f} ms during it ({ratio:.2f}x; {median['puts_during']:.0f} puts during)"
    )
