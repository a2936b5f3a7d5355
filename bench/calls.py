"""The client CPU each saver call costs, without the graph around it.

    ./dev bench calls --runs 3 --conversation-turns 10

One conversation of the issue-3 workload runs on ``floor-graph`` while every ``aput``,
``aput_writes`` and ``aget_tuple`` call the graph makes is recorded (its arguments are the
graph's own objects, so consecutive puts share message objects as they do in a run). The
same calls are then replayed, one at a time and in order, on each store (each run on a new
thread), and the CPU time of the calling thread is taken around each call: what the saver's
client costs per call and per turn, with nothing else running in the process. Medians over
the runs of each call kind's mean.
"""

from __future__ import annotations

import asyncio
import gc
import statistics
import time
from typing import Any

from bench.servers import conversation, open_store

STORES = ("langgraph-postgres", "threadkeep-postgres", "threadkeep-redis")
CALLS = ("aput", "aput_writes", "aget_tuple")
Call = tuple[str, tuple[Any, ...], dict[str, Any]]


async def record(turns: int) -> list[Call]:
    """The saver calls of one ``turns``-turn conversation, in order."""
    calls: list[Call] = []
    async with open_store("floor-graph") as store:
        saver = store.saver
        for name in CALLS:
            setattr(saver, name, _recording(name, getattr(saver, name), calls))
        await conversation(saver, "recorded", turns)
    return calls


def _recording(name: str, method: Any, calls: list[Call]) -> Any:
    async def recorded(*args: Any, **kwargs: Any) -> Any:
        calls.append((name, tuple(_as_called(arg) for arg in args), kwargs))
        return await method(*args, **kwargs)

    return recorded


def _as_called(value: Any) -> Any:
    """A checkpoint as it was when passed: LangGraph goes on updating the dicts of the one it
    passed to ``aput`` (a replay of the later state made one put in ten miss its one-statement
    path). Its values stay the very objects passed, as the graph shares them between puts."""
    if isinstance(value, dict) and "channel_versions" in value and "channel_values" in value:
        return {
            **value,
            "channel_values": dict(value["channel_values"]),
            "channel_versions": dict(value["channel_versions"]),
            "versions_seen": {node: dict(seen) for node, seen in value["versions_seen"].items()},
        }
    return value


def _on_thread(value: Any, thread_id: str) -> Any:
    """A recorded config, pointed at ``thread_id``."""
    if isinstance(value, dict) and isinstance(value.get("configurable"), dict):
        return {**value, "configurable": {**value["configurable"], "thread_id": thread_id}}
    return value


async def replay(name: str, calls: list[Call], runs: int) -> dict[str, float]:
    """Microseconds of thread CPU per call of each kind (the median over runs of each run's
    mean), and milliseconds per turn."""
    means: dict[str, list[float]] = {call: [] for call in CALLS}
    gc.collect()
    async with open_store(name) as store:
        for run in range(runs):
            spent: dict[str, list[float]] = {call: [] for call in CALLS}
            for call, recorded, kwargs in calls:
                args = tuple(_on_thread(arg, f"replay-{run}") for arg in recorded)
                start = time.thread_time()
                await getattr(store.saver, call)(*args, **kwargs)
                spent[call].append(time.thread_time() - start)
            for call in CALLS:
                means[call].append(statistics.mean(spent[call]) * 1e6)
    result = {call: statistics.median(means[call]) for call in CALLS}
    result.update({f"{call}_count": float(sum(1 for c, _, _ in calls if c == call)) for call in CALLS})
    return result


def main(runs: int = 3, turns: int = 10) -> dict[str, Any]:
    return asyncio.run(_main(runs, turns))


async def _main(runs: int, turns: int) -> dict[str, Any]:
    calls = await record(turns)
    results = {name: await replay(name, calls, runs) for name in STORES}
    print(
        f"\nClient CPU per call (µs of thread CPU; median of {runs} runs' means), {turns}-turn conversation"
    )
    print(f"{'store':22}" + "".join(f"{call:>14}" for call in CALLS) + f"{'ms per turn':>14}")
    for name, r in results.items():
        per_turn = sum(r[call] * r[f"{call}_count"] for call in CALLS) / turns / 1000
        r["ms_per_turn"] = per_turn
        print(f"{name:22}" + "".join(f"{r[call]:>14.0f}" for call in CALLS) + f"{per_turn:>14.2f}")
    counts = results[STORES[0]]
    print("calls per turn: " + ", ".join(f"{call} {counts[f'{call}_count'] / turns:.0f}" for call in CALLS))
    return results
