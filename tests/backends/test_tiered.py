"""The tiered provider (SPEC T1-T7, T9), each rule checked against the real Redis and Postgres
state after the operation."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
import redis
from langgraph.checkpoint.base import empty_checkpoint
from langgraph.graph import END, START, StateGraph
from typing_extensions import TypedDict

from tests.providers import REDIS_URL, postgres_schema, stored_checkpoint_ids, track_redis_prefix
from tests.servers import RedisServer
from threadkeep import Settings, StaleStateError, open_checkpointer
from threadkeep.backends.tiered.cache import NO_VERSION, REMOVED_HOLD_MS
from threadkeep.core.rules import required_head
from threadkeep.metrics import CACHE_EVENTS, Metrics
from threadkeep.workload import MESSAGES_PER_TURN, build_agent, turn_input

INTERRUPT = "__interrupt__"  # LangGraph's channel of an interrupt write

pytestmark = pytest.mark.providers("tiered")


def cfg(thread_id: str, **extra: Any) -> Any:
    return {"configurable": {"thread_id": thread_id, **extra}}


class Tiered:
    """A tiered saver on a fresh Postgres schema and a fresh cache prefix, with handles on
    both real stores."""

    def __init__(self, redis_url: str = REDIS_URL, **options: Any) -> None:
        self.dsn = postgres_schema(uuid.uuid4().hex)
        self.prefix = track_redis_prefix(f"tktestc{uuid.uuid4().hex[:10]}")
        self.redis_url = redis_url
        self.metrics = Metrics()
        options.setdefault("metrics", self.metrics)
        self.saver = open_checkpointer(
            "tiered",
            self.dsn,
            settings=Settings(cache_url=redis_url, retry_backoff_seconds=0.05),
            cache_prefix=self.prefix,
            **options,
        )
        self.redis = redis.Redis.from_url(redis_url)

    def entry(self, thread_id: str, user: str = "anonymous") -> dict[str, Any]:
        """Every key of the thread's cache entry that exists, with its contents."""
        out: dict[str, Any] = {}
        for key in self.saver.backend.cache.keys(thread_id, user):
            kind = self.redis.type(key)
            if kind == b"hash":
                out[key] = self.redis.hgetall(key)
            elif kind == b"zset":
                out[key] = self.redis.zrange(key, 0, -1)
        return out

    def cached_version(self, thread_id: str, user: str = "anonymous", ns: str = "") -> str | None:
        value = self.redis.hget(self.saver.backend.cache.keys(thread_id, user)[0], f"version\0{ns}")
        return None if value is None else value.decode()

    def durable_ids(self, thread_id: str) -> list[str]:
        return stored_checkpoint_ids(self.dsn, thread_id)

    def events(self, event: str) -> float:
        return self.metrics.value(CACHE_EVENTS, event=event)

    def close(self) -> None:
        self.saver.close()
        for key in self.redis.scan_iter(match=f"{self.prefix}:*"):
            self.redis.delete(key)
        self.redis.close()


@pytest.fixture
def tiered(provider: Any) -> Iterator[Tiered]:
    store = Tiered()
    yield store
    store.close()


def recorded_steps(saver: Any) -> list[Any]:
    """Every PutStep the saver's backend receives from now on."""
    steps: list[Any] = []
    original = saver.backend.put

    def put(step: Any) -> Any:
        steps.append(step)
        return original(step)

    saver.backend.put = put
    return steps


# --- T1, T2 ---------------------------------------------------------------------------------


def test_t2_the_durable_write_lands_before_the_cache_write_with_the_same_state(tiered: Tiered) -> None:
    seen_in_postgres: list[bool] = []
    cache = tiered.saver.backend.cache
    original = cache.store

    def store(step: Any, user: str, **kw: Any) -> Any:
        # At the moment the cache is written, Postgres already holds the checkpoint.
        seen_in_postgres.append(step.checkpoint_id in tiered.durable_ids(step.target.thread_id))
        return original(step, user, **kw)

    cache.store = store  # type: ignore[method-assign]
    build_agent(tiered.saver).invoke(turn_input(0), cfg("t2"))
    assert seen_in_postgres
    assert all(seen_in_postgres)
    durable = tiered.durable_ids("t2")
    assert tiered.cached_version("t2") == durable[-1]
    # the entry holds the newest state only, and it is the state Postgres holds
    assert len(tiered.entry("t2")[cache.keys("t2", "anonymous")[1]]) == 1
    with open_checkpointer("postgres", tiered.dsn, settings=Settings()) as postgres:
        expected = postgres.get_tuple(cfg("t2"))
    hit = tiered.saver.get_tuple(cfg("t2"))
    assert tiered.events("hit") >= 1
    assert hit.checkpoint == expected.checkpoint
    assert hit.metadata == expected.metadata


