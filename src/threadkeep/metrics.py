"""What the store counts about itself, on ``prometheus_client`` (SPEC SV4).

A :class:`Metrics` holds threadkeep's metric families in a ``prometheus_client``
``CollectorRegistry``. threadkeep counts into :data:`METRICS` (the process's, in a registry of
its own) unless a saver is given another (``open_checkpointer(..., metrics=Metrics())``; pass
``Metrics(registry=prometheus_client.REGISTRY)`` to count into an application's default
registry). ``GET /metrics`` serves :meth:`Metrics.render`. A *hook* (any callable) is told each
counter increment as it happens, to forward it to another metrics system.

Every family below is listed from the first scrape (HELP and TYPE), its series at zero where
threadkeep knows the labels: the cache, sweep and ownership series from the start, a
provider's series once a saver of that provider is built (a live-thread filter registered by
an application shows up with its first count).

Families:

- ``threadkeep_durable_write_seconds{provider,operation}`` (histogram): how long each write that
  stored took, the whole call (retries included): ``put``, ``put_writes``, ``delete``,
  ``delete_runs``, ``copy``, ``prune``, ``assign_owner``, ``retention`` (a thread's start, its
  finished mark, a park), ``ledger`` (a tool call's entry) and ``sweep`` (the sweep's deletes).
- ``threadkeep_retries_total{provider}``: tries run again after a dropped connection (SPEC W4).
- ``threadkeep_conflicts_total{provider}``: writes refused with ``StaleStateError`` (SPEC W2).
- ``threadkeep_forbidden_total{provider,operation}``: calls refused with
  ``StorageForbiddenError`` (SPEC W3): the write operations above, ``read`` (an ownership check
  of :class:`~threadkeep.resolver.OwnershipResolver`) and ``operator`` (an operator-only call
  outside ``operator_scope``).
- ``threadkeep_cache_events_total{event}``: the tiered provider's hot tier: ``hit``, ``miss``,
  ``stale`` and ``confirmed`` (see ``docs/tiered.md``), ``error`` (Redis failed; the read went
  to Postgres or the write was dropped), ``skipped`` (a write older than the cached state,
  refused by the compare-and-set) and ``cleared`` (an entry removed after a conflict or a
  delete).
- ``threadkeep_owner_cache_events_total{tier,event}``: the ownership resolver's caches
  (``tier`` ``local`` or ``shared``): ``hit``, ``miss``, and on the shared tier ``error``
  (Redis failed; the store answered).
- ``threadkeep_checkpoint_sweep_runs_total{dry_run}``: sweeps run to the end.
- ``threadkeep_checkpoint_sweep_spared_total{horizon,owner}``: threads the sweep found past a
  horizon but kept because a live-thread filter (``owner``) claimed them (SPEC SW4).
- ``threadkeep_checkpoint_sweep_deleted_total{horizon}``: threads the sweep deleted.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Final

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Histogram, generate_latest

__all__ = [
    "CACHE_EVENTS",
    "CONFLICTS",
    "CONTENT_TYPE",
    "FORBIDDEN",
    "METRICS",
    "OPERATIONS",
    "OWNER_CACHE_EVENTS",
    "RETRIES",
    "SWEEP_DELETED",
    "SWEEP_RUNS",
    "SWEEP_SPARED",
    "WRITE_SECONDS",
    "Meters",
    "Metrics",
]

WRITE_SECONDS: Final = "threadkeep_durable_write_seconds"
RETRIES: Final = "threadkeep_retries_total"
CONFLICTS: Final = "threadkeep_conflicts_total"
FORBIDDEN: Final = "threadkeep_forbidden_total"
CACHE_EVENTS: Final = "threadkeep_cache_events_total"
OWNER_CACHE_EVENTS: Final = "threadkeep_owner_cache_events_total"
SWEEP_RUNS: Final = "threadkeep_checkpoint_sweep_runs_total"
SWEEP_SPARED: Final = "threadkeep_checkpoint_sweep_spared_total"
SWEEP_DELETED: Final = "threadkeep_checkpoint_sweep_deleted_total"

# The media type of :meth:`Metrics.render`'s text.
CONTENT_TYPE: Final[str] = CONTENT_TYPE_LATEST

# The write operations a saver times (the ``operation`` label of WRITE_SECONDS and FORBIDDEN).
OPERATIONS: Final = (
    "put",
    "put_writes",
    "delete",
    "delete_runs",
    "copy",
    "prune",
    "assign_owner",
    "retention",
    "ledger",
    "sweep",
)
# A local store's write takes ~0.1-1 ms, a networked one's 1-10 ms; a slow one seconds.
_WRITE_BUCKETS: Final = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 10.0)

_HORIZONS: Final = ("finished", "waiting")


@dataclass(frozen=True, slots=True)
class _Family:
    help: str
    labels: tuple[str, ...]
    series: tuple[Mapping[str, str], ...] = ()  # rendered at zero from the start
    histogram: bool = False


_FAMILIES: Final[Mapping[str, _Family]] = {
    WRITE_SECONDS: _Family(
        "Seconds each durable write took (the whole call), by provider and operation.",
        ("provider", "operation"),
        histogram=True,
    ),
    RETRIES: _Family("Tries run again after a dropped connection, by provider.", ("provider",)),
    CONFLICTS: _Family("Writes refused with StaleStateError (a head moved on), by provider.", ("provider",)),
    FORBIDDEN: _Family(
        "Calls refused with StorageForbiddenError (another user's thread), by provider and operation.",
        ("provider", "operation"),
    ),
    CACHE_EVENTS: _Family(
        "Events of the tiered provider's Redis hot tier, by kind.",
        ("event",),
        tuple(
            {"event": event} for event in ("hit", "miss", "stale", "confirmed", "error", "skipped", "cleared")
        ),
    ),
    OWNER_CACHE_EVENTS: _Family(
        "Lookups of the ownership resolver's caches, by tier and outcome.",
        ("tier", "event"),
        (
            {"tier": "local", "event": "hit"},
            {"tier": "local", "event": "miss"},
            {"tier": "shared", "event": "hit"},
            {"tier": "shared", "event": "miss"},
            {"tier": "shared", "event": "error"},
        ),
    ),
    SWEEP_RUNS: _Family(
        "Checkpoint sweeps run to the end, by dry run or not.",
        ("dry_run",),
        ({"dry_run": "false"}, {"dry_run": "true"}),
    ),
    SWEEP_SPARED: _Family(
        "Threads past a retention horizon that a live-thread filter kept, by horizon and filter.",
        ("horizon", "owner"),
        tuple({"horizon": h, "owner": o} for h in _HORIZONS for o in ("interrupts", "parks")),
    ),
    SWEEP_DELETED: _Family(
        "Threads the checkpoint sweep deleted, by horizon.",
        ("horizon",),
        tuple({"horizon": h} for h in _HORIZONS),
    ),
}

Hook = Callable[[str, Mapping[str, str]], None]


class Metrics:
    """threadkeep's metric families in one registry; safe to use from any thread.

    Args:
        hook: Called with ``(name, labels)`` on every counter increment (not on a
            histogram's observations).
        registry: The ``prometheus_client`` registry to register the families in; default:
            a new one of this object's own (so that several can live in one process).
    """

    def __init__(self, hook: Hook | None = None, *, registry: CollectorRegistry | None = None) -> None:
        self.hook = hook
        self.registry = CollectorRegistry(auto_describe=True) if registry is None else registry
        self._families: dict[str, Counter | Histogram] = {}
        for name, family in _FAMILIES.items():
            if family.histogram:
                self._families[name] = Histogram(
                    name, family.help, family.labels, registry=self.registry, buckets=_WRITE_BUCKETS
                )
            else:
                self._families[name] = Counter(name, family.help, family.labels, registry=self.registry)
            for labels in family.series:
                self._families[name].labels(**labels)
        self._meters: dict[str, Meters] = {}
        self._guard = threading.Lock()

    def counter(self, name: str) -> Counter:
        """The ``prometheus_client`` counter of family ``name`` (one of this module's)."""
        family = self._families[name]
        if not isinstance(family, Counter):
            raise TypeError(f"{name} is a histogram, not a counter")
        return family

    def histogram(self, name: str) -> Histogram:
        """The ``prometheus_client`` histogram of family ``name`` (one of this module's)."""
        family = self._families[name]
        if not isinstance(family, Histogram):
            raise TypeError(f"{name} is a counter, not a histogram")
        return family

    def inc(self, name: str, amount: float = 1, **labels: str) -> None:
        """Add ``amount`` to counter ``name`` (one of this module's) with ``labels``."""
        self.counter(name).labels(**labels).inc(amount)
        if self.hook is not None:
            self.hook(name, labels)

    def observe(self, name: str, value: float, **labels: str) -> None:
        """Record ``value`` in histogram ``name`` with ``labels``."""
        self.histogram(name).labels(**labels).observe(value)

    def value(self, name: str, **labels: str) -> float:
        """A counter's current value, or how many values a histogram recorded (0 if none)."""
        sample = f"{name}_count" if isinstance(self._families[name], Histogram) else name
        return self.registry.get_sample_value(sample, labels) or 0.0

    def meters(self, provider: str) -> Meters:
        """``provider``'s series, resolved once for the hot path (and listed at zero from now)."""
        with self._guard:
            meters = self._meters.get(provider)
            if meters is None:
                meters = self._meters[provider] = Meters(self, provider)
            return meters

    def render(self) -> str:
        """Every family in the Prometheus text exposition format (:data:`CONTENT_TYPE`)."""
        return generate_latest(self.registry).decode()


class Meters:
    """One provider's series of :class:`Metrics`: what a saver and its engine count into.

    Build one with :meth:`Metrics.meters`.
    """

    def __init__(self, metrics: Metrics, provider: str) -> None:
        self.metrics = metrics
        self.provider = provider
        write, forbidden = metrics.histogram(WRITE_SECONDS), metrics.counter(FORBIDDEN)
        self._write = {op: write.labels(provider=provider, operation=op) for op in OPERATIONS}
        self._forbidden = {
            op: forbidden.labels(provider=provider, operation=op) for op in (*OPERATIONS, "read", "operator")
        }
        self._retry = metrics.counter(RETRIES).labels(provider=provider)
        self._conflict = metrics.counter(CONFLICTS).labels(provider=provider)

    def wrote(self, operation: str, seconds: float) -> None:
        """A write of ``operation`` stored, in ``seconds``."""
        child = self._write.get(operation)
        if child is None:
            self.metrics.observe(WRITE_SECONDS, seconds, provider=self.provider, operation=operation)
        else:
            child.observe(seconds)

    def retried(self) -> None:
        """A try is run again after a dropped connection."""
        self._retry.inc()
        self._heard(RETRIES, {"provider": self.provider})

    def conflicted(self) -> None:
        """A write was refused with ``StaleStateError``."""
        self._conflict.inc()
        self._heard(CONFLICTS, {"provider": self.provider})

    def forbidden(self, operation: str) -> None:
        """A call of ``operation`` was refused with ``StorageForbiddenError``."""
        child = self._forbidden.get(operation)
        if child is None:
            self.metrics.inc(FORBIDDEN, provider=self.provider, operation=operation)
            return
        child.inc()
        self._heard(FORBIDDEN, {"provider": self.provider, "operation": operation})

    def _heard(self, name: str, labels: Mapping[str, str]) -> None:
        if self.metrics.hook is not None:
            self.metrics.hook(name, labels)


METRICS: Final = Metrics()
