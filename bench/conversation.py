"""Issue 2's benchmark: the scripted tool-calling conversation on in-process stores.

For K = 5, 10, 20, 40 turns on one thread it runs the same conversation against LangGraph's
``InMemorySaver`` and ``SqliteSaver`` and threadkeep's ``memory`` and ``sqlite`` providers,
and reports bytes stored and per-call latency medians (median over ``--runs`` runs).

    ./dev bench conversation --runs 5
"""

from __future__ import annotations

import gc
import sqlite3
import statistics
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from langgraph.checkpoint.memory import InMemorySaver
from langgraph.checkpoint.sqlite import SqliteSaver

from bench.timing import instrument, median_ms
from threadkeep import Settings, open_checkpointer
from threadkeep.workload import build_agent, run_turns

TURNS = (5, 10, 20, 40)


class Store:
    """One saver on a fresh store, and how to measure its size."""

    def __init__(self, name: str, saver: Any, size: Callable[[], int], close: Callable[[], None]) -> None:
        self.name, self.saver, self.size, self.close = name, saver, size, close


def _file_bytes(path: Path) -> Callable[[], int]:
    def size() -> int:
        conn = sqlite3.connect(path)
        try:
            conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
            conn.execute("VACUUM")
        finally:
            conn.close()
        return path.stat().st_size

    return size


def _memory_bytes(saver: InMemorySaver) -> int:
    total = 0
    for checkpoints in saver.storage.values():
        for by_id in checkpoints.values():
            for (_, checkpoint), (_, metadata), _parent in by_id.values():
                total += len(checkpoint) + len(metadata)
    total += sum(len(blob) for _, blob in saver.blobs.values())
    total += sum(len(v[2][1]) for writes in saver.writes.values() for v in writes.values())
    return total


def open_store(name: str, folder: Path, *, synchronous: str = "NORMAL") -> Store:
    if name == "langgraph-memory":
        lg_memory = InMemorySaver()
        return Store(name, lg_memory, lambda: _memory_bytes(lg_memory), lambda: None)
    if name == "langgraph-sqlite":
        path = folder / "langgraph.sqlite"
        conn = sqlite3.connect(path, check_same_thread=False)
        lg_sqlite = SqliteSaver(conn)
        return Store(name, lg_sqlite, _file_bytes(path), conn.close)
    if name == "threadkeep-memory":
        tk_memory = open_checkpointer("memory", settings=Settings())
        return Store(name, tk_memory, lambda: tk_memory.stats()["payload_bytes"], tk_memory.close)
    if name.startswith("threadkeep-sqlite"):
        path = folder / f"{name}.sqlite"
        tk_sqlite = open_checkpointer("sqlite", str(path), settings=Settings(), synchronous=synchronous)
        return Store(name, tk_sqlite, _file_bytes(path), tk_sqlite.close)
    raise ValueError(name)


STORES = {
    "langgraph-memory": {},
    "langgraph-sqlite": {},
    "threadkeep-memory": {},
    "threadkeep-sqlite": {"synchronous": "NORMAL"},
    "threadkeep-sqlite-full": {"synchronous": "FULL"},
}


def run_once(name: str, turns: int) -> dict[str, Any]:
    """Run ``turns`` turns on a fresh store; return its size and per-call medians."""
    gc.collect()  # start every run from the same heap, whatever ran before
    with tempfile.TemporaryDirectory() as tmp:
        store = open_store(name, Path(tmp), **STORES[name])
        try:
            record = instrument(store.saver)
            run_turns(build_agent(store.saver), "bench", turns)
            result = {"bytes": store.size()}
            for call in ("put", "put_writes", "get_tuple"):
                result[call] = median_ms(record[call])
            return result
        finally:
            store.close()


def main(runs: int = 3, turns: tuple[int, ...] = TURNS) -> dict[str, Any]:
    results: dict[str, Any] = {}
    for k in turns:
        for name in STORES:
            samples = [run_once(name, k) for _ in range(runs)]
            results[f"{name}@{k}"] = {key: statistics.median(s[key] for s in samples) for key in samples[0]}
    report(results, turns)
    return results


def report(results: dict[str, Any], turns: tuple[int, ...]) -> None:
    names = list(STORES)
    print("\nBytes stored after K turns on one thread")
    print(f"{'store':24}" + "".join(f"{f'K={k}':>12}" for k in turns) + f"{'K40/K20':>10}")
    for name in names:
        row = [results[f"{name}@{k}"]["bytes"] for k in turns]
        growth = row[-1] / row[-2] if len(row) > 1 else float("nan")
        print(f"{name:24}" + "".join(f"{b:>12,.0f}" for b in row) + f"{growth:>10.2f}")
    k = turns[-1]
    print(
        f"\nAt K={k}: how many times smaller threadkeep-sqlite is than langgraph-sqlite: "
        f"{results[f'langgraph-sqlite@{k}']['bytes'] / results[f'threadkeep-sqlite@{k}']['bytes']:.1f}x"
    )
    print(f"\nPer-call median latency (ms) at K={k}, and ratio to langgraph-sqlite (<1 is faster)")
    base = results[f"langgraph-sqlite@{k}"]
    print(f"{'store':24}{'put':>10}{'put_writes':>12}{'get_tuple':>11}{'put x':>8}{'get x':>8}")
    for name in names:
        r = results[f"{name}@{k}"]
        print(
            f"{name:24}{r['put']:>10.3f}{r['put_writes']:>12.3f}{r['get_tuple']:>11.3f}"
            f"{r['put'] / base['put']:>8.2f}{r['get_tuple'] / base['get_tuple']:>8.2f}"
        )