def test_t2_a_failed_postgres_write_leaves_the_cache_untouched(tiered: Tiered) -> None:
    graph = build_agent(tiered.saver)
    graph.invoke(turn_input(0), cfg("t2-fail"))
    before = tiered.entry("t2-fail")
    assert before
    # A real Postgres failure: from now on the tables refuse every new checkpoint and write.
    with psycopg.connect(tiered.dsn, autocommit=True) as conn:
        conn.execute(
            "CREATE FUNCTION tk_refuse() RETURNS trigger LANGUAGE plpgsql AS "
            "$$ BEGIN RAISE EXCEPTION 'disk full (test)'; END $$"
        )
        for table in ("tk_checkpoints", "tk_writes"):
            conn.execute(
                f"CREATE TRIGGER tk_refuse BEFORE INSERT ON {table} FOR EACH ROW EXECUTE FUNCTION tk_refuse()"
            )
    with pytest.raises(Exception, match="disk full"):
        graph.invoke(turn_input(1), cfg("t2-fail"))
    assert tiered.entry("t2-fail") == before


def test_t1_entries_are_keyed_by_thread_and_user(tiered: Tiered) -> None:
    build_agent(tiered.saver).invoke(turn_input(0), cfg("shared-name", user_id="alice"))
    build_agent(tiered.saver).invoke(turn_input(0), cfg("other", user_id="bob"))
    assert tiered.entry("shared-name", "alice")
    assert not tiered.entry("shared-name", "bob")
    assert tiered.saver.get_tuple(cfg("shared-name", user_id="bob")) is None
    ttl = tiered.redis.pttl(tiered.saver.backend.cache.keys("shared-name", "alice")[0])
    assert 0 < ttl <= 86_400_000


# --- T3 ---------------------------------------------------------------------------------------


def test_t3_a_miss_reads_postgres_and_seeds_the_cache(tiered: Tiered) -> None:
    build_agent(tiered.saver).invoke(turn_input(0), cfg("t3"))
    expected = tiered.saver.get_tuple(cfg("t3"))
    for key in tiered.saver.backend.cache.keys("t3", "anonymous"):
        tiered.redis.delete(key)
    misses = tiered.events("miss")
    with open_checkpointer(
        "tiered",
        tiered.dsn,
        settings=Settings(cache_url=REDIS_URL),
        cache_prefix=tiered.prefix,
        metrics=tiered.metrics,
    ) as fresh:
        loaded = fresh.get_tuple(cfg("t3"))
        assert tiered.events("miss") == misses + 1
        assert loaded.checkpoint == expected.checkpoint
        assert tiered.cached_version("t3") == expected.checkpoint["id"]
        again = fresh.get_tuple(cfg("t3"))
    assert again.checkpoint == expected.checkpoint
    assert again.pending_writes == expected.pending_writes


def test_t2_the_tiered_stores_writes_commit_as_the_session_says(tiered: Tiered) -> None:
    """A read that seeds the cache must never see a write Postgres could still lose:
    concurrent writes on the tiered store's Postgres engine each commit as the session's
    own ``synchronous_commit`` says."""
    import asyncio

    from threadkeep.core.program import Sql

    engine = tiered.saver.backend.durable.engine

    def setting() -> Any:
        return (yield Sql("SELECT current_setting('synchronous_commit')", {}))

    async def writes() -> list[Any]:
        calls = [engine.arun(setting, write=True, atomic=False) for _ in range(10)]
        return list(await asyncio.gather(*calls))

    assert asyncio.run(writes()) == [[("on",)]] * 10


