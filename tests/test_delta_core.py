"""core/delta.py without a store: what prune, delete_for_runs and the history limit keep for
the DeltaChannel fields of a thread (issue 34.1)."""

from __future__ import annotations

from typing import Any

from langgraph.checkpoint.base import CheckpointTuple
from langgraph.checkpoint.serde.types import _DeltaSnapshot

from threadkeep.core.delta import DeltaWindow, delta_depth, keep_latest_counts, spared_by_delta


def node(
    checkpoint_id: str,
    parent: str | None,
    stored: dict[str, Any],
    counters: dict[str, list[int]] | None = None,
    ns: str = "",
) -> CheckpointTuple:
    """A checkpoint whose channels ``log`` and ``n`` both have a version, storing ``stored``."""

    def config(cid: str) -> Any:
        return {"configurable": {"thread_id": "t", "checkpoint_ns": ns, "checkpoint_id": cid}}

    return CheckpointTuple(
        config=config(checkpoint_id),
        checkpoint={  # type: ignore[typeddict-item]
            "v": 4,
            "id": checkpoint_id,
            "ts": "",
            "channel_values": stored,
            "channel_versions": {"log": "1", "n": "1"},
            "versions_seen": {},
        },
        metadata={"counters_since_delta_snapshot": counters} if counters else {},  # type: ignore[typeddict-item]
        parent_config=None if parent is None else config(parent),
    )


# 1 snapshots log, 3 snapshots n; 4 and 5 rebuild both from their ancestors.
CHAIN = [
    node("1", None, {"log": _DeltaSnapshot(["a"])}, {"n": [1, 1]}),
    node("2", "1", {}, {"log": [1, 1], "n": [2, 2]}),
    node("3", "2", {"n": _DeltaSnapshot(3)}, {"log": [2, 2]}),
    node("4", "3", {}, {"log": [3, 3], "n": [1, 1]}),
    node("5", "4", {}, {"log": [4, 4], "n": [2, 2]}),
]


def test_depth_is_the_supersteps_since_the_oldest_snapshot() -> None:
    assert delta_depth({"counters_since_delta_snapshot": {"log": [4, 4], "n": [0, 2]}}) == 4
    assert delta_depth({"step": 3}) == 0


def test_keep_latest_keeps_back_to_the_seed_of_every_delta_field() -> None:
    assert keep_latest_counts(CHAIN) == {"": 5}  # log's seed is checkpoint 1
    resnapshot = [*CHAIN, node("6", "5", {"log": _DeltaSnapshot(["b"])}, {"n": [3, 3]})]
    assert keep_latest_counts(resnapshot) == {"": 4}  # 6 stores log, n's seed is 3


def test_keep_latest_keeps_one_without_delta_fields() -> None:
    plain = [node("1", None, {"log": ["a"], "n": 1}), node("2", "1", {"log": ["a"], "n": 2})]
    assert keep_latest_counts(plain) == {"": 1}


def test_keep_latest_counts_each_namespace_and_stops_at_a_broken_chain() -> None:
    sub = [node("7", None, {"n": _DeltaSnapshot(1)}, {"log": [1, 1]}, ns="sub:1"), *CHAIN[2:]]
    # 3's parent is gone: the walk stops at 3; the subgraph's namespace has one checkpoint
    assert keep_latest_counts(sub) == {"sub:1": 1, "": 3}


def test_delete_spares_what_a_remaining_checkpoint_reads() -> None:
    doomed = {("", "1"), ("", "2"), ("", "3")}
    assert spared_by_delta(CHAIN, doomed) == doomed
    later = [*CHAIN, node("6", "5", {"log": _DeltaSnapshot(["b"]), "n": _DeltaSnapshot(9)})]
    doomed_all_but_6 = {("", str(i)) for i in range(1, 6)}
    assert spared_by_delta(later[5:], doomed_all_but_6) == set()


def test_window_keeps_what_the_newest_limit_read() -> None:
    window = DeltaWindow()
    key = ("t", "")
    assert window.keep(key, {}, None) is None
    assert window.keep(key, {}, 3) == 3  # no delta fields: the limit
    depths = [1, 2, 3, 1, 2, 3]
    kept = [window.keep(key, {"counters_since_delta_snapshot": {"log": [d, d]}}, 3) for d in depths]
    # until 3 puts are known, nothing is trimmed; then the newest 3 and what they read
    assert kept[:2] == [None, None]
    assert kept[2:] == [4, 5, 6, 4]  # e.g. the 5th: the one 2 puts back reads 3 further
