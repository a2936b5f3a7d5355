"""Moving threads from LangGraph's own savers into a threadkeep store (``threadkeep import``).

:func:`import_threads` reads every thread of a LangGraph saver through its public API
(``list``) and writes it into a threadkeep saver through LangGraph's (``put``,
``put_writes``), keeping thread and checkpoint ids, metadata, parent links and pending writes,
in every namespace. Checkpoints are put in id order (the order they were written), each
naming the checkpoint it continues from, as a run its caller started at a checkpoint does
(:func:`threadkeep.core.rules.named_checkpoint`): the head rule (SPEC W2) takes such a put as
a branch from that checkpoint, so a history whose branches interleave (time travel, forks,
``update_state``) is accepted as it is, with no import mode that sets the rule aside.

Re-running skips the checkpoints and writes the store already holds, so an interrupted import
resumes where it stopped. :func:`verify_threads` compares every imported thread with its
source. :func:`open_langgraph_saver` opens a SqliteSaver file or a Postgres database.
"""

from __future__ import annotations

import sqlite3
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import BaseCheckpointSaver, CheckpointTuple

from threadkeep.core.identity import ANONYMOUS, user_scope
from threadkeep.errors import (
    CheckpointSerializationError,
    ConfigurationError,
    InvalidInputError,
    MissingExtraError,
    StorageForbiddenError,
)
from threadkeep.extras import pip_install
from threadkeep.saver import ThreadkeepSaver

__all__ = [
    "ImportSummary",
    "Mismatch",
    "import_threads",
    "open_langgraph_saver",
    "source_thread_ids",
    "verify_threads",
]

# Why a checkpoint or a pending write is not copied: the store already holds it.
CHECKPOINTS_THERE = "checkpoints already in the store"
WRITES_THERE = "pending writes already in the store"
# Why an older checkpoint is not copied: the store keeps only the newest N of a namespace.
BEYOND_LIMIT = "checkpoints beyond the store's state_history_limit"
# Errors that make the importer skip one thread (the summary says why) and go on.
_THREAD_REFUSALS = (InvalidInputError, CheckpointSerializationError)

Progress = Callable[[int, int, str], None]


@dataclass(slots=True)
class ImportSummary:
    """What :func:`import_threads` did.

    Attributes:
        threads: Threads of the source.
        threads_copied: Threads into which at least one checkpoint or write was copied.
        checkpoints: Checkpoints copied.
        writes: Pending writes copied.
        skipped: What was not copied, by reason (reason -> count): the checkpoints and
            the pending writes the store already held.
        skipped_threads: Threads not imported (thread id -> reason): the store refused them.
    """

    threads: int = 0
    threads_copied: int = 0
    checkpoints: int = 0
    writes: int = 0
    skipped: Counter[str] = field(default_factory=Counter)
    skipped_threads: dict[str, str] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        """The summary as JSON-ready data (``threadkeep import --json``)."""
        return {
            "threads": self.threads,
            "threads_copied": self.threads_copied,
            "checkpoints_copied": self.checkpoints,
            "writes_copied": self.writes,
            "skipped": dict(+self.skipped),
            "threads_skipped": dict(self.skipped_threads),
        }


@dataclass(frozen=True, slots=True)
class Mismatch:
    """A difference :func:`verify_threads` found between a source thread and the store's."""

    thread_id: str
    checkpoint_ns: str
    checkpoint_id: str | None
    what: str

    def __str__(self) -> str:
        where = f"{self.thread_id!r} ns {self.checkpoint_ns!r}"
        if self.checkpoint_id is not None:
            where += f" checkpoint {self.checkpoint_id}"
        return f"{where}: {self.what}"


def _thread_config(thread_id: str) -> RunnableConfig:
    # No checkpoint_ns: LangGraph's savers list every namespace of the thread.
    return {"configurable": {"thread_id": thread_id}}


