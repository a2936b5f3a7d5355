"""The tool-call ledger (SPEC TM5) on every provider, through the sync and the async API:
what a call records, how it ends, and that the ledger is part of its thread (copied, deleted,
swept, kept by a prune, isolated by owner). Racing begins, in threads and in two processes,
record each call exactly once."""

from __future__ import annotations

import asyncio
import contextvars
import multiprocessing
import threading
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from tests.providers import REDIS_URL, Opener, postgres_schema, track_redis_prefix
from tests.retention.test_retention import ALL, Clock, write
from threadkeep import (
    CheckpointSerializationError,
    InvalidInputError,
    Settings,
    StorageError,
    StorageForbiddenError,
    ThreadkeepSaver,
    ToolCall,
    open_checkpointer,
    operator_scope,
    sweep_checkpoints,
    user_scope,
)
from threadkeep.core.ledger import call_key

pytestmark = pytest.mark.providers(*ALL)

RESULT = {"charge": "ch_1", "amount": 12.5, "lines": ("a", "b"), "at": datetime(2026, 1, 2, 3, 4, tzinfo=UTC)}


def cfg(thread_id: str, user: str | None = None) -> Any:
    configurable: dict[str, Any] = {"thread_id": thread_id}
    if user is not None:
        configurable["user_id"] = user
    return {"configurable": configurable}


@dataclass
class Ledger:
    """A saver's ledger calls through its sync or its async API (on one event loop)."""

    saver: ThreadkeepSaver
    api: str
    runner: asyncio.Runner | None = field(default=None, repr=False)

    def call(self, name: str, *args: Any, **kwargs: Any) -> Any:
        if self.api == "sync":
            return getattr(self.saver, name)(*args, **kwargs)
        if self.runner is None:
            self.runner = asyncio.Runner()
        # In the caller's context: a user_scope or operator_scope it is in holds for the call.
        return self.runner.run(
            getattr(self.saver, "a" + name)(*args, **kwargs), context=contextvars.copy_context()
        )

    def begin(self, config: Any, message_id: str, call_id: str, tool: str = "charge") -> ToolCall:
        entry: ToolCall = self.call("begin_tool_call", config, message_id, call_id, tool)
        return entry

    def end(self, config: Any, message_id: str, call_id: str, **outcome: Any) -> None:
        self.call("end_tool_call", config, message_id, call_id, **outcome)

    def calls(self, config: Any) -> list[ToolCall]:
        found: list[ToolCall] = self.call("tool_calls", config)
        return found

    def close(self) -> None:
        if self.runner is not None:
            self.runner.close()


@pytest.fixture
def ledger(saver: ThreadkeepSaver, api: str) -> Iterator[Ledger]:
    opened = Ledger(saver, api)
    yield opened
    opened.close()


def test_tm5_a_call_is_recorded_once_and_a_second_begin_gets_the_entry(ledger: Ledger) -> None:
    first = ledger.begin(cfg("t"), "m1", "c1", "charge")
    assert (first.status, first.fresh, first.tool, first.result, first.error) == (
        "started",
        True,
        "charge",
        None,
        None,
    )
    assert (first.thread_id, first.message_id, first.call_id, first.finished_at) == ("t", "m1", "c1", None)
    assert first.key == call_key("t", "m1", "c1")
    assert first.key.startswith("tk-")
    assert len(first.key) == 35
    again = ledger.begin(cfg("t"), "m1", "c1", "charge")
    assert again.fresh is False
    assert again == ToolCall(**{**_fields(first), "fresh": False})
    # Another call of the same message, and the same call id under another message, are others.
    assert ledger.begin(cfg("t"), "m1", "c2").fresh
    assert ledger.begin(cfg("t"), "m2", "c1").fresh
    assert len({entry.key for entry in ledger.calls(cfg("t"))}) == 3


def test_tm5_a_succeeded_call_returns_its_recorded_result(ledger: Ledger) -> None:
    ledger.begin(cfg("t"), "m1", "c1")
    ledger.end(cfg("t"), "m1", "c1", result=RESULT)
    replayed = ledger.begin(cfg("t"), "m1", "c1")
    assert (replayed.status, replayed.fresh, replayed.error) == ("succeeded", False, None)
    assert replayed.result == RESULT
    assert type(replayed.result["lines"]) is tuple  # the faithful codec: a tuple stays one
    assert replayed.finished_at is not None
    assert replayed.finished_at >= replayed.started_at
    # A result of None is a result.
    ledger.begin(cfg("t"), "m1", "none")
    ledger.end(cfg("t"), "m1", "none", result=None)
    assert ledger.begin(cfg("t"), "m1", "none").status == "succeeded"


