"""A SQL store: one engine, one dialect, its numbered migrations, and the programs bound to them."""

from __future__ import annotations

import re
import time
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from importlib import resources
from typing import Any, Protocol, TypeVar

from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import CheckpointTuple
from langgraph.checkpoint.serde.base import SerializerProtocol

from threadkeep.backends.sql import ledger, programs
from threadkeep.backends.sql.programs import SqlDialect
from threadkeep.core.identity import Actor
from threadkeep.core.ledger import CallBegin, CallEnd, StoredCall
from threadkeep.core.listing import ThreadRow, ThreadScan
from threadkeep.core.messages import ContentCache, EncodingMemo
from threadkeep.core.program import Engine, Program, ProgramFactory
from threadkeep.core.records import ListQuery, PutStep, StoredCheckpoint, Target, WritesStep
from threadkeep.core.retention import ExpiredThread, Park, SweepPage, ThreadRetention

__all__ = ["Migration", "SqlBackend", "SqlEngine", "load_migrations"]

T = TypeVar("T")

_MIGRATION_FILE = re.compile(r"^(\d{4})_[a-z0-9_]+\.sql$")


@dataclass(frozen=True, slots=True)
class Migration:
    """One numbered schema change; ``version`` is its file's number."""

    version: int
    name: str
    statements: tuple[str, ...]


def load_migrations(package: str) -> list[Migration]:
    """Read ``<package>/migrations/NNNN_name.sql`` files, in order.

    Raises:
        ValueError: the numbers do not run 1, 2, 3, ... without gaps (append-only).
    """
    folder = resources.files(package) / "migrations"
    found = []
    for entry in folder.iterdir():
        match = _MIGRATION_FILE.match(entry.name)
        if match:
            found.append((int(match.group(1)), entry.name, entry.read_text(encoding="utf-8")))
    found.sort()
    for expected, (version, name, _text) in enumerate(found, start=1):
        if version != expected:
            raise ValueError(f"migration {name} is out of sequence: expected number {expected}")
    return [Migration(version, name, _statements(text)) for version, name, text in found]


# A dollar-quote tag (``$body$``), or a semicolon that ends a line.
_SCRIPT_TOKEN = re.compile(r"\$(?:[A-Za-z_][A-Za-z_0-9]*)?\$|;[ \t]*$", re.MULTILINE)


def _statements(script: str) -> tuple[str, ...]:
    """Split a migration script on the semicolons that end its lines, outside dollar-quoted
    bodies (a function's own statements end lines too)."""
    parts: list[str] = []
    start, quote = 0, None
    for token in _SCRIPT_TOKEN.finditer(script):
        text = token.group()
        if text.startswith("$"):
            quote = None if quote == text else quote or text
        elif quote is None:
            parts.append(script[start : token.start()])
            start = token.end()
    parts.append(script[start:])
    return tuple(part.strip() for part in parts if _has_code(part))


def _has_code(part: str) -> bool:
    return any(line.strip() and not line.strip().startswith("--") for line in part.splitlines())


class SqlEngine(Engine, Protocol):
    """An engine of a SQL store, which can also set the schema up from an event loop."""

    def setup(self, make: ProgramFactory[T], *, transaction: bool = True) -> T:
        """:meth:`Engine.setup`; a read of one statement at a time may go without a
        ``transaction`` where the engine allows it."""
        ...

    async def asetup(self, make: ProgramFactory[T], *, transaction: bool = True) -> T:
        """The same as :meth:`setup`, without blocking the event loop."""
        ...