def test_t3_history_reads_go_to_postgres(tiered: Tiered) -> None:
    build_agent(tiered.saver).invoke(turn_input(0), cfg("t3-history"))
    ids = tiered.durable_ids("t3-history")
    hits, misses = tiered.events("hit"), tiered.events("miss")
    old = tiered.saver.get_tuple(cfg("t3-history", checkpoint_id=ids[2]))
    assert old.checkpoint["id"] == ids[2]
    assert len(list(tiered.saver.list(cfg("t3-history")))) == len(ids)
    assert (tiered.events("hit"), tiered.events("miss")) == (hits, misses)


# --- T4 ---------------------------------------------------------------------------------------


def test_t4_the_cache_refuses_an_older_state_and_accepts_an_equal_one(tiered: Tiered) -> None:
    steps = recorded_steps(tiered.saver)
    build_agent(tiered.saver).invoke(turn_input(0), cfg("t4"))
    cache, engine = tiered.saver.backend.cache, tiered.saver.backend.engine.cache
    newest, older = steps[-1], steps[-3]
    assert tiered.cached_version("t4") == newest.checkpoint_id
    before = tiered.entry("t4")
    outcome = engine.run(
        lambda: cache.store(older.whole() if older.whole else older, "anonymous", whole=True)
    )
    assert outcome == "skipped"
    assert tiered.entry("t4") == before
    again = engine.run(lambda: cache.store(newest, "anonymous"))
    assert again == "ok"
    assert tiered.cached_version("t4") == newest.checkpoint_id


def test_t4_an_entry_redis_evicted_part_of_still_refuses_an_older_state(tiered: Tiered) -> None:
    """The entry loses one key to an eviction (its checkpoints' index): an older state is
    still refused (its versions stay), and a step, which cannot apply to what is left,
    fills it again whole."""
    steps = recorded_steps(tiered.saver)
    build_agent(tiered.saver).invoke(turn_input(0), cfg("t4-evicted"))
    cache, engine = tiered.saver.backend.cache, tiered.saver.backend.engine.cache
    newest, older = steps[-1], steps[-3]
    keys = cache.keys("t4-evicted", "anonymous")
    assert tiered.redis.delete(keys[2]) == 1  # KEYS[3]: the heads
    outcome = engine.run(
        lambda: cache.store(older.whole() if older.whole else older, "anonymous", whole=True)
    )
    assert outcome == "skipped"
    assert tiered.cached_version("t4-evicted") == newest.checkpoint_id
    # A step cannot apply to what is left: the entry is emptied and the state sent whole.
    assert engine.run(lambda: cache.store(newest, "anonymous")) == "ok"
    assert tiered.cached_version("t4-evicted") == newest.checkpoint_id
    assert tiered.redis.exists(keys[2]) == 1
    state = tiered.saver.get_tuple(cfg("t4-evicted"))
    assert len(state.checkpoint["channel_values"]["messages"]) == MESSAGES_PER_TURN


def test_t4_a_state_with_no_durable_version_never_overwrites_one(tiered: Tiered) -> None:
    steps = recorded_steps(tiered.saver)
    build_agent(tiered.saver).invoke(turn_input(0), cfg("t4-sentinel"))
    cache, engine = tiered.saver.backend.cache, tiered.saver.backend.engine.cache
    step = steps[-1]
    whole = step.whole() if step.whole else step
    # An entry written with -1 takes any durable version afterwards...
    for key in cache.keys("t4-sentinel", "anonymous"):
        tiered.redis.delete(key)
    assert engine.run(lambda: cache.store(whole, "anonymous", whole=True, version=NO_VERSION)) == "ok"
    assert tiered.cached_version("t4-sentinel") == NO_VERSION
    assert engine.run(lambda: cache.store(whole, "anonymous", whole=True)) == "ok"
    assert tiered.cached_version("t4-sentinel") == step.checkpoint_id
    # ... and -1 never overwrites a durable version.
    outcome = engine.run(lambda: cache.store(whole, "anonymous", whole=True, version=NO_VERSION))
    assert outcome == "skipped"
    assert tiered.cached_version("t4-sentinel") == step.checkpoint_id


