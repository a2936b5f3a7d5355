"""The providers the contract suite runs over, and how a test opens a fresh store on each.

A provider that needs a server registers itself here with a probe. Without the server the
provider's tests are skipped locally and fail under ``CI=true``: CI never skips silently.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from threadkeep import Settings, ThreadkeepSaver, open_checkpointer

Opener = Callable[..., ThreadkeepSaver]


@dataclass(frozen=True)
class ProviderCase:
    """How to open a fresh, empty store of one provider for one test."""

    name: str
    open: Callable[[Path, str], Opener]  # (tmp_path, unique id) -> opener(**options)
    probe: Callable[[], str | None] = lambda: None  # why the provider cannot run, or None


def _sqlite(tmp_path: Path, unique: str) -> Opener:
    path = tmp_path / f"{unique}.sqlite"
    return lambda **options: open_checkpointer("sqlite", str(path), settings=Settings(), **options)


def _memory(tmp_path: Path, unique: str) -> Opener:
    return lambda **options: open_checkpointer("memory", settings=Settings(), **options)


CASES: dict[str, ProviderCase] = {
    "memory": ProviderCase("memory", _memory),
    "sqlite": ProviderCase("sqlite", _sqlite),
}

# Providers whose stores the memory engine cannot share across saver instances.
SHARED_STORE = frozenset({"sqlite"})


def require(case: ProviderCase) -> None:
    """Skip (locally) or fail (under CI=true) when the provider's server is missing."""
    reason = case.probe()
    if reason is None:
        return
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(f"{case.name}: {reason} (CI=true: a missing server is a failure)")
    pytest.skip(f"{case.name}: {reason}")


def provider_params(names: list[str] | None = None) -> list[Any]:
    return [pytest.param(CASES[name], id=name) for name in (names or list(CASES))]