class SqlBackend:
    """The storage operations of one SQL store, as program factories.

    Args:
        engine: Runs the programs (owns the connections).
        dialect: The statements the programs run.
        migrations: The store's schema, as numbered migrations.
    """

    # Messages written by a task are stored once, with the thread's message lists.
    messages_by_reference = True

    def __init__(self, engine: SqlEngine, dialect: SqlDialect, migrations: Sequence[Migration]) -> None:
        self.engine = engine
        self.dialect = dialect
        self.migrations = tuple(migrations)

    def open(self) -> None:
        """Check the format gate, then bring the schema up to date (SPEC P6). A store that is
        up to date already is checked in one short read; one that is not is upgraded on one
        connection, each step in its own transaction (:func:`programs.upgrade`)."""
        if not self.engine.setup(self._current, transaction=False):
            self.engine.setup(self._upgrade)

    async def aopen(self) -> None:
        """:meth:`open`, on the event loop's connections."""
        if not await self.engine.asetup(self._current, transaction=False):
            await self.engine.asetup(self._upgrade)

    def _current(self) -> Program[bool]:
        """The format gate: whether the store is up to date already."""
        return programs.is_current(self.dialect, [migration.version for migration in self.migrations])

    def _upgrade(self) -> Program[None]:
        """Check the store's format, migrate it and record the format, step by step."""
        steps = [(migration.version, migration.statements) for migration in self.migrations]
        return programs.upgrade(self.dialect, steps, time.time())

    def put(self, step: PutStep) -> Program[RunnableConfig]:
        return programs.put(self.dialect, step)

    def put_writes(self, step: WritesStep) -> Program[None]:
        return programs.put_writes(self.dialect, step)

    def get_tuple(
        self,
        target: Target,
        serde: SerializerProtocol,
        content: ContentCache,
        memo: EncodingMemo | None = None,
    ) -> Program[CheckpointTuple | None]:
        return programs.get_tuple(self.dialect, target, serde, content, memo)

    def get_stored(
        self, target: Target, content: ContentCache
    ) -> Program[tuple[StoredCheckpoint, dict[bytes, list[tuple[str, bytes]]]] | None]:
        return programs.get_stored(self.dialect, target, content)

    def owner_of(self, thread_id: str) -> Program[str | None]:
        return programs.owner_of(self.dialect, thread_id)

    def run_threads(self, run_ids: Sequence[str], owner: str | None) -> Program[list[tuple[str, str]]]:
        return programs.run_threads(self.dialect, run_ids, owner)

    def list_page(
        self, query: ListQuery, serde: SerializerProtocol, content: ContentCache
    ) -> Program[tuple[list[CheckpointTuple], ListQuery | None]]:
        return programs.list_page(self.dialect, query, serde, content)

    def delete_thread(self, thread_id: str, owner: str | None) -> Program[bool]:
        return programs.delete_thread(self.dialect, thread_id, owner)

    def delete_for_runs(
        self,
        run_ids: Sequence[str],
        owner: str | None,
        spare: Mapping[str, Collection[tuple[str, str]]] | None = None,
    ) -> Program[int]:
        return programs.delete_for_runs(self.dialect, run_ids, owner, spare)

    def copy_thread(self, source: str, target: str, actor: Actor, now: float) -> Program[bool]:
        return programs.copy_thread(self.dialect, source, target, actor, now)

    def prune(
        self,
        thread_ids: Iterable[str],
        strategy: str,
        owner: str | None,
        keep: Mapping[str, Mapping[str, int]] | None = None,
    ) -> Program[None]:
        return programs.prune(self.dialect, thread_ids, strategy, owner, keep)

    def assign_owner(
        self, thread_ids: Sequence[str], user: str, force: bool
    ) -> Program[dict[str, str | None]]:
        return programs.assign_owner(self.dialect, thread_ids, user, force)

    # retention (SPEC RT1-RT5, SW1-SW8) ----------------------------------------------------------

    def start_thread(
        self, thread_id: str, actor: Actor, declared: ThreadRetention, now: float
    ) -> Program[None]:
        return programs.start_thread(self.dialect, thread_id, actor, declared, now)

    def mark_finished(
        self, thread_ids: Sequence[str], actor: Actor, finished_minutes: int, now: float
    ) -> Program[dict[str, float]]:
        return programs.mark_finished(self.dialect, thread_ids, actor, finished_minutes, now)

    def thread_retention(
        self, thread_id: str, owner: str | None
    ) -> Program[tuple[ThreadRetention, float | None] | None]:
        return programs.thread_retention(self.dialect, thread_id, owner)

    def expired_page(self, page: SweepPage) -> Program[list[ExpiredThread]]:
        return programs.expired_page(self.dialect, page)

    def count_expired(self, page: SweepPage) -> Program[int]:
        return programs.count_expired(self.dialect, page)

    def delete_threads(
        self, threads: Sequence[ExpiredThread], page: SweepPage | None = None
    ) -> Program[list[str]]:
        return programs.delete_threads(self.dialect, threads, page)

    def threads_named(self, thread_ids: Sequence[str]) -> Program[list[ExpiredThread]]:
        return programs.threads_named(self.dialect, thread_ids)

    def record_park(self, park: Park) -> Program[None]:
        return programs.record_park(self.dialect, park)

    def clear_park(self, thread_id: str, park_id: str, actor: Actor) -> Program[None]:
        return programs.clear_park(self.dialect, thread_id, park_id, actor)

    def live_parks(self, thread_ids: Sequence[str], now: float, owner: str | None) -> Program[set[str]]:
        return programs.live_parks(self.dialect, thread_ids, now, owner)

    def interrupted(self, thread_ids: Sequence[str], since: float | None) -> Program[set[str]]:
        return programs.interrupted(self.dialect, thread_ids, since)

    def thread_rows(self, scan: ThreadScan) -> Program[list[ThreadRow]]:
        return programs.thread_rows(self.dialect, scan)

    def thread_row(self, thread_id: str, owner: str | None, now: float) -> Program[ThreadRow | None]:
        return programs.thread_row(self.dialect, thread_id, owner, now)

    # the tool-call ledger (SPEC TM5) -------------------------------------------------------------

    def begin_tool_call(self, step: CallBegin) -> Program[StoredCall]:
        return ledger.begin_tool_call(self.dialect, step)

    def end_tool_call(self, step: CallEnd) -> Program[None]:
        return ledger.end_tool_call(self.dialect, step)

    def tool_calls(self, thread_id: str, owner: str | None) -> Program[list[StoredCall]]:
        return ledger.tool_calls(self.dialect, thread_id, owner)

    # the store ------------------------------------------------------------------------------------

    def stats(self, thread_id: str | None = None) -> dict[str, Any]:
        """Counts of what the store (or one thread) holds, and its payload bytes."""
        q = self.dialect
        return self.engine.run(lambda: programs.stats(q, thread_id))

    def location(self) -> str:
        """Where the store is, for people (no secrets)."""
        return str(getattr(self.engine, "location", self.dialect.NAME))

    def check(self) -> None:
        """Raise :class:`~threadkeep.errors.CheckpointStoreFormatError` if the gate refuses."""
        q = self.dialect
        self.engine.setup(lambda: programs.ensure_format(q))

    def reset(self) -> None:
        """Drop every table threadkeep owns; other applications' tables stay as they are."""
        q = self.dialect
        self.engine.setup(lambda: programs.reset(q))
