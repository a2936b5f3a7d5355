"""P5: one saver per (provider, connection string, declared waiting retention)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.providers import CASES, REDIS_URL, redis_probe, require
from tests.retention.test_retention import write
from threadkeep import Settings, ThreadRetention, ThreadRetentionError
from threadkeep.registry import close_savers, saver_for


def test_p5_each_store_is_built_once_and_shared(tmp_path: Path) -> None:
    settings = Settings()
    try:
        first = saver_for("sqlite", str(tmp_path / "a.sqlite"), settings=settings)
        assert saver_for("sqlite", str(tmp_path / "a.sqlite"), settings=settings) is first
        other = saver_for("sqlite", str(tmp_path / "b.sqlite"), settings=settings)
        assert other is not first
        short = saver_for("sqlite", str(tmp_path / "a.sqlite"), waiting_minutes=30, settings=settings)
        assert short is not first
        assert short.declared == ThreadRetention(30, None)
        assert short.retention == first.retention  # the platform's: the sweep and marks use it
        short.start_threads(["t"])  # records the declared retention for the thread
        assert short.thread_retention("t") == (ThreadRetention(30, None), None)
        with pytest.raises(ThreadRetentionError, match="exceeds the platform's 10080"):
            saver_for("sqlite", str(tmp_path / "a.sqlite"), waiting_minutes=20_000, settings=settings)
    finally:
        close_savers()
    assert saver_for("sqlite", str(tmp_path / "a.sqlite"), settings=settings) is not first
    close_savers()


def test_p5_a_declared_waiting_on_redis_is_the_ttl_of_what_the_saver_writes() -> None:
    import redis

    require(CASES["redis"], redis_probe())
    try:
        saver = saver_for("redis", REDIS_URL, waiting_minutes=45, settings=Settings())
        write(saver, "p5-registry-thread")
        client = redis.Redis.from_url(REDIS_URL)
        ttls = [client.pttl(k) for k in saver.backend.space.thread("p5-registry-thread") if client.exists(k)]
        assert ttls
        assert all(44 * 60_000 < ttl <= 45 * 60_000 for ttl in ttls)
        saver.delete_thread("p5-registry-thread")
    finally:
        close_savers()