def source_thread_ids(source: BaseCheckpointSaver[Any]) -> list[str]:
    """Every thread id the source holds, sorted (the order an import takes them in)."""
    return sorted({str(item.config["configurable"]["thread_id"]) for item in source.list(None)})


def _key(item: CheckpointTuple) -> tuple[str, str]:
    configurable = item.config["configurable"]
    return str(configurable.get("checkpoint_ns", "")), str(configurable["checkpoint_id"])


def _parent_id(item: CheckpointTuple) -> str | None:
    parent = item.parent_config
    return None if parent is None else parent["configurable"].get("checkpoint_id")


def _history(saver: BaseCheckpointSaver[Any], thread_id: str) -> list[CheckpointTuple]:
    """The thread's checkpoints of every namespace, in the order they were written."""
    return sorted(saver.list(_thread_config(thread_id)), key=lambda item: (_key(item)[1], _key(item)[0]))


def _beyond_limit(history: Sequence[CheckpointTuple], limit: int | None) -> set[tuple[str, str]]:
    """The checkpoints a store that keeps the newest ``limit`` of each namespace drops."""
    if limit is None:
        return set()
    by_ns: dict[str, list[str]] = {}
    for item in history:
        ns, checkpoint_id = _key(item)
        by_ns.setdefault(ns, []).append(checkpoint_id)
    return {(ns, old) for ns, ids in by_ns.items() for old in sorted(ids, reverse=True)[limit:]}


def _writes_by_task(item: CheckpointTuple) -> dict[str, list[tuple[str, Any]]]:
    """The checkpoint's pending writes grouped by task, each task's in their order."""
    tasks: dict[str, list[tuple[str, Any]]] = {}
    for task_id, channel, value in item.pending_writes or ():
        tasks.setdefault(task_id, []).append((channel, value))
    return tasks


def _put_checkpoint(
    target: ThreadkeepSaver, thread_id: str, item: CheckpointTuple, parent: CheckpointTuple | None
) -> None:
    ns, _ = _key(item)
    parent_id = _parent_id(item)
    parent_versions = parent.checkpoint["channel_versions"] if parent is not None else {}
    # The channels this checkpoint changed, as LangGraph's own put would receive them.
    new_versions = {
        channel: version
        for channel, version in item.checkpoint["channel_versions"].items()
        if parent_versions.get(channel) != version
    }
    configurable: dict[str, Any] = {"thread_id": thread_id, "checkpoint_ns": ns}
    config: dict[str, Any] = {"configurable": configurable}
    if parent_id is not None:
        configurable["checkpoint_id"] = parent_id
        # The put names the checkpoint it continues from, as a run its caller started there
        # does: a branch of the history is accepted whatever the head is now.
        config["metadata"] = {"checkpoint_id": parent_id}
    target.put(config, item.checkpoint, item.metadata, new_versions)  # type: ignore[arg-type]


def _import_thread(
    source: BaseCheckpointSaver[Any], target: ThreadkeepSaver, thread_id: str, summary: ImportSummary
) -> None:
    history = _history(source, thread_id)
    by_key = {_key(item): item for item in history}
    held = {_key(item): item for item in target.list(_thread_config(thread_id))}
    dropped = _beyond_limit(history, target.state_history_limit)
    copied = False
    for item in history:
        ns, checkpoint_id = _key(item)
        if (ns, checkpoint_id) in dropped:
            summary.skipped[BEYOND_LIMIT] += 1
            continue
        stored = held.get((ns, checkpoint_id))
        if stored is None:
            parent_id = _parent_id(item)
            parent = None if parent_id is None else by_key.get((ns, parent_id))
            _put_checkpoint(target, thread_id, item, parent)
            summary.checkpoints += 1
            copied = True
        else:
            summary.skipped[CHECKPOINTS_THERE] += 1
        have = Counter(task_id for task_id, _, _ in (stored.pending_writes if stored else None) or ())
        at: RunnableConfig = {
            "configurable": {"thread_id": thread_id, "checkpoint_ns": ns, "checkpoint_id": checkpoint_id}
        }
        # Each task's writes in one call, in their order, with its rank as the task path: the
        # store returns pending writes by task path, so they come back in the source's order
        # (LangGraph's tuples do not carry the task paths themselves). A task's writes are
        # stored idempotently, so a task the store holds only part of is written again.
        for rank, (task_id, writes) in enumerate(_writes_by_task(item).items()):
            if have[task_id] >= len(writes):
                summary.skipped[WRITES_THERE] += len(writes)
                continue
            target.put_writes(at, writes, task_id, f"{rank:06}")
            summary.writes += len(writes) - have[task_id]
            summary.skipped[WRITES_THERE] += have[task_id]
            copied = True
    summary.threads_copied += copied


