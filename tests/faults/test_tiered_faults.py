"""The tiered provider's failure matrix (SPEC T8): each row a real fault, and afterwards every
acknowledged checkpoint is still readable and the thread goes on."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
import redis
from langchain_core.messages import HumanMessage

from tests.providers import (
    POSTGRES_URL,
    REDIS_URL,
    postgres_schema,
    stored_checkpoint_ids,
    track_redis_prefix,
)
from tests.servers import RedisServer, TcpProxy
from tests.workers import STALE_EXIT, log_graph, slow_graph
from threadkeep import Settings, StaleStateError, StorageError, open_checkpointer
from threadkeep.backends.redis.keys import KeySpace
from threadkeep.metrics import CACHE_EVENTS, Metrics
from threadkeep.workload import MESSAGES_PER_TURN, build_agent, turn_input

pytestmark = [pytest.mark.providers("tiered"), pytest.mark.slow]
FAST = Settings(retry_backoff_seconds=0.05, pool_timeout_seconds=1, connect_timeout_seconds=1)
ROOT = Path(__file__).resolve().parents[2]


def cfg(thread_id: str, **extra: Any) -> Any:
    return {"configurable": {"thread_id": thread_id, **extra}}


class Store:
    """A tiered store on a fresh schema and cache prefix; ``open()`` builds savers on it."""

    def __init__(self, cache_url: str = REDIS_URL, dsn: str | None = None) -> None:
        self.dsn = dsn or postgres_schema(uuid.uuid4().hex)
        self.cache_url = cache_url
        self.prefix = track_redis_prefix(f"tktestc{uuid.uuid4().hex[:10]}")
        self.metrics = Metrics()

    def open(self, dsn: str | None = None, **options: Any) -> Any:
        options.setdefault("metrics", self.metrics)
        options.setdefault("cache_timeout", 0.5)
        options.setdefault("state_history_limit", 1_000_000)  # every acknowledged step stays
        return open_checkpointer(
            "tiered",
            dsn or self.dsn,
            settings=FAST.with_values(cache_url=self.cache_url),
            cache_prefix=self.prefix,
            **options,
        )

    def durable_ids(self, thread_id: str) -> list[str]:
        return stored_checkpoint_ids(self.dsn, thread_id)

    def assert_all_readable(self, saver: Any, thread_id: str, messages: int) -> None:
        """Every checkpoint Postgres acknowledged reads back, and the newest state is whole."""
        ids = self.durable_ids(thread_id)
        assert ids
        for checkpoint_id in ids:
            found = saver.get_tuple(cfg(thread_id, checkpoint_id=checkpoint_id))
            assert found is not None
            assert found.checkpoint["id"] == checkpoint_id
        latest = saver.get_tuple(cfg(thread_id))
        assert latest.checkpoint["id"] == ids[-1]
        assert len(latest.checkpoint["channel_values"]["messages"]) == messages

    def events(self, event: str) -> float:
        return self.metrics.value(CACHE_EVENTS, event=event)

    def cached_version(self, thread_id: str) -> str | None:
        """The version the thread's cache entry holds (its root namespace's checkpoint id)."""
        entry = KeySpace(self.prefix).thread(f"{thread_id}\0anonymous")[0]
        value = redis.Redis.from_url(self.cache_url).hget(entry, "version\0")
        return None if value is None else value.decode()


@pytest.fixture
def own_redis(provider: Any) -> Iterator[RedisServer]:
    server = RedisServer().start()
    yield server
    server.close()


def test_t8_redis_unreachable_loads_and_writes_go_to_postgres(own_redis: RedisServer) -> None:
    store = Store(own_redis.url)
    with store.open() as saver:
        graph = build_agent(saver)
        graph.invoke(turn_input(0), cfg("down"))
        own_redis.stop()
        graph.invoke(turn_input(1), cfg("down"))
        graph.invoke(turn_input(2), cfg("down"))
        assert store.events("error") > 0
        store.assert_all_readable(saver, "down", 3 * MESSAGES_PER_TURN)
        own_redis.start()
        graph.invoke(turn_input(3), cfg("down"))
        hits = store.events("hit")
        store.assert_all_readable(saver, "down", 4 * MESSAGES_PER_TURN)
        assert store.events("hit") > hits  # the cache serves again


def test_t8_redis_restarted_empty_is_a_miss_then_reseeded(own_redis: RedisServer) -> None:
    store = Store(own_redis.url)
    with store.open() as saver:
        graph = build_agent(saver)
        graph.invoke(turn_input(0), cfg("restart"))
        own_redis.restart()
        assert own_redis.cli("dbsize").strip() == "0"
        misses = store.events("miss")
        graph.invoke(turn_input(1), cfg("restart"))
        assert store.events("miss") > misses
        store.assert_all_readable(saver, "restart", 2 * MESSAGES_PER_TURN)
        assert int(own_redis.cli("dbsize").strip()) > 0


def test_t8_an_expired_entry_is_a_miss(provider: Any) -> None:
    store = Store()
    with store.open(cache_ttl=1) as saver:
        graph = build_agent(saver)
        graph.invoke(turn_input(0), cfg("ttl"))
        keys = saver.backend.cache.keys("ttl", "anonymous")
        client = redis.Redis.from_url(REDIS_URL)
        assert client.exists(*keys) > 0
        time.sleep(1.3)
        assert client.exists(*keys) == 0
        misses = store.events("miss")
        graph.invoke(turn_input(1), cfg("ttl"))
        assert store.events("miss") > misses
        store.assert_all_readable(saver, "ttl", 2 * MESSAGES_PER_TURN)


def test_t8_eviction_under_maxmemory_loses_nothing(provider: Any) -> None:
    server = RedisServer("--maxmemory", "3mb", "--maxmemory-policy", "volatile-lru").start()
    try:
        store = Store(server.url)
        with store.open() as saver:
            graph = build_agent(saver)
            for turn in range(3):
                graph.invoke(turn_input(turn), cfg("evicted"))
            # Another tenant's volatile keys push the memory far past maxmemory.
            filler = redis.Redis.from_url(server.url)
            for i in range(600):
                filler.set(f"filler:{i}", b"x" * 16_384, ex=3600)
            stats = filler.info("stats")
            assert int(stats["evicted_keys"]) > 0
            keys = saver.backend.cache.keys("evicted", "anonymous")
            assert filler.exists(*keys) < len(keys)  # the entry lost keys
            store.assert_all_readable(saver, "evicted", 3 * MESSAGES_PER_TURN)
            graph.invoke(turn_input(3), cfg("evicted"))
            store.assert_all_readable(saver, "evicted", 4 * MESSAGES_PER_TURN)
    finally:
        server.close()


def test_t8_a_postgres_connection_killed_mid_run_is_retried(provider: Any) -> None:
    store = Store()
    name = f"tk-tkill-{uuid.uuid4().hex[:8]}"
    with store.open(dsn=f"{store.dsn} application_name={name}") as saver:
        graph = build_agent(saver)
        puts = 0
        original = saver.backend.durable.put

        def put(step: Any) -> Any:
            nonlocal puts
            puts += 1
            if puts % 4 == 0:  # in the middle of every turn
                with psycopg.connect(POSTGRES_URL, autocommit=True) as conn:
                    conn.execute(
                        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = %s",
                        (name,),
                    )
            return original(step)

        saver.backend.durable.put = put
        for turn in range(3):
            graph.invoke(turn_input(turn), cfg("killed"))
        assert puts >= 27
        store.assert_all_readable(saver, "killed", 3 * MESSAGES_PER_TURN)
        assert len(store.durable_ids("killed")) == 3 * (MESSAGES_PER_TURN + 1)


def test_t8_postgres_down_fails_the_run_and_it_resumes_from_the_last_durable_step(provider: Any) -> None:
    port = int(psycopg.conninfo.conninfo_to_dict(POSTGRES_URL).get("port") or 5432)
    proxy = TcpProxy(port).accept()
    store = Store()
    try:
        with store.open(dsn=f"{store.dsn} host=127.0.0.1 port={proxy.port}") as saver:
            graph = build_agent(saver)
            graph.invoke(turn_input(0), cfg("outage"))
            puts = 0
            original = saver.backend.durable.put

            def put(step: Any) -> Any:
                nonlocal puts
                puts += 1
                if puts == 4:
                    proxy.refuse()  # Postgres goes away mid-turn
                return original(step)

            saver.backend.durable.put = put
            with pytest.raises(StorageError):
                graph.invoke(turn_input(1), cfg("outage"), durability="sync")
            durable = store.durable_ids("outage")
            # the cache never got ahead of the truth
            version = redis.Redis.from_url(REDIS_URL).hget(
                saver.backend.cache.keys("outage", "anonymous")[0], "version\0"
            )
            assert version is not None
            assert version.decode() == durable[-1]
            proxy.accept()
            saver.backend.durable.put = original
            assert graph.get_state(cfg("outage")).tasks  # interrupted mid-turn
            graph.invoke(None, cfg("outage"))  # resume from the last durable checkpoint
            store.assert_all_readable(saver, "outage", 2 * MESSAGES_PER_TURN)
            humans = [m for m in graph.get_state(cfg("outage")).values["messages"] if m.type == "human"]
            assert len(humans) == 2
    finally:
        proxy.close()


def _worker(job: str, stdout: int | None = None, **options: Any) -> subprocess.Popen[bytes]:
    # The package under test first (PYTHONPATH, as pytest was given it), then the tests.
    path = os.pathsep.join(filter(None, [os.environ.get("PYTHONPATH"), str(ROOT)]))
    return subprocess.Popen(
        [sys.executable, "-m", "tests.workers", job, json.dumps(options)],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": path},
        stdout=stdout,
    )


def _wait_for(path: Path, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        assert time.monotonic() < deadline, f"no {path.name} after {timeout}s"
        time.sleep(0.02)


def test_t8_a_worker_killed_mid_node_is_resumed_at_that_node_by_another(
    provider: Any, tmp_path: Path
) -> None:
    store = Store()
    options = {
        "dsn": store.dsn,
        "cache_url": REDIS_URL,
        "cache_prefix": store.prefix,
        "thread": "killed-worker",
        "marker": str(tmp_path / "in-slow"),
        "go": str(tmp_path / "go"),
    }
    worker = _worker("slow", **options)
    try:
        _wait_for(tmp_path / "in-slow")
        worker.send_signal(signal.SIGKILL)
        assert worker.wait(timeout=30) == -signal.SIGKILL
    finally:
        if worker.poll() is None:
            worker.kill()
    (tmp_path / "go").write_text("go")
    with store.open() as saver:
        graph = slow_graph(saver, options)
        state = graph.get_state(cfg("killed-worker"))
        assert state.next == ("slow",)
        assert state.values["log"] == ["one"]
        result = graph.invoke(None, cfg("killed-worker"))
        assert result["log"] == ["one", "slow", "three"]
        ids = store.durable_ids("killed-worker")
        for checkpoint_id in ids:
            assert saver.get_tuple(cfg("killed-worker", checkpoint_id=checkpoint_id)) is not None


def test_t8_two_runs_racing_from_two_processes(provider: Any, tmp_path: Path) -> None:
    store = Store()
    with store.open() as saver:
        graph = log_graph(saver, "first")
        graph.invoke({"log": []}, cfg("raced"))
        base = {"dsn": store.dsn, "cache_url": REDIS_URL, "cache_prefix": store.prefix, "thread": "raced"}
        workers = [
            _worker(
                "race", **base, marker=str(tmp_path / f"ready-{name}"), go=str(tmp_path / "go"), name=name
            )
            for name in ("left", "right")
        ]
        try:
            for name in ("left", "right"):  # both workers hold the same head
                _wait_for(tmp_path / f"ready-{name}")
            (tmp_path / "go").write_text("go")
            codes = sorted(worker.wait(timeout=60) for worker in workers)
        finally:
            for worker in workers:
                if worker.poll() is None:
                    worker.kill()
        assert codes == [0, STALE_EXIT]  # exactly one wins
        state = saver.get_tuple(cfg("raced"))
        log = state.checkpoint["channel_values"]["log"]
        assert len(log) == 2
        assert log[0] == "first"
        assert log[1] in ("left", "right")
        assert state.checkpoint["id"] == store.durable_ids("raced")[-1]
        graph.invoke({"log": []}, cfg("raced"))  # the thread stays usable
        assert saver.get_tuple(cfg("raced")).checkpoint["channel_values"]["log"] == [*log, "first"]


# --- how stale a read can be (docs/tiered.md) -----------------------------------------------


def _readers(count: int, **options: Any) -> list[list[list[Any]]]:
    """``count`` processes, each reading the thread's state until it is the one wanted (at
    most 30 s): each one's reads, ``[started, checkpoint id, messages]``."""
    readers = [_worker("poll", stdout=subprocess.PIPE, deadline=30, **options) for _ in range(count)]
    try:
        return [json.loads(reader.communicate(timeout=120)[0]) for reader in readers]
    finally:
        for reader in readers:
            if reader.poll() is None:
                reader.kill()