def test_tm5_a_failed_call_records_its_error(ledger: Ledger) -> None:
    ledger.begin(cfg("t"), "m1", "c1")
    ledger.end(cfg("t"), "m1", "c1", error="card declined")
    failed = ledger.begin(cfg("t"), "m1", "c1")
    assert (failed.status, failed.error, failed.result, failed.fresh) == (
        "failed",
        "card declined",
        None,
        False,
    )


def test_tm5_an_end_is_refused_unless_the_call_is_started_or_ends_the_same_way(ledger: Ledger) -> None:
    with pytest.raises(InvalidInputError, match="never begun"):
        ledger.end(cfg("t"), "m1", "c1", result=1)
    ledger.begin(cfg("t"), "m1", "c1")
    with pytest.raises(InvalidInputError, match="not both and not neither"):
        ledger.end(cfg("t"), "m1", "c1")
    with pytest.raises(InvalidInputError, match="not both and not neither"):
        ledger.end(cfg("t"), "m1", "c1", result=1, error="no")
    ledger.end(cfg("t"), "m1", "c1", result=RESULT)
    ledger.end(cfg("t"), "m1", "c1", result=RESULT)  # the same end again changes nothing
    with pytest.raises(InvalidInputError, match="succeeded already") as refused:
        ledger.end(cfg("t"), "m1", "c1", error="timeout")
    assert refused.value.context["call_id"] == "c1"
    with pytest.raises(InvalidInputError, match="succeeded already"):
        ledger.end(cfg("t"), "m1", "c1", result={"other": 1})
    (entry,) = ledger.calls(cfg("t"))
    assert (entry.status, entry.result) == ("succeeded", RESULT)  # the first outcome stays


def test_tm5_the_ledger_lists_a_threads_calls_oldest_first(ledger: Ledger) -> None:
    assert ledger.calls(cfg("t")) == []
    for message_id, call_id in (("m1", "b"), ("m1", "a"), ("m2", "c")):
        ledger.begin(cfg("t"), message_id, call_id, f"tool-{call_id}")
    ledger.end(cfg("t"), "m1", "a", error="boom")
    ledger.begin(cfg("other"), "m1", "x")
    found = ledger.calls(cfg("t"))
    assert [(e.message_id, e.call_id, e.tool, e.status) for e in found] == [
        ("m1", "b", "tool-b", "started"),
        ("m1", "a", "tool-a", "failed"),
        ("m2", "c", "tool-c", "started"),
    ]
    assert all(not entry.fresh and entry.thread_id == "t" for entry in found)


def test_tm5_ids_are_checked_before_any_io(ledger: Ledger) -> None:
    for args, named in ((("m\0", "c"), "message_id"), (("m", "c" * 513), "call_id"), (("m", 7), "call_id")):
        with pytest.raises(InvalidInputError) as refused:
            ledger.begin(cfg("t"), *args)
        assert refused.value.context["field"] == named
    assert ledger.calls(cfg("t")) == []


def test_tm5_copy_thread_copies_the_ledger(ledger: Ledger) -> None:
    write(ledger.saver, "source")
    ledger.begin(cfg("source"), "m1", "c1")
    ledger.end(cfg("source"), "m1", "c1", result=RESULT)
    ledger.begin(cfg("source"), "m1", "c2")
    ledger.call("copy_thread", "source", "copy")
    source, copied = ledger.calls(cfg("source")), ledger.calls(cfg("copy"))
    assert [ToolCall(**{**_fields(e), "thread_id": "copy"}) for e in source] == copied
    replayed = ledger.begin(cfg("copy"), "m1", "c1")
    assert (replayed.fresh, replayed.result, replayed.key) == (False, RESULT, call_key("source", "m1", "c1"))
    # The copy is a thread of its own from then on.
    ledger.end(cfg("copy"), "m1", "c2", error="copy only")
    assert ledger.begin(cfg("source"), "m1", "c2").status == "started"


