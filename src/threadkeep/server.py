"""``threadkeep serve``: the small HTTP service (SPEC SV1, SV4). A thin adapter over the library.

Routes (:data:`API` lists them, and ``GET /openapi.json`` serves it as an OpenAPI schema):

- ``GET /healthz``: 200 ``{"status": "ok", ...}`` when the configured store answers, else 503.
- ``GET /metrics``: every threadkeep metric family (:mod:`threadkeep.metrics`) in the
  Prometheus text format (no key needed), listed from the start (at zero until counted).
- ``GET /openapi.json``: the routes as an OpenAPI 3.1 schema (no key needed).
- ``POST /api/checkpoints/sweep``: run :func:`threadkeep.sweep.sweep_checkpoints` (admin key;
  ``?dry_run=true`` deletes nothing); the body is the sweep's result (SPEC SW6).
- ``PATCH /api/settings``: a settings write (admin key); the body maps variables to values
  (``null`` restores a default). A removed or invalid variable is refused, naming it; an
  accepted write reopens the store with the new settings.
- The threads API (any key; SPEC SV1): ``GET /api/threads`` (a :class:`~threadkeep.threads.ThreadPage`),
  ``GET /api/threads/{id}/state``, ``/history``, ``/checkpoints/{checkpoint_id}``, ``/diff``,
  ``/retention``, ``DELETE /api/threads/{id}`` and ``POST /api/threads/{id}/finished``; the
  bodies are :mod:`threadkeep.views`.

Requests to ``/api/*`` carry ``Authorization: Bearer <key>``, a key of
``LLM_PROVIDER_CHECKPOINT_API_KEYS``. A user key acts in ``user_scope(key's user)``: it sees
and changes that user's threads only, and another user's thread answers 404 like a missing
one (its existence is not revealed); an admin key acts in ``operator_scope()``: every thread,
and ``GET /api/threads?user=`` narrows the listing to one user. A server started with no key
configured says so in a WARNING at start.

Errors are the error tree's (:meth:`ThreadkeepError.to_dict`), mapped to statuses once
(:data:`STATUS`): 401 no or unknown key, 403 a key's role may not, 404 no such thread (or
another user's), 409 a conflict, 422 a bad parameter or cursor, 503 the store does not answer.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import logging
import threading
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final, Literal

from langgraph.checkpoint.base import CheckpointTuple

from threadkeep.core.identity import operator_scope, user_scope
from threadkeep.errors import (
    AuthenticationError,
    ConfigurationError,
    ErrorKind,
    PermissionDeniedError,
    StorageError,
    StorageForbiddenError,
    ThreadkeepError,
    ThreadNotFoundError,
)
from threadkeep.extras import import_extra
from threadkeep.metrics import CONTENT_TYPE, METRICS, Metrics
from threadkeep.providers import open_checkpointer
from threadkeep.resolver import OwnershipResolver
from threadkeep.saver import ThreadkeepSaver
from threadkeep.settings import Settings
from threadkeep.sweep import sweep_checkpoints
from threadkeep.threads import MAX_PAGE, STATUSES, Cursor, ThreadQuery, ThreadStatus
from threadkeep.views import diff_view, state_view
from threadkeep.window import ahistory_page, aretention_of, root_config

__all__ = ["API", "STATUS", "ApiKey", "Endpoint", "checked_keys", "create_app", "openapi", "parse_api_keys"]

logger = logging.getLogger("threadkeep.server")

STATUS: Final[dict[ErrorKind, int]] = {
    "conflict": 409,
    "forbidden": 403,
    "unavailable": 503,
    "invalid": 422,
    "not_found": 404,
    "unauthorized": 401,
}
ROLES: Final = ("admin", "user")
# Never echoed back: connection strings may hold passwords.
_SECRETS: Final = frozenset(
    {
        "LLM_PROVIDER_CHECKPOINT_CONN_STRING",
        "LLM_PROVIDER_CHECKPOINT_CACHE_URL",
        "LLM_PROVIDER_CHECKPOINT_API_KEYS",
        "DATABASE_URL",
        "REDIS_URL",
    }
)


@dataclass(frozen=True, slots=True)
class ApiKey:
    user: str
    role: str


def parse_api_keys(spec: str | None) -> dict[str, ApiKey]:
    """``key:user:role,...`` (``LLM_PROVIDER_CHECKPOINT_API_KEYS``) as a map from key.

    Raises:
        ConfigurationError: an entry that is not ``key:user:role`` with a known role (the
            message shows the entry's position, never the key).
    """
    keys: dict[str, ApiKey] = {}
    for position, entry in enumerate(filter(None, (part.strip() for part in (spec or "").split(","))), 1):
        parts = entry.split(":")
        if len(parts) != 3 or not all(parts) or parts[2] not in ROLES:
            raise ConfigurationError(
                f"LLM_PROVIDER_CHECKPOINT_API_KEYS entry {position} must be key:user:role with role "
                f"{' or '.join(ROLES)}",
                context={"variable": "LLM_PROVIDER_CHECKPOINT_API_KEYS", "entry": position},
            )
        keys[parts[0]] = ApiKey(parts[1], parts[2])
    return keys


def checked_keys(settings: Settings, *, isolated: bool | None = None) -> dict[str, ApiKey]:
    """The API keys of ``settings``, refused if a ``user`` key could see other users' threads.

    Args:
        settings: The settings to serve.
        isolated: Whether the served store keeps owners apart (default: the settings'
            ``LLM_PROVIDER_CHECKPOINT_USER_ISOLATION``).

    Raises:
        ConfigurationError: an entry is malformed (:func:`parse_api_keys`), or a ``user``-role
            key is configured while user isolation is off: with no owners kept apart, that
            key would list, read and delete every user's threads.
    """
    keys = parse_api_keys(settings.api_keys)
    isolated = settings.enforce_user_isolation if isolated is None else isolated
    users = sorted({key.user for key in keys.values() if key.role == "user"})
    if users and not isolated:
        raise ConfigurationError(
            "LLM_PROVIDER_CHECKPOINT_API_KEYS holds user-role keys (for "
            f"{', '.join(repr(user) for user in users[:5])}) while "
            "LLM_PROVIDER_CHECKPOINT_USER_ISOLATION is false: with owners not kept apart, a user "
            "key would see and delete every user's threads. Turn isolation on "
            "(LLM_PROVIDER_CHECKPOINT_USER_ISOLATION=true), or give only admin keys",
            context={
                "variables": ["LLM_PROVIDER_CHECKPOINT_API_KEYS", "LLM_PROVIDER_CHECKPOINT_USER_ISOLATION"],
                "users": users[:5],
            },
        )
    return keys


Access = Literal["public", "key", "admin"]


@dataclass(frozen=True, slots=True)
class Endpoint:
    """One route of the app, as the OpenAPI schema describes it.

    Attributes:
        method: The HTTP method.
        path: The path, with ``{name}`` parameters.
        name: The handler's name (and the schema's ``operationId``).
        summary: What it does.
        access: ``public`` (no key), ``key`` (any known key) or ``admin`` (an admin key).
        query: The query parameters: ``(name, JSON type, description)``.
        returns: The success status and what its body is.
    """

    method: str
    path: str
    name: str
    summary: str
    access: Access = "key"
    query: tuple[tuple[str, str, str], ...] = ()
    returns: tuple[int, str] = (200, "the result as JSON")


_THREAD = "/api/threads/{thread_id}"
_LIMIT = ("limit", "integer", f"rows per page, 1 to {MAX_PAGE} (default 50)")
API: Final[tuple[Endpoint, ...]] = (
    Endpoint("GET", "/healthz", "healthz", "whether the store answers (503 if not)", "public"),
    Endpoint("GET", "/metrics", "metrics", "the counters, in the Prometheus text format", "public"),
    Endpoint("GET", "/openapi.json", "openapi", "this schema", "public"),
    Endpoint(
        "POST",
        "/api/checkpoints/sweep",
        "sweep",
        "run the sweep (SPEC SW6); its result",
        "admin",
        (("dry_run", "boolean", "delete nothing, report what would go"),),
    ),
    Endpoint("PATCH", "/api/settings", "write_settings", "change settings (a JSON object)", "admin"),
    Endpoint(
        "GET",
        "/api/threads",
        "list_threads",
        "a page of the caller's threads (an admin's: everyone's), newest write first",
        query=(
            ("status", "string", f"only threads of this status: {', '.join(STATUSES)}"),
            ("user", "string", "only this user's threads (admin keys; a user key may name only itself)"),
            ("written_after", "string", "only threads last written at or after (ISO 8601 or epoch seconds)"),
            ("written_before", "string", "only threads last written before (ISO 8601 or epoch seconds)"),
            ("metadata", "string", 'a JSON object the newest checkpoint\'s metadata holds, e.g. {"k": "v"}'),
            _LIMIT,
            ("cursor", "string", "the next_cursor of the previous page"),
        ),
        returns=(200, '{"threads": [summary], "next_cursor": string | null}'),
    ),
    Endpoint("GET", f"{_THREAD}/state", "thread_state", "the thread's newest checkpoint (a state view)"),
    Endpoint(
        "GET",
        f"{_THREAD}/history",
        "thread_history",
        "the thread's checkpoints, newest first",
        query=(_LIMIT, ("cursor", "string", "the next_cursor of the previous page (a checkpoint id)")),
        returns=(200, '{"checkpoints": [history row], "next_cursor": string | null}'),
    ),
    Endpoint(
        "GET",
        f"{_THREAD}/diff",
        "thread_diff",
        "what changed from checkpoint a to checkpoint b",
        query=(("a", "string", "the earlier checkpoint's id"), ("b", "string", "the later checkpoint's id")),
    ),
    Endpoint(
        "GET", f"{_THREAD}/retention", "thread_retention", "the thread's status, due time, and what spares it"
    ),
    # After the routes above: a thread id may hold "/", so ".../checkpoints/state" is the
    # state of thread ".../checkpoints" (a checkpoint id is never "state", "history", ...).
    Endpoint(
        "GET",
        f"{_THREAD}/checkpoints/{{checkpoint_id}}",
        "thread_checkpoint",
        "one checkpoint (a state view)",
    ),
    Endpoint("DELETE", _THREAD, "delete_thread", "delete the thread whole", returns=(204, "no body")),
    Endpoint(
        "POST",
        f"{_THREAD}/finished",
        "mark_finished",
        "mark the thread finished: it leaves on the finished horizon",
        returns=(200, '{"thread_id", "status": "finished", "due": epoch seconds}'),
    ),
)
_REQUIRED: Final = frozenset({("thread_diff", "a"), ("thread_diff", "b")})
_ERRORS: Final = {
    401: "no or unknown API key",
    403: "the key's role may not do this",
    404: "no such thread or checkpoint that the key may see (another user's answers the same)",
    422: "a bad parameter or cursor",
    503: "the store does not answer",
}


def openapi() -> dict[str, Any]:
    """The OpenAPI 3.1 schema of :data:`API`."""
    error = {"$ref": "#/components/schemas/Error"}
    paths: dict[str, dict[str, Any]] = {}
    for endpoint in API:
        parameters = [
            {"name": name, "in": "path", "required": True, "schema": {"type": "string"}}
            for name in ("thread_id", "checkpoint_id")
            if f"{{{name}}}" in endpoint.path
        ] + [
            {
                "name": name,
                "in": "query",
                "required": (endpoint.name, name) in _REQUIRED,
                "description": description,
                "schema": {"type": kind},
            }
            for name, kind, description in endpoint.query
        ]
        status, body = endpoint.returns
        responses: dict[str, Any] = {str(status): {"description": body}}
        if endpoint.access != "public":
            codes = [401, 403, 422, 503] + ([404] if "{thread_id}" in endpoint.path else [])
            for code in sorted(codes):
                responses[str(code)] = {
                    "description": _ERRORS[code],
                    "content": {"application/json": {"schema": error}},
                }
        operation: dict[str, Any] = {
            "operationId": endpoint.name,
            "summary": endpoint.summary,
            "parameters": parameters,
            "responses": responses,
        }
        if endpoint.access != "public":
            operation["security"] = [{"apiKey": []}]
            operation["description"] = (
                "needs an admin key"
                if endpoint.access == "admin"
                else "needs a key; a user key sees its own threads only"
            )
        paths.setdefault(endpoint.path, {})[endpoint.method.lower()] = operation
    return {
        "openapi": "3.1.0",
        "info": {"title": "threadkeep serve", "version": _version()},
        "paths": paths,
        "components": {
            "securitySchemes": {
                "apiKey": {
                    "type": "http",
                    "scheme": "bearer",
                    "description": "a key of LLM_PROVIDER_CHECKPOINT_API_KEYS (key:user:role)",
                }
            },
            "schemas": {
                "Error": {
                    "type": "object",
                    "required": ["error", "code", "message"],
                    "properties": {
                        "error": {"type": "string", "description": "the error's class"},
                        "code": {"type": "string", "description": "its stable code"},
                        "message": {"type": "string", "description": "what was wrong and what to do"},
                        "context": {"type": "object"},
                    },
                }
            },
        },
    }


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("threadkeep")
    except PackageNotFoundError:
        return "0"


# --- query parameters --------------------------------------------------------------------------


def _int(params: Mapping[str, str], name: str, default: int) -> int:
    text = params.get(name)
    if text is None or text == "":
        return default
    try:
        return int(text)
    except ValueError:
        raise ConfigurationError(
            f"{name}={text[:40]!r} is not a whole number: pass e.g. {name}={default}",
            context={name: text[:40]},
        ) from None


def _time(params: Mapping[str, str], name: str) -> float | None:
    """An ISO 8601 time (UTC when it names no zone) or epoch seconds, as epoch seconds."""
    text = params.get(name)
    if text is None or text == "":
        return None
    try:
        return float(text)
    except ValueError:
        pass
    try:
        when = dt.datetime.fromisoformat(text)
    except ValueError:
        raise ConfigurationError(
            f"{name}={text[:40]!r} is not a time: pass ISO 8601 (2025-01-31T12:00:00Z) or epoch seconds",
            context={name: text[:40]},
        ) from None
    return (when if when.tzinfo else when.replace(tzinfo=dt.UTC)).timestamp()


def _metadata(params: Mapping[str, str]) -> dict[str, Any] | None:
    text = params.get("metadata")
    if text is None or text == "":
        return None
    try:
        value = json.loads(text)
    except ValueError:
        value = None
    if not isinstance(value, dict):
        raise ConfigurationError(
            f"metadata={text[:40]!r} is not a JSON object: pass e.g. " + 'metadata={"source": "loop"}',
            context={"metadata": text[:40]},
        )
    return value


def _status(params: Mapping[str, str]) -> ThreadStatus | None:
    text = params.get("status") or None
    if text is not None and text not in STATUSES:
        raise ConfigurationError(
            f"unknown thread status {text[:40]!r}: choose one of {', '.join(STATUSES)}",
            context={"status": text[:40]},
        )
    return text


@contextlib.contextmanager
def _scope_of(key: ApiKey) -> Iterator[None]:
    """An admin acts as the operator (every thread); a user for that user only."""
    with operator_scope() if key.role == "admin" else user_scope(key.user):
        yield


class _Service:
    """The app's state: the settings, the saver they open, and the keys."""

    def __init__(self, settings: Settings, saver: ThreadkeepSaver | None, metrics: Metrics) -> None:
        self.settings = settings
        self.keys = checked_keys(settings, isolated=None if saver is None else saver.enforce_user_isolation)
        self.metrics = metrics
        self._given = saver
        self._saver = saver
        # `_opening` guards the lazy open; `_sweeping` is held by a sweep, and by a settings
        # write so that it waits for a running sweep instead of closing the store under it.
        # Health checks take neither for longer than an open: they answer during a sweep.
        self._opening = threading.Lock()
        self._sweeping = threading.Lock()
        self._closed = False  # shut down: nothing opens a store again
        # `_resolving` guards the ownership resolver, rebuilt when the store served changes.
        self._resolving = threading.Lock()
        self._resolver: OwnershipResolver | None = None
        self._retired: list[OwnershipResolver] = []

    @property
    def saver(self) -> ThreadkeepSaver:
        with self._opening:
            if self._closed:
                raise StorageError("the server is shutting down: its checkpoint store is closed")
            if self._saver is None:
                self._saver = open_checkpointer(settings=self.settings, metrics=self.metrics)
            return self._saver

    def resolver_for(self, saver: ThreadkeepSaver) -> OwnershipResolver:
        """The ownership resolver (SPEC SV2) in front of ``saver``: one per store served, its
        shared tier the settings' cache URL (``OwnershipResolver.from_settings``)."""
        with self._resolving:
            if self._resolver is None or self._resolver.saver is not saver:
                self._retire()
                self._resolver = OwnershipResolver.from_settings(saver, self.settings)
            return self._resolver

    @property
    def resolver(self) -> OwnershipResolver | None:
        """The resolver in use, if a thread route built one."""
        return self._resolver

    def _retire(self) -> None:
        if self._resolver is not None:
            self._resolver.close()
            self._retired.append(self._resolver)
            self._resolver = None

    def retired(self) -> list[OwnershipResolver]:
        """Resolvers of stores no longer served, to close their async clients (on the loop)."""
        with self._resolving:
            retired, self._retired = self._retired, []
        return retired

    @property
    def opened(self) -> ThreadkeepSaver | None:
        """The store, if open now (without waiting for an open in progress)."""
        saver = self._saver
        return None if self._closed else saver

    def check(self) -> None:
        """Raise unless the store answers (and this version can use it). A check whose store
        a settings write replaced and closed meanwhile asks the new store, so the settings
        change itself does not fail it; after shutdown, it fails and opens none."""
        saver = self.saver
        try:
            saver.backend.check()
        except StorageError:
            if self._saver is saver:  # the store this service serves failed
                raise
            self.saver.backend.check()

    def sweep(self, dry_run: bool) -> dict[str, Any]:
        with self._sweeping:
            saver = self.saver
            resolver = self.resolver_for(saver)

            def evict(thread_ids: Sequence[str]) -> None:
                for thread_id in thread_ids:
                    resolver.evict(thread_id)

            result = sweep_checkpoints(saver, dry_run=dry_run, metrics=self.metrics, on_deleted=evict)
            return result.to_dict()

    def replace_settings(self, settings: Settings) -> None:
        keys = checked_keys(settings)  # before anything changes: a refused write changes nothing
        with self._sweeping, self._opening:
            old, self._saver = self._saver, None
            self.settings, self.keys = settings, keys
            if old is not None and old is not self._given:
                old.close()
            self._given = None
        with self._resolving:
            self._retire()

    def start(self) -> None:
        with self._opening:
            self._closed = False
        if not self.keys:
            logger.warning(
                "threadkeep serve: no API key is configured, so /api/* (the sweep, settings "
                "writes) refuses every request with 401; set LLM_PROVIDER_CHECKPOINT_API_KEYS to "
                "key:user:admin (comma-separated key:user:role entries) to use them"
            )

    def close(self) -> None:
        with self._sweeping, self._opening:
            self._closed = True
            if self._saver is not None and self._saver is not self._given:
                self._saver.close()
            self._saver = self._given  # a saver the app was given stays open, and is served again
        with self._resolving:
            self._retire()