def _assert_not_served_past_the_lease(
    reads: list[list[Any]], committed_by: float, column: int, wanted: Any
) -> None:
    """Every read that started more than the lease after the newest state was committed
    (``committed_by``: a time after that commit) returned it (``wanted`` in ``column``)."""
    bound = committed_by + Settings().cache_lease_seconds
    late = [read for read in reads if read[0] > bound]
    assert all(read[column] == wanted for read in late), f"stale reads after the lease: {late}"


def _ancestry(saver: Any, thread_id: str) -> list[str]:
    """The checkpoint ids from the thread's newest back to its first, parent by parent."""
    found = saver.get_tuple(cfg(thread_id))
    ids = [found.checkpoint["id"]]
    while found.parent_config is not None:
        found = saver.get_tuple(found.parent_config)
        ids.append(found.checkpoint["id"])
    return ids


def _kill_after_commit(store: Store, thread_id: str, turn: int, marker: Path) -> float:
    """Run ``turn`` in a worker process, SIGKILLed once its first step is committed in
    Postgres and before it reaches the cache; returns a time after that commit."""
    base = {"dsn": store.dsn, "cache_url": store.cache_url, "cache_prefix": store.prefix}
    worker = _worker("stop_after_commit", **base, thread=thread_id, turn=turn, marker=str(marker))
    try:
        _wait_for(marker)
        worker.send_signal(signal.SIGKILL)
        assert worker.wait(timeout=30) == -signal.SIGKILL
    finally:
        if worker.poll() is None:
            worker.kill()
    return float(json.loads(marker.read_text()))


