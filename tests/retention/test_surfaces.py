"""The sweep's surfaces (SPEC SW1, SV1, SV3, SV4) and RT6: the CLI, the HTTP app, the server."""

from __future__ import annotations

import concurrent.futures
import json
import logging
import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from click.testing import CliRunner
from starlette.testclient import TestClient

from tests.retention.test_retention import cfg, exists, interrupting_graph, write
from threadkeep import ConfigurationError, Settings, StorageError, open_checkpointer
from threadkeep.cli import main
from threadkeep.metrics import CONTENT_TYPE, Metrics
from threadkeep.server import create_app

DAY = 86_400.0
ADMIN, USER = "k-admin", "k-user"
KEYS = f"{ADMIN}:ops:admin,{USER}:alice:user"


@pytest.fixture
def env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    values = {
        "LLM_PROVIDER_CHECKPOINT": "sqlite",
        "LLM_PROVIDER_CHECKPOINT_CONN_STRING": str(tmp_path / "surfaces.sqlite"),
        "LLM_PROVIDER_CHECKPOINT_API_KEYS": KEYS,
    }
    for name, value in values.items():
        monkeypatch.setenv(name, value)
    return values


def seed(
    days_ago: float = 10, *, finished: tuple[str, ...] = ("done",), waiting: tuple[str, ...] = ()
) -> None:
    """Threads written (and marked) ``days_ago`` days ago, plus one fresh thread."""
    past = time.time() - days_ago * DAY
    with open_checkpointer(settings=Settings.from_env(), clock=lambda: past) as old:
        for thread in (*finished, *waiting):
            write(old, thread)
        old.mark_finished(list(finished))
        interrupting_graph(old).invoke({"log": []}, cfg("asking"))
        old.mark_finished(["asking"])
    with open_checkpointer(settings=Settings.from_env()) as now:
        write(now, "fresh")


def still_there(*threads: str) -> list[bool]:
    with open_checkpointer(settings=Settings.from_env()) as saver:
        return [exists(saver, thread) for thread in threads]


# --- the CLI -------------------------------------------------------------------------------------


@pytest.mark.usefixtures("env")
def test_sv3_checkpoints_sweep_prints_a_summary() -> None:
    seed(finished=("done",), waiting=("stale",))
    dry = CliRunner().invoke(main, ["checkpoints", "sweep", "--dry-run"])
    assert dry.exit_code == 0, dry.output
    assert "dry run: nothing deleted" in dry.output
    assert "would delete 2 thread(s): 1 finished, 1 waiting" in dry.output
    assert "spared 1 thread(s) still in use: interrupts 1 (finished 1)" in dry.output
    assert "done" not in dry.output.replace("nothing deleted", "")  # counts, not ids
    listed = CliRunner().invoke(main, ["checkpoints", "sweep", "--dry-run", "--list"])
    assert listed.exit_code == 0, listed.output
    assert "done  (finished)" in listed.output
    assert "stale  (waiting)" in listed.output
    assert "asking  (finished horizon, claimed by interrupts)" in listed.output
    assert still_there("done", "stale") == [True, True]

    result = CliRunner().invoke(main, ["checkpoints", "sweep", "--list"])
    assert result.exit_code == 0, result.output
    assert "checkpoint sweep of the sqlite store" in result.output
    assert "deleted 2 thread(s): 1 finished, 1 waiting" in result.output
    assert "asking  (finished horizon, claimed by interrupts)" in result.output
    assert still_there("done", "stale", "asking", "fresh") == [False, False, True, True]


