"""The retention model (SPEC RT1-RT3): two horizons, and what a thread may declare. No I/O.

A *waiting* thread (not marked finished) lives the waiting retention after its newest
checkpoint; a *finished* one lives the finished retention after its mark, with the due time
fixed at the mark. The platform sets both (``LLM_PROVIDER_CHECKPOINT_RETENTION_*_MINUTES``);
a thread's owner may declare shorter ones for it. A thread waiting on an interrupt is spared
by the sweep past either horizon, for ever by default, or for the platform's optional
interrupt horizon (``LLM_PROVIDER_CHECKPOINT_RETENTION_INTERRUPT_MINUTES``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from threadkeep.errors import ThreadRetentionError

__all__ = [
    "ExpiredThread",
    "Horizon",
    "Park",
    "PlatformRetention",
    "SweepPage",
    "ThreadRetention",
    "declare_retention",
]

Horizon = Literal["finished", "waiting"]

_WAITING = "LLM_PROVIDER_CHECKPOINT_RETENTION_WAITING_MINUTES"
_FINISHED = "LLM_PROVIDER_CHECKPOINT_RETENTION_FINISHED_MINUTES"


@dataclass(frozen=True, slots=True)
class PlatformRetention:
    """The deployment's two horizons, in minutes (the settings check them at boot), and how
    long the sweep spares a thread waiting on an interrupt (``None``: for as long as it waits).
    """

    waiting_minutes: int = 10080
    finished_minutes: int = 1440
    interrupt_minutes: int | None = None

    def interrupted_since(self, now: float) -> float | None:
        """The oldest time (epoch seconds) an interrupt may have been waiting since and
        still spare its thread at ``now``; ``None``: any."""
        return None if self.interrupt_minutes is None else now - 60 * self.interrupt_minutes


@dataclass(frozen=True, slots=True)
class ThreadRetention:
    """What a thread's owner declared; ``None`` leaves a horizon to the platform.

    Build one with :func:`declare_retention`, which checks it against the platform's.
    """

    waiting_minutes: int | None = None
    finished_minutes: int | None = None

    def waiting(self, platform: PlatformRetention) -> int:
        """The waiting horizon in force for the thread."""
        return self.waiting_minutes or platform.waiting_minutes

    def finished(self, platform: PlatformRetention) -> int:
        """The finished horizon in force: declared, else the platform's capped at the
        thread's waiting."""
        if self.finished_minutes is not None:
            return self.finished_minutes
        return min(platform.finished_minutes, self.waiting(platform))


def declare_retention(
    platform: PlatformRetention, *, waiting_minutes: int | None = None, finished_minutes: int | None = None
) -> ThreadRetention:
    """A thread's own retention, which may only be shorter than the platform's (SPEC RT3).

    Raises:
        ThreadRetentionError: a value that is not a positive whole number of minutes, above
            the platform's, or a finished retention above the waiting one; the message names
            both values.
    """
    for name, value, limit, variable in (
        ("waiting_minutes", waiting_minutes, platform.waiting_minutes, _WAITING),
        ("finished_minutes", finished_minutes, platform.finished_minutes, _FINISHED),
    ):
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
            raise ThreadRetentionError(
                f"declared {name}={value!r} must be a positive whole number of minutes",
                context={name: value},
            )
        if value > limit:
            raise ThreadRetentionError(
                f"declared {name}={value} exceeds the platform's {limit} ({variable}); a thread "
                "may only declare a shorter retention",
                context={name: value, f"platform_{name}": limit},
            )
    waiting = waiting_minutes or platform.waiting_minutes
    if finished_minutes is not None and finished_minutes > waiting:
        raise ThreadRetentionError(
            f"declared finished_minutes={finished_minutes} exceeds the thread's waiting retention "
            f"of {waiting} minutes; a finished thread may not outlive a waiting one",
            context={"finished_minutes": finished_minutes, "waiting_minutes": waiting},
        )
    return ThreadRetention(waiting_minutes, finished_minutes)


@dataclass(frozen=True, slots=True)
class SweepPage:
    """Which page of expired threads a sweep asks a store for.

    A store with keys pages by key after ``after``; one without (Redis's finished set)
    skips the ``spared`` threads still in the set, which sort first.
    """

    horizon: Horizon
    now: float
    waiting_minutes: int
    after: int = 0
    spared: int = 0
    limit: int = 1000


@dataclass(frozen=True, slots=True)
class Park:
    """A run parked on a question (SPEC RT5): live until ``deadline`` (epoch seconds).

    ``user`` is who parks it: the owner of a thread the park creates (the thread's first
    checkpoint may still be on its way), and whose thread it must be under isolation
    (``required_owner``, ``None``: any).
    """

    thread_id: str
    park_id: str
    deadline: float
    user: str
    required_owner: str | None
    now: float


@dataclass(frozen=True, slots=True)
class ExpiredThread:
    """A thread a sweep found past a horizon: its store key (SQL: its tid), id and owner."""

    key: int
    thread_id: str
    owner: str
