"""Operator views of the configured store: is it usable by this version, what does it hold.

``threadkeep store check`` and ``threadkeep store reset`` call these; so can scripts.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

from threadkeep.errors import CheckpointStoreFormatError, StorageError
from threadkeep.providers import registration
from threadkeep.settings import Settings

__all__ = ["StoreStatus", "check_store", "reset_store"]


@dataclass(frozen=True, slots=True)
class StoreStatus:
    """What ``threadkeep store check`` reports.

    Attributes:
        provider: The configured provider.
        location: Where the store is (a path, or a connection string without its password).
        ready: Whether this version can use the store as it is.
        detail: One sentence for people: why it is (not) ready and what to do.
        stats: What the store holds, when it can be read.
    """

    provider: str
    location: str
    ready: bool
    detail: str
    stats: Mapping[str, int] | None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def check_store(settings: Settings | None = None) -> StoreStatus:
    """Run the format gate on the configured store without changing it (SPEC P6)."""
    settings = settings or Settings.from_env()
    backend = registration(settings.provider).admin(settings)
    try:
        location = backend.location()
        try:
            backend.check()
        except CheckpointStoreFormatError as error:
            return StoreStatus(settings.provider, location, False, error.message, None)
        try:
            stats: Mapping[str, int] | None = backend.stats()
            detail = "ready: this version reads and writes this store"
        except StorageError:
            stats = None
            detail = "ready: the store is empty; its tables are created on first use"
        return StoreStatus(settings.provider, location, True, detail, stats)
    finally:
        backend.engine.close()


def reset_store(settings: Settings | None = None) -> StoreStatus:
    """Delete everything the configured store holds (every thread), then check it again."""
    settings = settings or Settings.from_env()
    backend = registration(settings.provider).admin(settings)
    try:
        backend.reset()
    finally:
        backend.engine.close()
    return check_store(settings)
