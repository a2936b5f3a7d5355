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
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from langgraph.checkpoint.base import CheckpointTuple
from langgraph.checkpoint.serde.base import SerializerProtocol

from threadkeep.backends.redis import programs as redis_programs
from threadkeep.backends.redis.engine import Script
from threadkeep.backends.redis.keys import KeySpace
from threadkeep.core.identity import Actor
from threadkeep.core.messages import ContentCache, EncodingMemo
from threadkeep.core.program import Program
from threadkeep.core.records import PutStep, StoredCheckpoint, Target, WritesStep
from threadkeep.errors import CheckpointSerializationError, StorageError

__all__ = ["NO_VERSION", "REMOVED_HOLD_MS", "StateCache"]

NO_VERSION = "-1"
# How long the entry of a removed thread refuses writes: a write that read or stored the old
# state before the removal and reaches Redis after it must not bring the state back.
REMOVED_HOLD_MS = 60_000
_TRIES = 4


class StateCache:
    """The cache's programs over one Redis key space.

    Args:
        space: Where entries live (a prefix of their own, ``tkc`` by default).
        ttl_ms: How long an entry lives after its last write (``cache_ttl``); a read never
            extends it.
    """

    def __init__(self, space: KeySpace, ttl_ms: int) -> None:
        self.space = space
        self.ttl_ms = ttl_ms

    def keys(self, thread_id: str, user: str) -> tuple[str, ...]:
        """The nine keys of the entry of ``thread_id`` for ``user`` (one hash tag)."""
        return self.space.thread(f"{thread_id}\0{user}")

    def store(
        self, step: PutStep, user: str, *, whole: bool = False, version: str | None = None
    ) -> Program[str]:
        """Write the state a put stored durably (its version: its checkpoint id, unless
        ``version`` says otherwise). Returns ``"ok"``, or ``"skipped"`` when the entry
        already holds a newer state."""
        keys = self.keys(step.target.thread_id, user)
        known = [chain.reused for chain in step.chains]
        for _ in range(_TRIES):
            reply = yield Script("cache_put", keys, self._put_args(step, user, whole, known, version))
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
        self, step: PutStep, user: str, whole: bool, known: Sequence[int], version: str | None
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
            *redis_programs.step_rows(step, known),
        ]

    def store_writes(self, step: WritesStep, user: str) -> Program[None]:
        """Add a task's writes to the entry, if it holds their checkpoint (T6)."""
        keys = self.keys(step.target.thread_id, user)
        yield from redis_programs.put_writes(self.space, step, self.ttl_ms, keys=keys)

    def seed(
        self,
        stored: StoredCheckpoint,
        lists: Mapping[bytes, Sequence[tuple[str, bytes]]],
        actor: Actor,
        user: str,
        *,
        now: float,
        serde: SerializerProtocol,
    ) -> Program[str]:
        """Write a state read from Postgres after a miss, with its pending writes (T3)."""
        outcome = yield from self.store(stored.as_put_step(actor, lists, now), user, whole=True)
        if outcome == "ok" and stored.writes:
            yield from self.store_writes(stored.as_writes_step(actor, now, serde), user)
        return outcome

    def load(
        self,
        target: Target,
        user: str,
        serde: SerializerProtocol,
        content: ContentCache,
        memo: EncodingMemo | None = None,
    ) -> Program[CheckpointTuple | None]:
        """The entry's newest state of ``target``'s namespace, in one round trip; ``None`` on
        a miss, including an entry that lost some of its keys (an eviction)."""
        keys = self.keys(target.thread_id, user)
        whose = Target(target.thread_id, target.checkpoint_ns, None, Actor(target.actor.user_id, None))
        try:
            found = yield from redis_programs.read_state(self.space, whose, content, keys=keys)
        except (StorageError, CheckpointSerializationError):
            found = None  # a list the entry lost part of (an eviction): a miss
        if found is None:
            return None
        stored, lists = found
        if stored.missing_channels():
            return None
        return stored.to_tuple(serde, lists, content, memo)

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
