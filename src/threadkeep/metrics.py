"""Counters the store keeps about itself, in the Prometheus text format.

A :class:`Metrics` registry holds counters by name and labels. threadkeep counts into
:data:`METRICS` (the process's registry) unless a saver is given its own; ``GET /metrics``
serves :meth:`Metrics.render`. A *hook* (any callable) can also be told each event as it
happens, to forward it to another metrics system.

Every counter below is rendered from the start, before anything is counted: the series of
the labels threadkeep itself uses at zero (a live-thread filter registered by an
application shows up with its first count), so a fresh server's ``/metrics`` lists them all.

Counters:

- ``threadkeep_cache_events_total{event}``: the tiered provider's hot tier: ``hit``, ``miss``,
  ``stale`` and ``confirmed`` (see ``docs/tiered.md``), ``error`` (Redis failed; the read went
  to Postgres or the write was dropped), ``skipped`` (a write older than the cached state,
  refused by the compare-and-set) and ``cleared`` (an entry removed after a conflict or a
  delete).
- ``threadkeep_checkpoint_sweep_spared_total{horizon,owner}``: threads the sweep found past a
  horizon but kept because a live-thread filter (``owner``) claimed them (SPEC SW4).
- ``threadkeep_checkpoint_sweep_deleted_total{horizon}``: threads the sweep deleted.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from typing import Final

__all__ = ["CACHE_EVENTS", "METRICS", "SWEEP_DELETED", "SWEEP_SPARED", "Metrics"]

CACHE_EVENTS: Final = "threadkeep_cache_events_total"
SWEEP_SPARED: Final = "threadkeep_checkpoint_sweep_spared_total"
SWEEP_DELETED: Final = "threadkeep_checkpoint_sweep_deleted_total"

_HORIZONS: Final = ("finished", "waiting")
# The label sets threadkeep counts with, rendered at zero until they are counted.
_SERIES: Final[Mapping[str, tuple[Mapping[str, str], ...]]] = {
    CACHE_EVENTS: tuple(
        {"event": event} for event in ("hit", "miss", "stale", "confirmed", "error", "skipped", "cleared")
    ),
    SWEEP_SPARED: tuple({"horizon": h, "owner": o} for h in _HORIZONS for o in ("interrupts", "parks")),
    SWEEP_DELETED: tuple({"horizon": h} for h in _HORIZONS),
}

_HELP: Final[Mapping[str, str]] = {
    CACHE_EVENTS: "Events of the tiered provider's Redis hot tier, by kind.",
    SWEEP_SPARED: "Threads past a retention horizon that a live-thread filter kept, by horizon and filter.",
    SWEEP_DELETED: "Threads the checkpoint sweep deleted, by horizon.",
}

Labels = tuple[tuple[str, str], ...]
Hook = Callable[[str, Mapping[str, str]], None]


class Metrics:
    """Counters by name and labels; safe to use from any thread.

    Args:
        hook: Called with ``(name, labels)`` on every increment.
    """

    def __init__(self, hook: Hook | None = None) -> None:
        self.hook = hook
        self._counts: dict[str, dict[Labels, float]] = {
            name: {tuple(sorted(labels.items())): 0 for labels in series} for name, series in _SERIES.items()
        }
        self._guard = threading.Lock()

    def inc(self, name: str, amount: float = 1, **labels: str) -> None:
        """Add ``amount`` to counter ``name`` with ``labels``."""
        key = tuple(sorted(labels.items()))
        with self._guard:
            series = self._counts.setdefault(name, {})
            series[key] = series.get(key, 0) + amount
        if self.hook is not None:
            self.hook(name, labels)

    def value(self, name: str, **labels: str) -> float:
        """The counter's current value (0 if it was never incremented)."""
        with self._guard:
            return self._counts.get(name, {}).get(tuple(sorted(labels.items())), 0)

    def render(self) -> str:
        """Every counter in the Prometheus text exposition format (version 0.0.4)."""
        lines: list[str] = []
        with self._guard:
            snapshot = {name: dict(series) for name, series in sorted(self._counts.items())}
        for name, series in snapshot.items():
            lines.append(f"# HELP {name} {_HELP.get(name, name)}")
            lines.append(f"# TYPE {name} counter")
            for labels, value in sorted(series.items()):
                rendered = ",".join(f'{key}="{_escape(val)}"' for key, val in labels)
                lines.append(f"{name}{{{rendered}}} {value:g}" if rendered else f"{name} {value:g}")
        return "\n".join(lines) + "\n"


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


METRICS: Final = Metrics()
