"""One saver per store (SPEC P5): a run may name its own provider and connection string.

:func:`saver_for` builds each saver once per (provider, connection string, declared waiting
retention) and hands the same one back afterwards, so a deployment whose runs name a few
stores holds one pool per store. A declared waiting retention gets a saver of its own whose
platform waiting is that retention (on redis: its keys' TTL). :func:`close_savers` closes them
all (at shutdown).

The sweep covers the deployment's configured store (SPEC SW7). A run's own redis store
leaves on its keys' TTL and its own memory store with the process; a run's own SQL store is
swept by a deployment (or a ``threadkeep checkpoints sweep``) configured on it.
"""

from __future__ import annotations

import threading

from threadkeep.core.retention import PlatformRetention, ThreadRetention, declare_retention
from threadkeep.providers import open_checkpointer
from threadkeep.saver import ThreadkeepSaver
from threadkeep.settings import Settings

__all__ = ["close_savers", "saver_for"]

_Key = tuple[str, str | None, int | None]
_SAVERS: dict[_Key, ThreadkeepSaver] = {}
_GUARD = threading.Lock()


def saver_for(
    provider: str | None = None,
    conn_string: str | None = None,
    *,
    waiting_minutes: int | None = None,
    settings: Settings | None = None,
) -> ThreadkeepSaver:
    """The saver of a store, built on first use and shared afterwards.

    Args:
        provider: Default: the configured provider (and its connection string).
        conn_string: The store's connection string (for ``provider``).
        waiting_minutes: A declared waiting retention (at most the platform's): the saver's
            waiting horizon, and on redis the TTL of what it writes.
        settings: The deployment's settings; default: read from the environment.

    Raises:
        ConfigurationError: an unknown provider, or a setting refused.
        ThreadRetentionError: ``waiting_minutes`` above the platform's.
    """
    base = settings or Settings.from_env()
    if provider is not None:
        base = base.with_values(provider=provider, conn_string=conn_string)
    platform = PlatformRetention(
        base.retention_waiting_minutes, base.retention_finished_minutes, base.retention_interrupt_minutes
    )
    declared = (
        None if waiting_minutes is None else declare_retention(platform, waiting_minutes=waiting_minutes)
    )
    key: _Key = (base.provider, base.conn_string, waiting_minutes)
    with _GUARD:
        saver = _SAVERS.get(key)
        if saver is None:
            saver = _SAVERS[key] = _open(base, platform, declared)
        return saver


def _open(
    settings: Settings, platform: PlatformRetention, declared: ThreadRetention | None
) -> ThreadkeepSaver:
    if declared is None or declared.waiting_minutes is None:
        return open_checkpointer(settings=settings)
    # Built with the declared waiting as its own (on redis: the TTL of every key it writes),
    # then told the platform's, which the sweep and the finished marks use.
    saver = open_checkpointer(
        settings=settings.with_values(
            retention_waiting_minutes=declared.waiting_minutes,
            retention_finished_minutes=min(settings.retention_finished_minutes, declared.waiting_minutes),
        )
    )
    saver.retention = platform
    saver.declared = declared
    return saver


def close_savers() -> None:
    """Close every saver :func:`saver_for` built."""
    with _GUARD:
        savers = list(_SAVERS.values())
        _SAVERS.clear()
    for saver in savers:
        saver.close()
