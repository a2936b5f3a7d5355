"""The providers, their facts, and the one entry point that builds a saver (SPEC P1-P4).

A static table names each provider's :class:`Provider` as ``"module:attribute"`` and the
extras its drivers come from. A backend module, and with it its driver, is imported the
first time its provider is chosen: a deployment needs, and pays for, only the provider it
uses, and a provider whose extra is missing raises :class:`MissingExtraError` naming the
``pip install`` to run. Backends import this module; it imports none of them.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final

from langgraph.checkpoint.serde.base import SerializerProtocol

from threadkeep.codec.serde import build_serde
from threadkeep.core.retention import PlatformRetention
from threadkeep.errors import ConfigurationError
from threadkeep.extras import import_extra
from threadkeep.metrics import Metrics
from threadkeep.saver import Backend, ProviderFacts, ThreadkeepSaver
from threadkeep.settings import PROVIDERS, Settings

__all__ = [
    "FACTS",
    "Provider",
    "SaverOptions",
    "aopen_checkpointer",
    "facts_of",
    "open_checkpointer",
    "registration",
    "saver_kwargs",
]

FACTS: Mapping[str, ProviderFacts] = {
    "memory": ProviderFacts("memory", survives_restart=False, expiry="process", holds_parked_runs=False),
    "sqlite": ProviderFacts("sqlite", survives_restart=True, expiry="sweep", holds_parked_runs=False),
    "postgres": ProviderFacts("postgres", survives_restart=True, expiry="sweep", holds_parked_runs=True),
    "redis": ProviderFacts("redis", survives_restart=True, expiry="ttl", holds_parked_runs=True),
    "tiered": ProviderFacts("tiered", survives_restart=True, expiry="sweep", holds_parked_runs=True),
}


@dataclass(frozen=True, slots=True)
class SaverOptions:
    """Per-saver options that override the deployment settings.

    Attributes:
        serde: A serializer to store values with (wrapped for compression); default: the
            codec the settings name.
        enforce_user_isolation: See :class:`~threadkeep.saver.ThreadkeepSaver`.
        state_history_limit: Newest checkpoints kept per (thread, namespace).
        clock: Wall-clock seconds.
        metrics: Where the saver counts (:mod:`threadkeep.metrics`); default:
            :data:`threadkeep.metrics.METRICS`.
        backend: Provider-specific options (``synchronous``, ``busy_timeout_ms``,
            ``max_connections`` for sqlite).
    """

    serde: SerializerProtocol | None = None
    enforce_user_isolation: bool | None = None
    state_history_limit: int | None = None
    clock: Callable[[], float] = time.time
    metrics: Metrics | None = None
    backend: Mapping[str, Any] = field(default_factory=dict)


_COMMON = frozenset({"serde", "enforce_user_isolation", "state_history_limit", "clock", "metrics"})
Builder = Callable[[Settings, SaverOptions], ThreadkeepSaver]
AsyncBuilder = Callable[[Settings, SaverOptions], Awaitable[ThreadkeepSaver]]
AdminOpener = Callable[[Settings], Backend]


@dataclass(frozen=True, slots=True)
class Provider:
    """How a backend builds one provider's savers (a backend module exports one per provider).

    Attributes:
        build: Builds a saver (format gate and migrations included).
        admin: Opens the store without the format gate, for ``threadkeep store``.
        options: The provider-specific options ``open_checkpointer`` accepts.
        abuild: Builds a saver from inside an event loop, on the loop's connections;
            ``None``: :attr:`build` serves both.
    """

    build: Builder
    admin: AdminOpener
    options: frozenset[str] = frozenset()
    abuild: AsyncBuilder | None = None


@dataclass(frozen=True, slots=True)
class _Entry:
    target: str  # "module:attribute" of the provider's Provider
    extras: tuple[str, ...] = ()  # the extras whose drivers the module imports


# Each provider's backend, imported on first use (the shape of DBOS's system-database
# factory): importing a backend imports its driver, so nothing else may import one.
_TABLE: Final[Mapping[str, _Entry]] = {
    "memory": _Entry("threadkeep.backends.sqlite:MEMORY_PROVIDER"),
    "sqlite": _Entry("threadkeep.backends.sqlite:SQLITE_PROVIDER"),
    "postgres": _Entry("threadkeep.backends.postgres:POSTGRES_PROVIDER", ("postgres",)),
    "redis": _Entry("threadkeep.backends.redis:REDIS_PROVIDER", ("redis",)),
    "tiered": _Entry("threadkeep.backends.tiered:TIERED_PROVIDER", ("postgres", "redis")),
}
_LOADED: dict[str, Provider] = {}


def registration(provider: str) -> Provider:
    """The :class:`Provider` of ``provider``, importing its backend on first use.

    Raises:
        ConfigurationError: an unknown provider.
        MissingExtraError: the provider's extra is not installed (the message names the
            ``pip install`` to run).
    """
    facts_of(provider)
    loaded = _LOADED.get(provider)
    if loaded is None:
        # Python's import lock serializes concurrent first uses; both then find one module.
        entry = _TABLE[provider]
        module, _, attribute = entry.target.partition(":")
        backend = import_extra(module, f"the {provider} provider", *entry.extras)
        loaded = _LOADED[provider] = getattr(backend, attribute)
    return loaded


def facts_of(provider: str) -> ProviderFacts:
    """What provider ``provider`` promises (SPEC P4)."""
    try:
        return FACTS[provider]
    except KeyError:
        raise ConfigurationError(
            f"unknown checkpoint provider {provider!r}; choose one of {', '.join(PROVIDERS)}"
        ) from None


def open_checkpointer(
    provider: str | None = None,
    conn_string: str | None = None,
    *,
    settings: Settings | None = None,
    **options: Any,
) -> ThreadkeepSaver:
    """Build the checkpointer the settings (or the arguments) name.

    With no arguments it follows ``LLM_PROVIDER_CHECKPOINT*``: by default a SQLite file at
    ``.threadkeep/checkpoints.sqlite`` under the working directory. Close the saver (or use
    it as a context manager) when done.

    Args:
        provider: ``memory``, ``sqlite``, ``postgres``, ``redis`` or ``tiered``.
        conn_string: The provider's connection string (a path for sqlite).
        settings: Deployment settings; default: read from the environment.
        **options: ``serde``, ``enforce_user_isolation``, ``state_history_limit``,
            ``clock``, ``metrics`` (a :class:`threadkeep.metrics.Metrics` to count into), and
            the provider's own options.

    Raises:
        ConfigurationError: an unknown provider or option, or a setting refused.
        CheckpointStoreFormatError: the store holds checkpoints of another format.
    """
    entry, base, saver_options = _resolve(provider, conn_string, settings, options)
    return entry.build(base, saver_options)


async def aopen_checkpointer(
    provider: str | None = None,
    conn_string: str | None = None,
    *,
    settings: Settings | None = None,
    **options: Any,
) -> ThreadkeepSaver:
    """:func:`open_checkpointer`, from inside an event loop, for an application that uses
    the async API: on ``postgres`` the format gate runs on the loop's connection pool, so
    opening the store and its first read share one connection (the sync open checks on a
    connection of its own). Other providers open as :func:`open_checkpointer` does. Close the
    saver with ``await saver.aclose()`` (or ``async with``).

    Raises:
        ConfigurationError: as :func:`open_checkpointer`.
        CheckpointStoreFormatError: as :func:`open_checkpointer`.
    """
    entry, base, saver_options = _resolve(provider, conn_string, settings, options)
    if entry.abuild is None:
        return entry.build(base, saver_options)
    return await entry.abuild(base, saver_options)


def _resolve(
    provider: str | None, conn_string: str | None, settings: Settings | None, options: Mapping[str, Any]
) -> tuple[Provider, Settings, SaverOptions]:
    """The provider, settings and options an open names, checked."""
    base = settings or Settings.from_env()
    if provider is not None:
        facts_of(provider)
        base = base.with_values(provider=provider, conn_string=conn_string)
    elif conn_string is not None:
        base = base.with_values(conn_string=conn_string)
    entry = registration(base.provider)
    unknown = sorted(set(options) - _COMMON - entry.options)
    if unknown:
        raise ConfigurationError(
            f"unknown option(s) {', '.join(unknown)} for the {base.provider} provider; accepted: "
            f"{', '.join(sorted(_COMMON | entry.options))}",
            context={"options": unknown},
        )
    common = {k: v for k, v in options.items() if k in _COMMON}
    backend = {k: v for k, v in options.items() if k in entry.options}
    return entry, base, SaverOptions(**common, backend=backend)


def saver_kwargs(settings: Settings, options: SaverOptions) -> dict[str, Any]:
    """The ThreadkeepSaver keyword arguments every builder passes on."""
    return {
        "serde": build_serde(
            settings.codec,
            compress_threshold=settings.inline_compress_bytes,
            inner=options.serde,
            msgpack_strict=settings.msgpack_strict,
        ),
        "enforce_user_isolation": (
            settings.enforce_user_isolation
            if options.enforce_user_isolation is None
            else options.enforce_user_isolation
        ),
        "state_history_limit": (
            settings.state_history_limit
            if options.state_history_limit is None
            else options.state_history_limit
        ),
        "clock": options.clock,
        "metrics": options.metrics,
        "retention": PlatformRetention(
            settings.retention_waiting_minutes,
            settings.retention_finished_minutes,
            settings.retention_interrupt_minutes,
        ),
    }