def import_threads(
    source: BaseCheckpointSaver[Any],
    target: ThreadkeepSaver,
    *,
    user: str | None = None,
    thread_ids: Sequence[str] | None = None,
    progress: Progress | None = None,
) -> ImportSummary:
    """Copy every thread of ``source`` (a LangGraph saver) into ``target``.

    Each thread keeps its id and every checkpoint its id, parent, metadata, values and pending
    writes, in every namespace. What the store already holds is skipped, so a second run (or
    one after an interrupted import) copies only the rest; so are the checkpoints a store
    with a ``state_history_limit`` would drop at once (older than its newest N of a
    namespace). A thread the store refuses (another user owns it, an id it cannot key, a
    value it cannot store faithfully) is skipped with the reason in the summary; the others
    are imported.

    Args:
        source: The saver to read (``SqliteSaver``, ``PostgresSaver``, any LangGraph saver).
        target: The threadkeep saver to write.
        user: The owner of the imported threads (default: the anonymous owner,
            :data:`threadkeep.ANONYMOUS`, whose threads ``threadkeep threads assign-owner``
            hands over later).
        thread_ids: Import only these threads (default: every thread of the source).
        progress: Called after each thread with (threads done, threads in all, thread id).

    Returns:
        What was copied and skipped.
    """
    ids = list(thread_ids) if thread_ids is not None else source_thread_ids(source)
    summary = ImportSummary(threads=len(ids))
    with user_scope(user or ANONYMOUS):
        for done, thread_id in enumerate(ids, start=1):
            try:
                _import_thread(source, target, thread_id, summary)
            except StorageForbiddenError as error:
                summary.skipped_threads[thread_id] = (
                    f"{error} The store holds this thread for another user: import it as its owner (--user)."
                )
            except _THREAD_REFUSALS as error:
                summary.skipped_threads[thread_id] = f"{type(error).__name__}: {error}"
            if progress is not None:
                progress(done, len(ids), thread_id)
    return summary


def _comparable(item: CheckpointTuple) -> dict[str, Any]:
    return {
        "parent": _parent_id(item),
        "metadata": dict(item.metadata),
        "checkpoint": dict(item.checkpoint),
        "pending_writes": list(item.pending_writes or ()),
    }


def _compare(
    thread_id: str, ours: Iterable[CheckpointTuple], theirs: Iterable[CheckpointTuple]
) -> Iterator[Mismatch]:
    held = {_key(item): item for item in ours}
    for item in theirs:
        ns, checkpoint_id = _key(item)
        copy = held.get((ns, checkpoint_id))
        if copy is None:
            yield Mismatch(thread_id, ns, checkpoint_id, "missing from the store")
            continue
        want, got = _comparable(item), _comparable(copy)
        for part in want:
            if want[part] != got[part]:
                yield Mismatch(thread_id, ns, checkpoint_id, f"{part} differs")