# --- T5 ---------------------------------------------------------------------------------------


def test_t5_a_conflict_clears_the_entry_and_the_thread_recovers(tiered: Tiered) -> None:
    graph = build_agent(tiered.saver)
    graph.invoke(turn_input(0), cfg("t5"))
    stale = tiered.saver.get_tuple(cfg("t5"))
    graph.invoke(turn_input(1), cfg("t5"))  # the thread moves on
    assert tiered.entry("t5")
    checkpoint = {**stale.checkpoint, "id": str(uuid.uuid1())}
    head = tiered.durable_ids("t5")[-1]
    with pytest.raises(StaleStateError):
        tiered.saver.put(stale.config, checkpoint, {"source": "loop", "step": 99}, {})
    # the state is gone from the entry; only its version stays, for the compare-and-set
    thread_key = tiered.saver.backend.cache.keys("t5", "anonymous")[0]
    assert tiered.entry("t5") == {thread_key: {b"version\0": head.encode()}}
    assert tiered.events("cleared") >= 1
    graph.invoke(turn_input(2), cfg("t5"))  # the next run reads Postgres and goes on
    assert tiered.cached_version("t5") == tiered.durable_ids("t5")[-1]


def test_t5_a_write_that_arrives_after_the_conflict_cannot_bring_an_older_state_back(
    tiered: Tiered,
) -> None:
    steps = recorded_steps(tiered.saver)
    graph = build_agent(tiered.saver)
    graph.invoke(turn_input(0), cfg("t5-late"))
    stale = tiered.saver.get_tuple(cfg("t5-late"))
    graph.invoke(turn_input(1), cfg("t5-late"))
    late = steps[-3]  # an older state of the thread, whose cache write was held up
    with pytest.raises(StaleStateError):
        tiered.saver.put(stale.config, {**stale.checkpoint, "id": str(uuid.uuid1())}, {}, {})
    cache, engine = tiered.saver.backend.cache, tiered.saver.backend.engine.cache
    outcome = engine.run(lambda: cache.store(late.whole() if late.whole else late, "anonymous", whole=True))
    assert outcome == "skipped"
    with open_checkpointer("postgres", tiered.dsn, settings=Settings()) as postgres:
        expected = postgres.get_tuple(cfg("t5-late"))
    assert tiered.saver.get_tuple(cfg("t5-late")).checkpoint == expected.checkpoint
    assert tiered.cached_version("t5-late") == expected.checkpoint["id"]  # seeded from Postgres


def test_t5_a_write_that_arrives_after_a_delete_cannot_bring_the_thread_back(tiered: Tiered) -> None:
    steps = recorded_steps(tiered.saver)
    build_agent(tiered.saver).invoke(turn_input(0), cfg("t5-gone"))
    late = steps[-1]  # the newest state: its cache write (or a seed of it) was held up
    tiered.saver.delete_thread("t5-gone")
    cache, engine = tiered.saver.backend.cache, tiered.saver.backend.engine.cache
    outcome = engine.run(lambda: cache.store(late.whole() if late.whole else late, "anonymous", whole=True))
    assert outcome == "skipped"
    assert tiered.saver.get_tuple(cfg("t5-gone")) is None
    assert tiered.saver.get_tuple(cfg("t5-gone")) is None  # the miss seeded nothing either
    assert tiered.cached_version("t5-gone") is None
    # the held entry lives a short while, not the cache's TTL, and a new run works meanwhile
    thread_key = cache.keys("t5-gone", "anonymous")[0]
    assert 0 < tiered.redis.pttl(thread_key) <= REMOVED_HOLD_MS
    build_agent(tiered.saver).invoke(turn_input(0), cfg("t5-gone"))
    assert len(tiered.saver.get_tuple(cfg("t5-gone")).checkpoint["channel_values"]["messages"]) == 8


# --- T6 ---------------------------------------------------------------------------------------


