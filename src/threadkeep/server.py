"""``threadkeep serve``: the small HTTP service (SPEC SV1, SV4). A thin adapter over the library.

Routes:

- ``GET /healthz``: 200 ``{"status": "ok", ...}`` when the configured store answers, else 503.
- ``GET /metrics``: every threadkeep counter in the Prometheus text format (no key needed),
  listed from the start (at zero until counted).
- ``POST /api/checkpoints/sweep``: run :func:`threadkeep.sweep.sweep_checkpoints` (admin key;
  ``?dry_run=true`` deletes nothing); the body is the sweep's result (SPEC SW6).
- ``PATCH /api/settings``: a settings write (admin key); the body maps variables to values
  (``null`` restores a default). A removed or invalid variable is refused, naming it; an
  accepted write reopens the store with the new settings.

Requests to ``/api/*`` carry ``Authorization: Bearer <key>``, a key of
``LLM_PROVIDER_CHECKPOINT_API_KEYS``: 401 without a known key, 403 for a non-admin key. A
server started with no key configured says so in a WARNING at start.
threadkeep errors map to statuses once (:data:`STATUS`).
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Final

from threadkeep.errors import ConfigurationError, ErrorKind, StorageError, ThreadkeepError
from threadkeep.extras import import_extra
from threadkeep.metrics import METRICS, Metrics
from threadkeep.providers import open_checkpointer
from threadkeep.saver import ThreadkeepSaver
from threadkeep.settings import Settings
from threadkeep.sweep import sweep_checkpoints

__all__ = ["STATUS", "ApiKey", "create_app", "parse_api_keys"]

logger = logging.getLogger("threadkeep.server")

STATUS: Final[dict[ErrorKind, int]] = {"conflict": 409, "forbidden": 403, "unavailable": 503, "invalid": 422}
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


class _Service:
    """The app's state: the settings, the saver they open, and the keys."""

    def __init__(self, settings: Settings, saver: ThreadkeepSaver | None, metrics: Metrics) -> None:
        self.settings = settings
        self.keys = parse_api_keys(settings.api_keys)
        self.metrics = metrics
        self._given = saver
        self._saver = saver
        # `_opening` guards the lazy open; `_sweeping` is held by a sweep, and by a settings
        # write so that it waits for a running sweep instead of closing the store under it.
        # Health checks take neither for longer than an open: they answer during a sweep.
        self._opening = threading.Lock()
        self._sweeping = threading.Lock()
        self._closed = False  # shut down: nothing opens a store again

    @property
    def saver(self) -> ThreadkeepSaver:
        with self._opening:
            if self._closed:
                raise StorageError("the server is shutting down: its checkpoint store is closed")
            if self._saver is None:
                self._saver = open_checkpointer(settings=self.settings)
            return self._saver

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
            return sweep_checkpoints(self.saver, dry_run=dry_run, metrics=self.metrics).to_dict()

    def replace_settings(self, settings: Settings) -> None:
        with self._sweeping, self._opening:
            old, self._saver = self._saver, None
            self.settings, self.keys = settings, parse_api_keys(settings.api_keys)
            if old is not None and old is not self._given:
                old.close()
            self._given = None

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


def create_app(
    settings: Settings | None = None, *, saver: ThreadkeepSaver | None = None, metrics: Metrics = METRICS
) -> Any:
    """The Starlette app of ``threadkeep serve``.

    Args:
        settings: Default: from the environment (a removed variable refuses to boot).
        saver: Serve this store instead of opening the one the settings name (kept open).
        metrics: The registry ``/metrics`` serves.

    Raises:
        MissingExtraError: the ``[server]`` extra is not installed.
    """
    import_extra("starlette", "threadkeep serve", "server")
    from starlette.applications import Starlette
    from starlette.concurrency import run_in_threadpool
    from starlette.requests import Request
    from starlette.responses import JSONResponse, PlainTextResponse, Response
    from starlette.routing import Route

    service = _Service(settings or Settings.from_env(), saver, metrics)

    def admin(handler: Callable[[Request], Awaitable[Response]]) -> Callable[[Request], Awaitable[Response]]:
        async def guarded(request: Request) -> Response:
            header = request.headers.get("authorization", "")
            token = header[7:].strip() if header.lower().startswith("bearer ") else ""
            key = service.keys.get(token) if token else None
            if key is None:
                return JSONResponse(
                    {"error": "unauthorized", "message": "send Authorization: Bearer <an API key>"},
                    status_code=401,
                    headers={"WWW-Authenticate": "Bearer"},
                )
            if key.role != "admin":
                return JSONResponse(
                    {
                        "error": "forbidden",
                        "message": f"user {key.user!r} is not an admin; this route needs an admin key "
                        "(role admin in LLM_PROVIDER_CHECKPOINT_API_KEYS)",
                    },
                    status_code=403,
                )
            try:
                return await handler(request)
            except ThreadkeepError as error:
                return JSONResponse(error.to_dict(), status_code=STATUS[error.kind])

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
        return PlainTextResponse(service.metrics.render(), media_type="text/plain; version=0.0.4")

    @admin
    async def sweep(request: Request) -> Response:
        dry_run = request.query_params.get("dry_run", "false").lower() in ("1", "true", "yes")
        return JSONResponse(await run_in_threadpool(service.sweep, dry_run))

    @admin
    async def write_settings(request: Request) -> Response:
        try:
            body = await request.json()
        except ValueError:
            body = None
        if not isinstance(body, dict) or not all(isinstance(v, str | None) for v in body.values()):
            raise ConfigurationError(
                "a settings write is a JSON object of variable names to strings or null, e.g. "
                '{"LLM_PROVIDER_CHECKPOINT_RETENTION_WAITING_MINUTES": "600"}'
            )
        settings = service.settings.updated(body)
        await run_in_threadpool(service.replace_settings, settings)
        public = {
            k: v
            for k, v in settings.as_env().items()
            if k.endswith(("_MINUTES", "_SECONDS")) or k == "LLM_PROVIDER_CHECKPOINT"
        }
        return JSONResponse({"status": "ok", "settings": public})

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        service.start()
        yield
        await run_in_threadpool(service.close)

    # -- the inspector page (issue 38 item 6): GET /, /inspector/*, /api/session -------------
    from threadkeep import inspector

    def identify(token: str) -> tuple[str, str] | None:
        key = service.keys.get(token)
        return None if key is None else (key.user, key.role)

    inspector_routes = inspector.routes(identify)
    # -- end of the inspector page ---------------------------------------------------------------

    return Starlette(
        lifespan=lifespan,
        routes=[
            Route("/healthz", healthz, methods=["GET"]),
            Route("/metrics", metrics_route, methods=["GET"]),
            Route("/api/checkpoints/sweep", sweep, methods=["POST"]),
            Route("/api/settings", write_settings, methods=["PATCH"]),
            *inspector_routes,
        ],
    )


def serve(host: str = "127.0.0.1", port: int = 8420) -> None:
    """Run the app with uvicorn until interrupted.

    Raises:
        MissingExtraError: the ``[server]`` extra is not installed.
    """
    import_extra("uvicorn", "threadkeep serve", "server")
    import uvicorn

    uvicorn.run(create_app(), host=host, port=port, log_level="info")
