"""Who is asking: the user a call acts for, and the thread it targets (SPEC W3).

A thread belongs to the user who first wrote it. A call acts for, in order:

1. the identity LangGraph's server puts in ``config["configurable"]["langgraph_auth_user"]``
   when its custom auth is on: the object the server builds from what the auth handler
   returned (anything with an ``identity`` attribute, as ``langgraph_sdk.auth.types.BaseUser``
   has) or that dict's ``"identity"``;
2. else ``config["configurable"]["user_id"]``;
3. else the user of the enclosing :func:`user_scope`;
4. else ``"anonymous"`` (:data:`ANONYMOUS`).

An empty id (``""`` or ``None``: LangGraph's server sends ``user_id: ""`` without auth, and an
unauthenticated user's identity is ``""``) is no id: the next source decides. The server's
identity comes first because the server sets it from the authenticated request, while
``user_id`` is whatever the client put in the run's config.

Calls LangGraph makes without a config (``delete_thread``, ``copy_thread``, ``prune``,
``delete_for_runs``) act for the scope's user. :func:`operator_scope` acts for no user in
particular: it sees and deletes every thread, which is what the sweep and the operator CLI
need. docs/isolation.md tells the whole model.
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
    "AUTH_USER_KEY",
    "Actor",
    "actor_for",
    "operator_scope",
    "user_scope",
]

ANONYMOUS: Final = "anonymous"
# Where LangGraph's server puts the authenticated user in a run's configurable.
AUTH_USER_KEY: Final = "langgraph_auth_user"


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
    """Resolve the acting user from a call's ``configurable`` and the current scope (see the
    module for the order).

    Raises:
        InvalidInputError: the user id is not a valid id (:mod:`threadkeep.core.ids`).
    """
    scope = _scope.get()
    explicit = _named_user(configurable or {})
    if explicit is not None:
        user_id = explicit
    elif isinstance(scope, str) and scope:
        user_id = checked_id(scope, "user_id")
    else:
        user_id = ANONYMOUS
    if not isolate or (scope is _OPERATOR and explicit is None):
        return Actor(user_id, None)
    return Actor(user_id, user_id)


def _named_user(configurable: Mapping[str, Any]) -> str | None:
    """The user ``configurable`` names (the server's identity, else ``user_id``), checked;
    ``None`` when it names none."""
    auth_user = configurable.get(AUTH_USER_KEY)
    if auth_user is not None:
        identity = _identity_of(auth_user)
        if identity:
            return checked_id(identity, f"{AUTH_USER_KEY}.identity")
    user_id = configurable.get("user_id")
    if user_id is None or user_id == "":
        return None
    return checked_id(str(user_id), "user_id")


def _identity_of(user: object) -> object:
    """The ``identity`` of LangGraph's auth user: an object's attribute (the server's user
    proxies, ``BaseUser``) or a mapping's key (a ``MinimalUserDict``)."""
    if isinstance(user, Mapping):
        return user.get("identity")
    try:
        return getattr(user, "identity", None)
    except NotImplementedError:  # starlette's BaseUser, whose subclass did not say
        return None
