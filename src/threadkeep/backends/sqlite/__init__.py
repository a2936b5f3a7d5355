"""The SQLite and memory providers: one engine, a file in WAL mode or a private in-memory DB.

``memory`` is the same store kept in process memory: every rule (atomic steps, heads,
isolation, messages stored once) holds identically, and it is gone with the process.
"""

from __future__ import annotations

from threadkeep.backends.sql.backend import SqlBackend, load_migrations
from threadkeep.backends.sqlite import queries
from threadkeep.backends.sqlite.engine import MEMORY, SqliteEngine
from threadkeep.providers import FACTS, Provider, SaverOptions, saver_kwargs
from threadkeep.saver import ThreadkeepSaver
from threadkeep.settings import Settings

__all__ = [
    "MEMORY_PROVIDER",
    "SQLITE_PROVIDER",
    "SqliteEngine",
    "build_memory",
    "build_sqlite",
    "open_sqlite_backend",
]

_MIGRATIONS = load_migrations(__name__)
_OPTIONS = frozenset({"synchronous", "busy_timeout_ms", "max_connections"})


def open_sqlite_backend(path: str, *, gate: bool = True, **engine_options: object) -> SqlBackend:
    """Open the SQLite store at ``path`` (``":memory:"`` for a private one).

    With ``gate`` (the default) the format gate runs and the schema is migrated; without it
    the store is opened as it is, for ``threadkeep store check`` and ``reset``.
    """
    engine = SqliteEngine(path, **engine_options)  # type: ignore[arg-type]
    backend = SqlBackend(engine, queries, _MIGRATIONS)
    if gate:
        try:
            backend.open()
        except BaseException:
            engine.close()
            raise
    return backend


def build_sqlite(settings: Settings, options: SaverOptions) -> ThreadkeepSaver:
    backend = open_sqlite_backend(settings.sqlite_path(), **options.backend)
    return ThreadkeepSaver(backend, FACTS["sqlite"], **saver_kwargs(settings, options))


def build_memory(settings: Settings, options: SaverOptions) -> ThreadkeepSaver:
    backend = open_sqlite_backend(MEMORY, **options.backend)
    return ThreadkeepSaver(backend, FACTS["memory"], **saver_kwargs(settings, options))


def _sqlite_admin(settings: Settings) -> SqlBackend:
    return open_sqlite_backend(settings.sqlite_path(), gate=False)


def _memory_admin(settings: Settings) -> SqlBackend:
    return open_sqlite_backend(MEMORY, gate=False)


SQLITE_PROVIDER = Provider(build_sqlite, _sqlite_admin, _OPTIONS)
MEMORY_PROVIDER = Provider(build_memory, _memory_admin, _OPTIONS)
