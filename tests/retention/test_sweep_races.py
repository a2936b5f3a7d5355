"""The sweep never deletes a step it acknowledged (SPEC SW5, SW8, issue 33.1).

A sweep deletes threads eight days old while a writer re-runs every third of them, in the
same process or another, sync or async. A thread written after its delete began is a live
thread: whatever the sweep does next, every put the writer saw acknowledged is still there.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import pytest

from tests.providers import REDIS_URL, ProviderCase, postgres_schema, track_redis_prefix
from tests.retention.revive import AckFile, acknowledging, graph, open_store, revive
from threadkeep import sweep_checkpoints
from threadkeep.core.identity import operator_scope

pytestmark = [pytest.mark.providers("sqlite", "postgres", "tiered", "redis")]

DAY = 24 * 60 * 60
THREADS = 240
RUNS = 2


def store_of(provider: ProviderCase, tmp_path: Path) -> dict[str, str]:
    """A fresh store of ``provider`` that another process can open too."""
    unique = uuid.uuid4().hex
    name = provider.name
    if name == "sqlite":
        return {"provider": name, "location": str(tmp_path / f"{unique}.sqlite")}
    if name == "postgres":
        return {"provider": name, "location": postgres_schema(unique)}
    if name == "redis":
        return {"provider": name, "location": REDIS_URL, "prefix": track_redis_prefix(f"tktest{unique[:12]}")}
    return {
        "provider": name,
        "location": postgres_schema(unique),
        "prefix": track_redis_prefix(f"tktestc{unique[:12]}"),
        "cache_url": REDIS_URL,
    }


def seed(store: dict[str, str], threads: list[str]) -> None:
    """``threads`` written eight days ago; every other one marked finished then (due a day
    later), so a sweep now finds them all past a horizon (Redis: the finished ones)."""
    with open_store(store, clock=lambda: time.time() - 8 * DAY) as old:
        app = graph(old)
        for thread_id in threads:
            app.invoke({"n": 0}, {"configurable": {"thread_id": thread_id}})
        old.mark_finished(threads[::2])


def missing(store: dict[str, str], acks: list[dict[str, str]]) -> list[dict[str, str]]:
    """The acknowledged puts whose checkpoint the store no longer holds, and, for each
    thread, its last acknowledged put if a read of the thread's latest state (the tiered
    store: its cache) does not find it."""
    last = {ack["thread_id"]: ack for ack in acks}
    with open_store(store) as reader, operator_scope():
        lost = [ack for ack in acks if reader.get_tuple({"configurable": dict(ack)}) is None]
        for ack in last.values():
            latest = reader.get_tuple({"configurable": {"thread_id": ack["thread_id"]}})
            if latest is None or latest.config["configurable"]["checkpoint_id"] != ack["checkpoint_id"]:
                lost.append(ack)
    return lost


def wait_for_acks(count: Any, at_least: int = 3) -> None:
    deadline = time.monotonic() + 60
    while count() < at_least:
        assert time.monotonic() < deadline, "the writer acknowledged nothing in 60 s"
        time.sleep(0.01)


def sweep_in_process(
    store: dict[str, str], revived: list[str], mode: str, stop: Path
) -> tuple[Any, list[Any]]:
    """Sweep while a thread of this process re-runs ``revived``; the sweep's result and the
    writer's acknowledged puts."""
    acks: list[dict[str, str]] = []
    writer = open_store(store)
    worker = threading.Thread(target=revive, args=(acknowledging(writer, acks), revived, mode, stop.exists))
    worker.start()
    try:
        wait_for_acks(lambda: len(acks))
        with open_store(store) as sweeper:
            result = sweep_checkpoints(sweeper)
        wait_for_acks(lambda: len(acks), len(acks) + 3)  # and on, after the sweep
    finally:
        stop.touch()
        worker.join(timeout=120)
        writer.close()
    assert not worker.is_alive()
    return result, acks


def sweep_beside_a_process(
    store: dict[str, str], revived: list[str], mode: str, stop: Path, ack_file: Path
) -> tuple[Any, list[Any]]:
    """Sweep while another process re-runs ``revived``."""
    options = {"store": store, "threads": revived, "mode": mode, "acks": str(ack_file), "stop": str(stop)}
    process = subprocess.Popen([sys.executable, "-m", "tests.retention.revive", json.dumps(options)])

    def acked() -> int:
        return len(ack_file.read_text().splitlines()) if ack_file.exists() else 0

    try:
        wait_for_acks(acked)
        with open_store(store) as sweeper:
            result = sweep_checkpoints(sweeper)
        wait_for_acks(acked, acked() + 3)
    finally:
        stop.touch()
        assert process.wait(timeout=120) == 0
    return result, [json.loads(line) for line in ack_file.read_text().splitlines()]


@pytest.mark.slow
@pytest.mark.parametrize("where", ["in-process", "other-process"])
@pytest.mark.parametrize("mode", ["sync", "async"])
def test_sw5_a_sweep_never_deletes_a_put_it_acknowledged(
    provider: ProviderCase, tmp_path: Path, where: str, mode: str
) -> None:
    for run in range(RUNS):
        store = store_of(provider, tmp_path)
        threads = [f"race-{i}" for i in range(THREADS)]
        seed(store, threads)
        revived = threads[::3]
        stop = tmp_path / f"stop-{run}"
        if where == "in-process":
            result, acks = sweep_in_process(store, revived, mode, stop)
        else:
            result, acks = sweep_beside_a_process(store, revived, mode, stop, tmp_path / f"acks-{run}")
        assert result.swept_count > 0, result  # the sweep did delete (the test raced something)
        assert missing(store, acks) == [], f"run {run}: acknowledged checkpoints deleted by the sweep"


def test_sw5_a_thread_written_right_after_its_delete_stays(provider: ProviderCase, tmp_path: Path) -> None:
    """The race made certain: the writer re-runs a thread the moment the sweep's delete of
    it has committed, and again before the sweep ends."""
    store = store_of(provider, tmp_path)
    threads = ["old-0", "old-1", "old-2"]
    seed(store, threads)
    acks = AckFile(str(tmp_path / "acks"))
    with open_store(store) as sweeper, acknowledging(open_store(store), acks) as writer:
        delete = sweeper.delete_threads
        deletes: list[list[str]] = []

        def delete_then_write(doomed: Any, page: Any = None) -> list[str]:
            deleted = delete(doomed, page)
            deletes.append(deleted)
            for thread_id in deleted:
                writer.start_threads([thread_id])
                graph(writer).invoke({"n": 0}, {"configurable": {"thread_id": thread_id}})
            return deleted

        sweeper.delete_threads = delete_then_write  # type: ignore[method-assign]
        result = sweep_checkpoints(sweeper)
        acks.file.close()
    swept = threads[::2] if provider.name == "redis" else threads  # redis: only finished ones
    assert sorted(thread for deleted in deletes for thread in deleted) == swept
    assert result.swept_count == len(swept)
    assert len(acks) == 3 * len(swept)  # a fresh run stores three checkpoints
    assert missing(store, acks) == []
