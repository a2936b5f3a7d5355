"""The sweep's surfaces (SPEC SW1, SV1, SV3, SV4) and RT6: the CLI, the HTTP app, the server."""

from __future__ import annotations

import concurrent.futures
import json
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
from threadkeep.metrics import Metrics
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
    assert "done  (finished)" in dry.output
    assert still_there("done", "stale") == [True, True]

    result = CliRunner().invoke(main, ["checkpoints", "sweep"])
    assert result.exit_code == 0, result.output
    assert "checkpoint sweep of the sqlite store" in result.output
    assert "deleted 2 thread(s): 1 finished, 1 waiting" in result.output
    assert "asking  (finished horizon, claimed by interrupts)" in result.output
    assert still_there("done", "stale", "asking", "fresh") == [False, False, True, True]


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
    assert response.headers["content-type"].startswith("text/plain; version=0.0.4")
    text = response.text
    assert "# TYPE threadkeep_checkpoint_sweep_spared_total counter" in text
    assert 'threadkeep_checkpoint_sweep_spared_total{horizon="finished",owner="interrupts"} 1' in text
    assert 'threadkeep_checkpoint_sweep_deleted_total{horizon="finished"} 1' in text


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
