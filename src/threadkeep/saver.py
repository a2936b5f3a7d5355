"""The LangGraph checkpointer every provider hands out.

:class:`ThreadkeepSaver` is one class for all providers: it turns LangGraph's calls into
encoded steps (:mod:`threadkeep.core.records`), runs the backend's program for each on the
backend's engine, and returns what the program returns. The sync and async methods of each
pair differ only in how the program is run.
"""

from __future__ import annotations

import builtins
import contextlib
import copy
import random
import time
from collections.abc import AsyncIterator, Callable, Collection, Iterator, Mapping, Sequence
from dataclasses import dataclass
from types import TracebackType
from typing import Any, Literal, Protocol, TypeVar, runtime_checkable

from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import (
    BaseCheckpointSaver,
    ChannelVersions,
    Checkpoint,
    CheckpointMetadata,
    CheckpointTuple,
)
from langgraph.checkpoint.serde.base import SerializerProtocol

from threadkeep.codec.serde import build_serde, with_allowlist
from threadkeep.core.delta import DeltaWindow, keep_latest_counts, spared_by_delta
from threadkeep.core.identity import ANONYMOUS, Actor, actor_for
from threadkeep.core.ids import checked_id, checked_ids, checked_park
from threadkeep.core.ledger import (
    MISSING,
    CallBegin,
    CallEnd,
    StoredCall,
    ToolCall,
    prepare_begin,
    prepare_end,
)
from threadkeep.core.listing import ThreadRow, ThreadScan, page_program
from threadkeep.core.messages import ContentCache, EncodingMemo
from threadkeep.core.program import Engine, Program, ProgramFactory
from threadkeep.core.records import (
    ListQuery,
    PutStep,
    Target,
    WritesStep,
    prepare_put,
    prepare_writes,
    target_of,
)
from threadkeep.core.retention import (
    ExpiredThread,
    Park,
    PlatformRetention,
    SweepPage,
    ThreadRetention,
    declare_retention,
)
from threadkeep.errors import InvalidInputError, StaleStateError, StorageForbiddenError
from threadkeep.metrics import METRICS, Metrics
from threadkeep.threads import ThreadPage, ThreadQuery

__all__ = ["Backend", "ProviderFacts", "ThreadkeepSaver"]

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class ProviderFacts:
    """What a provider can promise (SPEC P4).

    Attributes:
        name: The provider's name (``sqlite``, ``postgres``, ...).
        survives_restart: Whether threads outlive the process.
        expiry: How expired threads leave: ``"sweep"`` (the checkpoint sweep deletes them),
            ``"ttl"`` (key TTLs), ``"process"`` (with the process).
        holds_parked_runs: Whether a run parked on ``ask`` can be resumed by another worker.
    """

    name: str
    survives_restart: bool
    expiry: Literal["sweep", "ttl", "process"]
    holds_parked_runs: bool


