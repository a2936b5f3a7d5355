"""Write the generated part of docs/settings.md from the settings' own definitions.

    python tools/gen_settings_doc.py           rewrite the page's generated part
    python tools/gen_settings_doc.py --check   exit 1 if the page is stale (./dev test runs it)

The table comes from ``threadkeep.settings``: each variable, its field and its default from
``VARIABLES``, its meaning from the ``Attributes:`` section of the ``Settings`` docstring; the
list of removed variables from ``REMOVED_VARIABLES``. Everything below the marker line is
written by hand and kept as it is.
"""

from __future__ import annotations

import argparse
import inspect
import re
import sys
from pathlib import Path

from threadkeep.settings import REMOVED_VARIABLES, VARIABLES, Settings

PAGE = Path(__file__).resolve().parents[1] / "docs" / "settings.md"
MARKER = (
    "<!-- Everything above is written by tools/gen_settings_doc.py from threadkeep/settings.py"
    " (VARIABLES, the Settings docstring, REMOVED_VARIABLES): edit those, then run it. -->"
)
HEADER = """# Settings

Read from the environment when a saver is built (`Settings.from_env()`). A malformed or
out-of-range value is refused at start with `ConfigurationError`, naming the variable and the
value. `open_checkpointer(**options)` overrides some of them per saver. What each one costs
in production, and how to size them: [production.md](production.md).

| Variable | Default | Meaning |
|---|---|---|"""
REMOVED = """## Removed

A deployment that sets one of these is refused at start, and a settings write that sets
one (`Settings.updated({...})`, `PATCH /api/settings`) is refused, naming it:
"""
_ENTRY = re.compile(r"^    (\w+): (.*)$")


def descriptions() -> dict[str, str]:
    """Each field's description, from the ``Attributes:`` section of ``Settings``'s docstring
    (an entry indented four spaces under it, its continuation lines deeper)."""
    lines = inspect.cleandoc(Settings.__doc__ or "").splitlines()
    found: dict[str, str] = {}
    inside = False
    current: str | None = None
    for line in lines:
        if line.strip() == "Attributes:":
            inside = True
            continue
        if not inside:
            continue
        if line and not line.startswith(" "):  # the next section
            break
        entry = _ENTRY.match(line)
        if entry:
            current = entry.group(1)
            found[current] = entry.group(2).strip()
        elif current is not None and line.startswith("        "):
            found[current] += " " + line.strip()
    return found


def undocumented() -> list[str]:
    """The settings' fields without a description."""
    described = descriptions()
    return [name for name, _default in VARIABLES.values() if name not in described]


def render(hand_written: str) -> str:
    """The whole page: the generated part, the marker, then ``hand_written``."""
    described = descriptions()
    out = [HEADER]
    for variable, (name, default) in VARIABLES.items():
        shown = f"`{default}`" if default else "unset"
        meaning = described.get(name, "(undescribed: add it to the Settings docstring)")
        out.append(f"| `{variable}` | {shown} | {meaning} |")
    out += ["", REMOVED]
    out += [f"- `{variable}`: {instead}." for variable, instead in REMOVED_VARIABLES.items()]
    out += ["", MARKER, "", hand_written.lstrip("\n")]
    return "\n".join(out)


def hand_written(page: str) -> str:
    """What follows the marker on ``page``.

    Raises:
        SystemExit: the page has no marker (its hand-written part would be lost).
    """
    _head, marker, tail = page.partition(MARKER)
    if not marker:
        raise SystemExit(f"{PAGE} has no marker line; put it back above the hand-written part:\n{MARKER}")
    return tail


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if docs/settings.md is stale")
    args = parser.parse_args(argv)
    current = PAGE.read_text()
    wanted = render(hand_written(current))
    missing = undocumented()
    if missing:
        print(
            f"settings without a description: {', '.join(missing)}; add each to the Attributes of the"
            " Settings docstring in src/threadkeep/settings.py",
            file=sys.stderr,
        )
    if args.check:
        if current != wanted:
            print(f"{PAGE} is stale: run python tools/gen_settings_doc.py", file=sys.stderr)
            return 1
        return 1 if missing else 0
    if current != wanted:
        PAGE.write_text(wanted)
        print(f"wrote {PAGE}")
    return 1 if missing else 0


if __name__ == "__main__":
    sys.exit(main())