def test_t6_pending_writes_match_postgres(tiered: Tiered) -> None:
    class State(TypedDict):
        value: str

    def ask(state: State) -> State:
        from langgraph.types import interrupt

        return {"value": interrupt("ok?")}

    builder = StateGraph(State)
    builder.add_node("ask", ask)
    builder.add_edge(START, "ask")
    builder.add_edge("ask", END)
    graph = builder.compile(checkpointer=tiered.saver)
    graph.invoke({"value": ""}, cfg("t6"))
    cached = tiered.saver.get_tuple(cfg("t6"))
    with open_checkpointer("postgres", tiered.dsn, settings=Settings()) as postgres:
        durable = postgres.get_tuple(cfg("t6"))
    assert durable.pending_writes
    assert cached.pending_writes == durable.pending_writes
    writes_key = tiered.saver.backend.cache.keys("t6", "anonymous")[5]
    assert tiered.redis.hlen(writes_key) == len(durable.pending_writes)


def test_t6_the_same_state_seeded_again_keeps_its_pending_writes(tiered: Tiered) -> None:
    """A second reader's seed of the state the entry holds (an equal version) arrives after
    the writes were added: the entry keeps them."""
    steps = recorded_steps(tiered.saver)
    graph = build_agent(tiered.saver)
    graph.invoke(turn_input(0), cfg("t6-seed"))
    last = steps[-1]
    tiered.saver.put_writes(
        {"configurable": {"thread_id": "t6-seed", "checkpoint_ns": "", "checkpoint_id": last.checkpoint_id}},
        [("messages", "pending")],
        "task-1",
    )
    cache, engine = tiered.saver.backend.cache, tiered.saver.backend.engine.cache
    assert (
        engine.run(lambda: cache.store(last.whole() if last.whole else last, "anonymous", whole=True)) == "ok"
    )
    hit = tiered.saver.get_tuple(cfg("t6-seed"))
    assert tiered.events("hit") >= 1
    assert hit.pending_writes == [("task-1", "messages", "pending")]


# --- T7 ---------------------------------------------------------------------------------------


def _commandstats(client: redis.Redis) -> dict[str, int]:
    stats = client.info("commandstats")
    return {name: int(value["calls"]) for name, value in stats.items()}


def test_t7_a_load_after_a_hit_is_one_redis_round_trip_and_no_postgres(provider: Any) -> None:
    # A Redis of its own, whose script count is this test's alone; a lease no load outlasts.
    server = RedisServer().start()
    tiered = Tiered(server.url, cache_lease=3600)
    try:
        build_agent(tiered.saver).invoke(turn_input(0), cfg("t7"))
        tiered.saver.get_tuple(cfg("t7"))  # scripts loaded, a hit
        postgres_calls: list[Any] = []
        durable = tiered.saver.backend.engine.durable
        original = durable.run
        durable.run = lambda make, **kw: postgres_calls.append(make) or original(make, **kw)  # type: ignore[method-assign]
        sent: list[Any] = []
        cache = tiered.saver.backend.engine.cache
        execute = cache._execute
        cache._execute = lambda client, request: sent.append(request) or execute(client, request)  # type: ignore[method-assign]
        before = _commandstats(tiered.redis)
        loaded = tiered.saver.get_tuple(cfg("t7"))
        after = _commandstats(tiered.redis)
        # One request from the client, and the server ran one script for it.
        assert [type(request).__name__ for request in sent] == ["Script"]
        assert after["cmdstat_evalsha"] - before["cmdstat_evalsha"] == 1
        assert postgres_calls == []
        assert len(loaded.checkpoint["channel_values"]["messages"]) == 8
    finally:
        tiered.close()
        server.close()


def test_t7_a_load_past_its_lease_is_confirmed_by_one_postgres_lookup_and_renewed(provider: Any) -> None:
    tiered = Tiered(cache_lease=0.001)
    try:
        build_agent(tiered.saver).invoke(turn_input(0), cfg("t7-lease"))
        postgres_calls: list[Any] = []
        durable = tiered.saver.backend.engine.durable
        original = durable.run
        durable.run = lambda make, **kw: postgres_calls.append(make) or original(make, **kw)  # type: ignore[method-assign]
        sent: list[str] = []
        cache = tiered.saver.backend.engine.cache
        execute = cache._execute
        cache._execute = lambda client, request: sent.append(request.name) or execute(client, request)  # type: ignore[method-assign]
        time.sleep(0.01)  # past the lease of the last write
        loaded = tiered.saver.get_tuple(cfg("t7-lease"))
        # The entry, one lookup of Postgres's newest version (not a state read), the renewal.
        assert sent == ["load", "cache_renew"]
        assert len(postgres_calls) == 1
        assert tiered.events("confirmed") == 1
        assert tiered.events("stale") == 0
        assert loaded.checkpoint["id"] == tiered.durable_ids("t7-lease")[-1]
        assert len(loaded.checkpoint["channel_values"]["messages"]) == MESSAGES_PER_TURN
    finally:
        tiered.close()


