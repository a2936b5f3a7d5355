"""The resume state file (SPEC TM4): atomic, shared by threads and processes, expiring."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from pathlib import Path

from threadkeep.turns.pointers import Pointer, PointerFile


def entry(user: str, stamp: float = 1000.0) -> Pointer:
    return Pointer(user, f"turn-{user}", "running", stamp, "str", "")


def test_writers_in_threads_and_processes_lose_no_entry(tmp_path: Path) -> None:
    path = tmp_path / "resumable.json"
    script = (
        "import sys\n"
        "from threadkeep.turns.pointers import Pointer, PointerFile\n"
        "f = PointerFile(sys.argv[1], 3600, clock=lambda: 1000.0)\n"
        "for i in range(30):\n"
        "    f.put(Pointer(f'{sys.argv[2]}-{i}', 't', 'running', 1000.0, 'str', ''))\n"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    processes = [
        subprocess.Popen([sys.executable, "-c", script, str(path), f"p{n}"], env=env) for n in range(2)
    ]
    pointers = PointerFile(path, 3600, clock=lambda: 1000.0)
    threads = [
        threading.Thread(target=lambda n=n: [pointers.put(entry(f"t{n}-{i}")) for i in range(30)])
        for n in range(3)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    for process in processes:
        assert process.wait(timeout=60) == 0

    assert len(pointers.all()) == 5 * 30
    assert json.loads(path.read_text())["version"] == 1
    assert not list(tmp_path.glob("*.tmp"))


def test_an_expired_entry_is_ignored_then_dropped_at_the_next_write(tmp_path: Path) -> None:
    now = [1000.0]
    pointers = PointerFile(tmp_path / "r.json", 60, clock=lambda: now[0])
    pointers.put(entry("alice", stamp=1000.0))
    now[0] = 1059.0
    assert pointers.get("alice") is not None
    now[0] = 1060.0
    assert pointers.get("alice") is None
    assert "alice" in json.loads((tmp_path / "r.json").read_text())["turns"]  # not written by a read
    pointers.put(entry("bob", stamp=now[0]))
    assert list(json.loads((tmp_path / "r.json").read_text())["turns"]) == ["bob"]


def test_a_file_that_cannot_be_read_counts_as_empty_and_is_replaced(tmp_path: Path) -> None:
    path = tmp_path / "r.json"
    path.write_text("{not json")
    pointers = PointerFile(path, 60, clock=lambda: 1000.0)
    assert pointers.all() == {}
    pointers.put(entry("alice"))
    assert pointers.get("alice") == entry("alice")
