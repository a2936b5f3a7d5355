"""threadkeep as the checkpointer of LangGraph's server (``langgraph dev``).

In ``langgraph.json``::

    "checkpointer": {"path": "threadkeep.langgraph.checkpointer"}

The server enters :func:`checkpointer` at start and closes it at shutdown. The store is the one
the ``LLM_PROVIDER_CHECKPOINT*`` settings name (by default a SQLite file at
``.threadkeep/checkpoints.sqlite`` under the server's working directory); set them in the
server's environment (or the ``"env"`` file of ``langgraph.json``).

Who owns what (docs/isolation.md, "LangGraph's server"), using only what LangGraph documents:

- A run's steps carry the server's run config: they act for its ``langgraph_auth_user`` (custom
  auth on), else for no user (``"anonymous"``).
- The server's other calls carry no user: its reads of state and history (``aget_tuple``,
  ``alist``), ``threads.delete`` -> ``adelete_thread``, ``threads.copy`` -> ``acopy_thread``,
  deleting a run -> ``adelete_for_runs``. With custom auth, the ``@auth.authenticate`` handler
  calls :func:`act_for` with the user it authenticated; the rest of that request acts for that
  user. Without it, a call acts for no user: it reads only the anonymous owner's threads, and
  refuses to delete or copy anyone else's (fails closed).
- Code in the server that serves no request (a custom route, a websocket, a background task)
  acts for no user, likewise.
- The one exception: ``adelete_for_runs`` called for no user, as the server's worker calls it to
  clean up after a run that ``multitask_strategy="rollback"`` cancelled, acts for the user each
  of those runs ran for, for runs this process ran through :func:`checkpointer`.
"""

from __future__ import annotations

import asyncio
import builtins
import threading
from collections import OrderedDict
from collections.abc import AsyncIterator, Collection, Iterator, Sequence
from contextlib import AbstractContextManager, asynccontextmanager, nullcontext
from contextvars import ContextVar
from typing import Any, Final

from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import (
    BaseCheckpointSaver,
    ChannelVersions,
    Checkpoint,
    CheckpointMetadata,
    CheckpointTuple,
)

from threadkeep.core.identity import ANONYMOUS, actor_for, ambient_scope, auth_identity, user_scope
from threadkeep.core.ids import checked_id
from threadkeep.providers import open_checkpointer
from threadkeep.saver import ThreadkeepSaver

__all__ = ["ServerSaver", "act_for", "checkpointer", "server_scope"]

# The user act_for named for the request being served (None: it named none).
_request_user: ContextVar[str | None] = ContextVar("threadkeep_langgraph_request_user", default=None)
# How many runs' users are remembered for the rollback cleanup: a rollback cancels a run that
# is still pending or running, so only recent runs matter.
RUNS_REMEMBERED: Final = 10_000


def act_for(user: object) -> None:
    """Make the rest of the current request act for ``user``: the server's reads, deletes and
    copies in it, which carry no user of their own (while :func:`checkpointer` is open).

    Call it from the ``@auth.authenticate`` handler of LangGraph's custom auth (an ``async``
    handler: the server runs a sync one in a worker thread, whose context does not reach the
    request), with what the handler returns: an identity string, a ``MinimalUserDict`` or a
    ``BaseUser``. An empty identity is no user.

    Raises:
        InvalidInputError: the identity is not a valid id.
    """
    identity = (checked_id(user, "user") if user else None) if isinstance(user, str) else auth_identity(user)
    _request_user.set(identity or "")


def server_scope() -> str | None:
    """The user :func:`act_for` named for the current request: its id, ``""`` for no user, or
    ``None`` when it named none (a request without custom auth, or code outside any request).
    """
    return _request_user.get()


class _RunUsers:
    """The user each recent run of the server ran for, process-wide (the server opens one
    checkpointer per event loop, and a run's steps and its cleanup may use different ones)."""

    def __init__(self, limit: int = RUNS_REMEMBERED) -> None:
        self._users: OrderedDict[str, str] = OrderedDict()
        self._limit = limit
        self._lock = threading.Lock()

    def record(self, run_id: str, user_id: str) -> None:
        with self._lock:
            self._users[run_id] = user_id
            self._users.move_to_end(run_id)
            while len(self._users) > self._limit:
                self._users.popitem(last=False)

    def users_of(self, run_ids: Sequence[str]) -> dict[str, str]:
        with self._lock:
            return {run_id: self._users[run_id] for run_id in run_ids if run_id in self._users}


_run_users: Final = _RunUsers()