class Backend(Protocol):
    """The storage operations of one store, as program factories run on its engine."""

    # Whether the store keeps a pending write of messages as their digests (SPEC S1).
    messages_by_reference: bool

    @property
    def engine(self) -> Engine: ...

    def put(self, step: PutStep) -> Program[RunnableConfig]: ...

    def put_writes(self, step: WritesStep) -> Program[None]: ...

    def get_tuple(
        self,
        target: Target,
        serde: SerializerProtocol,
        content: ContentCache,
        memo: EncodingMemo | None = None,
    ) -> Program[CheckpointTuple | None]: ...

    def list_page(
        self, query: ListQuery, serde: SerializerProtocol, content: ContentCache
    ) -> Program[tuple[list[CheckpointTuple], ListQuery | None]]: ...

    def delete_thread(self, thread_id: str, owner: str | None) -> Program[bool]: ...

    # The user who owns ``thread_id``, any user's (``None``: the store has no such thread).
    def owner_of(self, thread_id: str) -> Program[str | None]: ...

    # The (thread id, owner) of the threads holding checkpoints of ``run_ids``, found by
    # index; ``None``: the store finds them only by reading every thread (Redis).
    def run_threads(
        self, run_ids: Sequence[str], owner: str | None
    ) -> Program[list[tuple[str, str]] | None]: ...

    # ``spare``: per thread, the (namespace, checkpoint id) of the runs' checkpoints to keep:
    # those a checkpoint that stays reads its delta fields from (see core/delta.py).
    def delete_for_runs(
        self,
        run_ids: Sequence[str],
        owner: str | None,
        spare: Mapping[str, Collection[tuple[str, str]]] | None = None,
    ) -> Program[int]: ...

    def copy_thread(self, source: str, target: str, actor: Actor, now: float) -> Program[bool]: ...

    # ``keep``: per thread, per namespace, how many newest checkpoints keep_latest keeps (1
    # when not named): more where a delta field reads older ones (see core/delta.py).
    def prune(
        self,
        thread_ids: Sequence[str],
        strategy: str,
        owner: str | None,
        keep: Mapping[str, Mapping[str, int]] | None = None,
    ) -> Program[None]: ...

    def assign_owner(
        self, thread_ids: Sequence[str], user: str, force: bool
    ) -> Program[dict[str, str | None]]: ...

    def stats(self, thread_id: str | None = None) -> dict[str, Any]: ...

    # retention (SPEC RT1-RT5, SW1-SW8); ``spared`` and ``after`` are the sweep's cursor: a
    # store pages by key after ``after`` or, if it has no keys, skips the ``spared`` threads.
    # Each operation on a thread's retention, mark or parks checks its owner (SPEC W3) in the
    # statement or script that acts, as put does: start_thread, mark_finished, record_park and
    # clear_park raise StorageForbiddenError on another user's thread; thread_retention and
    # live_parks see only ``owner``'s threads (``None``: any owner).
    def start_thread(
        self, thread_id: str, actor: Actor, declared: ThreadRetention, now: float
    ) -> Program[None]: ...

    def mark_finished(
        self, thread_ids: Sequence[str], actor: Actor, finished_minutes: int, now: float
    ) -> Program[dict[str, float]]: ...

    def thread_retention(
        self, thread_id: str, owner: str | None
    ) -> Program[tuple[ThreadRetention, float | None] | None]: ...

    def expired_page(self, page: SweepPage) -> Program[list[ExpiredThread]]: ...

    def count_expired(self, page: SweepPage) -> Program[int]: ...

    def delete_threads(
        self, threads: Sequence[ExpiredThread], page: SweepPage | None = None
    ) -> Program[list[str]]: ...

    def threads_named(self, thread_ids: Sequence[str]) -> Program[list[ExpiredThread]]: ...

    def record_park(self, park: Park) -> Program[None]: ...

    def clear_park(self, thread_id: str, park_id: str, actor: Actor) -> Program[None]: ...

    def live_parks(self, thread_ids: Sequence[str], now: float, owner: str | None) -> Program[set[str]]: ...

    def interrupted(self, thread_ids: Sequence[str], since: float | None) -> Program[set[str]]: ...

    # the thread listing (SPEC SV1, SV3; core/listing.py): the threads after the scan's
    # cursor, newest write first, at most ``scan.limit``, read from an index (never a read of
    # every thread); a store may return threads of another status than ``scan.status`` (the
    # listing drops them) but none of another owner than ``scan.owner``.
    def thread_rows(self, scan: ThreadScan) -> Program[builtins.list[ThreadRow]]: ...

    # the tool-call ledger (SPEC TM5; core/ledger.py): kept with the thread, owned by its
    # owner. begin records a started entry unless the thread holds one for the call, and
    # returns the entry as stored (another user's thread: StorageForbiddenError); end ends a
    # started entry (or finds it ended: CallEnd.check_ended decides); tool_calls lists the
    # thread's entries oldest first, none for a thread of another owner than ``owner``.
    def begin_tool_call(self, step: CallBegin) -> Program[StoredCall]: ...

    def end_tool_call(self, step: CallEnd) -> Program[None]: ...

    def tool_calls(self, thread_id: str, owner: str | None) -> Program[builtins.list[StoredCall]]: ...

    def location(self) -> str: ...

    def check(self) -> None: ...

    def reset(self) -> None: ...


@runtime_checkable
class ThreadRowReader(Protocol):
    """A backend that reads one thread's listing row by id (the SQL stores and tiered; not
    Redis, whose listing rows carry their keys' expiry)."""

    def thread_row(self, thread_id: str, owner: str | None, now: float) -> Program[ThreadRow | None]: ...


