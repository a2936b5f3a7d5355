"""The resume state file: each user's resumable turn, stamped, expiring (SPEC TM4).

One JSON file, ``{"version": 1, "turns": {user_id: entry}}``. Every change reads the file,
changes it and replaces it whole (a temporary file in the same folder, fsynced, then
``os.replace``), under a lock that threads and processes on the host share: a reader never
sees half a file, and two workers writing at once lose neither's entry. An entry older than
the time to live is ignored by reads and dropped at the next write.
"""

from __future__ import annotations

import base64
import json
import logging
import os
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Literal

try:
    import fcntl
except ImportError:  # pragma: no cover - not POSIX: the lock is per process only
    fcntl = None  # type: ignore[assignment]

__all__ = ["Pointer", "PointerFile"]

logger = logging.getLogger("threadkeep.turns")

_VERSION = 1
# One lock per file path in this process; the file lock (fcntl) covers other processes.
_LOCKS: dict[str, threading.Lock] = {}
_LOCKS_GUARD = threading.Lock()


@dataclass(frozen=True, slots=True)
class Pointer:
    """A user's resumable turn.

    Attributes:
        user_id: Whose turn it is.
        thread_id: The turn's thread.
        status: ``running`` (written as the turn starts: still running, or cut off by a crash)
            or ``failed`` (it failed or timed out, and was kept).
        stamp: Wall-clock seconds of the entry's last change; it expires ``ttl`` after.
        input_type: The turn's input, encoded with the saver's serializer: its type ...
        input_data: ... and its bytes, in base64 (a restart on ``memory`` runs it again).
        error: What ended a failed turn.
    """

    user_id: str
    thread_id: str
    status: Literal["running", "failed"]
    stamp: float
    input_type: str
    input_data: str
    error: str | None = None

    @staticmethod
    def encode_input(typed: tuple[str, bytes]) -> tuple[str, str]:
        """A serializer's ``(type, bytes)`` as the two text fields."""
        return typed[0], base64.b64encode(typed[1]).decode("ascii")

    def typed_input(self) -> tuple[str, bytes]:
        """The input as its serializer's ``(type, bytes)``."""
        return self.input_type, base64.b64decode(self.input_data)


class PointerFile:
    """The resume state file at ``path``; entries live ``ttl`` seconds.

    Args:
        path: The file (its folder is created on the first write).
        ttl: Seconds an entry stays valid after its stamp.
        clock: Wall-clock seconds (stamps must mean the same to every process).
    """

    def __init__(
        self, path: str | os.PathLike[str], ttl: float, clock: Callable[[], float] = time.time
    ) -> None:
        self.path = Path(path)
        self.ttl = ttl
        self.clock = clock
        key = str(self.path.resolve())
        with _LOCKS_GUARD:
            self._lock = _LOCKS.setdefault(key, threading.Lock())

    def get(self, user_id: str) -> Pointer | None:
        """The user's entry, or ``None`` (none, or expired)."""
        return self._read().get(user_id)

    def all(self) -> dict[str, Pointer]:
        """Every entry that has not expired, by user."""
        return self._read()

    def put(self, pointer: Pointer) -> Pointer | None:
        """Write ``pointer`` (replacing the user's entry); returns the entry it replaced."""
        with self._locked() as entries:
            previous = entries.get(pointer.user_id)
            entries[pointer.user_id] = pointer
        return previous

    def drop(self, user_id: str | None = None, thread_id: str | None = None) -> list[Pointer]:
        """Drop the user's entry (``None``: every entry); with ``thread_id``, only if it names
        that thread. Returns the entries dropped."""
        with self._locked() as entries:
            chosen = list(entries) if user_id is None else [user_id]
            return [
                entries.pop(user)
                for user in chosen
                if user in entries and (thread_id is None or entries[user].thread_id == thread_id)
            ]

    # the file -------------------------------------------------------------------------------

    def _read(self) -> dict[str, Pointer]:
        try:
            text = self.path.read_text(encoding="utf-8")
        except FileNotFoundError:
            return {}
        try:
            document = json.loads(text)
            if document.get("version") != _VERSION:
                raise ValueError(f"version {document.get('version')!r}")
            entries = {user: Pointer(**entry) for user, entry in document["turns"].items()}
        except (ValueError, TypeError, KeyError, AttributeError) as error:
            logger.warning("ignoring the resume state file %s, which cannot be read: %s", self.path, error)
            return {}
        now = self.clock()
        return {user: entry for user, entry in entries.items() if now - entry.stamp < self.ttl}

    def _write(self, entries: dict[str, Pointer]) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        document = {"version": _VERSION, "turns": {user: asdict(entry) for user, entry in entries.items()}}
        handle, temporary = tempfile.mkstemp(prefix=self.path.name + ".", suffix=".tmp", dir=self.path.parent)
        try:
            with os.fdopen(handle, "w", encoding="utf-8") as out:
                json.dump(document, out, sort_keys=True)
                out.flush()
                os.fsync(out.fileno())
            os.replace(temporary, self.path)
        except BaseException:
            Path(temporary).unlink(missing_ok=True)
            raise
        _fsync_folder(self.path.parent)

    @contextmanager
    def _locked(self) -> Iterator[dict[str, Pointer]]:
        """The entries (expired ones left out), written back at exit, under both locks."""
        with self._lock:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            with open(self.path.with_name(self.path.name + ".lock"), "a") as lock_file:
                if fcntl is not None:
                    fcntl.flock(lock_file.fileno(), fcntl.LOCK_EX)
                try:
                    entries = self._read()
                    yield entries
                    self._write(entries)
                finally:
                    if fcntl is not None:
                        fcntl.flock(lock_file.fileno(), fcntl.LOCK_UN)


def _fsync_folder(folder: Path) -> None:
    """Make the rename itself durable (POSIX); a folder that cannot be opened is passed by."""
    try:
        descriptor = os.open(folder, os.O_RDONLY)
    except OSError:  # pragma: no cover - Windows
        return
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)
