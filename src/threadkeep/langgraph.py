"""threadkeep as the checkpointer of LangGraph's server (``langgraph dev``).

In ``langgraph.json``::

    "checkpointer": {"path": "threadkeep.langgraph.checkpointer"}

The server enters :func:`checkpointer` once at start and closes it at shutdown. The store is
the one the ``LLM_PROVIDER_CHECKPOINT*`` settings name (by default a SQLite file at
``.threadkeep/checkpoints.sqlite`` under the server's working directory); set them in the
server's environment (or the ``"env"`` file of ``langgraph.json``).

Who owns what (docs/isolation.md, "LangGraph's server"): a run's steps carry the server's
config, so they act for its ``langgraph_auth_user`` (custom auth on), else for no user
(``"anonymous"``). The server's calls that name no user (its reads of state and history, and
``threads.delete`` -> ``adelete_thread``, ``threads.copy`` -> ``acopy_thread``, a rollback ->
``adelete_for_runs``, which carry no config) act in :func:`server_scope`: for the user of the
request or run the server is serving, the same user its runs write for, or as the operator
for the server's own work outside any request. A user reads, deletes and copies their own
threads; another user's thread reads as missing and refuses a delete or copy with
``StorageForbiddenError``, whatever the server's own authorization let through.
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from threadkeep.core.identity import OPERATOR, Ambient, ambient_scope, auth_identity
from threadkeep.providers import open_checkpointer
from threadkeep.saver import ThreadkeepSaver

__all__ = ["checkpointer", "server_scope"]


@asynccontextmanager
async def checkpointer() -> AsyncIterator[ThreadkeepSaver]:
    """Open the configured store for LangGraph's server; close it when the server stops.

    Calls that name no user (the server's reads carry no ``langgraph_auth_user``; its
    deletes, copies and rollbacks carry no config) act in :func:`server_scope`.

    Raises:
        ConfigurationError: a setting is refused (the message names it).
        MissingExtraError: the provider's extra is not installed.
    """
    # Opening may connect and migrate: keep that off the server's event loop.
    saver = await asyncio.to_thread(open_checkpointer)
    try:
        with ambient_scope(server_scope):
            yield saver
    finally:
        await saver.aclose()


def server_scope() -> Ambient:
    """Whom LangGraph's server is acting for in the current context.

    - In a request or a run: its user, the identity the server's custom auth gave it (``""``
      without custom auth, or for an unauthenticated user: no user, the anonymous owner).
    - In the server's own work outside any request or run (the worker's rollback of a run
      cancelled by ``multitask_strategy="rollback"``): :data:`~threadkeep.core.identity.OPERATOR`.
      The server has authorised the request that caused it, and acts on the threads it keeps.
    - Outside LangGraph's server: ``None``, no scope.

    The server keeps each request's and run's user in its auth context
    (``langgraph_api.utils.get_auth_ctx``), the same context it copies into a run's
    ``config["configurable"]["langgraph_auth_user"]``.
    """
    # Only looked up, never imported: the server imports it at start, and importing it
    # elsewhere reads the server's settings from the environment (and fails without them).
    server = sys.modules.get("langgraph_api.utils")
    if server is None:  # not inside LangGraph's server
        return None
    context = server.get_auth_ctx()
    if context is None:
        return OPERATOR
    return auth_identity(context.user) or ""