def test_tm5_delete_thread_deletes_the_ledger(ledger: Ledger) -> None:
    write(ledger.saver, "t")
    ledger.begin(cfg("t"), "m1", "c1")
    ledger.begin(cfg("kept"), "m1", "c1")
    ledger.call("delete_thread", "t")
    assert ledger.calls(cfg("t")) == []
    assert ledger.begin(cfg("t"), "m1", "c1").fresh  # a new thread of the same id starts afresh
    assert [e.thread_id for e in ledger.calls(cfg("kept"))] == ["kept"]


def test_tm5_a_thread_known_only_by_its_ledger_is_deleted_whole(ledger: Ledger) -> None:
    ledger.begin(cfg("t"), "m1", "c1")  # before the thread's first checkpoint
    ledger.call("delete_thread", "t")
    assert ledger.calls(cfg("t")) == []


def test_tm5_prune_keeps_the_ledger(ledger: Ledger) -> None:
    write(ledger.saver, "t")
    write(ledger.saver, "t")
    ledger.begin(cfg("t"), "m1", "c1")
    ledger.end(cfg("t"), "m1", "c1", result=RESULT)
    ledger.call("prune", ["t"], strategy="keep_latest")
    assert [(e.call_id, e.result) for e in ledger.calls(cfg("t"))] == [("c1", RESULT)]


def test_sw5_the_sweep_deletes_a_threads_ledger(open_saver: Opener) -> None:
    clock = Clock()
    saver = open_saver(
        clock=clock, settings=Settings(retention_waiting_minutes=600, retention_finished_minutes=60)
    )
    for thread in ("done", "running"):
        write(saver, thread)
        saver.begin_tool_call(cfg(thread), "m1", "c1", "charge")
    saver.mark_finished(["done"])
    clock.advance(61)
    assert sweep_checkpoints(saver).finished_swept == 1
    assert saver.tool_calls(cfg("done")) == []
    assert [e.call_id for e in saver.tool_calls(cfg("running"))] == ["c1"]


def test_w3_the_ledger_is_isolated_by_owner(ledger: Ledger) -> None:
    alice, bob = cfg("t", "alice"), cfg("t", "bob")
    ledger.begin(alice, "m1", "c1")
    assert ledger.calls(bob) == []
    with pytest.raises(StorageForbiddenError):
        ledger.begin(bob, "m1", "c1")
    with pytest.raises(StorageForbiddenError):
        ledger.begin(bob, "m1", "c2")
    with pytest.raises(StorageForbiddenError):
        ledger.end(bob, "m1", "c1", result="bob's")
    with user_scope("bob"):
        assert ledger.calls(cfg("t")) == []
    with operator_scope():
        assert [e.call_id for e in ledger.calls(cfg("t"))] == ["c1"]
    with user_scope("alice"):
        ledger.end(cfg("t"), "m1", "c1", result="alice's")
    assert [(e.call_id, e.result) for e in ledger.calls(alice)] == [("c1", "alice's")]
    # A call naming no user acts for the anonymous owner, who is another user.
    assert ledger.calls(cfg("t")) == []
    ledger.begin(cfg("anon"), "m1", "c1")
    assert ledger.calls(cfg("anon", "alice")) == []
    assert [e.call_id for e in ledger.calls(cfg("anon"))] == ["c1"]


@pytest.mark.providers("tiered")
def test_t1_the_tiered_ledger_is_durable_and_holds_with_the_cache_lost(open_saver: Opener) -> None:
    import redis

    saver = open_saver()
    write(saver, "t")
    saver.begin_tool_call(cfg("t"), "m1", "c1", "charge")
    saver.end_tool_call(cfg("t"), "m1", "c1", result=RESULT)
    prefix = saver.backend.cache.space.prefix  # type: ignore[attr-defined]
    client = redis.Redis.from_url(REDIS_URL)
    lost = list(client.scan_iter(match=f"{prefix}:*", count=1000))
    assert lost  # the thread's state was cached
    client.delete(*lost)
    again = open_saver()
    replayed = again.begin_tool_call(cfg("t"), "m1", "c1", "charge")
    assert (replayed.status, replayed.result, replayed.fresh) == ("succeeded", RESULT, False)


def test_tm5_racing_begins_in_threads_record_a_call_once(saver: ThreadkeepSaver) -> None:
    write(saver, "t")
    for round_ in range(5):
        barrier = threading.Barrier(6)
        fresh: list[bool] = []

        def begin(
            round_: int = round_, barrier: threading.Barrier = barrier, fresh: list[bool] = fresh
        ) -> None:
            barrier.wait()
            fresh.append(saver.begin_tool_call(cfg("t"), "m1", f"c{round_}", "charge").fresh)

        workers = [threading.Thread(target=begin) for _ in range(6)]
        for worker in workers:
            worker.start()
        for worker in workers:
            worker.join()
        assert sorted(fresh) == [False] * 5 + [True]