def test_t4_a_special_write_replaced_behind_the_cache_is_not_served_past_the_lease(provider: Any) -> None:
    """A special write (an interrupt, a resume, an error) keeps its key when it is written
    again: the lease's check compares the writes themselves, not their number."""
    tiered = Tiered(cache_lease=0.05)
    plain = open_checkpointer("postgres", tiered.dsn)  # a writer whose cache write was lost
    try:
        config = cfg("t4-replaced")
        saved = tiered.saver.put(config, empty_checkpoint(), {"source": "loop", "step": 0}, {})
        tiered.saver.put_writes(saved, [(INTERRUPT, "first")], "task-1")
        assert tiered.saver.get_tuple(config).pending_writes == [("task-1", INTERRUPT, "first")]
        plain.put_writes(saved, [(INTERRUPT, "second")], "task-1")  # committed; the cache not told
        time.sleep(0.1)  # past the lease
        assert tiered.saver.get_tuple(config).pending_writes == [("task-1", INTERRUPT, "second")]
        assert tiered.events("stale") == 1
    finally:
        plain.close()
        tiered.close()


def test_t4_a_state_with_pending_writes_past_its_lease_is_confirmed_not_reloaded(provider: Any) -> None:
    """The cache's writes and Postgres's digest alike: a lease past its end is renewed."""
    tiered = Tiered(cache_lease=0.05)
    try:
        config = cfg("t4-pending")
        saved = tiered.saver.put(config, empty_checkpoint(), {"source": "loop", "step": 0}, {})
        tiered.saver.put_writes(saved, [(INTERRUPT, "ask"), ("log", {"n": 1})], "task-1")
        tiered.saver.put_writes(saved, [("log", b"\x00bytes")], "task-2")
        time.sleep(0.1)
        found = tiered.saver.get_tuple(config)
        assert sorted(found.pending_writes, key=repr) == sorted(
            [("task-1", INTERRUPT, "ask"), ("task-1", "log", {"n": 1}), ("task-2", "log", b"\x00bytes")],
            key=repr,
        )
        assert (tiered.events("confirmed"), tiered.events("stale")) == (1, 0)
    finally:
        tiered.close()


def test_t7_a_steps_cache_write_does_not_resend_the_history(tiered: Tiered) -> None:
    sizes: list[int] = []
    engine = tiered.saver.backend.engine.cache
    original = engine._execute

    def execute(client: Any, request: Any) -> Any:
        if getattr(request, "name", "") == "cache_put":
            sizes.append(sum(len(a) if isinstance(a, (bytes, str)) else 8 for a in request.args))
        return original(client, request)

    engine._execute = execute  # type: ignore[method-assign]
    graph = build_agent(tiered.saver)
    graph.invoke(turn_input(0), cfg("t7-size"))
    first_turn = sorted(sizes)
    sizes.clear()
    for turn in range(1, 8):
        graph.invoke(turn_input(turn), cfg("t7-size"))
    eighth_turn = sorted(sizes[-len(first_turn) :])
    # After 8 turns the history is 8 times longer; a step's write is not.
    assert max(eighth_turn) < 2 * max(first_turn)
    assert sum(eighth_turn) < 2 * sum(first_turn)


# --- a write never branches from a stale head (docs/tiered.md) --------------------------------