def test_t4_a_worker_killed_between_its_commit_and_its_cache_write_is_not_served_past_the_lease(
    provider: Any, tmp_path: Path
) -> None:
    store = Store()
    thread = "killed-after-commit"
    base = {"dsn": store.dsn, "cache_url": store.cache_url, "cache_prefix": store.prefix, "thread": thread}
    with store.open() as saver:
        graph = build_agent(saver)
        graph.invoke(turn_input(0), cfg(thread))
        committed = []
        for kill in range(2):
            cached = store.cached_version(thread)
            after_commit = _kill_after_commit(store, thread, kill + 1, tmp_path / f"committed-{kill}")
            head = store.durable_ids(thread)[-1]
            committed.append(head)
            assert head != cached
            assert store.cached_version(thread) == cached  # the cache was left behind
            # Readers in two other processes see Postgres's head, at the latest once the
            # lease of the state left behind has run out.
            for reads in _readers(2, **base, want_id=head):
                assert reads[-1][1] == head, f"still served {reads[-1][1]}, Postgres has {head}"
                _assert_not_served_past_the_lease(reads, after_commit, 1, head)
        # Neither the next write nor the next run drops a step Postgres committed.
        graph.update_state(cfg(thread), {"messages": [HumanMessage(content="a note")]}, as_node="agent")
        graph.invoke(turn_input(3), cfg(thread))
        history = _ancestry(saver, thread)
        assert all(checkpoint_id in history for checkpoint_id in committed)