class ThreadkeepSaver(BaseCheckpointSaver[str]):
    """A LangGraph checkpointer with the full sync and async API, on any threadkeep store.

    Build one with :func:`threadkeep.open_checkpointer`. Close it (or use it as a context
    manager) to release the connections it opened.

    Args:
        backend: The store's operations and engine.
        facts: What the provider promises.
        serde: How values are stored; default: the faithful JSON codec with compression.
        enforce_user_isolation: A thread belongs to the user who first wrote it (SPEC W3).
        state_history_limit: Keep only the newest N checkpoints per (thread, namespace).
        clock: Wall-clock seconds; tests pass a controllable one.
        retention: The platform's two horizons (SPEC RT1).
        metrics: Where its writes, conflicts, refusals and the sweep's work are counted
            (:mod:`threadkeep.metrics`); default: :data:`threadkeep.metrics.METRICS`.
    """

    def __init__(
        self,
        backend: Backend,
        facts: ProviderFacts,
        *,
        serde: SerializerProtocol | None = None,
        enforce_user_isolation: bool = True,
        state_history_limit: int | None = None,
        clock: Callable[[], float] = time.time,
        retention: PlatformRetention | None = None,
        metrics: Metrics | None = None,
    ) -> None:
        super().__init__(serde=serde or build_serde())
        self.metrics = metrics or METRICS
        self._meters = self.metrics.meters(facts.name)
        self.retention = retention or PlatformRetention()
        # The retention a saver built for runs that declare a shorter one records at their
        # start (threadkeep.saver_for(..., waiting_minutes=...)); None: the platform's.
        self.declared: ThreadRetention | None = None
        self.backend = backend
        self.facts = facts
        self.enforce_user_isolation = enforce_user_isolation
        self.state_history_limit = state_history_limit
        self.clock = clock
        self._owns_engine = True
        self._memo = EncodingMemo()
        self._content = ContentCache()
        self._delta_window = DeltaWindow()

    # running programs ---------------------------------------------------------------------

    # ``op``: the write's operation, as the metrics name it (threadkeep.metrics.OPERATIONS):
    # a write that stores is timed, a refusal counted. The timing is two clock reads and a
    # histogram's observe (~1 µs) on a write of at least ~100 µs.
    def _run(
        self, make: ProgramFactory[T], *, write: bool = False, atomic: bool = True, op: str = "read"
    ) -> T:
        with self._metered(write, op):
            return self.backend.engine.run(make, write=write, atomic=atomic)

    async def _arun(
        self, make: ProgramFactory[T], *, write: bool = False, atomic: bool = True, op: str = "read"
    ) -> T:
        with self._metered(write, op):
            return await self.backend.engine.arun(make, write=write, atomic=atomic)

    @contextlib.contextmanager
    def _metered(self, write: bool, op: str) -> Iterator[None]:
        """Count a call of ``op`` that ran inside: a refusal (a conflict, another user's
        thread), and a ``write``'s duration once it stored."""
        started = time.perf_counter()
        try:
            yield
        except (StaleStateError, StorageForbiddenError) as error:
            self._refused(error, op)
            raise
        if write:
            self._meters.wrote(op, time.perf_counter() - started)

    def _refused(self, error: Exception, op: str) -> None:
        if isinstance(error, StaleStateError):
            self._meters.conflicted()
        else:
            self._meters.forbidden(op)

    def _actor(self) -> Actor:
        return actor_for(None, isolate=self.enforce_user_isolation)

    def _target(self, config: RunnableConfig) -> Target:
        return target_of(config, isolate=self.enforce_user_isolation)

    def _put_step(
        self,
        config: RunnableConfig,
        checkpoint: Checkpoint,
        metadata: CheckpointMetadata,
        new_versions: ChannelVersions,
    ) -> ProgramFactory[RunnableConfig]:
        configurable = config.get("configurable") or {}
        step = prepare_put(
            config,
            checkpoint,
            metadata,
            new_versions,
            self.serde,
            isolate=self.enforce_user_isolation,
            history_limit=self._delta_window.keep(
                (str(configurable.get("thread_id")), configurable.get("checkpoint_ns") or ""),
                metadata,
                self.state_history_limit,
            ),
            now=self.clock(),
            memo=self._memo,
            content=self._content,
        )
        return lambda: self.backend.put(step)

    def _writes_step(
        self, config: RunnableConfig, writes: Sequence[tuple[str, Any]], task_id: str, task_path: str
    ) -> ProgramFactory[None]:
        step = prepare_writes(
            config,
            writes,
            task_id,
            task_path,
            self.serde,
            isolate=self.enforce_user_isolation,
            history_limit=self.state_history_limit,
            now=self.clock(),
            by_reference=self.backend.messages_by_reference,
        )
        return lambda: self.backend.put_writes(step)

    def _get_tuple(self, config: RunnableConfig) -> ProgramFactory[CheckpointTuple | None]:
        target, serde = self._target(config), self.serde
        return lambda: self.backend.get_tuple(target, serde, self._content, self._memo)

    def _list_query(
        self,
        config: RunnableConfig | None,
        filter: dict[str, Any] | None,
        before: RunnableConfig | None,
        limit: int | None,
    ) -> ListQuery | None:
        query = ListQuery.from_call(
            config, filter=filter, before=before, limit=limit, isolate=self.enforce_user_isolation
        )
        return None if query.done else query

    def _list_page(self, query: ListQuery) -> ProgramFactory[tuple[list[CheckpointTuple], ListQuery | None]]:
        serde = self.serde
        return lambda: self.backend.list_page(query, serde, self._content)

    def _delete_thread(self, thread_id: str) -> ProgramFactory[bool]:
        owner, checked = self._actor().owner_filter, checked_id(str(thread_id), "thread_id")
        return lambda: self.backend.delete_thread(checked, owner)

    def _all(
        self, config: RunnableConfig | None, filter: dict[str, Any] | None = None
    ) -> Program[builtins.list[CheckpointTuple]]:
        """Every checkpoint ``list(config, filter=filter)`` returns, read in a program."""
        found: builtins.list[CheckpointTuple] = []
        query = self._list_query(config, filter, None, None)
        while query is not None:
            page, query = yield from self.backend.list_page(query, self.serde, self._content)
            found += page
        return found

    def _delete_for_runs(self, run_ids: Sequence[str]) -> ProgramFactory[int]:
        owner, ids = self._actor().owner_filter, checked_ids(run_ids, "run_ids")

        def program() -> Program[int]:
            # A run's checkpoints that a later checkpoint's delta fields are rebuilt from
            # stay (core/delta.py): read in the same run as the delete. Only the caller's
            # threads are read; the store refuses the runs' checkpoints on another user's.
            threads = yield from self.backend.run_threads(ids, owner)
            by_thread = {thread_id for thread_id, _ in threads or ()}
            if threads is None:  # no index: the runs' checkpoints, from a read of every thread
                for run_id in ids:
                    found = yield from self._all(None, {"run_id": run_id})
                    by_thread.update(t.config["configurable"]["thread_id"] for t in found)
            spare = {}
            for thread_id in sorted(by_thread):
                thread = yield from self._all({"configurable": {"thread_id": thread_id}})
                gone = {_where(t) for t in thread if t.metadata.get("run_id") in ids}
                spare[thread_id] = spared_by_delta(thread, gone)
            return (yield from self.backend.delete_for_runs(ids, owner, spare))

        return program

    def _copy_thread(self, source: str, target: str) -> ProgramFactory[bool]:
        source = checked_id(str(source), "source_thread_id")
        target = checked_id(str(target), "target_thread_id")
        actor, now = self._actor(), self.clock()
        return lambda: self.backend.copy_thread(source, target, actor, now)

    def _prune(self, thread_ids: Sequence[str], strategy: str) -> ProgramFactory[None]:
        owner, ids = self._actor().owner_filter, checked_ids(thread_ids, "thread_ids")
        if strategy != "keep_latest":
            return lambda: self.backend.prune(ids, strategy, owner)

        def program() -> Program[None]:
            # keep_latest keeps, in each namespace, what its latest checkpoint's delta fields
            # are rebuilt from (core/delta.py): read in the same run as the prune. Only the
            # caller's threads are read; the store refuses another user's.
            keep = {}
            for thread_id in ids:
                keep[thread_id] = keep_latest_counts(
                    (yield from self._all({"configurable": {"thread_id": thread_id}}))
                )
            return (yield from self.backend.prune(ids, strategy, owner, keep))

        return program

    # LangGraph's API ----------------------------------------------------------------------

    def get_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        """The addressed checkpoint, or the newest of the thread's namespace."""
        return self._run(self._get_tuple(config))

    async def aget_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        """Async :meth:`get_tuple`."""
        return await self._arun(self._get_tuple(config))

    def list(
        self,
        config: RunnableConfig | None,
        *,
        filter: dict[str, Any] | None = None,
        before: RunnableConfig | None = None,
        limit: int | None = None,
    ) -> Iterator[CheckpointTuple]:
        """Checkpoints newest first, a page at a time; ``config=None`` lists every thread."""
        query = self._list_query(config, filter, before, limit)
        while query is not None:
            page, query = self._run(self._list_page(query))
            yield from page

    async def alist(
        self,
        config: RunnableConfig | None,
        *,
        filter: dict[str, Any] | None = None,
        before: RunnableConfig | None = None,
        limit: int | None = None,
    ) -> AsyncIterator[CheckpointTuple]:
        """Async :meth:`list`."""
        query = self._list_query(config, filter, before, limit)
        while query is not None:
            page, query = await self._arun(self._list_page(query))
            for item in page:
                yield item

    def put(
        self,
        config: RunnableConfig,
        checkpoint: Checkpoint,
        metadata: CheckpointMetadata,
        new_versions: ChannelVersions,
    ) -> RunnableConfig:
        """Store a checkpoint atomically (SPEC W1).

        Raises:
            StaleStateError: the put continues a thread whose head moved on (SPEC W2).
            StorageForbiddenError: the thread belongs to another user (SPEC W3).
            CheckpointSerializationError: a value cannot be stored faithfully.
            InvalidInputError: an id is not one every store can key (``threadkeep.core.ids``);
                every call that takes an id refuses it so, before any I/O.
        """
        return self._run(self._put_step(config, checkpoint, metadata, new_versions), write=True, op="put")

    async def aput(
        self,
        config: RunnableConfig,
        checkpoint: Checkpoint,
        metadata: CheckpointMetadata,
        new_versions: ChannelVersions,
    ) -> RunnableConfig:
        """Async :meth:`put`."""
        return await self._arun(
            self._put_step(config, checkpoint, metadata, new_versions), write=True, op="put"
        )

    def put_writes(
        self, config: RunnableConfig, writes: Sequence[tuple[str, Any]], task_id: str, task_path: str = ""
    ) -> None:
        """Store a task's writes against the checkpoint it was planned from."""
        # put_writes programs are guarded and idempotent statement by statement (no transaction).
        self._run(
            self._writes_step(config, writes, task_id, task_path), write=True, atomic=False, op="put_writes"
        )

    async def aput_writes(
        self, config: RunnableConfig, writes: Sequence[tuple[str, Any]], task_id: str, task_path: str = ""
    ) -> None:
        """Async :meth:`put_writes`."""
        await self._arun(
            self._writes_step(config, writes, task_id, task_path), write=True, atomic=False, op="put_writes"
        )

    def delete_thread(self, thread_id: str) -> None:
        """Delete every checkpoint, write and message of a thread. A thread the store does not
        hold is no error (as LangGraph's savers have it).

        Raises:
            StorageForbiddenError: the thread belongs to another user than the scope's
                (SPEC W3); nothing is deleted. An operator (:func:`threadkeep.operator_scope`)
                deletes any user's thread.
        """
        self._run(self._delete_thread(thread_id), write=True, op="delete")

    async def adelete_thread(self, thread_id: str) -> None:
        """Async :meth:`delete_thread`."""
        await self._arun(self._delete_thread(thread_id), write=True, op="delete")

    def delete_for_runs(self, run_ids: Sequence[str]) -> None:
        """Delete the checkpoints whose metadata ``run_id`` is one of ``run_ids``. A run that
        stored nothing is no error.

        Raises:
            StorageForbiddenError: a run stored checkpoints on a thread of another user than
                the scope's; nothing is deleted.
        """
        self._run(self._delete_for_runs(run_ids), write=True, op="delete_runs")

    async def adelete_for_runs(self, run_ids: Sequence[str]) -> None:
        """Async :meth:`delete_for_runs`."""
        await self._arun(self._delete_for_runs(run_ids), write=True, op="delete_runs")

    def copy_thread(self, source_thread_id: str, target_thread_id: str) -> None:
        """Copy every checkpoint, write and message of one thread onto another (created for
        the scope's user if new). A source the store does not hold copies nothing and creates
        no target.

        Raises:
            StorageForbiddenError: the source or the target belongs to another user than the
                scope's; nothing is copied.
        """
        self._run(self._copy_thread(source_thread_id, target_thread_id), write=True, op="copy")

    async def acopy_thread(self, source_thread_id: str, target_thread_id: str) -> None:
        """Async :meth:`copy_thread`."""
        await self._arun(self._copy_thread(source_thread_id, target_thread_id), write=True, op="copy")

    def prune(self, thread_ids: Sequence[str], *, strategy: str = "keep_latest") -> None:
        """Keep only each namespace's latest checkpoint (``keep_latest``), or delete all.
        Threads the store does not hold are passed by.

        Raises:
            StorageForbiddenError: one of the threads belongs to another user than the
                scope's; no thread is pruned.
        """
        self._run(self._prune(thread_ids, strategy), write=True, op="prune")

    async def aprune(self, thread_ids: Sequence[str], *, strategy: str = "keep_latest") -> None:
        """Async :meth:`prune`."""
        await self._arun(self._prune(thread_ids, strategy), write=True, op="prune")

    # owners (SPEC W3; docs/isolation.md) ------------------------------------------------------

    def _assign_owner(
        self, thread_ids: Sequence[str], user: str, force: bool
    ) -> ProgramFactory[dict[str, str | None]]:
        self._operator("assign_owner")
        ids, user = checked_ids(thread_ids, "thread_ids"), checked_id(user, "user")
        if not user:
            raise InvalidInputError(
                "user is empty: name the user to hand the threads to (the anonymous owner is "
                f"{ANONYMOUS!r}). Nothing was changed.",
                context={"field": "user", "problem": "empty", "value": "''"},
            )
        return lambda: self.backend.assign_owner(ids, user, force)

    def assign_owner(
        self, thread_ids: Sequence[str], user: str, *, force: bool = False
    ) -> dict[str, str | None]:
        """Hand threads to ``user``: the threads written before a deployment passed user ids
        belong to the anonymous owner (:data:`threadkeep.ANONYMOUS`), and only that owner
        (or an operator) can see them until they are handed over. Operator only
        (:func:`threadkeep.operator_scope`). Each thread changes owner atomically, with
        its checkpoints, writes, retention and parks; on SQL stores all of them in one
        transaction.

        Args:
            thread_ids: The threads to hand over.
            user: Their new owner.
            force: Also take threads another user owns (without it, only the anonymous
                owner's threads, and ``user``'s own, are accepted).

        Returns:
            Each thread's owner before the call; ``None`` for a thread the store does not
            hold (nothing is created for it).

        Raises:
            StorageForbiddenError: without ``force``, a thread belongs to another user (no
                thread changes owner), or the call is made outside the operator scope.
            InvalidInputError: an id no store can key, or an empty ``user``.
        """
        return self._run(self._assign_owner(thread_ids, user, force), write=True, op="assign_owner")

    async def aassign_owner(
        self, thread_ids: Sequence[str], user: str, *, force: bool = False
    ) -> dict[str, str | None]:
        """Async :meth:`assign_owner`."""
        return await self._arun(self._assign_owner(thread_ids, user, force), write=True, op="assign_owner")

    # retention (SPEC RT2-RT5): the owners' and parks' calls -----------------------------------

    def _actor_of(self, config: RunnableConfig | None) -> Actor:
        return actor_for((config or {}).get("configurable"), isolate=self.enforce_user_isolation)

    def _start(
        self, thread_ids: Sequence[str], declared: ThreadRetention | None, config: RunnableConfig | None
    ) -> ProgramFactory[None]:
        ids, actor, now = checked_ids(thread_ids, "thread_ids"), self._actor_of(config), self.clock()
        wanted = declared or self.declared or ThreadRetention()
        # Checked here too: a ThreadRetention built by hand could exceed the platform's.
        declared = declare_retention(
            self.retention, waiting_minutes=wanted.waiting_minutes, finished_minutes=wanted.finished_minutes
        )

        def program() -> Program[None]:
            for thread_id in ids:
                yield from self.backend.start_thread(thread_id, actor, declared, now)

        return program

    def start_threads(
        self,
        thread_ids: Sequence[str],
        *,
        retention: ThreadRetention | None = None,
        config: RunnableConfig | None = None,
    ) -> None:
        """A run starts on ``thread_ids``: take them out of the finished set and record their
        declared retention (``None``: the platform's; a later start replaces it). Build a
        declared one with :func:`threadkeep.declare_retention`. ``config`` names the user
        (``configurable.user_id``), as the run's own config does.

        Raises:
            ThreadRetentionError: ``retention`` exceeds the platform's.
            StorageForbiddenError: a thread belongs to another user.
        """
        self._run(self._start(thread_ids, retention, config), write=True, op="retention")

    async def astart_threads(
        self,
        thread_ids: Sequence[str],
        *,
        retention: ThreadRetention | None = None,
        config: RunnableConfig | None = None,
    ) -> None:
        """Async :meth:`start_threads`."""
        await self._arun(self._start(thread_ids, retention, config), write=True, op="retention")

    def _mark(
        self, thread_ids: Sequence[str], config: RunnableConfig | None
    ) -> ProgramFactory[dict[str, float]]:
        ids, actor, now = checked_ids(thread_ids, "thread_ids"), self._actor_of(config), self.clock()
        finished = self.retention.finished_minutes
        return lambda: self.backend.mark_finished(ids, actor, finished, now)

    def mark_finished(
        self, thread_ids: Sequence[str], *, config: RunnableConfig | None = None
    ) -> dict[str, float]:
        """Mark threads finished: each is due the finished retention in force now (its
        declared one, else the platform's capped at its waiting). Returns the due times
        (epoch seconds) of the threads marked; a thread the store does not hold is not.

        Raises:
            StorageForbiddenError: a thread belongs to another user (on SQL stores nothing is
                marked then; on Redis, the threads listed before it are).
        """
        return self._run(self._mark(thread_ids, config), write=True, op="retention")

    async def amark_finished(
        self, thread_ids: Sequence[str], *, config: RunnableConfig | None = None
    ) -> dict[str, float]:
        """Async :meth:`mark_finished`."""
        return await self._arun(self._mark(thread_ids, config), write=True, op="retention")

    def _retention(
        self, thread_id: str, config: RunnableConfig | None
    ) -> ProgramFactory[tuple[ThreadRetention, float | None] | None]:
        owner, checked = self._actor_of(config).owner_filter, checked_id(str(thread_id), "thread_id")
        return lambda: self.backend.thread_retention(checked, owner)

    def thread_retention(
        self, thread_id: str, *, config: RunnableConfig | None = None
    ) -> tuple[ThreadRetention, float | None] | None:
        """A thread's declared retention and finished due time (``None``: waiting), or
        ``None`` if the store holds no such thread of the user ``config`` names (another
        user's thread is not seen, as a read sees nothing of it)."""
        return self._run(self._retention(thread_id, config))

    async def athread_retention(
        self, thread_id: str, *, config: RunnableConfig | None = None
    ) -> tuple[ThreadRetention, float | None] | None:
        """Async :meth:`thread_retention`."""
        return await self._arun(self._retention(thread_id, config))

    def _record_park(
        self, thread_id: str, park_id: str, deadline: float, config: RunnableConfig | None
    ) -> ProgramFactory[None]:
        thread_id, park_id = checked_park(thread_id, park_id)
        actor = self._actor_of(config)
        park = Park(thread_id, park_id, deadline, actor.user_id, actor.owner_filter, self.clock())
        return lambda: self.backend.record_park(park)

    def record_park(
        self, thread_id: str, park_id: str, deadline: float, *, config: RunnableConfig | None = None
    ) -> None:
        """Record a live park until ``deadline`` (epoch seconds), for the user ``config``
        names; see :func:`threadkeep.ask`.

        Raises:
            StorageForbiddenError: the thread belongs to another user.
        """
        self._run(self._record_park(thread_id, park_id, deadline, config), write=True, op="retention")

    async def arecord_park(
        self, thread_id: str, park_id: str, deadline: float, *, config: RunnableConfig | None = None
    ) -> None:
        """Async :meth:`record_park`."""
        await self._arun(self._record_park(thread_id, park_id, deadline, config), write=True, op="retention")

    def _clear_park(
        self, thread_id: str, park_id: str, config: RunnableConfig | None
    ) -> ProgramFactory[None]:
        thread_id, park_id = checked_park(thread_id, park_id)
        actor = self._actor_of(config)
        return lambda: self.backend.clear_park(thread_id, park_id, actor)

    def clear_park(self, thread_id: str, park_id: str, *, config: RunnableConfig | None = None) -> None:
        """Remove a park once its question is answered, for the user ``config`` names (a
        park that is not there, or a thread the store does not hold, is no error).

        Raises:
            StorageForbiddenError: the thread belongs to another user.
        """
        self._run(self._clear_park(thread_id, park_id, config), write=True, op="retention")

    async def aclear_park(
        self, thread_id: str, park_id: str, *, config: RunnableConfig | None = None
    ) -> None:
        """Async :meth:`clear_park`."""
        await self._arun(self._clear_park(thread_id, park_id, config), write=True, op="retention")

    # the tool-call ledger (SPEC TM5; docs/turns.md) ------------------------------------------

    def _begin_call(
        self, config: RunnableConfig, message_id: str, call_id: str, tool: str
    ) -> ProgramFactory[ToolCall]:
        step = prepare_begin(
            config, message_id, call_id, tool, isolate=self.enforce_user_isolation, now=self.clock()
        )
        serde = self.serde

        def program() -> Program[ToolCall]:
            return step.entry((yield from self.backend.begin_tool_call(step)), serde)

        return program

    def begin_tool_call(self, config: RunnableConfig, message_id: str, call_id: str, tool: str) -> ToolCall:
        """Record a tool call as started, unless the thread's ledger holds it already.

        The ledger is keyed by the thread ``config`` names, the assistant message that issued
        the call and the call's id. Of two callers (threads, processes) beginning the same
        call at once, exactly one records it.

        Args:
            config: The run's config: its ``thread_id`` and user (as a read's config).
            message_id: The id of the assistant message that issued the call.
            call_id: The call's id in that message.
            tool: The tool's name.

        Returns:
            The entry as stored: ``fresh=True`` if this call recorded it; else the earlier
            entry, ``started``, ``succeeded`` (with its result) or ``failed``.

        Raises:
            StorageForbiddenError: the thread belongs to another user.
            InvalidInputError: an id (or the tool's name) no store can key.
        """
        return self._run(
            self._begin_call(config, message_id, call_id, tool), write=True, atomic=False, op="ledger"
        )

    async def abegin_tool_call(
        self, config: RunnableConfig, message_id: str, call_id: str, tool: str
    ) -> ToolCall:
        """Async :meth:`begin_tool_call`."""
        return await self._arun(
            self._begin_call(config, message_id, call_id, tool), write=True, atomic=False, op="ledger"
        )

    def _end_call(
        self, config: RunnableConfig, message_id: str, call_id: str, result: Any, error: str | None
    ) -> ProgramFactory[None]:
        step = prepare_end(
            config,
            message_id,
            call_id,
            result=result,
            error=error,
            serde=self.serde,
            isolate=self.enforce_user_isolation,
            now=self.clock(),
        )
        return lambda: self.backend.end_tool_call(step)

    def end_tool_call(
        self,
        config: RunnableConfig,
        message_id: str,
        call_id: str,
        *,
        result: Any = MISSING,
        error: str | None = None,
    ) -> None:
        """End a started tool call: ``succeeded`` with ``result`` (stored with the saver's
        serializer, so it reads back as the same value), or ``failed`` with ``error``.

        Ending it again the same way (the same status and the same result or error) changes
        nothing, so a retried end is safe.

        Raises:
            InvalidInputError: both or neither of ``result`` and ``error`` given; the call was
                never begun on the thread; or it ended already, otherwise (the entry keeps its
                first outcome).
            StorageForbiddenError: the thread belongs to another user.
        """
        self._run(self._end_call(config, message_id, call_id, result, error), write=True, op="ledger")

    async def aend_tool_call(
        self,
        config: RunnableConfig,
        message_id: str,
        call_id: str,
        *,
        result: Any = MISSING,
        error: str | None = None,
    ) -> None:
        """Async :meth:`end_tool_call`."""
        await self._arun(self._end_call(config, message_id, call_id, result, error), write=True, op="ledger")

    def _tool_calls(self, config: RunnableConfig) -> ProgramFactory[builtins.list[ToolCall]]:
        target, serde = self._target(config), self.serde

        def program() -> Program[builtins.list[ToolCall]]:
            stored = yield from self.backend.tool_calls(target.thread_id, target.actor.owner_filter)
            return [entry.decoded(target.thread_id, serde) for entry in stored]

        return program

    def tool_calls(self, config: RunnableConfig) -> builtins.list[ToolCall]:
        """The ledger of the thread ``config`` names, oldest first; empty for a thread the
        store does not hold, or one of another user (as a read sees nothing of it)."""
        return self._run(self._tool_calls(config))

    async def atool_calls(self, config: RunnableConfig) -> builtins.list[ToolCall]:
        """Async :meth:`tool_calls`."""
        return await self._arun(self._tool_calls(config))

    # the thread listing (SPEC SV1, SV3; threadkeep.threads) -----------------------------------

    def _threads(self, query: ThreadQuery) -> ProgramFactory[ThreadPage]:
        actor = self._actor()
        owner = query.owner
        if actor.owner_filter is not None:
            if owner is not None and owner != actor.owner_filter:
                raise StorageForbiddenError.listing(owner, actor.owner_filter)
            owner = actor.owner_filter
        elif owner is not None:
            owner = checked_id(owner, "owner")
        now, platform = self.clock(), self.retention
        return lambda: page_program(query, owner, now, platform, self.backend.thread_rows)

    def threads(self, query: ThreadQuery | None = None) -> ThreadPage:
        """One page of the store's threads, newest write first (SPEC SV1, SV3).

        Read from an index on every provider, never a read of every thread: a page costs the
        same in a store of a hundred threads or of a million (bench/threads.py). In a
        :func:`~threadkeep.user_scope` it lists that user's threads only; in
        :func:`~threadkeep.operator_scope` (or with isolation off) every thread, narrowed by
        ``query.owner``. Pass the page's ``next_cursor`` in the next query for the next page:
        pages neither repeat nor skip a thread that was not written meanwhile (a thread
        written meanwhile moves to the front, where a new first page finds it).

        A metadata filter (and, on Redis, a status filter) is applied to index rows after
        they are read: a page reads at most :data:`threadkeep.core.listing.SCAN_BOUND` rows,
        and may end short, even empty, with a ``next_cursor`` to go on with. ``next_cursor``
        is ``None`` once no thread is left.

        Raises:
            StorageForbiddenError: in a user's scope, ``query.owner`` names another user.
            ConfigurationError: a query out of range (:class:`~threadkeep.threads.ThreadQuery`).
        """
        return self._run(self._threads(query or ThreadQuery()))

    async def athreads(self, query: ThreadQuery | None = None) -> ThreadPage:
        """Async :meth:`threads`."""
        return await self._arun(self._threads(query or ThreadQuery()))

    def _thread_row(self, thread_id: str) -> ProgramFactory[ThreadRow | None] | None:
        backend, owner = self.backend, self._actor().owner_filter
        if not isinstance(backend, ThreadRowReader):
            return None
        checked, now = checked_id(str(thread_id), "thread_id"), self.clock()
        return lambda: backend.thread_row(checked, owner, now)

    def thread_row(self, thread_id: str) -> ThreadRow | None:
        """``thread_id``'s row as :meth:`threads` lists it (its waiting clock, status and
        marks), or ``None``: no such thread of the scope's user, or a store that cannot read
        one row by id (Redis)."""
        make = self._thread_row(thread_id)
        return None if make is None else self._run(make)

    async def athread_row(self, thread_id: str) -> ThreadRow | None:
        """Async :meth:`thread_row`."""
        make = self._thread_row(thread_id)
        return None if make is None else await self._arun(make)

    # the sweep's view of the store (operator calls: see threadkeep.sweep) ---------------------

    def _operator(self, operation: str) -> None:
        """The sweep's calls act on every user's threads: with isolation on, only the
        operator (:func:`threadkeep.operator_scope`) may make them (SPEC W3)."""
        actor = self._actor()
        if actor.owner_filter is not None:
            self._meters.forbidden("operator")
            raise StorageForbiddenError.operator_only(operation, actor.user_id)

    def owner_of(self, thread_id: str) -> str | None:
        """The user who owns ``thread_id``, whoever it is; ``None``: the store holds no such
        thread (operator only; :class:`threadkeep.resolver.OwnershipResolver` caches it).

        Raises:
            StorageForbiddenError: called outside :func:`threadkeep.operator_scope` with
                isolation on.
        """
        self._operator("owner_of")
        checked_id(thread_id, "thread_id")
        return self._run(lambda: self.backend.owner_of(thread_id))

    async def aowner_of(self, thread_id: str) -> str | None:
        """Async :meth:`owner_of`."""
        self._operator("owner_of")
        checked_id(thread_id, "thread_id")
        return await self._arun(lambda: self.backend.owner_of(thread_id))

    def expired_page(self, page: SweepPage) -> builtins.list[ExpiredThread]:
        """The next page of threads past a horizon, any owner's (operator only)."""
        self._operator("expired_page")
        return self._run(lambda: self.backend.expired_page(page))

    def count_expired(self, page: SweepPage) -> int:
        """How many threads are past a horizon (operator only)."""
        self._operator("count_expired")
        return self._run(lambda: self.backend.count_expired(page))

    def delete_threads(
        self, threads: Sequence[ExpiredThread], page: SweepPage | None = None
    ) -> builtins.list[str]:
        """Delete ``threads`` (with a sweep's ``page``: those still past its horizon and not
        parked), whoever owns them; returns the ids deleted (operator only).

        Raises:
            StorageForbiddenError: called outside :func:`threadkeep.operator_scope` with
                isolation on.
        """
        self._operator("delete_threads")
        return self._run(lambda: self.backend.delete_threads(threads, page), write=True, op="sweep")

    def threads_named(self, thread_ids: Sequence[str]) -> builtins.list[ExpiredThread]:
        """Which of ``thread_ids`` the store holds, with their owners (operator only)."""
        self._operator("threads_named")
        return self._run(lambda: self.backend.threads_named(thread_ids))

    def live_parks(self, thread_ids: Sequence[str], now: float) -> set[str]:
        """Which of ``thread_ids`` hold a park live at ``now``: any owner's for the operator
        (the sweep) or with isolation off, else only the scope's user's."""
        owner = self._actor().owner_filter
        return self._run(lambda: self.backend.live_parks(thread_ids, now, owner))

    async def alive_parks(self, thread_ids: Sequence[str], now: float) -> set[str]:
        """Async :meth:`live_parks`."""
        owner = self._actor().owner_filter
        return await self._arun(lambda: self.backend.live_parks(thread_ids, now, owner))

    def interrupted(self, thread_ids: Sequence[str], since: float | None = None) -> set[str]:
        """Which of ``thread_ids`` wait on an interrupt, any owner's (operator only): their
        newest root checkpoint holds an interrupt write and, with ``since`` (epoch seconds),
        was stored at or after it."""
        self._operator("interrupted")
        return self._run(lambda: self.backend.interrupted(thread_ids, since))

    def get_next_version(self, current: str | None, channel: None) -> str:
        """Versions that sort as they grow and never collide across branches."""
        # LangGraph may hand back an int version from another saver; accept both.
        # Ten digits sort as numbers; 48 random bits keep two branches that reach the same
        # number from sharing a stored value. (LangGraph's savers spend 50 characters.)
        number = 0 if current is None else int(str(current).split(".")[0])
        return f"{number + 1:010}.{random.getrandbits(48):012x}"

    def with_allowlist(self, extra_allowlist: Collection[tuple[str, ...]]) -> ThreadkeepSaver:
        """A shallow copy whose serializer also allows ``extra_allowlist`` classes on read."""
        clone = copy.copy(self)
        clone._owns_engine = False  # the original closes what it opened
        clone._memo = EncodingMemo()  # digests belong to one serializer
        clone.serde = with_allowlist(self.serde, extra_allowlist)
        return clone

    # lifecycle ------------------------------------------------------------------------------

    def stats(self, thread_id: str | None = None) -> Mapping[str, Any]:
        """What the store (or one thread, whoever owns it) holds.

        Keys: ``threads``, ``checkpoints``, ``channel_values``, ``writes``, ``messages``
        (rows), and ``payload_bytes`` (the bytes of every stored value and structure).
        """
        return self.backend.stats(thread_id)

    def close(self) -> None:
        """Release what this saver opened; never a pool or client it was given."""
        if self._owns_engine:
            self._owns_engine = False
            self.backend.engine.close()

    async def aclose(self) -> None:
        """:meth:`close`, from inside an event loop (closes that loop's async pool too)."""
        if self._owns_engine:
            self._owns_engine = False
            await self.backend.engine.aclose()

    def __enter__(self) -> ThreadkeepSaver:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    async def __aenter__(self) -> ThreadkeepSaver:
        return self

    async def __aexit__(
        self, kind: type[BaseException] | None, error: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.aclose()


def _where(found: CheckpointTuple) -> tuple[str, str]:
    """A stored checkpoint's (namespace, checkpoint id)."""
    configurable = found.config["configurable"]
    return configurable.get("checkpoint_ns", ""), configurable["checkpoint_id"]