# --- two processes ------------------------------------------------------------------------------

ROUNDS = 20


def _store(provider: str, tmp_path: Path) -> dict[str, Any]:
    """How two processes open one store of ``provider`` (a fresh one)."""
    unique = uuid.uuid4().hex
    if provider == "sqlite":
        return {"provider": "sqlite", "conn": str(tmp_path / "race.sqlite"), "options": {}}
    if provider == "postgres":
        return {"provider": "postgres", "conn": postgres_schema(unique), "options": {}}
    if provider == "redis":
        return {
            "provider": "redis",
            "conn": REDIS_URL,
            "options": {"key_prefix": track_redis_prefix(f"tkl{unique[:12]}")},
        }
    return {
        "provider": "tiered",
        "conn": postgres_schema(unique),
        "cache_url": REDIS_URL,
        "options": {"cache_prefix": track_redis_prefix(f"tklc{unique[:12]}")},
    }


def _open(store: dict[str, Any]) -> ThreadkeepSaver:
    settings = Settings()
    if "cache_url" in store:
        settings = settings.with_values(cache_url=store["cache_url"])
    return open_checkpointer(store["provider"], store["conn"], settings=settings, **store["options"])


def _racer(store: dict[str, Any], api: str, barrier: Any, results: Any) -> None:
    """One process: begin the same ROUNDS calls as the other, each at the barrier."""
    saver = _open(store)
    try:
        runner = asyncio.Runner() if api == "async" else None
        for round_ in range(ROUNDS):
            barrier.wait()
            args = (cfg("race", "alice"), "m1", f"c{round_}", "charge")
            if runner is None:
                entry = saver.begin_tool_call(*args)
            else:
                entry = runner.run(saver.abegin_tool_call(*args))
            results.put((round_, entry.fresh, entry.key, entry.started_at))
        if runner is not None:
            runner.close()
    finally:
        saver.close()


@pytest.mark.providers("sqlite", "postgres", "redis", "tiered")
def test_tm5_two_processes_racing_on_a_call_record_it_once(provider: Any, api: str, tmp_path: Path) -> None:
    store = _store(provider.name, tmp_path)
    with _open(store) as saver:  # the schema, before the race
        saver.begin_tool_call(cfg("race", "alice"), "m0", "warm", "charge")
    context = multiprocessing.get_context("spawn")
    barrier, results = context.Barrier(2), context.Queue()
    racers = [context.Process(target=_racer, args=(store, api, barrier, results)) for _ in range(2)]
    for racer in racers:
        racer.start()
    found = [results.get(timeout=120) for _ in range(2 * ROUNDS)]
    for racer in racers:
        racer.join(timeout=60)
        assert racer.exitcode == 0
    for round_ in range(ROUNDS):
        entries = [entry for entry in found if entry[0] == round_]
        assert sorted(fresh for _, fresh, _, _ in entries) == [False, True]
        assert len({(key, started) for _, _, key, started in entries}) == 1  # both see one entry
    with _open(store) as saver:
        assert len(saver.tool_calls(cfg("race", "alice"))) == ROUNDS + 1


def _fields(entry: ToolCall) -> dict[str, Any]:
    return {name: getattr(entry, name) for name in ToolCall.__dataclass_fields__}


@pytest.mark.providers("redis")
def test_r1_a_thread_whose_ledger_redis_evicted_is_refused_not_read_as_empty(open_saver: Opener) -> None:
    """A ledger read as empty would run its calls again: a thread that began calls and lost
    its calls hash (an eviction) is refused, as one that lost any other part."""
    import redis

    saver = open_saver()
    write(saver, "t")
    saver.begin_tool_call(cfg("t"), "m1", "c1", "charge")
    calls = saver.backend.space.thread("t")[-1]  # type: ignore[attr-defined]
    assert calls.endswith(":calls")
    assert redis.Redis.from_url(REDIS_URL).delete(calls) == 1
    with pytest.raises(CheckpointSerializationError, match="lost its tool-call ledger"):
        saver.tool_calls(cfg("t"))
    with pytest.raises(StorageError, match="lost its tool-call ledger"):
        saver.begin_tool_call(cfg("t"), "m1", "c1", "charge")
    with pytest.raises(CheckpointSerializationError, match="lost its tool-call ledger"):
        saver.get_tuple(cfg("t"))