@dataclass(frozen=True, slots=True)
class _Call:
    """What a route reads of its request: the key, the path, the query and the body."""

    key: ApiKey
    path: Mapping[str, str]
    query: Mapping[str, str]
    body: Callable[[], Awaitable[Any]]  # the request's JSON body; ValueError if it is none


class _Routes:
    """The routes that take a key, one method per :data:`API` entry of access ``key`` or
    ``admin``: the sweep, the settings write and the threads API (SPEC SV1).

    Each runs in the key's scope (:func:`_scope_of`), reads the store through the saver's
    async methods and returns the JSON body (``None``: 204). A thread the scope does not see
    is a :class:`ThreadNotFoundError`, whether none is stored or another user owns it: a
    user's delete or mark of another's thread (:class:`StorageForbiddenError` in the
    library) answers the same 404 as a read of it, so that no route tells the two apart.
    """

    def __init__(self, service: _Service, run_in_threadpool: Callable[..., Awaitable[Any]]) -> None:
        self.service = service
        self.run_in_threadpool = run_in_threadpool

    async def store(self) -> ThreadkeepSaver:
        opened = self.service.opened
        if opened is not None:
            return opened
        # Opening takes a lock and may connect: off the event loop.
        saver: ThreadkeepSaver = await self.run_in_threadpool(lambda: self.service.saver)
        return saver

    async def visible(self, call: _Call) -> str:
        """The route's thread id, once the ownership resolver (SPEC SV2) says the key may see
        it: an admin sees every thread; for a user key a thread of another user (counted in
        ``threadkeep_forbidden_total{operation="read"}``), or none, is not found."""
        thread_id = call.path["thread_id"]
        if call.key.role == "admin":
            return thread_id
        resolver = self.service.resolver_for(await self.store())
        try:
            owner = await resolver.acheck(thread_id, call.key.user)
        except StorageForbiddenError:
            raise ThreadNotFoundError(thread_id) from None
        if owner is None:
            raise ThreadNotFoundError(thread_id)
        return thread_id

    async def evict(self, thread_id: str) -> None:
        """Forget the thread's owner (after a delete or a mark), here and in the shared cache."""
        await self.service.resolver_for(await self.store()).aevict(thread_id)

    async def head(self, thread_id: str, checkpoint_id: str | None = None) -> CheckpointTuple:
        found = await (await self.store()).aget_tuple(root_config(thread_id, checkpoint_id))
        if found is None:
            raise ThreadNotFoundError(thread_id, checkpoint_id)
        return found

    async def sweep(self, call: _Call) -> Any:
        dry_run = call.query.get("dry_run", "false").lower() in ("1", "true", "yes")
        return await self.run_in_threadpool(self.service.sweep, dry_run)

    async def write_settings(self, call: _Call) -> Any:
        try:
            body = await call.body()
        except ValueError:
            body = None
        if not isinstance(body, dict) or not all(isinstance(v, str | None) for v in body.values()):
            raise ConfigurationError(
                "a settings write is a JSON object of variable names to strings or null, e.g. "
                '{"LLM_PROVIDER_CHECKPOINT_RETENTION_WAITING_MINUTES": "600"}'
            )
        settings = self.service.settings.updated(body)
        await self.run_in_threadpool(self.service.replace_settings, settings)
        for resolver in self.service.retired():
            await resolver.aclose()
        public = {
            k: v
            for k, v in settings.as_env().items()
            if k.endswith(("_MINUTES", "_SECONDS")) or k == "LLM_PROVIDER_CHECKPOINT"
        }
        return {"status": "ok", "settings": public}

    async def list_threads(self, call: _Call) -> Any:
        params, key = call.query, call.key
        owner = params.get("user") or None
        if owner is not None and key.role != "admin" and owner != key.user:
            raise PermissionDeniedError(
                f"user {key.user!r} may list only their own threads, not user {owner[:40]!r}'s: leave "
                "out user=, or use an admin key",
                context={"user": key.user},
            )
        cursor = params.get("cursor") or None
        query = ThreadQuery(
            owner=owner,
            status=_status(params),
            written_after=_time(params, "written_after"),
            written_before=_time(params, "written_before"),
            metadata=_metadata(params),
            limit=_int(params, "limit", 50),
            cursor=Cursor.decode(cursor) if cursor else None,
        )
        page = await (await self.store()).athreads(query)
        return page.to_dict()

    async def thread_state(self, call: _Call) -> Any:
        return state_view(await self.head(await self.visible(call)))

    async def thread_checkpoint(self, call: _Call) -> Any:
        return state_view(await self.head(await self.visible(call), call.path["checkpoint_id"]))

    async def thread_history(self, call: _Call) -> Any:
        limit, cursor = _int(call.query, "limit", 50), call.query.get("cursor")
        thread_id = await self.visible(call)
        return await ahistory_page(await self.store(), thread_id, limit=limit, cursor=cursor)

    async def thread_diff(self, call: _Call) -> Any:
        thread_id, a, b = await self.visible(call), call.query.get("a"), call.query.get("b")
        if not a or not b:
            raise ConfigurationError(
                "a diff needs two checkpoint ids: pass ?a=<earlier id>&b=<later id> (the history lists them)",
                context={"a": a, "b": b},
            )
        return diff_view(await self.head(thread_id, a), await self.head(thread_id, b))

    async def thread_retention(self, call: _Call) -> Any:
        return await aretention_of(await self.store(), await self.visible(call))

    async def delete_thread(self, call: _Call) -> None:
        thread_id = await self.visible(call)
        await self.head(thread_id)  # a thread missing, or another user's: 404
        try:
            await (await self.store()).adelete_thread(thread_id)
        except StorageForbiddenError:
            raise ThreadNotFoundError(thread_id) from None
        finally:
            await self.evict(thread_id)

    async def mark_finished(self, call: _Call) -> Any:
        thread_id = await self.visible(call)
        try:
            due = await (await self.store()).amark_finished([thread_id])
        except StorageForbiddenError:
            raise ThreadNotFoundError(thread_id) from None
        finally:
            await self.evict(thread_id)
        if thread_id not in due:
            raise ThreadNotFoundError(thread_id)
        return {"thread_id": thread_id, "status": "finished", "due": due[thread_id]}