def test_w2_a_put_on_a_state_the_cache_served_needs_it_to_still_be_the_head() -> None:
    def required(parent: str, source: str, named: str | None, served: str | None) -> str | None:
        return required_head(
            checkpoint_ns="", parent_id=parent, source=source, named=named, served_head=served
        )

    for source in ("loop", "update", "fork"):
        assert required("b", source, None, "b") == "b"
    # Read from Postgres, an update branches from any checkpoint, as on every provider ...
    assert required("b", "update", None, None) is None
    # ... and so does time travel to a checkpoint the run's caller named.
    assert required("b", "update", "b", "b") is None
    # What the cache served speaks only of that state.
    assert required("c", "update", None, "b") is None


def test_w2_time_travel_from_a_config_the_cache_served_still_branches(tiered: Tiered) -> None:
    graph = build_agent(tiered.saver)
    graph.invoke(turn_input(0), cfg("travel"))
    earlier = graph.get_state(cfg("travel")).config  # served by the cache
    assert not [key for key in earlier["configurable"] if "threadkeep" in key]  # nothing of ours
    graph.invoke(turn_input(1), cfg("travel"))
    forked = graph.update_state(earlier, {"messages": []}, as_node="agent")
    fork = tiered.saver.get_tuple(forked)
    assert fork.parent_config["configurable"]["checkpoint_id"] == earlier["configurable"]["checkpoint_id"]


# --- history and metrics ------------------------------------------------------------------------


def test_s3_tiered_keeps_twenty_checkpoints_by_default(provider: Any) -> None:
    store = Tiered(state_history_limit=None)
    try:
        assert store.saver.state_history_limit == 20
        graph = build_agent(store.saver)
        for turn in range(3):
            graph.invoke(turn_input(turn), cfg("s3"))
        assert len(store.durable_ids("s3")) == 20
        assert len(store.saver.get_tuple(cfg("s3")).checkpoint["channel_values"]["messages"]) == 24
    finally:
        store.close()


def test_the_metrics_hook_hears_every_cache_event(provider: Any) -> None:
    heard: list[tuple[str, dict[str, str]]] = []
    store = Tiered(metrics=Metrics(hook=lambda name, labels: heard.append((name, dict(labels)))))
    try:
        build_agent(store.saver).invoke(turn_input(0), cfg("m"))
        store.saver.get_tuple(cfg("m"))
        for key in store.saver.backend.cache.keys("m", "anonymous"):
            store.redis.delete(key)
        store.saver.get_tuple(cfg("m"))
        events = [labels["event"] for name, labels in heard if name == CACHE_EVENTS]
        assert "hit" in events
        assert "miss" in events
        text = store.saver.backend.metrics.render()
        assert 'threadkeep_cache_events_total{event="hit"}' in text
    finally:
        store.close()


# --- T9 ---------------------------------------------------------------------------------------


class Steps(TypedDict):
    seen: list[tuple[int, str | None]]


@pytest.mark.parametrize("durability", ["sync", "async", "exit"])
def test_t9_durability_modes(tiered: Tiered, durability: str) -> None:
    """What each node sees already stored in Postgres and Redis, and what is stored at the end."""
    thread = f"t9-{durability}"
    lock = threading.Lock()

    def observe(state: Steps) -> Steps:
        with lock:
            return {
                "seen": [*state["seen"], (len(tiered.durable_ids(thread)), tiered.cached_version(thread))]
            }

    builder = StateGraph(Steps)
    builder.add_node("one", observe)
    builder.add_node("two", observe)
    builder.add_node("three", observe)
    builder.add_edge(START, "one")
    builder.add_edge("one", "two")
    builder.add_edge("two", "three")
    builder.add_edge("three", END)
    graph = builder.compile(checkpointer=tiered.saver)
    result = graph.invoke({"seen": []}, cfg(thread), durability=durability)
    stored = tiered.durable_ids(thread)
    if durability == "exit":
        # nothing reaches either tier during the run; both, once, at its end
        assert [count for count, _ in result["seen"]] == [0, 0, 0]
        assert all(version is None for _, version in result["seen"])
        assert len(stored) == 1
    else:
        # every step reaches both tiers (sync: before the next node runs)
        assert len(stored) == 5  # input, one, two, three, and the step before "one"
        if durability == "sync":
            assert [count for count, _ in result["seen"]] == [2, 3, 4]
            assert [version for _, version in result["seen"]] == stored[1:4]
    assert tiered.cached_version(thread) == stored[-1]