class ServerSaver(BaseCheckpointSaver[str]):
    """The checkpointer :func:`checkpointer` gives LangGraph's server: every call goes to a
    :class:`~threadkeep.saver.ThreadkeepSaver` (``saver``). It also remembers whom each run's
    steps act for, so that the server's rollback cleanup, which names no user, acts for the run's
    user (see the module).

    Attributes:
        saver: The threadkeep saver, for its own API (retention, owners, stats).
    """

    def __init__(self, saver: ThreadkeepSaver) -> None:
        super().__init__(serde=saver.serde)
        self.saver = saver

    def _record(self, config: RunnableConfig) -> None:
        """Remember the user a run's step acted for (the server's run config names the run)."""
        configurable = config.get("configurable") or {}
        run_id = configurable.get("run_id")
        if run_id:
            user = actor_for(configurable, isolate=True).user_id
            _run_users.record(str(run_id), user)

    def _run_scopes(
        self, run_ids: Sequence[str]
    ) -> builtins.list[tuple[AbstractContextManager[None], builtins.list[str]]]:
        """``run_ids`` grouped by the scope to delete them in: when the call names no user at
        all (the server's rollback cleanup), the user each run recorded here ran for; else, and
        for runs not recorded, the call's own scope."""
        ids = [str(run_id) for run_id in run_ids]
        no_user = _request_user.get() is None and actor_for(None, isolate=True).owner_filter == ANONYMOUS
        users = _run_users.users_of(ids) if no_user else {}
        groups: dict[str | None, builtins.list[str]] = {}
        for run_id in ids:
            groups.setdefault(users.get(run_id), []).append(run_id)
        return [
            (nullcontext() if user is None else user_scope(user), group) for user, group in groups.items()
        ]

    # reads ---------------------------------------------------------------------------------

    def get_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        return self.saver.get_tuple(config)

    async def aget_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        return await self.saver.aget_tuple(config)

    def list(
        self,
        config: RunnableConfig | None,
        *,
        filter: dict[str, Any] | None = None,
        before: RunnableConfig | None = None,
        limit: int | None = None,
    ) -> Iterator[CheckpointTuple]:
        return self.saver.list(config, filter=filter, before=before, limit=limit)

    async def alist(
        self,
        config: RunnableConfig | None,
        *,
        filter: dict[str, Any] | None = None,
        before: RunnableConfig | None = None,
        limit: int | None = None,
    ) -> AsyncIterator[CheckpointTuple]:
        async for found in self.saver.alist(config, filter=filter, before=before, limit=limit):
            yield found

    # a run's steps -------------------------------------------------------------------------

    def put(
        self,
        config: RunnableConfig,
        checkpoint: Checkpoint,
        metadata: CheckpointMetadata,
        new_versions: ChannelVersions,
    ) -> RunnableConfig:
        stored = self.saver.put(config, checkpoint, metadata, new_versions)
        self._record(config)
        return stored

    async def aput(
        self,
        config: RunnableConfig,
        checkpoint: Checkpoint,
        metadata: CheckpointMetadata,
        new_versions: ChannelVersions,
    ) -> RunnableConfig:
        stored = await self.saver.aput(config, checkpoint, metadata, new_versions)
        self._record(config)
        return stored

    def put_writes(
        self, config: RunnableConfig, writes: Sequence[tuple[str, Any]], task_id: str, task_path: str = ""
    ) -> None:
        self.saver.put_writes(config, writes, task_id, task_path)
        self._record(config)

    async def aput_writes(
        self, config: RunnableConfig, writes: Sequence[tuple[str, Any]], task_id: str, task_path: str = ""
    ) -> None:
        await self.saver.aput_writes(config, writes, task_id, task_path)
        self._record(config)

    def get_next_version(self, current: str | None, channel: None) -> str:
        return self.saver.get_next_version(current, channel)

    def with_allowlist(self, extra_allowlist: Collection[tuple[str, ...]]) -> ServerSaver:
        return ServerSaver(self.saver.with_allowlist(extra_allowlist))

    # calls without a config ----------------------------------------------------------------

    def delete_thread(self, thread_id: str) -> None:
        self.saver.delete_thread(thread_id)

    async def adelete_thread(self, thread_id: str) -> None:
        await self.saver.adelete_thread(thread_id)

    def copy_thread(self, source_thread_id: str, target_thread_id: str) -> None:
        self.saver.copy_thread(source_thread_id, target_thread_id)

    async def acopy_thread(self, source_thread_id: str, target_thread_id: str) -> None:
        await self.saver.acopy_thread(source_thread_id, target_thread_id)

    def prune(self, thread_ids: Sequence[str], *, strategy: str = "keep_latest") -> None:
        self.saver.prune(thread_ids, strategy=strategy)

    async def aprune(self, thread_ids: Sequence[str], *, strategy: str = "keep_latest") -> None:
        await self.saver.aprune(thread_ids, strategy=strategy)

    def delete_for_runs(self, run_ids: Sequence[str]) -> None:
        """:meth:`ThreadkeepSaver.delete_for_runs`; called for no user, each run recorded by
        this process is deleted for the user it ran for."""
        for scope, ids in self._run_scopes(run_ids):
            with scope:
                self.saver.delete_for_runs(ids)

    async def adelete_for_runs(self, run_ids: Sequence[str]) -> None:
        """Async :meth:`delete_for_runs`."""
        for scope, ids in self._run_scopes(run_ids):
            with scope:
                await self.saver.adelete_for_runs(ids)


@asynccontextmanager
async def checkpointer() -> AsyncIterator[ServerSaver]:
    """Open the configured store for LangGraph's server; close it when the server stops.

    Raises:
        ConfigurationError: a setting is refused (the message names it).
        MissingExtraError: the provider's extra is not installed.
    """
    # Opening may connect and migrate: keep that off the server's event loop.
    saver = await asyncio.to_thread(open_checkpointer)
    try:
        with ambient_scope(server_scope):
            yield ServerSaver(saver)
    finally:
        await saver.aclose()
