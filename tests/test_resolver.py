"""SPEC SV2: the ownership resolver's rules, on real stores and a real Redis."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import redis

from tests.providers import CASES, REDIS_URL, redis_probe, require, track_redis_prefix
from tests.servers import RedisServer
from tests.test_metrics import put_chain
from threadkeep import StorageForbiddenError, operator_scope
from threadkeep.metrics import OWNER_CACHE_EVENTS, Metrics
from threadkeep.resolver import OwnershipResolver


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


# The resolver reads owners through the saver; sqlite and postgres stand for every store
# (test_owner_of_on_every_store reads an owner on each).
pytestmark = pytest.mark.providers("sqlite", "postgres")


@pytest.fixture
def saver(open_saver: Any) -> Any:
    return open_saver(metrics=Metrics())


@pytest.fixture
def prefix() -> str:
    require(CASES["redis"], redis_probe())
    return track_redis_prefix(f"tktestowner{uuid.uuid4().hex[:10]}")


def reads(resolver: OwnershipResolver) -> int:
    return resolver.stats.store_reads


def test_sv2_the_lru_answers_a_second_lookup_until_it_expires(saver: Any) -> None:
    put_chain(saver, "t", 1, user_id="alice")
    clock = Clock()
    resolver = OwnershipResolver(saver, lru_seconds=30, clock=clock)
    assert [resolver.owner_of("t") for _ in range(5)] == ["alice"] * 5
    assert reads(resolver) == 1
    assert resolver.stats.local_hits == 4
    clock.now += 31
    assert resolver.owner_of("t") == "alice"
    assert reads(resolver) == 2


def test_sv2_the_lru_holds_at_most_lru_size_threads(saver: Any) -> None:
    for thread in ("a", "b", "c"):
        put_chain(saver, thread, 1, user_id="alice")
    resolver = OwnershipResolver(saver, lru_size=2)
    for thread in ("a", "b", "c", "a"):
        resolver.owner_of(thread)
    assert reads(resolver) == 4  # "a" was dropped for "c"


def test_sv2_only_positive_answers_are_cached(saver: Any, prefix: str) -> None:
    resolver = OwnershipResolver(saver, redis_url=REDIS_URL, key_prefix=prefix)
    assert resolver.owner_of("later") is None
    assert resolver.owner_of("later") is None
    assert reads(resolver) == 2
    assert redis.Redis.from_url(REDIS_URL).get(f"{prefix}:later") is None
    put_chain(saver, "later", 1, user_id="bob")
    assert resolver.owner_of("later") == "bob"  # created meanwhile: found at once


def test_sv2_the_shared_cache_answers_another_process(saver: Any, prefix: str) -> None:
    put_chain(saver, "t", 1, user_id="alice")
    first = OwnershipResolver(saver, redis_url=REDIS_URL, key_prefix=prefix)
    second = OwnershipResolver(saver, redis_url=REDIS_URL, key_prefix=prefix)
    assert first.owner_of("t") == "alice"
    assert second.owner_of("t") == "alice"
    assert (reads(first), reads(second), second.stats.shared_hits) == (1, 0, 1)
    ttl = redis.Redis.from_url(REDIS_URL).ttl(f"{prefix}:t")
    assert 3500 < ttl <= 3600  # an hour
    assert saver.metrics.value(OWNER_CACHE_EVENTS, tier="shared", event="hit") == 1


def test_sv2_a_delete_evicts_both_tiers_and_leaves_a_tombstone(saver: Any, prefix: str) -> None:
    put_chain(saver, "t", 1, user_id="alice")
    here = OwnershipResolver(saver, redis_url=REDIS_URL, key_prefix=prefix, tombstone_seconds=5)
    there = OwnershipResolver(saver, redis_url=REDIS_URL, key_prefix=prefix)
    assert here.owner_of("t") == "alice"
    with operator_scope():
        saver.delete_thread("t")
    here.evict("t")
    client = redis.Redis.from_url(REDIS_URL)
    assert 0 < client.ttl(f"{prefix}:t") <= 5  # the tombstone, short
    assert here.owner_of("t") is None  # not the cached "alice"
    assert there.owner_of("t") is None  # another process: the tombstone, not the stale answer

    # A thread of that id created again: found, but not cached while the tombstone stands,
    # so no answer read before the delete can be cached after it.
    put_chain(saver, "t", 1, user_id="bob")
    assert there.owner_of("t") == "bob"
    assert client.get(f"{prefix}:t") == b"-"


def test_sv2_a_stale_answer_cannot_overwrite_a_tombstone(saver: Any, prefix: str) -> None:
    """A lookup that read the store before another process's delete writes its answer after
    it: the tombstone wins (SET NX)."""
    put_chain(saver, "t", 1, user_id="alice")
    slow = OwnershipResolver(saver, redis_url=REDIS_URL, key_prefix=prefix)
    other = OwnershipResolver(saver, redis_url=REDIS_URL, key_prefix=prefix)
    program = slow._lookup("t")
    assert program.send(None).command[0] == "GET"
    assert program.send(None).thread_id == "t"  # a shared miss; the store is asked
    other.evict("t")  # meanwhile another process deletes the thread
    setting = program.send("alice")  # the store's answer, read before the delete
    assert setting.command[:3] == ("SET", f"{prefix}:t", b"=alice")
    reply = slow._execute(setting)
    assert reply is None  # NX: not written
    assert redis.Redis.from_url(REDIS_URL).get(f"{prefix}:t") == b"-"


def test_sv2_an_eviction_in_process_blocks_a_lookup_in_flight(saver: Any) -> None:
    put_chain(saver, "t", 1, user_id="alice")
    resolver = OwnershipResolver(saver)
    program = resolver._lookup("t")
    assert program.send(None).thread_id == "t"
    resolver.evict("t")
    with pytest.raises(StopIteration):
        program.send("alice")
    assert resolver.owner_of("t") == "alice"
    assert reads(resolver) == 2  # the in-flight answer was not cached


@pytest.fixture
def own_redis() -> Iterator[RedisServer]:
    server = RedisServer().start()
    try:
        yield server
    finally:
        server.close()


def test_sv2_a_redis_failure_falls_back_to_the_store(saver: Any, own_redis: RedisServer) -> None:
    put_chain(saver, "t", 1, user_id="alice")
    put_chain(saver, "u", 1, user_id="bob")
    resolver = OwnershipResolver(saver, redis_url=own_redis.url, lru_seconds=0.001, redis_timeout=0.5)
    assert resolver.owner_of("t") == "alice"
    own_redis.stop()  # killed: every command fails
    assert resolver.owner_of("u") == "bob"
    assert resolver.owner_of("t") == "alice"
    resolver.evict("t")  # does not raise either
    assert resolver.stats.errors >= 3
    assert saver.metrics.value(OWNER_CACHE_EVENTS, tier="shared", event="error") == resolver.stats.errors


def test_sv2_async_lookups_follow_the_same_rules(saver: Any, prefix: str) -> None:
    put_chain(saver, "t", 1, user_id="alice")

    async def main() -> tuple[Any, ...]:
        resolver = OwnershipResolver(saver, redis_url=REDIS_URL, key_prefix=prefix)
        try:
            owners = [await resolver.aowner_of("t") for _ in range(3)]
            await resolver.aevict("t")
            missing = await resolver.aowner_of("nope")
            with pytest.raises(StorageForbiddenError):
                await resolver.acheck("t", "mallory")
            return owners, missing, resolver.stats.store_reads
        finally:
            await resolver.aclose()

    assert asyncio.run(main()) == (["alice"] * 3, None, 3)


def test_sv2_check_refuses_another_users_thread(saver: Any) -> None:
    put_chain(saver, "t", 1, user_id="alice")
    resolver = OwnershipResolver(saver)
    assert resolver.check("t", "alice") == "alice"
    assert resolver.check("missing", "alice") is None
    with pytest.raises(StorageForbiddenError) as refused:
        resolver.check("t", "mallory")
    assert refused.value.code == "STORAGE_FORBIDDEN_001"
    assert "mallory" in str(refused.value)


@pytest.mark.providers("memory", "sqlite", "postgres", "redis", "tiered")
def test_owner_of_on_every_store(saver: Any) -> None:
    put_chain(saver, "t", 1, user_id="alice")
    with operator_scope():
        assert saver.owner_of("t") == "alice"
        assert saver.owner_of("missing") is None
        assert asyncio.run(saver.aowner_of("t")) == "alice"
    with pytest.raises(StorageForbiddenError):
        saver.owner_of("t")  # outside operator scope, with isolation on


def test_sv2_stores_sharing_one_redis_keep_their_owners_apart(open_saver: Any) -> None:
    from tests.providers import track_redis_prefix
    from threadkeep.resolver import store_identity

    require(CASES["redis"], redis_probe())
    one, two = open_saver(), open_saver(fresh=True)
    assert store_identity(one) != store_identity(two)
    for saver, user in ((one, "alice"), (two, "bob")):
        track_redis_prefix(f"tkowner:{store_identity(saver)}")
        put_chain(saver, "t", 1, user_id=user)
    here = OwnershipResolver(one, redis_url=REDIS_URL)
    there = OwnershipResolver(two, redis_url=REDIS_URL)
    assert here.owner_of("t") == "alice"
    assert there.owner_of("t") == "bob"  # its own store's owner, not the other's cached one
    assert (there.stats.shared_hits, there.stats.store_reads) == (0, 1)
