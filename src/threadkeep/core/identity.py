"""Who is asking: the user a call acts for, and the thread it targets (SPEC W3).

A thread belongs to the user who first wrote it. A call acts for, in order:

1. the identity LangGraph's server puts in ``config["configurable"]["langgraph_auth_user"]``
   when its custom auth is on: the object the server builds from what the auth handler
   returned (anything with an ``identity`` attribute, as ``langgraph_sdk.auth.types.BaseUser``
   has) or that dict's ``"identity"``;
2. else, outside any :func:`user_scope`, the user the ambient scope names while an
   :func:`ambient_scope` source is open: in LangGraph's server (:mod:`threadkeep.langgraph`),
   the user its custom auth handler named for the request being served. It comes before
   ``user_id``: the server merges fields of a client's request into the config, and a client
   must not act as another user by naming one;
3. else ``config["configurable"]["user_id"]``;
4. else the user of the enclosing :func:`user_scope`;
5. else, outside any scope, the ambient scope's operator (when its source returns
   :data:`OPERATOR`), or ``"anonymous"`` (:data:`ANONYMOUS`).

An empty id (``""`` or ``None``: LangGraph's server sends ``user_id: ""`` without auth, and an
unauthenticated user's identity is ``""``) is no id: the next source decides. The server's
identity comes first because the server sets it from the authenticated request, while
``user_id`` is whatever the client put in the run's config.

Calls LangGraph makes without a config (``delete_thread``, ``copy_thread``, ``prune``,
``delete_for_runs``) act for the scope's user (or the ambient scope's). :func:`operator_scope`
acts for no user in particular: it sees and deletes every thread, which is what the sweep and the operator CLI
need. docs/isolation.md tells the whole model.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any, Final, TypeAlias

from threadkeep.core.ids import checked_id

__all__ = [
    "ANONYMOUS",
    "AUTH_USER_KEY",
    "OPERATOR",
    "Actor",
    "Ambient",
    "actor_for",
    "ambient_scope",
    "auth_identity",
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
# What an ambient_scope source returns to act as the operator.
OPERATOR: Final = _OPERATOR
# An ambient scope: a user id ("": a request with no user, the anonymous owner), the
# operator, or None (the source knows of no scope).
Ambient: TypeAlias = "str | _Operator | None"
_scope: ContextVar[str | _Operator | None] = ContextVar("threadkeep_user_scope", default=None)
# Process-wide, not a ContextVar: the source is opened once (the server's start) and read in
# every request's own context.
_ambient_sources: list[Callable[[], Ambient]] = []


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


@contextmanager
def ambient_scope(source: Callable[[], Ambient]) -> Iterator[None]:
    """While open, a call that names no user and runs in no :func:`user_scope` or
    :func:`operator_scope` acts in the scope ``source()`` returns: a user id (``""``: no user),
    :data:`OPERATOR`, or ``None`` for none. Process-wide: for a process that serves many
    users, such as LangGraph's server, where ``source`` reads the current request's context.
    """
    _ambient_sources.append(source)
    try:
        yield
    finally:
        _ambient_sources.remove(source)


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
    """Resolve the acting user from a call's ``configurable``, the current scope and the
    ambient user (see the module for the order).

    Raises:
        InvalidInputError: the user id is not a valid id (:mod:`threadkeep.core.ids`).
    """
    scope = _scope.get()
    server_user = None
    if scope is None:
        scope = _ambient()
        if isinstance(scope, str) and scope:
            server_user = scope  # authenticated by the server: a client-named user_id does not override it
    explicit = _named_user(configurable or {}, server_user)
    if explicit is not None:
        user_id = explicit
    elif isinstance(scope, str) and scope:
        user_id = checked_id(scope, "user_id")
    else:
        user_id = ANONYMOUS
    if not isolate or (scope is _OPERATOR and explicit is None):
        return Actor(user_id, None)
    return Actor(user_id, user_id)


def _ambient() -> Ambient:
    """The scope of the newest open :func:`ambient_scope` source that knows one."""
    for source in reversed(_ambient_sources):
        scope = source()
        if scope is not None:
            return scope
    return None


def _named_user(configurable: Mapping[str, Any], server_user: str | None = None) -> str | None:
    """The user ``configurable`` names (the server's identity; else the user the ambient
    server scope authenticated, ``server_user``; else ``user_id``), checked; ``None`` when
    it names none."""
    identity = auth_identity(configurable.get(AUTH_USER_KEY))
    if identity is not None:
        return identity
    if server_user is not None:
        return checked_id(server_user, "user_id")
    user_id = configurable.get("user_id")
    if user_id is None or user_id == "":
        return None
    return checked_id(str(user_id), "user_id")


def auth_identity(user: object) -> str | None:
    """The id of LangGraph's auth user ``user`` (its ``identity``), checked; ``None`` for no
    user, or one whose identity is empty (unauthenticated).

    Raises:
        InvalidInputError: the identity is not a valid id.
    """
    if user is None:
        return None
    identity = _identity_of(user)
    if not identity:
        return None
    return checked_id(identity, f"{AUTH_USER_KEY}.identity")


def _identity_of(user: object) -> object:
    """The ``identity`` of LangGraph's auth user: an object's attribute (the server's user
    proxies, ``BaseUser``) or a mapping's key (a ``MinimalUserDict``)."""
    if isinstance(user, Mapping):
        return user.get("identity")
    try:
        return getattr(user, "identity", None)
    except NotImplementedError:  # starlette's BaseUser, whose subclass did not say
        return None