def test_w4_a_begin_run_again_after_its_reply_was_lost_is_still_its_own(saver: ThreadkeepSaver) -> None:
    """A store retries a call whose reply was lost by running its program again: the entry
    the first try recorded is still this call's (fresh), and nobody else's."""
    from threadkeep.core.ledger import prepare_begin

    step = prepare_begin(cfg("t"), "m1", "c1", "charge", isolate=True, now=1.0)
    engine = saver.backend.engine
    tries = [
        engine.run(lambda: saver.backend.begin_tool_call(step), write=True, atomic=False) for _ in range(2)
    ]
    assert [step.entry(stored, saver.serde).fresh for stored in tries] == [True, True]
    assert saver.begin_tool_call(cfg("t"), "m1", "c1", "charge").fresh is False


def test_tm5_racing_ends_of_a_call_record_one_outcome(saver: ThreadkeepSaver) -> None:
    """Of ends racing with different outcomes, one is recorded; every other is refused."""
    write(saver, "t")
    for round_ in range(5):
        saver.begin_tool_call(cfg("t"), "m1", f"c{round_}", "charge")
        barrier, outcomes = threading.Barrier(4), []

        def end(
            n: int, round_: int = round_, barrier: threading.Barrier = barrier, outcomes: list[str] = outcomes
        ) -> None:
            barrier.wait()
            try:
                saver.end_tool_call(cfg("t"), "m1", f"c{round_}", result=f"ender {n}")
            except InvalidInputError:
                outcomes.append("refused")
            else:
                outcomes.append(f"ender {n}")

        workers = [threading.Thread(target=end, args=(n,)) for n in range(4)]
        for worker in workers:
            worker.start()
        for worker in workers:
            worker.join()
        (winner,) = [outcome for outcome in outcomes if outcome != "refused"]
        assert outcomes.count("refused") == 3
        (entry,) = [e for e in saver.tool_calls(cfg("t")) if e.call_id == f"c{round_}"]
        assert (entry.status, entry.result) == ("succeeded", winner)


@pytest.mark.providers("redis")
def test_r2_the_ledger_carries_the_threads_waiting_retention(open_saver: Opener) -> None:
    import redis

    saver = open_saver()
    saver.backend.ttl_ms = 60_000  # type: ignore[attr-defined]  # a one-minute waiting retention
    saver.begin_tool_call(cfg("t"), "m1", "c1", "charge")
    client, keys = redis.Redis.from_url(REDIS_URL), saver.backend.space.thread("t")  # type: ignore[attr-defined]
    calls, thread = client.pttl(keys[-1]), client.pttl(keys[0])
    assert 50_000 < calls <= 60_000
    assert abs(calls - thread) < 1_000  # one deadline for the thread's keys
    client.pexpire(keys[-1], 1_000)
    saver.tool_calls(cfg("t"))
    assert client.pttl(keys[-1]) <= 1_000  # a read does not extend it
    saver.end_tool_call(cfg("t"), "m1", "c1", result=1)
    assert client.pttl(keys[-1]) > 50_000  # a write does


@pytest.mark.parametrize("dialect", ["sqlite", "postgres"])
def test_tm5_a_begin_racing_the_threads_first_put_reads_its_entry(dialect: str) -> None:
    """The thread's row is committed between a begin's insert (which found no thread) and its
    read (which finds the thread without the entry): the begin runs again and returns its
    entry (as turns37 found on Postgres, durability async), rather than failing."""
    import importlib

    from threadkeep.backends.sql.ledger import begin_tool_call
    from threadkeep.core.ledger import prepare_begin
    from threadkeep.core.program import drive

    queries = importlib.import_module(f"threadkeep.backends.{dialect}.queries")
    step = prepare_begin(cfg("t", "alice"), "m", "c", "charge", isolate=True, now=1.0)
    empty = ("alice", None, None, None, None, None, None, None, None, None)
    stored = ("alice", "charge", step.key, step.claim, "started", None, None, None, 1.0, None)
    replies = iter([[None, [empty]], [None, [stored]]])
    entry = drive(begin_tool_call(queries, step), lambda request: next(replies))
    assert (entry.claim, entry.status) == (step.claim, "started")
