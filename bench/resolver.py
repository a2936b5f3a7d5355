"""Issue 38's resolver figure (SPEC SV2): how many store reads the ownership resolver saves.

    ./dev bench resolver --lookups 100000 --lookup-threads 1000

A SQLite store holds M threads of as many users. N owner lookups, spread evenly over a
simulated ten minutes (the resolver's clock is the workload's, so the LRU's 30 s expiry
counts), pick their thread at random, uniformly or skewed (Zipf, s = 1.1: a few threads get
most of the traffic, as live conversations do). Each workload runs three ways: the store alone
(every lookup a read), one resolver with its LRU alone, and two resolvers ("two server
processes", each taking every other lookup) sharing a Redis cache
(``THREADKEEP_BENCH_REDIS_URL``, default ``redis://127.0.0.1:6379/0``, under a fresh key
prefix, deleted afterwards). Reported: store reads, the share of lookups saved, and the mean
lookup time.
"""

from __future__ import annotations

import os
import random
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from threadkeep import Settings, open_checkpointer, operator_scope
from threadkeep.metrics import Metrics
from threadkeep.resolver import OwnershipResolver

REDIS_URL = os.environ.get("THREADKEEP_BENCH_REDIS_URL", "redis://127.0.0.1:6379/0")
WINDOW_SECONDS = 600.0


class _Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def _seed(saver: Any, threads: int) -> list[str]:
    from langgraph.checkpoint.base import empty_checkpoint

    ids = [f"thread-{n}" for n in range(threads)]
    for n, thread_id in enumerate(ids):
        config = {"configurable": {"thread_id": thread_id, "checkpoint_ns": "", "user_id": f"user-{n}"}}
        saver.put(config, empty_checkpoint(), {"source": "input", "step": -1}, {})
    return ids


def _workload(ids: list[str], lookups: int, skew: bool, seed: int) -> list[str]:
    rng = random.Random(seed)
    weights = [1 / (rank + 1) ** 1.1 for rank in range(len(ids))] if skew else None
    return rng.choices(ids, weights=weights, k=lookups)


def _run(
    saver: Any, picks: list[str], resolvers: list[OwnershipResolver] | None, clock: _Clock
) -> dict[str, Any]:
    step = WINDOW_SECONDS / len(picks)
    started = time.perf_counter()
    if resolvers is None:
        with operator_scope():
            for thread_id in picks:
                saver.owner_of(thread_id)
        reads = len(picks)
    else:
        for n, thread_id in enumerate(picks):
            clock.now = n * step
            resolvers[n % len(resolvers)].owner_of(thread_id)
        reads = sum(r.stats.store_reads for r in resolvers)
    elapsed = time.perf_counter() - started
    return {
        "store_reads": reads,
        "saved": round(1 - reads / len(picks), 4),
        "mean_us": round(elapsed / len(picks) * 1e6, 1),
    }


def main(*, lookups: int = 100_000, threads: int = 1000) -> dict[str, Any]:
    """Measure; print the table; the results (one run: the counts are exact)."""
    results: dict[str, Any] = {"lookups": lookups, "threads": threads, "window_seconds": WINDOW_SECONDS}
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "resolver.sqlite"
        with open_checkpointer("sqlite", str(path), settings=Settings(), metrics=Metrics()) as saver:
            ids = _seed(saver, threads)
            for skew in (False, True):
                picks = _workload(ids, lookups, skew, seed=38)
                name = "zipf" if skew else "uniform"
                clock = _Clock()
                local = [OwnershipResolver(saver, clock=clock)]
                prefix = f"tkbenchowner{uuid.uuid4().hex[:8]}"
                shared = [
                    OwnershipResolver(saver, redis_url=REDIS_URL, key_prefix=prefix, clock=clock)
                    for _ in range(2)
                ]
                try:
                    results[name] = {
                        "store only": _run(saver, picks, None, clock),
                        "LRU": _run(saver, picks, local, _clock_reset(clock)),
                        "2 x LRU + shared Redis": _run(saver, picks, shared, _clock_reset(clock)),
                    }
                finally:
                    _drop(prefix)
                    for resolver in shared:
                        resolver.close()
    print(f"ownership resolver: {lookups} lookups over {threads} threads in {WINDOW_SECONDS:g} s (simulated)")
    print(f"{'workload':10}{'tiers':26}{'store reads':>12}{'saved':>9}{'mean µs':>10}")
    for name in ("uniform", "zipf"):
        for tiers, row in results[name].items():
            print(f"{name:10}{tiers:26}{row['store_reads']:>12}{row['saved']:>9.1%}{row['mean_us']:>10}")
    return {"resolver": results}


def _clock_reset(clock: _Clock) -> _Clock:
    clock.now = 0.0
    return clock


def _drop(prefix: str) -> None:
    import redis

    client = redis.Redis.from_url(REDIS_URL)
    for key in client.scan_iter(match=f"{prefix}:*", count=1000):
        client.delete(key)
