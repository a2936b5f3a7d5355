"""The write rules every provider enforces, free of I/O (SPEC W2, W3).

Each (thread, namespace) has a head: its newest checkpoint. A put names the checkpoint it
continues from (its parent). It may proceed when:

* the parent is the head (the normal step),
* it stores a checkpoint id already stored (a retried put whose first attempt committed),
* it names no parent (a new root: LangGraph's first put on a thread),
* it is an explicit branch: ``update_state`` (source ``update``), a replay fork (source
  ``fork``), or a run that was started from an addressed older checkpoint (time travel),
  which :data:`BRANCH_KEY` marks on the config ``get_tuple`` hands the run. An
  ``update_state`` or fork whose parent a cache served as the newest state
  (:data:`SERVED_KEY`) is not one: the cache may have served it late, so the put needs it
  to still be the head, as a step does.

Anything else continues a thread that moved on: :class:`~threadkeep.errors.StaleStateError`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Final

from threadkeep.core.identity import ANONYMOUS, Actor
from threadkeep.errors import StaleStateError, StorageForbiddenError

__all__ = [
    "BRANCH_KEY",
    "BRANCH_SOURCES",
    "SERVED_KEY",
    "check_handover",
    "check_head",
    "check_owner",
    "required_head",
    "required_owner",
]

# Carried by the config get_tuple returns for an addressed checkpoint; LangGraph merges that
# config into every later put of the run. The "__" prefix keeps it out of stored metadata.
BRANCH_KEY: Final = "__threadkeep_branch_from"
BRANCH_SOURCES: Final = frozenset({"update", "fork"})
# Carried by the config of a state the tiered cache served as the newest (its checkpoint
# id): a write based on it, a branch too, needs it to still be the head, so that a state the
# cache served late never becomes the parent of a branch beside the true head.
SERVED_KEY: Final = "__threadkeep_served_head"


def required_head(
    *, parent_id: str | None, source: object, branch_from: str | None, served_head: str | None = None
) -> str | None:
    """The head a put must find to proceed, or ``None`` when any head will do.

    A new root (no parent) and an explicit branch need no particular head; a step that
    continues the thread needs its parent to still be the head, and so does an
    ``update_state`` or a fork whose parent a cache served as the head (``served_head``),
    unless that parent was then addressed by id (time travel: ``branch_from``).
    """
    if parent_id is None or branch_from == parent_id:
        return None
    if parent_id == served_head:
        return parent_id
    if source in BRANCH_SOURCES:
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
    branch_from: str | None,
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
        parent_id=parent_id, source=source, branch_from=branch_from, served_head=served_head
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