def create_app(
    settings: Settings | None = None, *, saver: ThreadkeepSaver | None = None, metrics: Metrics = METRICS
) -> Any:
    """The Starlette app of ``threadkeep serve``.

    Args:
        settings: Default: from the environment (a removed variable refuses to boot).
        saver: Serve this store instead of opening the one the settings name (kept open).
        metrics: What ``/metrics`` serves, and where the store the settings open counts (a
            given ``saver`` counts where it was built to).

    Raises:
        MissingExtraError: the ``[server]`` extra is not installed.
    """
    import_extra("starlette", "threadkeep serve", "server")
    from starlette.applications import Starlette
    from starlette.concurrency import run_in_threadpool
    from starlette.requests import Request
    from starlette.responses import JSONResponse, Response
    from starlette.routing import Route

    service = _Service(settings or Settings.from_env(), saver, metrics)
    routes = _Routes(service, run_in_threadpool)
    Handler = Callable[[Request, ApiKey], Awaitable[Response]]

    def refusal(error: ThreadkeepError) -> Response:
        headers = {"WWW-Authenticate": "Bearer"} if error.kind == "unauthorized" else None
        return JSONResponse(error.to_dict(), status_code=STATUS[error.kind], headers=headers)

    def authenticated(handler: Handler, *, admin: bool = False) -> Callable[[Request], Awaitable[Response]]:
        """Run ``handler`` for a known key, in its scope; any error of the tree is the response."""

        async def guarded(request: Request) -> Response:
            header = request.headers.get("authorization", "")
            token = header[7:].strip() if header.lower().startswith("bearer ") else ""
            key = service.keys.get(token) if token else None
            try:
                if key is None:
                    raise AuthenticationError("send Authorization: Bearer <an API key>")
                if admin and key.role != "admin":
                    raise PermissionDeniedError(
                        f"user {key.user!r} is not an admin; this route needs an admin key "
                        "(role admin in LLM_PROVIDER_CHECKPOINT_API_KEYS)",
                        context={"user": key.user},
                    )
                with _scope_of(key):
                    return await handler(request, key)
            except ThreadkeepError as error:
                return refusal(error)

        return guarded

    async def healthz(request: Request) -> Response:
        try:
            await run_in_threadpool(service.check)
        except Exception as error:  # the details go to the log, not to an unauthenticated caller
            logger.warning("health check failed: %s", error)
            return JSONResponse(
                {
                    "status": "unavailable",
                    "message": "the checkpoint store does not answer; see the server log",
                },
                status_code=503,
            )
        return JSONResponse({"status": "ok", "provider": service.settings.provider})

    async def metrics_route(request: Request) -> Response:
        return Response(service.metrics.render(), media_type=CONTENT_TYPE)

    async def openapi_route(request: Request) -> Response:
        return JSONResponse(openapi())

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        service.start()
        yield
        await run_in_threadpool(service.close)
        for resolver in service.retired():
            await resolver.aclose()

    def json_route(method: Callable[[_Call], Awaitable[Any]]) -> Handler:
        async def handler(request: Request, key: ApiKey) -> Response:
            body = await method(_Call(key, request.path_params, request.query_params, request.json))
            return Response(status_code=204) if body is None else JSONResponse(body)

        return handler

    public: dict[str, Callable[[Request], Awaitable[Response]]] = {
        "healthz": healthz,
        "metrics": metrics_route,
        "openapi": openapi_route,
    }
    guarded = {e.name: json_route(getattr(routes, e.name)) for e in API if e.access != "public"}
    table = [
        Route(
            # A thread id may hold "/" (ids are any text, docs/operations.md): the thread id
            # takes the path up to the route's fixed suffix, the longest such match.
            endpoint.path.replace("{thread_id}", "{thread_id:path}"),
            public[endpoint.name]
            if endpoint.access == "public"
            else authenticated(guarded[endpoint.name], admin=endpoint.access == "admin"),
            methods=[endpoint.method],
            name=endpoint.name,
        )
        for endpoint in API
    ]
    # -- the inspector page (issue 38 item 6): GET /, /inspector/* (not in the schema) ---------
    from threadkeep import inspector

    def identify(token: str) -> tuple[str, str] | None:
        key = service.keys.get(token)
        return None if key is None else (key.user, key.role)

    table += inspector.routes(identify)
    # -- end of the inspector page ---------------------------------------------------------------

    app = Starlette(lifespan=lifespan, routes=table, exception_handlers={404: _no_route, 405: _no_route})
    app.state.service = service  # its resolver's stats: app.state.service.resolver.stats
    return app


async def _no_route(request: Any, error: Exception) -> Any:
    """An unknown path (404) or method (405), answered as JSON like every refusal."""
    from starlette.responses import JSONResponse

    status = getattr(error, "status_code", 404)
    if status == 405:
        body = {
            "error": "MethodNotAllowed",
            "code": "HTTP_405",
            "message": f"{request.method} is not a method of {request.url.path}: see /openapi.json "
            "for each route's methods",
        }
    else:
        body = {
            "error": "NotFound",
            "code": "HTTP_404",
            "message": f"no route {request.url.path}: the routes are listed at /openapi.json",
        }
    return JSONResponse(body, status_code=status, headers=getattr(error, "headers", None))


def serve(host: str = "127.0.0.1", port: int = 8420) -> None:
    """Run the app with uvicorn until interrupted.

    Raises:
        MissingExtraError: the ``[server]`` extra is not installed.
    """
    import_extra("uvicorn", "threadkeep serve", "server")
    import uvicorn

    uvicorn.run(create_app(), host=host, port=port, log_level="info")
