"""The lowest versions threadkeep supports, read from pyproject.toml, for tools/check_versions.

    python tools/lowest_versions.py              print the constraints of the lowest run
    python tools/lowest_versions.py --installed  print the versions this Python has installed

The libraries threadkeep drives directly (``RANGED``) are pinned at the lower bound of their
range in pyproject.toml; every range must also have an upper bound. Every other package keeps
its pin from constraints.txt, except those whose version follows a ranged library
(``FOLLOWERS``): pip picks them to fit.
"""

from __future__ import annotations

import sys
import tomllib
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parent.parent

RANGED = ("langgraph", "langgraph-checkpoint", "psycopg", "psycopg-pool", "redis", "prometheus-client")

FOLLOWERS = {
    "psycopg-binary": "psycopg[binary] requires exactly its own version",
}


def lower_bounds() -> dict[str, str]:
    """Each ranged library's lower bound, checking that every mention of it in pyproject.toml
    states the same lower bound and an upper bound."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    mentions = list(project["dependencies"])
    for extra in project["optional-dependencies"].values():
        mentions.extend(extra)
    bounds: dict[str, str] = {}
    for text in mentions:
        requirement = Requirement(text)
        name = canonicalize_name(requirement.name)
        if name not in RANGED:
            continue
        lows = [s.version for s in requirement.specifier if s.operator == ">="]
        highs = [s.version for s in requirement.specifier if s.operator == "<"]
        if len(lows) != 1 or len(highs) != 1:
            sys.exit(f"pyproject.toml: {text!r} must state one lower (>=) and one upper (<) bound")
        if bounds.setdefault(name, lows[0]) != lows[0]:
            sys.exit(f"pyproject.toml: {name} has two lower bounds, {bounds[name]} and {lows[0]}")
    missing = [name for name in RANGED if name not in bounds]
    if missing:
        sys.exit(f"pyproject.toml names no range for {', '.join(missing)}")
    return bounds


def constraints() -> str:
    lines = [f"{name}=={low}" for name, low in lower_bounds().items()]
    for line in (ROOT / "constraints.txt").read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            name = canonicalize_name(Requirement(line).name)
            if name not in RANGED and name not in FOLLOWERS:
                lines.append(line)
    return "\n".join(lines) + "\n"


def installed() -> str:
    def one(name: str) -> str:
        try:
            return f"{name} {version(name)}"
        except PackageNotFoundError:
            return f"{name} (not installed)"

    return ", ".join(one(name) for name in (*RANGED, "psycopg-binary", "hiredis"))


if __name__ == "__main__":
    sys.stdout.write(f"{installed()}\n" if sys.argv[1:] == ["--installed"] else constraints())
