"""The write rules every provider enforces, free of I/O (SPEC W2, W3).

Each (thread, namespace) has a head: its newest checkpoint. A put names the checkpoint it
continues from (its parent). It may proceed when:

* the parent is the head (the normal step),
* it stores a checkpoint id already stored (a retried put whose first attempt committed),
* it names no parent (a new root: LangGraph's first put on a thread),
* it is an explicit branch: ``update_state`` (source ``update``), a replay fork (source
  ``fork``), or a put of a run its caller started from a checkpoint it named (time travel,
  a fork, a resume at an older checkpoint): see :func:`named_checkpoint`. An
  ``update_state`` or fork whose parent the tiered cache served as the newest state
  (``served_head``) is not one: the cache may have served it late, so the put needs it to
  still be the head, as a step does.

Anything else continues a thread that moved on: :class:`~threadkeep.errors.StaleStateError`.

A run that names a checkpoint branches from it in its own namespace and, below it, in every
subgraph's namespace, where LangGraph continues from the checkpoint each subgraph held at
that point: one the named checkpoint or older than it (checkpoint ids sort by time). Nothing
of this is added to the configs, metadata or values LangGraph returns: the saver reads it
from the config LangGraph hands ``put``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

from threadkeep.core.identity import ANONYMOUS, Actor
from threadkeep.errors import StaleStateError, StorageForbiddenError

__all__ = [
    "BRANCH_SOURCES",
    "check_handover",
    "check_head",
    "check_owner",
    "named_checkpoint",
    "required_head",
    "required_owner",
]

BRANCH_SOURCES: Final = frozenset({"update", "fork"})


def named_checkpoint(config: Mapping[str, Any]) -> str | None:
    """The checkpoint the caller of the run that puts with ``config`` named, if any.

    LangGraph copies the ``checkpoint_id`` its caller passed into the run's config
    ``metadata`` (for tracing), keeps it there for every subgraph the run calls, and hands
    that config to each ``put``; the ``configurable`` ``checkpoint_id`` of a put is only its
    parent. A put called outside a run (no ``metadata``) names none.
    """
    metadata = config.get("metadata")
    named = metadata.get("checkpoint_id") if isinstance(metadata, Mapping) else None
    return named if isinstance(named, str) and named else None


def required_head(
    *,
    checkpoint_ns: str,
    parent_id: str | None,
    source: object,
    named: str | None,
    served_head: str | None = None,
) -> str | None:
    """The head a put must find to proceed, or ``None`` when any head will do.

    A new root (no parent) and an explicit branch need no particular head; a step that
    continues the thread needs its parent to still be the head, and so does an
    ``update_state`` or a fork whose parent a cache served as the newest state
    (``served_head``), unless the run's caller named that parent. A run whose caller named
    checkpoint ``named`` branches from it, and in a subgraph's namespace from the checkpoint
    the subgraph held then: ``named`` or an older one.
    """
    if parent_id is None or (named is not None and parent_id == named):
        return None
    if parent_id == served_head:
        return parent_id
    if source in BRANCH_SOURCES:
        return None
    if named is not None and checkpoint_ns != "" and parent_id < named:
        return None
    return parent_id


def check_head(
    *,
    thread_id: str,
    checkpoint_ns: str,
    parent_id: str | None,
    checkpoint_id: str,
    head_id: str | None,
    already_stored: bool,
    source: object,
    named: str | None,
    served_head: str | None = None,
) -> None:
    """Refuse a put that continues a thread whose head moved on.

    A put of a checkpoint already stored (a retry whose first attempt committed) passes.
    Stores that must decide inside the server (Redis scripts) enforce
    :func:`required_head`'s answer the same way.

    Raises:
        StaleStateError: naming the thread, the expected and the current head.
    """
    required = required_head(
        checkpoint_ns=checkpoint_ns, parent_id=parent_id, source=source, named=named, served_head=served_head
    )
    if required is None or required == head_id or already_stored:
        return
    raise StaleStateError(thread_id, checkpoint_ns, parent_id, head_id)


def required_owner(actor: Actor) -> str | None:
    """The owner a write by ``actor`` needs the thread to have, or ``None`` for any owner.

    Stores that check inside the server (a guarded insert, a Redis script) enforce this
    answer; :func:`check_owner` raises for the same rule.
    """
    return actor.user_id if actor.checks_owner else None


def check_owner(*, thread_id: str, owner: str, user_id: str, enforce: bool, action: str = "write") -> None:
    """Refuse ``action`` (a write, a delete, a copy, a prune) by ``user_id`` on a thread
    ``owner`` owns, when isolation is on.

    Raises:
        StorageForbiddenError: naming the thread, the user and the action.
    """
    if enforce and owner != user_id:
        raise StorageForbiddenError(thread_id, user_id, action=action)


def check_handover(owners: Mapping[str, str], user: str, force: bool) -> None:
    """Refuse to hand to ``user`` a thread another user owns (not the anonymous owner), unless
    ``force``. ``owners``: each thread's owner now.

    Raises:
        StorageForbiddenError: naming every such thread and its owner.
    """
    taken = {thread_id: owner for thread_id, owner in owners.items() if owner not in (ANONYMOUS, user)}
    if taken and not force:
        raise StorageForbiddenError.owned(taken, user)
