"""SPEC SV4: what /metrics shows after a workload is what the workload did."""

from __future__ import annotations

import time
import uuid
from typing import Any

import pytest
from langgraph.checkpoint.base import empty_checkpoint
from prometheus_client.parser import text_string_to_metric_families
from starlette.testclient import TestClient

from tests.providers import POSTGRES_URL, postgres_probe, postgres_schema, require
from tests.retention.test_retention import cfg
from threadkeep import (
    Settings,
    StaleStateError,
    StorageForbiddenError,
    open_checkpointer,
    operator_scope,
    user_scope,
)
from threadkeep.metrics import CONTENT_TYPE, Metrics
from threadkeep.resolver import OwnershipResolver
from threadkeep.server import create_app
from threadkeep.sweep import sweep_checkpoints

FAST_RETRIES = Settings(retry_backoff_seconds=0.05, pool_timeout_seconds=1, connect_timeout_seconds=1)
DAY = 86_400


def scrape(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample of a /metrics page, by name and labels."""
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def put_chain(saver: Any, thread_id: str, count: int, **configurable: Any) -> list[Any]:
    """``count`` checkpoints on ``thread_id``, each the child of the one before; their configs."""
    config = cfg(thread_id) | {"configurable": {"thread_id": thread_id, "checkpoint_ns": "", **configurable}}
    stored = []
    for step in range(count):
        config = saver.put(config, empty_checkpoint(), {"source": "loop", "step": step}, {})
        config["configurable"].update(configurable)
        stored.append(config)
    return stored


def kill_own_connections(application_name: str) -> int:
    """Terminate the backends of this test's saver only (its application_name), never others'."""
    import psycopg

    with psycopg.connect(POSTGRES_URL, autocommit=True) as admin:
        row = admin.execute(
            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
            "WHERE application_name = %s AND pid <> pg_backend_pid()",
            (application_name,),
        ).fetchone()
    return int(row[0]) if row else 0


@pytest.mark.postgres
def test_sv4_metrics_count_what_a_workload_did() -> None:
    require_postgres()
    metrics = Metrics()
    name = f"tk-metrics-{uuid.uuid4().hex[:8]}"
    dsn = f"{postgres_schema(uuid.uuid4().hex)} application_name={name}"
    options: dict[str, Any] = {"settings": FAST_RETRIES, "metrics": metrics}
    long_ago = time.time() - 30 * DAY
    with open_checkpointer("postgres", dsn, clock=lambda: long_ago, **options) as old:
        put_chain(old, "old", 1)  # 1 put
        old.mark_finished(["old"])  # 1 retention write
    with (
        open_checkpointer("postgres", dsn, min_size=1, max_size=1, **options) as saver,
        TestClient(create_app(saver=saver, metrics=metrics)) as http,
    ):
        first = http.get("/metrics")
        assert first.headers["content-type"] == CONTENT_TYPE
        assert scrape(first.text)[("threadkeep_retries_total", (("provider", "postgres"),))] == 0

        chain = put_chain(saver, "t1", 3, user_id="alice")  # 3 puts
        saver.put_writes(chain[-1], [("log", "a")], "task-1")  # 1 put_writes
        with pytest.raises(StaleStateError):  # 1 conflict: a put from an old parent
            saver.put(chain[0], empty_checkpoint(), {"source": "loop", "step": 9}, {})
        with pytest.raises(StorageForbiddenError):  # forbidden put
            saver.put(cfg("t1") | {"configurable": {"thread_id": "t1", "user_id": "mallory"}},
                      empty_checkpoint(), {}, {})  # fmt: skip
        with user_scope("mallory"), pytest.raises(StorageForbiddenError):  # forbidden delete
            saver.delete_thread("t1")
        resolver = OwnershipResolver(saver)
        with pytest.raises(StorageForbiddenError):  # forbidden read
            resolver.check("t1", "mallory")
        assert resolver.check("t1", "alice") == "alice"

        assert kill_own_connections(name) >= 1
        put_chain(saver, "t2", 1, user_id="alice")  # 1 put, after 1 retry on a new connection
        with user_scope("alice"):
            saver.delete_thread("t2")  # 1 delete
        with operator_scope():
            swept = sweep_checkpoints(saver, metrics=metrics)  # 1 run, 1 deleted, 1 sweep write
        assert swept.swept_count == 1

        text = http.get("/metrics").text
    got = scrape(text)

    def sample(name: str, **labels: str) -> float:
        return got[(name, tuple(sorted(labels.items())))]

    writes = "threadkeep_durable_write_seconds_count"
    assert sample(writes, provider="postgres", operation="put") == 5
    assert sample(writes, provider="postgres", operation="put_writes") == 1
    assert sample(writes, provider="postgres", operation="delete") == 1
    assert sample(writes, provider="postgres", operation="retention") == 1
    assert sample(writes, provider="postgres", operation="sweep") == 1
    assert sample(writes, provider="postgres", operation="ledger") == 0  # listed at zero
    assert sample("threadkeep_durable_write_seconds_sum", provider="postgres", operation="put") > 0
    assert sample("threadkeep_retries_total", provider="postgres") == 1
    assert sample("threadkeep_conflicts_total", provider="postgres") == 1
    assert sample("threadkeep_forbidden_total", provider="postgres", operation="put") == 1
    assert sample("threadkeep_forbidden_total", provider="postgres", operation="delete") == 1
    assert sample("threadkeep_forbidden_total", provider="postgres", operation="read") == 1
    assert sample("threadkeep_forbidden_total", provider="postgres", operation="prune") == 0
    assert sample("threadkeep_owner_cache_events_total", tier="local", event="miss") == 1
    assert sample("threadkeep_owner_cache_events_total", tier="local", event="hit") == 1
    assert sample("threadkeep_checkpoint_sweep_runs_total", dry_run="false") == 1
    assert sample("threadkeep_checkpoint_sweep_runs_total", dry_run="true") == 0
    assert sample("threadkeep_checkpoint_sweep_deleted_total", horizon="finished") == 1
    assert sample("threadkeep_cache_events_total", event="hit") == 0


def test_sv4_every_family_is_listed_on_the_first_scrape(tmp_path: Any) -> None:
    metrics = Metrics()
    with open_checkpointer(
        "sqlite", str(tmp_path / "m.sqlite"), settings=Settings(), metrics=metrics
    ) as saver:
        families = {family.name for family in text_string_to_metric_families(metrics.render())}
        assert {
            "threadkeep_durable_write_seconds",
            "threadkeep_retries",
            "threadkeep_conflicts",
            "threadkeep_forbidden",
            "threadkeep_cache_events",
            "threadkeep_owner_cache_events",
            "threadkeep_checkpoint_sweep_runs",
            "threadkeep_checkpoint_sweep_spared",
            "threadkeep_checkpoint_sweep_deleted",
        } <= families
        got = scrape(metrics.render())
        assert (
            got[("threadkeep_durable_write_seconds_count", (("operation", "put"), ("provider", "sqlite")))]
            == 0
        )
        put_chain(saver, "t", 2)
        assert metrics.value("threadkeep_durable_write_seconds", provider="sqlite", operation="put") == 2


def test_sv4_the_hook_hears_the_savers_events(tmp_path: Any) -> None:
    heard: list[tuple[str, dict[str, str]]] = []
    metrics = Metrics(hook=lambda name, labels: heard.append((name, dict(labels))))
    with open_checkpointer(
        "sqlite", str(tmp_path / "h.sqlite"), settings=Settings(), metrics=metrics
    ) as saver:
        chain = put_chain(saver, "t", 2)
        with pytest.raises(StaleStateError):
            saver.put(chain[0], empty_checkpoint(), {}, {})
    assert heard == [("threadkeep_conflicts_total", {"provider": "sqlite"})]


def require_postgres() -> None:
    from tests.providers import CASES

    require(CASES["postgres"], postgres_probe())
