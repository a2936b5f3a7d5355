"""The results files the benchmarks write (``--json``), and the names their stores are shown by.

Each file maps a store name to its figures (``conversation.json``: ``"<store>@<K>"``), plus a
``"_run"`` entry: the command that wrote it and the machine it ran on (``bench.environment``).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).resolve().parent / "results"
RUN = "_run"

# How each store is named on the page and in the figures; the order is the order shown.
LABELS = {
    "langgraph-memory": "LangGraph InMemorySaver",
    "langgraph-sqlite": "LangGraph SqliteSaver",
    "langgraph-postgres": "LangGraph AsyncPostgresSaver",
    "threadkeep-memory": "threadkeep memory",
    "threadkeep-sqlite": "threadkeep sqlite",
    "threadkeep-sqlite-full": "threadkeep sqlite, synchronous=FULL",
    "threadkeep-postgres": "threadkeep postgres",
    "threadkeep-postgres-ungated": "threadkeep postgres, no format gate",
    "threadkeep-pg-z256": "threadkeep postgres, compress over 256 B",
    "threadkeep-redis": "threadkeep redis",
    "threadkeep-tiered": "threadkeep tiered",
    "floor-postgres": "floor: Postgres INSERT per step",
    "floor-redis": "floor: Redis SET per step (latest state only)",
    "floor-graph": "floor: the graph alone",
}


def load(name: str, folder: Path = RESULTS) -> dict[str, Any] | None:
    """The results file ``name`` (e.g. ``"servers.json"``) in ``folder``; None if it is absent."""
    path = folder / name
    if not path.exists():
        return None
    loaded: dict[str, Any] = json.loads(path.read_text())
    return loaded


def stores(results: dict[str, Any]) -> list[str]:
    """The stores of a results file, in ``LABELS`` order (``conversation.json``'s ``@K`` dropped)."""
    found = {key.split("@")[0] for key in results if key != RUN}
    return [name for name in LABELS if name in found]


def label(name: str) -> str:
    return LABELS.get(name, name)
