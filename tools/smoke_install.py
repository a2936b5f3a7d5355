"""Smoke test of one installed threadkeep: it opens what its extras promise, and no more.

Run by ``tools/check_installs`` inside a fresh virtual environment holding the wheel and the
extras named by ``--extras`` (and nothing else of the project's; no PYTHONPATH), from a
working directory outside the repository. For each provider the install promises it opens
a store on the real servers, puts a checkpoint and reads it back; for each provider (and
``threadkeep serve``) whose extra is missing it checks that ``MissingExtraError`` names the
``pip install`` to run; it runs ``threadkeep demo``; with ``[server]`` it starts ``threadkeep
serve`` and asks ``/healthz`` and the inspector page's files (``/``, ``/inspector/*``). Exit
status 0 when everything holds; the first failure otherwise, with its traceback.

    python tools/smoke_install.py --extras postgres,redis
"""

from __future__ import annotations

import argparse
import importlib.resources
import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
import uuid
from pathlib import Path

POSTGRES_URL = os.environ.get("THREADKEEP_TEST_POSTGRES_URL", "host=127.0.0.1 user=postgres dbname=test")
REDIS_URL = os.environ.get("THREADKEEP_TEST_REDIS_URL", "redis://127.0.0.1:6379/0")
# The extras each provider needs (memory and sqlite: none).
NEEDS = {
    "memory": (),
    "sqlite": (),
    "postgres": ("postgres",),
    "redis": ("redis",),
    "tiered": ("postgres", "redis"),
}
DRIVERS = ("psycopg", "psycopg_pool", "redis", "starlette", "uvicorn")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--extras", default="", help="the extras installed, comma-separated")
    extras = set(filter(None, parser.parse_args().extras.split(",")))
    threadkeep_script = Path(sys.executable).with_name("threadkeep")

    import threadkeep

    where = threadkeep.__file__
    expect(Path(where).is_relative_to(sys.prefix), f"not the installed wheel: {where}")
    expect((importlib.resources.files("threadkeep") / "py.typed").is_file(), "the wheel has no py.typed")
    loaded = sorted(m for m in sys.modules if m.startswith("threadkeep.backends") or m in DRIVERS)
    expect(not loaded, f"import threadkeep imported {loaded}")

    with tempfile.TemporaryDirectory() as folder:
        os.chdir(folder)
        for provider, needs in NEEDS.items():
            missing = [extra for extra in needs if extra not in extras]
            if missing:
                check_refused(provider, needs)
            else:
                check_opens(provider, Path(folder))
            print(f"ok: {provider} {'refused, naming its extra' if missing else 'opens, puts and reads'}")
            if provider == "sqlite":
                loaded = [m for m in DRIVERS if m in sys.modules]
                expect(not loaded, f"memory and sqlite imported {loaded}")

        demo = run([threadkeep_script, "demo", "--turns", "2"])
        expect(demo.returncode == 0, demo.stdout + demo.stderr)
        expect("checkpoints, newest first" in demo.stdout, demo.stdout)
        expect("pip install langgraph-checkpoint-sqlite" in demo.stdout, demo.stdout)
        print("ok: threadkeep demo")

        if "server" in extras:
            check_serves(threadkeep_script, Path(folder))
            print("ok: threadkeep serve answers /healthz")
        else:
            refused = run([threadkeep_script, "serve", "--port", str(free_port())])
            expect(refused.returncode == 1, refused.stdout + refused.stderr)
            expect("Traceback" not in refused.stderr, refused.stderr)
            expect("pip install 'threadkeep[server]'" in refused.stderr, refused.stderr)
            print("ok: threadkeep serve refused, naming its extra")


def check_opens(provider: str, folder: Path) -> None:
    from langgraph.checkpoint.base import empty_checkpoint

    import threadkeep

    unique = uuid.uuid4().hex[:12]
    settings = threadkeep.Settings()
    options: dict[str, object] = {}
    conn_string: str | None = None
    schema = None
    if provider == "sqlite":
        conn_string = str(folder / "smoke.sqlite")
    elif provider in ("postgres", "tiered"):
        schema = f"tk_smoke_{unique}"
        postgres(f"CREATE SCHEMA {schema}")
        conn_string = f"{POSTGRES_URL} options='-c search_path={schema}'"
    if provider == "redis":
        conn_string, options["key_prefix"] = REDIS_URL, f"tksmoke{unique}"
    elif provider == "tiered":
        settings = settings.with_values(cache_url=REDIS_URL)
        options["cache_prefix"] = f"tksmokec{unique}"
    try:
        with threadkeep.open_checkpointer(provider, conn_string, settings=settings, **options) as saver:
            config = {"configurable": {"thread_id": f"smoke-{unique}", "checkpoint_ns": ""}}
            checkpoint = empty_checkpoint()
            checkpoint["channel_values"] = {"answer": f"stored by the {provider} provider"}
            checkpoint["channel_versions"] = {"answer": 1}
            stored = saver.put(config, checkpoint, {"source": "input", "step": -1}, {"answer": 1})
            found = saver.get_tuple(stored)
            expect(found is not None, f"{provider}: the checkpoint put is not there")
            expect(found.checkpoint["channel_values"] == checkpoint["channel_values"], found)
            if provider != "memory":
                saver.backend.reset()
    finally:
        if schema:
            postgres(f"DROP SCHEMA IF EXISTS {schema} CASCADE")


def check_refused(provider: str, needs: tuple[str, ...]) -> None:
    import threadkeep

    hint = f"pip install 'threadkeep[{','.join(needs)}]'"
    try:
        threadkeep.open_checkpointer(provider, settings=threadkeep.Settings())
    except threadkeep.MissingExtraError as error:
        refusal = str(error)
    else:
        raise SystemExit(f"{provider} opened without its extra {needs}")
    expect(hint in refusal, f"{provider}: {refusal} does not name {hint}")


def check_serves(threadkeep_script: Path, folder: Path) -> None:
    port = free_port()
    env = {**os.environ, "LLM_PROVIDER_CHECKPOINT_CONN_STRING": str(folder / "served.sqlite")}
    server = subprocess.Popen(
        [threadkeep_script, "serve", "--port", str(port)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        deadline = time.monotonic() + 60
        while True:
            if server.poll() is not None:
                expect(False, f"threadkeep serve stopped: {server.communicate()[0]}")
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=5) as reply:
                    expect(reply.status == 200, reply.status)
                break
            except (urllib.error.URLError, ConnectionError):
                expect(time.monotonic() < deadline, "threadkeep serve did not answer within 60 s")
                time.sleep(0.2)
        # The inspector's files ship in the wheel: the page and what it loads.
        for path, holds in (
            ("/", "/inspector/app.js"),
            ("/inspector/app.js", "/api/threads"),
            ("/inspector/app.css", ""),
        ):
            with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as reply:
                expect(reply.status == 200 and holds in reply.read().decode(), f"GET {path}: {reply.status}")
    finally:
        server.terminate()
        server.wait(timeout=30)


def expect(condition: object, failure: object) -> None:
    """Stop with ``failure`` unless ``condition`` holds (asserts vanish under ``python -O``)."""
    if not condition:
        raise SystemExit(f"smoke test failed: {failure}")


def postgres(statement: str) -> None:
    import psycopg

    with psycopg.connect(POSTGRES_URL, autocommit=True) as conn:
        conn.execute(statement)


def run(command: list[object]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(part) for part in command], capture_output=True, text=True, timeout=300, check=False
    )


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


if __name__ == "__main__":
    main()
