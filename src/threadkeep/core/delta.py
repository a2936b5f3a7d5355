"""What a ``DeltaChannel`` field needs kept to be read back (langgraph 1.2). No I/O.

A delta field stores its value only at some checkpoints (a ``_DeltaSnapshot`` every
``snapshot_frequency`` updates); at the others LangGraph rebuilds it from the nearest
ancestor that stores one (its *seed*) and the pending writes of the ancestors in between
(``BaseCheckpointSaver.get_delta_channel_history``). Deleting those ancestors or their
writes would silently rebuild the field from less history, so ``prune("keep_latest")``
and the history limit keep them:

- :func:`keep_latest_counts` says, per namespace, how many of its newest checkpoints keep
  the latest one and every ancestor back to its seeds (every checkpoint of a chain is newer
  than its ancestors, so keeping the newest ``n`` keeps the chain).
- :class:`DeltaWindow` widens a history limit at each put by the depth of the seeds of the
  checkpoints it keeps, as their metadata (``counters_since_delta_snapshot``) tells it.
"""

from __future__ import annotations

import threading
from collections import OrderedDict, deque
from collections.abc import Collection, Iterable, Mapping
from typing import Any, Final

from langgraph.checkpoint.base import CheckpointTuple
from langgraph.checkpoint.serde.types import _DeltaSnapshot

__all__ = ["COUNTERS", "DeltaWindow", "delta_depth", "keep_latest_counts", "spared_by_delta"]

# The metadata key in which LangGraph counts, per delta channel, (updates, supersteps) since
# the channel's last snapshot; absent from checkpoints of graphs without delta channels.
COUNTERS: Final = "counters_since_delta_snapshot"


def delta_depth(metadata: Mapping[str, Any]) -> int:
    """How many ancestors of a checkpoint with ``metadata`` its delta fields may read: at
    most one per superstep since the oldest of their snapshots (0: it reads none)."""
    counters = metadata.get(COUNTERS) or {}
    return max((int(pair[1]) for pair in counters.values()), default=0)


def _by_namespace(
    tuples: Iterable[CheckpointTuple],
) -> tuple[dict[str, dict[str, CheckpointTuple]], set[str]]:
    """A thread's checkpoints by namespace and id, and the channels any of them shows to be
    delta channels (counted in metadata, or stored as a snapshot)."""
    nodes: dict[str, dict[str, CheckpointTuple]] = {}
    delta: set[str] = set()
    for found in tuples:
        ns = found.config["configurable"].get("checkpoint_ns", "")
        nodes.setdefault(ns, {})[found.config["configurable"]["checkpoint_id"]] = found
        delta.update(found.metadata.get(COUNTERS) or {})
        delta.update(k for k, v in found.checkpoint["channel_values"].items() if type(v) is _DeltaSnapshot)
    return nodes, delta


def _read_ancestors(by_id: Mapping[str, CheckpointTuple], delta: set[str], checkpoint_id: str) -> list[str]:
    """The ancestors (nearest first) whose writes or stored values the delta fields of
    ``checkpoint_id`` are rebuilt from: up to the nearest one storing each, as LangGraph's
    ``get_delta_channel_history`` walks. A chain that breaks (an ancestor gone) stops there."""
    found = by_id[checkpoint_id]
    reads = delta & set(found.checkpoint["channel_versions"])
    reads -= set(found.checkpoint["channel_values"])
    out: list[str] = []
    parent = found.parent_config
    while reads and parent is not None:
        ancestor = by_id.get(parent["configurable"]["checkpoint_id"])
        if ancestor is None:
            break
        out.append(ancestor.config["configurable"]["checkpoint_id"])
        reads -= set(ancestor.checkpoint["channel_values"])
        parent = ancestor.parent_config
    return out


def keep_latest_counts(tuples: Iterable[CheckpointTuple]) -> dict[str, int]:
    """For the checkpoints of one thread: per namespace, how many of its newest checkpoints
    ``keep_latest`` keeps so that the latest reads its delta fields back (1 when it has
    none, or stores them all)."""
    nodes, delta = _by_namespace(tuples)
    counts: dict[str, int] = {}
    for ns, by_id in nodes.items():
        head = max(by_id)
        floor = min([head, *_read_ancestors(by_id, delta, head)])
        counts[ns] = sum(1 for checkpoint_id in by_id if checkpoint_id >= floor)
    return counts


def spared_by_delta(
    tuples: Iterable[CheckpointTuple], doomed: Collection[tuple[str, str]]
) -> set[tuple[str, str]]:
    """Of the ``doomed`` (namespace, checkpoint id) of one thread, those a checkpoint that
    stays reads its delta fields from (directly, or through another spared one)."""
    nodes, delta = _by_namespace(tuples)
    spared: set[tuple[str, str]] = set()
    if not delta:
        return spared
    for ns, by_id in nodes.items():
        for checkpoint_id in by_id:
            if (ns, checkpoint_id) in doomed:
                continue
            spared.update((ns, ancestor) for ancestor in _read_ancestors(by_id, delta, checkpoint_id))
    return spared & set(doomed)


class DeltaWindow:
    """How many checkpoints a history limit keeps at a put, so that each of the newest
    ``limit`` still reads its delta fields: the one ``p`` puts back needs the ``p + depth + 1``
    newest (``depth``: its :func:`delta_depth`). The depths of the last ``limit`` puts of each
    (thread, namespace) that uses delta fields are remembered in this process; until
    ``limit`` of them are known (a fresh process) the put keeps everything (``None``).

    The older checkpoints kept for them are kept for their writes and stored values: one of
    them read as a state may show a delta field rebuilt from less history (every checkpoint
    of a thread whose delta fields snapshot at different steps reads further back than the
    one before, so "every kept one reads back whole" would keep the whole thread).

    The window counts the newest checkpoints of the namespace, in the order they were
    created: it covers a linear history, forks (LangGraph snapshots a forked checkpoint's
    delta fields) and replays from a checkpoint the window holds.
    """

    _MAX_THREADS: Final = 4096

    def __init__(self) -> None:
        self._depths: OrderedDict[tuple[str, str], deque[int]] = OrderedDict()
        self._lock = threading.Lock()

    def keep(self, key: tuple[str, str], metadata: Mapping[str, Any], limit: int | None) -> int | None:
        """The number of newest checkpoints to keep after putting one with ``metadata``
        in the namespace ``key``, under ``limit``."""
        if limit is None:
            return None
        depth = delta_depth(metadata)
        with self._lock:
            depths = self._depths.get(key)
            if depths is None:
                if not depth:
                    return limit
                depths = self._depths[key] = deque(maxlen=limit)
                if len(self._depths) > self._MAX_THREADS:
                    self._depths.popitem(last=False)
            self._depths.move_to_end(key)
            depths.appendleft(depth)
            if len(depths) < limit:
                return None
            return max(limit, *(position + d + 1 for position, d in enumerate(depths)))
