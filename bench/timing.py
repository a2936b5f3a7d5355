"""Per-call timing of a checkpointer, measured where the graph calls it."""

from __future__ import annotations

import functools
import statistics
import time
from collections import defaultdict
from collections.abc import Callable
from typing import Any

TIMED = ("put", "put_writes", "get_tuple", "aput", "aput_writes", "aget_tuple")


def instrument(saver: Any) -> dict[str, list[float]]:
    """Wrap ``saver``'s calls so each one's wall time is recorded; returns the record."""
    record: dict[str, list[float]] = defaultdict(list)
    for name in TIMED:
        method = getattr(saver, name, None)
        if method is None:
            continue
        wrapped = _async_timer(method, record[name]) if name.startswith("a") else _timer(method, record[name])
        setattr(saver, name, wrapped)
    return record


def _timer(method: Callable[..., Any], out: list[float]) -> Callable[..., Any]:
    @functools.wraps(method)
    def timed(*args: Any, **kwargs: Any) -> Any:
        start = time.perf_counter()
        try:
            return method(*args, **kwargs)
        finally:
            out.append(time.perf_counter() - start)

    return timed


def _async_timer(method: Callable[..., Any], out: list[float]) -> Callable[..., Any]:
    @functools.wraps(method)
    async def timed(*args: Any, **kwargs: Any) -> Any:
        start = time.perf_counter()
        try:
            return await method(*args, **kwargs)
        finally:
            out.append(time.perf_counter() - start)

    return timed


def median_ms(samples: list[float]) -> float:
    return statistics.median(samples) * 1000 if samples else float("nan")


def percentile_ms(samples: list[float], q: float) -> float:
    if not samples:
        return float("nan")
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] * 1000