def test_w2_a_write_based_on_a_stale_cached_head_is_refused_not_branched(
    provider: Any, tmp_path: Path
) -> None:
    store = Store()
    thread = "stale-head"
    with store.open(cache_lease=3600) as saver:  # the entry stays within its lease throughout
        graph = build_agent(saver)
        graph.invoke(turn_input(0), cfg(thread))
        cached = store.cached_version(thread)
        _kill_after_commit(store, thread, 1, tmp_path / "committed")
        head = store.durable_ids(thread)[-1]
        assert head != cached
        # Within its lease the entry serves the state the killed worker moved past ...
        assert saver.get_tuple(cfg(thread)).checkpoint["id"] == cached
        # ... but a write based on it, an update_state too, is refused: it never branches
        # beside the head Postgres committed.
        note = {"messages": [HumanMessage(content="a note")]}
        with pytest.raises(StaleStateError):
            graph.update_state(cfg(thread), note, as_node="agent")
        assert head in store.durable_ids(thread)
        assert store.durable_ids(thread)[-1] == head  # nothing stored
        # The refusal cleared the entry: the write read again is based on the true head.
        assert saver.get_tuple(cfg(thread)).checkpoint["id"] == head
        graph.update_state(cfg(thread), note, as_node="agent")
        assert head in _ancestry(saver, thread)


