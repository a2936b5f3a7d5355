"""The optional extras: the modules each one installs, and the refusal when one is missing.

A provider or command whose extra is not installed raises :class:`MissingExtraError` naming
the ``pip install`` to run, never a bare ``ModuleNotFoundError``.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from types import ModuleType
from typing import Final

from threadkeep.errors import MissingExtraError

__all__ = ["EXTRAS", "import_extra", "pip_install"]

# The top-level modules each extra of pyproject.toml installs.
EXTRAS: Final[Mapping[str, frozenset[str]]] = {
    "postgres": frozenset({"psycopg", "psycopg_pool"}),
    "redis": frozenset({"redis"}),
    "server": frozenset({"starlette", "uvicorn"}),
}


def pip_install(*extras: str) -> str:
    """The command that installs threadkeep with ``extras``."""
    return f"pip install 'threadkeep[{','.join(extras)}]'"


def import_extra(module: str, needed_by: str, *extras: str) -> ModuleType:
    """Import ``module``, which needs ``extras`` installed.

    Args:
        module: The module to import (it may import an extra's modules).
        needed_by: What needs it, for the message (``the redis provider``).
        extras: The extras whose modules it imports.

    Raises:
        MissingExtraError: a module one of ``extras`` installs is missing. Any other missing
            module is a broken install and propagates as it is.
    """
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as exc:
        missing = (exc.name or "").partition(".")[0]
        if not any(missing in EXTRAS[extra] for extra in extras):
            raise
        command = pip_install(*extras)
        raise MissingExtraError(
            f"{needed_by} needs {missing!r}, which is not installed; install it with: {command}",
            context={"missing": missing, "extras": list(extras), "install": command},
        ) from exc
