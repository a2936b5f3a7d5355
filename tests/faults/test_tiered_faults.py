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

from tests.providers import (
    POSTGRES_URL,
    REDIS_URL,
    postgres_schema,
    stored_checkpoint_ids,
    track_redis_prefix,
)
from tests.servers import RedisServer, TcpProxy
from tests.workers import STALE_EXIT, log_graph, slow_graph
from threadkeep import Settings, StorageError, open_checkpointer
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


def _worker(job: str, **options: Any) -> subprocess.Popen[bytes]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.Popen(
        [sys.executable, "-m", "tests.workers", job, json.dumps(options)], cwd=ROOT, env=env
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