@pytest.mark.usefixtures("env")
def test_sv3_a_dry_run_over_many_threads_prints_counts_and_lists_ids_on_request(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from threadkeep import sweep

    monkeypatch.setattr(sweep, "DOOMED_LISTED", 5)
    threads = tuple(f"old-{n:02}" for n in range(12))
    seed(finished=threads[:4], waiting=threads[4:])
    dry = CliRunner().invoke(main, ["checkpoints", "sweep", "--dry-run"])
    assert dry.exit_code == 0, dry.output
    assert "would delete 12 thread(s): 4 finished, 8 waiting" in dry.output
    assert "spared 1 thread(s) still in use: interrupts 1 (finished 1)" in dry.output
    assert "--list prints the threads' ids" in dry.output
    assert "old-" not in dry.output
    assert "asking" not in dry.output
    assert len(dry.output.splitlines()) == 5

    listed = CliRunner().invoke(main, ["checkpoints", "sweep", "--dry-run", "--list"])
    assert listed.exit_code == 0, listed.output
    assert sum("old-" in line for line in listed.output.splitlines()) == 5
    assert "... and 7 more (a dry run lists the first 5)" in listed.output
    assert "asking  (finished horizon, claimed by interrupts)" in listed.output
    assert still_there(*threads) == [True] * 12


def test_sv3_with_an_interrupt_horizon_the_sweep_deletes_interrupts_left_longer(
    env: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    seed(days_ago=10, finished=("done",))  # "asking" has waited on its interrupt for 10 days
    monkeypatch.setenv("LLM_PROVIDER_CHECKPOINT_RETENTION_INTERRUPT_MINUTES", str(11 * 24 * 60))
    dry = CliRunner().invoke(main, ["checkpoints", "sweep", "--dry-run"])
    assert "would delete 1 thread(s): 1 finished, 0 waiting" in dry.output
    assert "spared 1 thread(s) still in use: interrupts 1 (finished 1)" in dry.output

    monkeypatch.setenv("LLM_PROVIDER_CHECKPOINT_RETENTION_INTERRUPT_MINUTES", str(9 * 24 * 60))
    result = CliRunner().invoke(main, ["checkpoints", "sweep"])
    assert result.exit_code == 0, result.output
    assert "deleted 2 thread(s): 2 finished, 0 waiting" in result.output
    assert "spared 0 thread(s) still in use" in result.output
    assert still_there("done", "asking", "fresh") == [False, False, True]


@pytest.mark.usefixtures("env")
def test_sv3_a_long_sweep_shows_a_progress_bar_on_stderr(monkeypatch: pytest.MonkeyPatch) -> None:
    from threadkeep import sweep

    monkeypatch.setattr(sweep, "PAGE_SIZE", 2)
    seed(finished=("a", "b", "c", "d", "e"))
    result = CliRunner().invoke(main, ["checkpoints", "sweep", "--json"])
    assert result.exit_code == 0, result.output
    assert "sweeping" in result.stderr
    assert json.loads(result.stdout)["finished_swept"] == 5


@pytest.mark.usefixtures("env")
def test_sv3_checkpoints_sweep_json_is_the_sw6_result() -> None:
    seed()
    result = CliRunner().invoke(main, ["checkpoints", "sweep", "--json"])
    assert result.exit_code == 0, result.output
    body = json.loads(result.output)
    assert body["provider"] == "sqlite"
    assert (body["swept_count"], body["finished_swept"], body["waiting_swept"]) == (1, 1, 0)
    assert body["spared"] == [{"thread_id": "asking", "horizon": "finished", "owner": "interrupts"}]
    assert (body["waiting_minutes"], body["finished_minutes"], body["skipped"]) == (10080, 1440, [])


@pytest.mark.usefixtures("env")
def test_sv3_conversations_delete_thread() -> None:
    seed(days_ago=0, finished=())
    result = CliRunner().invoke(main, ["conversations", "delete-thread", "fresh"])
    assert result.exit_code == 0, result.output
    assert "deleted thread 'fresh'" in result.output
    assert still_there("fresh") == [False]
    missing = CliRunner().invoke(main, ["conversations", "delete-thread", "fresh", "--json"])
    assert missing.exit_code == 4
    assert json.loads(missing.output) == {"thread_id": "fresh", "deleted": False}


# --- the HTTP app, in process --------------------------------------------------------------------


@pytest.fixture
def client(env: dict[str, str]) -> Any:
    metrics = Metrics()
    with TestClient(create_app(metrics=metrics)) as http:
        http.metrics = metrics  # type: ignore[attr-defined]
        yield http


def test_sv1_sweep_route_needs_an_admin_key(client: Any) -> None:
    seed()
    assert client.post("/api/checkpoints/sweep").status_code == 401
    assert client.post("/api/checkpoints/sweep", headers={"Authorization": "Bearer nope"}).status_code == 401
    forbidden = client.post("/api/checkpoints/sweep", headers={"Authorization": f"Bearer {USER}"})
    assert forbidden.status_code == 403
    assert "alice" in forbidden.json()["message"]
    assert still_there("done") == [True]

    dry = client.post("/api/checkpoints/sweep?dry_run=true", headers={"Authorization": f"Bearer {ADMIN}"})
    assert dry.status_code == 200
    assert dry.json()["doomed"] == [{"thread_id": "done", "horizon": "finished"}]
    swept = client.post("/api/checkpoints/sweep", headers={"Authorization": f"Bearer {ADMIN}"})
    assert swept.status_code == 200
    body = swept.json()
    assert {key: body[key] for key in ("provider", "swept_count", "finished_swept", "waiting_swept")} == {
        "provider": "sqlite",
        "swept_count": 1,
        "finished_swept": 1,
        "waiting_swept": 0,
    }
    assert still_there("done", "asking") == [False, True]


def test_sv4_metrics_serve_the_prometheus_text_format(client: Any) -> None:
    seed()
    client.post("/api/checkpoints/sweep", headers={"Authorization": f"Bearer {ADMIN}"})
    response = client.get("/metrics")
    assert response.status_code == 200
    assert response.headers["content-type"] == CONTENT_TYPE  # prometheus_client's text format
    text = response.text
    assert "# TYPE threadkeep_checkpoint_sweep_spared_total counter" in text
    assert 'threadkeep_checkpoint_sweep_spared_total{horizon="finished",owner="interrupts"} 1' in text
    assert 'threadkeep_checkpoint_sweep_deleted_total{horizon="finished"} 1' in text


async def test_sv4_a_fresh_servers_metrics_list_every_counter(env: dict[str, str]) -> None:
    """Before anything is counted, /metrics names every counter (HELP and TYPE) with its
    series at zero: a dashboard or alert has something to read from the first scrape."""
    from threadkeep.metrics import CACHE_EVENTS, SWEEP_DELETED, SWEEP_SPARED

    transport = httpx.ASGITransport(app=create_app(metrics=Metrics()))
    async with httpx.AsyncClient(transport=transport, base_url="http://threadkeep") as http:
        response = await http.get("/metrics")
    assert response.status_code == 200
    lines = response.text.splitlines()
    for name in (CACHE_EVENTS, SWEEP_SPARED, SWEEP_DELETED):
        assert any(line.startswith(f"# HELP {name} ") for line in lines), name
        assert f"# TYPE {name} counter" in lines
    for series in (
        'threadkeep_checkpoint_sweep_deleted_total{horizon="finished"} 0.0',
        'threadkeep_checkpoint_sweep_deleted_total{horizon="waiting"} 0.0',
        'threadkeep_checkpoint_sweep_spared_total{horizon="waiting",owner="interrupts"} 0.0',
        'threadkeep_checkpoint_sweep_spared_total{horizon="finished",owner="parks"} 0.0',
        'threadkeep_cache_events_total{event="hit"} 0.0',
        'threadkeep_cache_events_total{event="error"} 0.0',
    ):
        assert series in lines, series


def test_sv1_serve_warns_at_start_when_no_api_key_is_configured(
    env: dict[str, str], monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="threadkeep.server")
    with TestClient(create_app(metrics=Metrics())):
        pass
    assert not [r for r in caplog.records if r.name == "threadkeep.server"]  # keys are configured

    monkeypatch.delenv("LLM_PROVIDER_CHECKPOINT_API_KEYS")
    with TestClient(create_app(metrics=Metrics())):
        warnings = [r.getMessage() for r in caplog.records if r.name == "threadkeep.server"]
    assert len(warnings) == 1, warnings
    assert "no API key is configured" in warnings[0]
    assert "LLM_PROVIDER_CHECKPOINT_API_KEYS" in warnings[0]


def test_sv1_threadkeep_serve_without_an_api_key_says_so_at_start(env: dict[str, str]) -> None:
    environ = {k: v for k, v in {**os.environ, **env}.items() if k != "LLM_PROVIDER_CHECKPOINT_API_KEYS"}
    server = subprocess.Popen(
        [str(Path(sys.executable).with_name("threadkeep")), "serve", "--port", str(_free_port())],
        env=environ,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    output: list[str] = []
    try:
        for line in server.stdout:  # type: ignore[union-attr]
            output.append(line)
            if "Application startup complete" in line:
                break
    finally:
        server.terminate()
        server.wait(timeout=10)
    text = "".join(output)
    assert "Application startup complete" in text, text
    assert "no API key is configured" in text
    assert "LLM_PROVIDER_CHECKPOINT_API_KEYS" in text


def test_sv1_healthz(client: Any) -> None:
    response = client.get("/healthz")
    assert response.status_code == 200
    assert response.json() == {"status": "ok", "provider": "sqlite"}


def test_sv1_healthz_answers_ok_while_a_settings_write_replaces_the_store(
    client: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A health check that got the store a settings write then closes asks the new store:
    a load balancer polling it sees no 503 from a settings change."""
    from threadkeep.backends.sql.backend import SqlBackend

    check, replaced, checking = SqlBackend.check, threading.Event(), threading.Event()

    def held_check(backend: SqlBackend) -> None:
        if not checking.is_set():  # the first check waits until the store is replaced
            checking.set()
            assert replaced.wait(10)
        check(backend)

    monkeypatch.setattr(SqlBackend, "check", held_check)
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        health = pool.submit(client.get, "/healthz")
        assert checking.wait(10)
        written = client.patch(
            "/api/settings",
            json={"LLM_PROVIDER_CHECKPOINT_RETENTION_FINISHED_MINUTES": "60"},
            headers={"Authorization": f"Bearer {ADMIN}"},
        )
        assert written.status_code == 200
        replaced.set()
        response = health.result(timeout=10)
    assert response.status_code == 200, response.text
    assert response.json() == {"status": "ok", "provider": "sqlite"}


def test_sv1_a_health_check_during_shutdown_opens_no_store(
    env: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A health check still running when the server shuts down (and closes its store) fails
    as the store is gone: it does not open a new one that nothing would close."""
    from threadkeep.backends.sql.backend import SqlBackend
    from threadkeep.server import _Service

    service = _Service(Settings.from_env(), None, Metrics())
    service.start()
    service.check()  # the store is open
    check, closed, checking = SqlBackend.check, threading.Event(), threading.Event()

    def held_check(backend: SqlBackend) -> None:
        checking.set()
        assert closed.wait(10)
        check(backend)

    monkeypatch.setattr(SqlBackend, "check", held_check)
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        health = pool.submit(service.check)
        assert checking.wait(10)
        service.close()  # the server's shutdown
        closed.set()
        with pytest.raises(StorageError, match="shutting down"):
            health.result(timeout=10)
    assert service._saver is None


def test_sv1_a_saver_given_to_the_app_stays_open_and_is_served_after_a_restart(
    env: dict[str, str], tmp_path: Path
) -> None:
    settings_store = Path(env["LLM_PROVIDER_CHECKPOINT_CONN_STRING"])
    with open_checkpointer("sqlite", str(tmp_path / "given.sqlite")) as given:
        app = create_app(saver=given, metrics=Metrics())
        for _ in range(2):  # started, shut down, started again
            with TestClient(app) as http:
                assert http.get("/healthz").status_code == 200
        assert given.get_tuple({"configurable": {"thread_id": "nothing"}}) is None  # still open
    assert not settings_store.exists()  # the app never opened the store its settings name


def test_rt6_a_removed_setting_is_refused_at_boot_and_on_a_settings_write(client: Any) -> None:
    with pytest.raises(ConfigurationError, match="LLM_PROVIDER_CHECKPOINT_TTL_MINUTES was removed"):
        Settings.from_env({"LLM_PROVIDER_CHECKPOINT_TTL_MINUTES": "60"})
    with pytest.raises(ConfigurationError, match="FLOW_CHECKPOINT_RETENTION_DAYS was removed"):
        Settings().updated({"FLOW_CHECKPOINT_RETENTION_DAYS": "7"})
    admin = {"Authorization": f"Bearer {ADMIN}"}
    refused = client.patch("/api/settings", json={"LLM_PROVIDER_CHECKPOINT_TTL_MINUTES": "60"}, headers=admin)
    assert refused.status_code == 422
    assert refused.json()["context"] == {"variable": "LLM_PROVIDER_CHECKPOINT_TTL_MINUTES"}
    assert "LLM_PROVIDER_CHECKPOINT_TTL_MINUTES was removed" in refused.json()["message"]
    invalid = client.patch(
        "/api/settings", json={"LLM_PROVIDER_CHECKPOINT_RETENTION_FINISHED_MINUTES": "99999"}, headers=admin
    )
    assert invalid.status_code == 422
    assert "LLM_PROVIDER_CHECKPOINT_RETENTION_FINISHED_MINUTES=99999" in invalid.json()["message"]
    accepted = client.patch(
        "/api/settings", json={"LLM_PROVIDER_CHECKPOINT_RETENTION_FINISHED_MINUTES": "60"}, headers=admin
    )
    assert accepted.status_code == 200
    assert accepted.json()["settings"]["LLM_PROVIDER_CHECKPOINT_RETENTION_FINISHED_MINUTES"] == "60"
    assert "LLM_PROVIDER_CHECKPOINT_API_KEYS" not in accepted.json()["settings"]
    swept = client.post("/api/checkpoints/sweep?dry_run=1", headers=admin).json()
    assert swept["finished_minutes"] == 60
    assert (
        client.patch("/api/settings", json={}, headers={"Authorization": f"Bearer {USER}"}).status_code == 403
    )


def test_rt6_a_server_with_a_removed_setting_refuses_to_boot(env: dict[str, str], monkeypatch: Any) -> None:
    monkeypatch.setenv("LLM_PROVIDER_CHECKPOINT_TTL_MINUTES", "60")
    with pytest.raises(ConfigurationError, match="LLM_PROVIDER_CHECKPOINT_TTL_MINUTES"):
        create_app()


# --- threadkeep serve, as a process -----------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_sv1_threadkeep_serve_end_to_end(env: dict[str, str]) -> None:
    seed()
    port = _free_port()
    threadkeep = Path(sys.executable).with_name("threadkeep")
    server = subprocess.Popen(
        [str(threadkeep), "serve", "--port", str(port)],
        env={**os.environ, **env},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                if httpx.get(f"{base}/healthz", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert server.poll() is None, server.stdout.read().decode()  # type: ignore[union-attr]
            assert time.monotonic() < deadline, "threadkeep serve did not answer in 30 s"
            time.sleep(0.1)
        assert httpx.post(f"{base}/api/checkpoints/sweep").status_code == 401
        swept = httpx.post(f"{base}/api/checkpoints/sweep", headers={"Authorization": f"Bearer {ADMIN}"})
        assert swept.status_code == 200
        assert swept.json()["finished_swept"] == 1
        metrics = httpx.get(f"{base}/metrics").text
        assert 'threadkeep_checkpoint_sweep_deleted_total{horizon="finished"} 1' in metrics
    finally:
        server.terminate()
        server.wait(timeout=10)
    assert still_there("done", "asking") == [False, True]
