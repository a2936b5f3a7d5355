"""Who is asking: the user a call acts for, and the thread it targets (SPEC W3).

A thread belongs to the user who first wrote it: ``config["configurable"]["user_id"]``, else
the user of the enclosing :func:`user_scope`, else ``"anonymous"``. Calls LangGraph makes
without a config (``delete_thread``, ``copy_thread``, ``prune``, ``delete_for_runs``) act for
the scope's user. :func:`operator_scope` acts for no user in particular: it sees and deletes
every thread, which is what the sweep and the operator CLI need.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any, Final

from threadkeep.core.ids import checked_id

__all__ = [
    "ANONYMOUS",
    "Actor",
    "actor_for",
    "operator_scope",
    "user_scope",
]

ANONYMOUS: Final = "anonymous"


class _Operator:
    def __repr__(self) -> str:
        return "<operator>"


_OPERATOR: Final = _Operator()
_scope: ContextVar[str | _Operator | None] = ContextVar("threadkeep_user_scope", default=None)


@contextmanager
def user_scope(user_id: str) -> Iterator[None]:
    """Act for ``user_id`` in calls that carry no ``user_id`` of their own."""
    token = _scope.set(user_id)
    try:
        yield
    finally:
        _scope.reset(token)


@contextmanager
def operator_scope() -> Iterator[None]:
    """Act as the operator: every thread is visible and deletable, whoever owns it."""
    token = _scope.set(_OPERATOR)
    try:
        yield
    finally:
        _scope.reset(token)


@dataclass(frozen=True, slots=True)
class Actor:
    """The user a call acts for.

    Attributes:
        user_id: Owner recorded on threads this call creates.
        owner_filter: Owner every read and delete is restricted to; ``None`` means any
            owner (isolation off, or the operator).
    """

    user_id: str
    owner_filter: str | None

    @property
    def checks_owner(self) -> bool:
        """Whether writes must be refused on threads another user owns."""
        return self.owner_filter is not None


def actor_for(configurable: Mapping[str, Any] | None, *, isolate: bool) -> Actor:
    """Resolve the acting user from a call's ``configurable`` and the current scope.

    Raises:
        InvalidInputError: the user id is not a valid id (:mod:`threadkeep.core.ids`).
    """
    scope = _scope.get()
    explicit = (configurable or {}).get("user_id")
    if explicit is not None:
        user_id = checked_id(str(explicit), "user_id")
    elif isinstance(scope, str):
        user_id = checked_id(scope, "user_id")
    else:
        user_id = ANONYMOUS
    if not isolate or (scope is _OPERATOR and explicit is None):
        return Actor(user_id, None)
    return Actor(user_id, user_id)