def test_t4_a_writer_cut_off_from_redis_is_not_served_past_the_lease(
    own_redis: RedisServer, tmp_path: Path
) -> None:
    store = Store(own_redis.url)
    thread = "partitioned"
    proxy = TcpProxy(own_redis.port).accept()
    try:
        writer = _worker(
            "partition",
            dsn=store.dsn,
            cache_url=f"redis://127.0.0.1:{proxy.port}/0",  # only the writer goes through the proxy
            cache_prefix=store.prefix,
            cache_timeout=0.5,
            thread=thread,
            marker=str(tmp_path / "turn-0"),
            go=str(tmp_path / "go"),
            done=str(tmp_path / "done"),
        )
        try:
            _wait_for(tmp_path / "turn-0")
            cached = store.cached_version(thread)
            proxy.refuse()  # the writer's connections to Redis die; Redis keeps its data
            (tmp_path / "go").write_text("go")
            assert writer.wait(timeout=120) == 0
        finally:
            if writer.poll() is None:
                writer.kill()
    finally:
        proxy.close()
    after_commits = float(json.loads((tmp_path / "done").read_text()))
    assert store.cached_version(thread) == cached  # turn 1 never reached the cache
    assert store.durable_ids(thread)[-1] != cached
    every = 2 * MESSAGES_PER_TURN
    base = {"dsn": store.dsn, "cache_url": store.cache_url, "cache_prefix": store.prefix, "thread": thread}
    for reads in _readers(2, **base, want_messages=every):
        assert reads[-1][2] == every, f"still served {reads[-1][2]} messages, Postgres has {every}"
        _assert_not_served_past_the_lease(reads, after_commits, 2, every)
    with store.open() as saver:
        store.assert_all_readable(saver, thread, every)
