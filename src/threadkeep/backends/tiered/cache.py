"""The hot tier: the newest state of each active thread, in Redis (SPEC T1, T4, T6, T7).

An entry is the Redis provider's layout (``backends/redis/keys.py``) for one (thread, user),
holding per namespace only the newest checkpoint, its channel values and pending writes, and
the thread's messages stored once. So a load is the Redis provider's one-script read, and a
step's write (``lua/cache_put.lua``) sends what the step changed, not the history.

The entry carries the version of the state it holds (its checkpoint id; ``-1`` for a state
with no durable version yet, lower than any). ``cache_put`` is a compare-and-set on it: a
state that continues the cached one applies; an older one is refused (``skipped``), an
equal one applies again. A step whose parent the entry does not hold (after a miss, a skipped
write or an eviction) is answered ``full``, and the whole state is sent instead. Clearing an
entry (``forget``) keeps what the compare-and-set needs: its versions after a conflict, and a
hold that refuses every write for a while after the thread's state was removed, so a write
that was under way cannot bring a deleted or older state back.

Each state the entry takes carries a validity lease (``lease_ms``, counted from a moment the
state was known to be the durable head): within it a load serves the state alone; past it
the caller checks the state against Postgres and renews the lease (``renew``), or reads
Postgres. So a state that a failed or lost cache write left behind is served for at most
the lease, by any process.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from langgraph.checkpoint.serde.base import SerializerProtocol

from threadkeep.backends.redis import programs as redis_programs
from threadkeep.backends.redis.engine import Script
from threadkeep.backends.redis.keys import KeySpace
from threadkeep.core.identity import Actor
from threadkeep.core.messages import ContentCache
from threadkeep.core.program import Program
from threadkeep.core.records import PutStep, StoredCheckpoint, Target, WritesStep
from threadkeep.errors import CheckpointSerializationError, StorageError

__all__ = ["NO_VERSION", "REMOVED_HOLD_MS", "Loaded", "StateCache"]

NO_VERSION = "-1"
# How long the entry of a removed thread refuses writes: a write that read or stored the old
# state before the removal and reaches Redis after it must not bring the state back.
REMOVED_HOLD_MS = 60_000
_TRIES = 4

Lists = Mapping[bytes, Sequence[tuple[str, bytes]]]


@dataclass(frozen=True, slots=True)
class Loaded:
    """What a load found: the state (``None``: a miss), whether it is within its lease, and
    the Redis time of the read (ms; ``None`` if the reply could not say)."""

    state: tuple[StoredCheckpoint, Lists] | None
    valid: bool
    read_at: int | None


class StateCache:
    """The cache's programs over one Redis key space.

    Args:
        space: Where entries live (a prefix of their own, ``tkc`` by default).
        ttl_ms: How long an entry lives after its last write (``cache_ttl``); a read never
            extends it.
        lease_ms: How long a state is served without asking Postgres (``cache_lease``),
            from when it was known to be the durable head.
    """

    def __init__(self, space: KeySpace, ttl_ms: int, lease_ms: int) -> None:
        self.space = space
        self.ttl_ms = ttl_ms
        self.lease_ms = lease_ms

    def keys(self, thread_id: str, user: str) -> tuple[str, ...]:
        """The ten keys of the entry of ``thread_id`` for ``user`` (one hash tag)."""
        return self.space.thread(f"{thread_id}\0{user}")

    def store(
        self,
        step: PutStep,
        user: str,
        *,
        since: int | None = None,
        whole: bool = False,
        version: str | None = None,
    ) -> Program[str]:
        """Write the state a put stored durably (its version: its checkpoint id, unless
        ``version`` says otherwise), with a lease from ``since`` (ms, a time before the
        Postgres statement that stored or read it; ``None``: Redis's now). Returns ``"ok"``,
        or ``"skipped"`` when the entry already holds a newer state."""
        keys = self.keys(step.target.thread_id, user)
        known = [chain.reused for chain in step.chains]
        for _ in range(_TRIES):
            args = self._put_args(step, user, whole, known, version=version, since=since)
            reply = yield Script("cache_put", keys, args)
            status = reply[0]
            if status == b"ok":
                return "ok"
            if status == b"skipped":
                return "skipped"
            if status == b"full" and not whole:
                whole = True
                if step.whole is not None:
                    step = step.whole()
                known = [chain.reused for chain in step.chains]
                continue
            # "resend": a list's known prefix is not in the entry: ask which links are.
            for position, chain in enumerate(step.chains):
                known[position] = redis_programs.stored_prefix((yield Script("probe", keys, chain.nodes)))
        raise StorageError(f"the cache entry of thread {step.target.thread_id!r} kept changing under a write")

    def _put_args(
        self,
        step: PutStep,
        user: str,
        whole: bool,
        known: Sequence[int],
        *,
        version: str | None,
        since: int | None,
    ) -> list[object]:
        target = step.target
        return [
            target.thread_id,
            user,
            step.now,
            self.ttl_ms,
            target.checkpoint_ns,
            step.checkpoint_id,
            version or step.checkpoint_id,
            step.parent_id or "",
            "1" if whole else "0",
            redis_programs.record_of(step),
            self.lease_ms,
            "" if since is None else since,
            *redis_programs.step_rows(step, known),
        ]

    def store_writes(self, step: WritesStep, user: str) -> Program[None]:
        """Add a task's writes to the entry, if it holds their checkpoint (T6)."""
        keys = self.keys(step.target.thread_id, user)
        yield from redis_programs.put_writes(self.space, step, self.ttl_ms, keys=keys)

    def seed(
        self,
        stored: StoredCheckpoint,
        lists: Lists,
        actor: Actor,
        user: str,
        *,
        now: float,
        since: int,
        serde: SerializerProtocol,
    ) -> Program[str]:
        """Write a state read from Postgres after a miss, with its pending writes (T3);
        ``since``: a time (ms) before that read."""
        step = stored.as_put_step(actor, lists, now)
        outcome = yield from self.store(step, user, since=since, whole=True)
        if outcome == "ok" and stored.writes:
            yield from self.store_writes(stored.as_writes_step(actor, now, serde), user)
        return outcome

    def load(self, target: Target, user: str, content: ContentCache) -> Program[Loaded]:
        """The entry's newest state of ``target``'s namespace and its lease, in one round
        trip; a miss (``state`` ``None``) includes an entry that lost some of its keys (an
        eviction)."""
        keys = self.keys(target.thread_id, user)
        whose = Target(target.thread_id, target.checkpoint_ns, None, Actor(target.actor.user_id, None))
        try:
            found, read_at, valid = yield from redis_programs.read_leased_state(
                self.space, whose, content, keys=keys
            )
        except (StorageError, CheckpointSerializationError):
            return Loaded(None, False, None)  # a list the entry lost part of (an eviction): a miss
        if found is not None and found[0].missing_channels():
            found = None
        return Loaded(found, valid, read_at)

    def renew(self, target: Target, user: str, version: str, since: int) -> Program[bool]:
        """Renew the lease of the entry's state of ``target``'s namespace from ``since`` (ms),
        if it still holds ``version``, which Postgres confirmed after that time."""
        keys = self.keys(target.thread_id, user)
        renewed = yield Script("cache_renew", keys, [target.checkpoint_ns, version, since, self.lease_ms])
        return bool(renewed)

    def forget(self, thread_id: str, user: str, *, removed: bool) -> Program[int]:
        """Remove the entry's state (SPEC T5); returns how many of its keys held some.

        Args:
            removed: The thread's durable state was removed (deleted, pruned, copied over):
                the entry refuses every write for :data:`REMOVED_HOLD_MS`. Otherwise (a
                conflict) it keeps its versions, so only the durable head or a newer state
                can fill it again.
        """
        mode = "hold" if removed else "keep"
        existed = yield Script("forget", self.keys(thread_id, user), [mode, REMOVED_HOLD_MS])
        return int(existed)