def verify_threads(
    source: BaseCheckpointSaver[Any],
    target: ThreadkeepSaver,
    *,
    user: str | None = None,
    thread_ids: Sequence[str] | None = None,
) -> list[Mismatch]:
    """Compare every thread of ``source`` with ``target``'s: its latest checkpoint of each
    namespace and its whole history (ids, parents, metadata, values, pending writes), but
    for the checkpoints a store with a ``state_history_limit`` does not keep.

    Returns:
        The differences found; empty when every thread was imported whole.
    """
    ids = list(thread_ids) if thread_ids is not None else source_thread_ids(source)
    found: list[Mismatch] = []
    with user_scope(user or ANONYMOUS):
        for thread_id in ids:
            history = _history(source, thread_id)
            dropped = _beyond_limit(history, target.state_history_limit)
            theirs = [item for item in history if _key(item) not in dropped]
            found.extend(_compare(thread_id, target.list(_thread_config(thread_id)), theirs))
            for ns in sorted({_key(item)[0] for item in theirs}):
                config: RunnableConfig = {"configurable": {"thread_id": thread_id, "checkpoint_ns": ns}}
                latest, ours = source.get_tuple(config), target.get_tuple(config)
                if latest is not None and (ours is None or _key(ours) != _key(latest)):
                    found.append(Mismatch(thread_id, ns, None, "latest checkpoint differs"))
    return found


def _missing_extra(what: str, error: ModuleNotFoundError) -> MissingExtraError:
    command = pip_install("migrate")
    return MissingExtraError(
        f"{what} needs {error.name!r}, which is not installed; install it with: {command}",
        context={"missing": error.name, "extras": ["migrate"], "install": command},
    )


@contextmanager
def _open_postgres(source: str) -> Iterator[BaseCheckpointSaver[Any]]:
    try:
        from langgraph.checkpoint.postgres import PostgresSaver
    except ModuleNotFoundError as error:
        raise _missing_extra("importing from Postgres", error) from error
    import psycopg

    with ExitStack() as stack:
        try:
            saver = stack.enter_context(PostgresSaver.from_conn_string(source))
            # One read: refuses a database PostgresSaver never set up, before any write.
            next(iter(saver.list(None, limit=1)), None)
        except psycopg.errors.UndefinedTable as error:
            raise ConfigurationError(
                "the source database holds no LangGraph PostgresSaver tables (checkpoints, "
                "checkpoint_blobs, checkpoint_writes) in its search_path: name the database and "
                "schema PostgresSaver wrote",
                context={"error": str(error)},
            ) from error
        except psycopg.OperationalError as error:
            raise ConfigurationError(
                f"cannot read the source database: {error}", context={"error": str(error)}
            ) from error
        yield saver


@contextmanager
def open_langgraph_saver(source: str) -> Iterator[BaseCheckpointSaver[Any]]:
    """Open LangGraph's saver on ``source``: a ``postgres://`` or ``postgresql://`` DSN
    (``PostgresSaver``; ``AsyncPostgresSaver`` writes the same tables) or the path of a
    ``SqliteSaver`` file, opened read-only.

    Raises:
        MissingExtraError: the saver's package is not installed.
        ConfigurationError: the file does not exist or is not one SqliteSaver wrote; the
            database cannot be reached or holds no PostgresSaver tables.
    """
    if source.startswith(("postgres://", "postgresql://")):
        with _open_postgres(source) as saver:
            yield saver
        return
    try:
        from langgraph.checkpoint.sqlite import SqliteSaver
    except ModuleNotFoundError as error:
        raise _missing_extra("importing from a SQLite file", error) from error
    path = Path(source)
    if not path.is_file():
        raise ConfigurationError(
            f"no SQLite file at {source!r}: name a LangGraph SqliteSaver file or a postgresql:// DSN",
            context={"source": source},
        )
    conn = sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True, check_same_thread=False)
    try:
        sqlite_saver = SqliteSaver(conn)
        try:
            # On a file SqliteSaver wrote, its setup writes nothing; on any other it would.
            sqlite_saver.setup()
        except sqlite3.OperationalError as error:
            raise ConfigurationError(
                f"{source!r} is not a file LangGraph's SqliteSaver wrote (reading it read-only: "
                f"{error}): name that file, or a postgresql:// DSN",
                context={"source": source},
            ) from error
        yield sqlite_saver
    finally:
        conn.close()
