"""The one sweep on every provider (SPEC SW1-SW8), with a controllable clock."""

from __future__ import annotations

import logging
import sqlite3
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest

from tests.providers import REDIS_URL, Opener
from tests.retention.test_retention import (
    ALL,
    MINUTE,
    PARKING,
    SWEPT,
    T0,
    Clock,
    asking_graph,
    cfg,
    exists,
    interrupting_graph,
    write,
)
from threadkeep import (
    Settings,
    declare_retention,
    operator_scope,
    register_live_thread_filter,
    sweep_checkpoints,
)
from threadkeep import sweep as sweep_module
from threadkeep.metrics import SWEEP_DELETED, SWEEP_SPARED, Metrics
from threadkeep.sweep import unregister_live_thread_filter

SETTINGS = Settings(retention_waiting_minutes=600, retention_finished_minutes=60)


@contextmanager
def live_filter(owner: str, fn: Any) -> Iterator[None]:
    """A live-thread filter registered for one block."""
    register_live_thread_filter(owner, fn)
    try:
        yield
    finally:
        unregister_live_thread_filter(owner)


def opened(open_saver: Opener, clock: Clock, **options: Any) -> Any:
    return open_saver(clock=clock, settings=SETTINGS, **options)


@pytest.mark.providers(*ALL, "redis-cluster")
def test_sw2_finished_threads_past_due_are_deleted_on_every_provider(open_saver: Opener) -> None:
    clock = Clock()
    saver = opened(open_saver, clock)
    for thread in ("early", "late", "waiting"):
        write(saver, thread)
    saver.mark_finished(["early"])
    clock.advance(30)
    saver.mark_finished(["late"])
    clock.advance(31)  # early is due, late is not
    result = sweep_checkpoints(saver)
    assert (result.finished_swept, result.swept_count) == (1, 1)
    assert [exists(saver, t) for t in ("early", "late", "waiting")] == [False, True, True]
    assert result.to_dict().keys() >= {
        "provider",
        "waiting_minutes",
        "finished_minutes",
        "swept_count",
        "finished_swept",
        "waiting_swept",
        "spared",
        "skipped",
    }
    assert (result.provider, result.waiting_minutes, result.finished_minutes) == (saver.facts.name, 600, 60)


@pytest.mark.providers(*SWEPT)
def test_sw3_waiting_threads_past_their_horizon_are_deleted(open_saver: Opener) -> None:
    clock = Clock()
    saver = opened(open_saver, clock)
    write(saver, "platform")
    saver.start_threads(["declared"], retention=declare_retention(saver.retention, waiting_minutes=100))
    write(saver, "declared")
    clock.advance(101)
    result = sweep_checkpoints(saver)
    assert (result.waiting_swept, result.skipped) == (1, [])
    assert (exists(saver, "declared"), exists(saver, "platform")) == (False, True)
    clock.advance(500)
    assert sweep_checkpoints(saver).waiting_swept == 1
    assert not exists(saver, "platform")


@pytest.mark.providers("memory", "redis")
def test_sw3_redis_and_memory_report_the_waiting_horizon_as_skipped(open_saver: Opener) -> None:
    clock = Clock()
    saver = opened(open_saver, clock)
    write(saver, "old")
    clock.advance(10_000)
    result = sweep_checkpoints(saver)
    assert result.swept_count == 0
    assert exists(saver, "old")
    expected = "key" if saver.facts.name == "redis" else "process"
    assert len(result.skipped) == 1
    assert "waiting horizon" in result.skipped[0]
    assert expected in result.skipped[0]


@pytest.mark.providers(*PARKING, "redis-cluster")
def test_sw4_a_parked_thread_is_spared_logged_counted_listed_and_stays_marked(
    open_saver: Opener, caplog: pytest.LogCaptureFixture
) -> None:
    clock = Clock()
    saver = opened(open_saver, clock)
    asking_graph(saver, deadline=T0 + 300 * MINUTE).invoke({"log": []}, cfg("parked"))
    write(saver, "done")
    saver.mark_finished(["parked", "done"])
    clock.advance(61)
    metrics = Metrics()
    with caplog.at_level(logging.WARNING, logger="threadkeep.sweep"):
        result = sweep_checkpoints(saver, metrics=metrics)
    assert result.finished_swept == 1
    assert [(s.thread_id, s.horizon, s.owner) for s in result.spared] == [("parked", "finished", "parks")]
    assert "1 thread(s) past their horizon kept" in caplog.text
    assert "parks 1 (finished 1)" in caplog.text
    assert metrics.value(SWEEP_SPARED, horizon="finished", owner="parks") == 1
    assert metrics.value(SWEEP_DELETED, horizon="finished") == 1
    assert 'threadkeep_checkpoint_sweep_spared_total{horizon="finished",owner="parks"} 1' in metrics.render()
    assert saver.thread_retention("parked")[1] is not None  # still marked: the next sweep asks again
    assert [s.thread_id for s in sweep_checkpoints(saver, metrics=metrics).spared] == ["parked"]
    assert metrics.value(SWEEP_SPARED, horizon="finished", owner="parks") == 2
    clock.advance(300)  # the park expired; its interrupt still waits to be resumed
    assert [(s.thread_id, s.owner) for s in sweep_checkpoints(saver).spared] == [("parked", "interrupts")]


@pytest.mark.providers(*ALL)
def test_sw4_a_thread_waiting_on_an_interrupt_is_spared(open_saver: Opener) -> None:
    clock = Clock()
    saver = opened(open_saver, clock)
    interrupting_graph(saver).invoke({"log": []}, cfg("asking"))
    saver.mark_finished(["asking"])
    clock.advance(61)
    result = sweep_checkpoints(saver)
    assert [(s.thread_id, s.owner) for s in result.spared] == [("asking", "interrupts")]
    assert exists(saver, "asking")


@pytest.mark.providers("sqlite")
def test_sw4_a_sweep_that_spares_many_threads_logs_one_warning(
    open_saver: Opener, caplog: pytest.LogCaptureFixture
) -> None:
    """Spared threads are summed up in one WARNING per sweep, by filter and horizon; each
    spared thread has its own line only at DEBUG."""
    clock = Clock()
    saver = opened(open_saver, clock)
    kept = [f"kept-{n}" for n in range(30)]
    for thread in (*kept, "done"):
        write(saver, thread)
    interrupting_graph(saver).invoke({"log": []}, cfg("asking"))
    saver.mark_finished([*kept[:10], "done", "asking"])
    clock.advance(601)  # the ten marked ones and "asking" past finished, the other 20 past waiting
    with (
        live_filter("keeper", lambda saver, ids, now: [t for t in ids if t.startswith("kept-")]),
        caplog.at_level(logging.DEBUG, logger="threadkeep.sweep"),
    ):
        result = sweep_checkpoints(saver)
    assert result.swept_count == 1
    assert len(result.spared) == 31
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1, warnings
    assert "31 thread(s) past their horizon kept" in warnings[0]
    assert "interrupts 1 (finished 1)" in warnings[0]
    assert "keeper 30 (finished 10, waiting 20)" in warnings[0]
    assert "kept-" not in warnings[0]
    per_thread = [r.getMessage() for r in caplog.records if r.levelno == logging.DEBUG]
    assert len(per_thread) == 31
    asking = "checkpoint sweep: thread asking is past the finished horizon but interrupts reports it live"
    assert f"{asking}; kept" in per_thread


def test_sw4_a_sweep_that_spares_nothing_logs_no_warning(
    caplog: pytest.LogCaptureFixture, tmp_path: Any
) -> None:
    from threadkeep import open_checkpointer

    with open_checkpointer("sqlite", str(tmp_path / "s.sqlite")) as saver:
        write(saver, "fresh")
        with caplog.at_level(logging.DEBUG, logger="threadkeep.sweep"):
            sweep_checkpoints(saver)
    assert [r for r in caplog.records if r.levelno >= logging.WARNING] == []


@pytest.mark.providers(*ALL)
def test_sw4_the_interrupt_horizon_spares_an_interrupt_until_it_has_waited_that_long(
    open_saver: Opener,
) -> None:
    """With LLM_PROVIDER_CHECKPOINT_RETENTION_INTERRUPT_MINUTES, a thread waiting on an
    interrupt is spared until its newest root checkpoint is older than the horizon, then
    swept like any other: marked finished (every provider), or past the waiting horizon
    (the providers that sweep waiting threads)."""
    clock = Clock()
    saver = open_saver(clock=clock, settings=SETTINGS.with_values(retention_interrupt_minutes=1440))
    assert saver.retention.interrupt_minutes == 1440
    for thread in ("finished", "left"):
        interrupting_graph(saver).invoke({"log": []}, cfg(thread))
    saver.mark_finished(["finished"])
    sweeps_waiting = saver.facts.expiry == "sweep"
    clock.advance(1439)  # past both horizons, within the interrupt horizon
    spared = sweep_checkpoints(saver).spared
    expected = [("finished", "finished")] + ([("left", "waiting")] if sweeps_waiting else [])
    assert sorted((s.thread_id, s.horizon) for s in spared) == expected
    assert {s.owner for s in spared} == {"interrupts"}
    assert exists(saver, "finished")
    assert exists(saver, "left")

    clock.advance(2)  # the interrupts have waited longer than 1440 minutes
    result = sweep_checkpoints(saver)
    assert (result.spared, result.finished_swept, result.waiting_swept) == ([], 1, int(sweeps_waiting))
    assert not exists(saver, "finished")
    assert exists(saver, "left") is not sweeps_waiting


@pytest.mark.providers(*SWEPT)
def test_sw4_without_an_interrupt_horizon_an_interrupt_is_spared_for_ever(open_saver: Opener) -> None:
    clock = Clock()
    saver = opened(open_saver, clock)
    assert saver.retention.interrupt_minutes is None
    interrupting_graph(saver).invoke({"log": []}, cfg("left"))
    clock.advance(100 * 365 * 24 * 60)
    assert [(s.thread_id, s.horizon, s.owner) for s in sweep_checkpoints(saver).spared] == [
        ("left", "waiting", "interrupts")
    ]


@pytest.mark.providers("sqlite", "redis")
def test_sw4_a_filter_that_raises_fails_the_sweep(open_saver: Opener) -> None:
    clock = Clock()
    saver = opened(open_saver, clock)
    write(saver, "t")
    saver.mark_finished(["t"])
    clock.advance(61)

    def broken(saver: Any, thread_ids: Any, now: float) -> set[str]:
        raise ConnectionError("the interactions store is down")

    with live_filter("interactions", broken):
        with pytest.raises(ConnectionError) as raised:
            sweep_checkpoints(saver)
        assert "live-thread filter 'interactions'" in raised.value.__notes__[0]
        assert exists(saver, "t")


def test_sw4_filter_owners_are_checked() -> None:
    from threadkeep import ConfigurationError

    with pytest.raises(ConfigurationError, match="must match"):
        register_live_thread_filter("Bad Owner", lambda saver, ids, now: set())
    with pytest.raises(ConfigurationError, match="already registered"):
        register_live_thread_filter("parks", lambda saver, ids, now: set())


@pytest.mark.providers(*ALL)
def test_sw6_a_dry_run_lists_what_would_go_and_deletes_nothing(open_saver: Opener) -> None:
    clock = Clock()
    saver = opened(open_saver, clock)
    write(saver, "t")
    saver.mark_finished(["t"])
    clock.advance(61)
    result = sweep_checkpoints(saver, dry_run=True)
    assert (result.dry_run, result.swept_count, result.doomed) == (
        True,
        1,
        [{"thread_id": "t", "horizon": "finished"}],
    )
    assert exists(saver, "t")


@pytest.mark.providers(*SWEPT, "redis")
def test_sw8_pages_through_the_store_past_spared_threads(
    open_saver: Opener, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sweep_module, "PAGE_SIZE", 3)
    clock = Clock()
    saver = opened(open_saver, clock)
    threads = [f"t{i}" for i in range(8)]
    for thread in threads:
        write(saver, thread)
    saver.mark_finished(threads)
    keep = {"t1", "t4", "t5"}
    with live_filter("keeper", lambda saver, ids, now: keep | {"not-on-the-page"}):
        clock.advance(61)
        pages: list[int] = []
        result = sweep_checkpoints(saver, progress=lambda r, total: pages.append(total))
    assert result.finished_swept == 5
    assert sorted(s.thread_id for s in result.spared) == sorted(keep)
    assert [t for t in threads if exists(saver, t)] == sorted(keep)
    assert len(pages) >= 3
    assert pages[0] == 8


# --- SW5: a deleted thread leaves nothing behind ------------------------------------------------


@pytest.fixture
def without_interrupts_filter() -> Any:
    """Sweep threads that wait on an interrupt too (to check what deleting them leaves)."""
    unregister_live_thread_filter("interrupts")
    yield
    register_live_thread_filter("interrupts", sweep_module._interrupts)


@pytest.mark.providers("sqlite", "postgres", "tiered")
@pytest.mark.usefixtures("without_interrupts_filter")
def test_sw5_a_swept_thread_leaves_no_row_in_any_table(open_saver: Opener) -> None:
    clock = Clock()
    saver = opened(open_saver, clock)
    if saver.facts.holds_parked_runs:  # a park, its interrupt, checkpoints, writes, messages
        asking_graph(saver, deadline=T0 + 300 * MINUTE).invoke({"log": []}, cfg("gone"))
    else:
        interrupting_graph(saver).invoke({"log": []}, cfg("gone"))
    write(saver, "kept")
    saver.mark_finished(["gone"])
    clock.advance(400)  # past the park's deadline and the finished horizon
    gone_tid = _tid(saver, "gone")
    result = sweep_checkpoints(saver)
    assert result.finished_swept == 1, result
    tables = _tables(saver)
    assert {"tk_threads", "tk_checkpoints", "tk_blobs", "tk_writes", "tk_messages", "tk_parks"} <= set(tables)
    kept_tid = _tid(saver, "kept")
    leftovers = {table: rows for table, rows in tables.items() if rows - {kept_tid}}
    assert leftovers == {}, f"gone was {gone_tid}, kept is {kept_tid}: {result}"
    if saver.facts.name == "tiered":
        import redis

        from threadkeep.backends.tiered.cache import REMOVED_HOLD_MS

        client = redis.Redis.from_url(REDIS_URL)
        entry, *state = saver.backend.cache.keys("gone", "anonymous")
        assert client.exists(*state) == 0
        # only the hold that keeps a late cache write out, and only for a while
        assert client.hgetall(entry) == {b"gone": b"1"}
        assert 0 < client.pttl(entry) <= REMOVED_HOLD_MS


@pytest.mark.providers("redis")
@pytest.mark.usefixtures("without_interrupts_filter")
def test_sw5_a_swept_redis_thread_leaves_no_key(open_saver: Opener) -> None:
    import redis

    clock = Clock()
    saver = opened(open_saver, clock)
    asking_graph(saver, deadline=T0 + 30 * MINUTE).invoke({"log": []}, cfg("gone"))
    write(saver, "kept")
    saver.mark_finished(["gone", "kept"])
    saver.start_threads(["kept"])
    clock.advance(61)
    assert sweep_checkpoints(saver).finished_swept == 1
    client = redis.Redis.from_url(REDIS_URL)
    space = saver.backend.space
    keys = {key.decode() for key in client.scan_iter(match=f"{space.prefix}:*", count=1000)}
    assert not [key for key in keys if space.tag("gone") in key]
    assert [key for key in keys if space.tag("kept") in key]
    assert client.zrange(space.finished_key, 0, -1) == []


def _tables(saver: Any) -> dict[str, set[int]]:
    """Every tk_ table of the store and the thread keys (tids) its rows belong to."""
    durable = getattr(saver.backend, "durable", saver.backend)
    if durable.dialect.NAME == "sqlite":
        conn = sqlite3.connect(durable.engine.path)
        names = [r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")]
        found = {
            name: {r[0] for r in conn.execute(f"SELECT tid FROM {name}")}
            for name in names
            if name.startswith("tk_") and name not in ("tk_meta", "tk_migrations")
        }
        conn.close()
        return found
    import psycopg

    with psycopg.connect(durable.engine.conninfo) as conn:
        names = [
            r[0] for r in conn.execute("SELECT tablename FROM pg_tables WHERE schemaname = current_schema()")
        ]
        return {
            name: {r[0] for r in conn.execute(f"SELECT tid FROM {name}")}  # type: ignore[arg-type]
            for name in names
            if name.startswith("tk_") and name not in ("tk_meta", "tk_migrations")
        }


def _tid(saver: Any, thread_id: str) -> int:
    with operator_scope():
        return next(t.key for t in saver.threads_named([thread_id]))


@pytest.mark.providers(*SWEPT, "redis")
def test_sw_a_thread_resumed_after_its_page_was_read_is_not_deleted(open_saver: Opener) -> None:
    clock = Clock()
    saver = opened(open_saver, clock)
    for thread in ("resumed", "done"):
        write(saver, thread)
    saver.mark_finished(["resumed", "done"])
    clock.advance(61)  # both are past the finished horizon

    def meanwhile(saver: Any, ids: Any, now: float) -> set[str]:
        saver.start_threads(["resumed"])  # while the sweep asks its filters, a run starts
        return set()

    with live_filter("meanwhile", meanwhile):
        result = sweep_checkpoints(saver)
    assert (exists(saver, "resumed"), exists(saver, "done")) == (True, False)
    assert result.finished_swept == 1


@pytest.mark.providers(*SWEPT)
def test_sw_a_thread_written_after_its_page_was_read_is_not_deleted(open_saver: Opener) -> None:
    clock = Clock()
    saver = opened(open_saver, clock)
    for thread in ("written", "stale"):
        write(saver, thread)
    clock.advance(601)  # both are past the waiting horizon

    def meanwhile(saver: Any, ids: Any, now: float) -> set[str]:
        if "written" in ids:
            write(saver, "written")  # while the sweep asks its filters, a run writes
        return set()

    with live_filter("meanwhile", meanwhile):
        result = sweep_checkpoints(saver)
    assert (exists(saver, "written"), exists(saver, "stale")) == (True, False)
    assert result.waiting_swept == 1


@pytest.mark.providers(*SWEPT, "redis")
def test_sw6_a_dry_run_over_several_pages_lists_every_thread_once(
    open_saver: Opener, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sweep_module, "PAGE_SIZE", 2)
    clock = Clock()
    saver = opened(open_saver, clock)
    threads = [f"t{i}" for i in range(5)]
    for thread in threads:
        write(saver, thread)
    saver.mark_finished(threads)
    clock.advance(61)
    result = sweep_checkpoints(saver, dry_run=True)
    assert sorted(row["thread_id"] for row in result.doomed) == threads
    assert result.swept_count == 5
    assert all(exists(saver, thread) for thread in threads)


@pytest.mark.providers(*SWEPT)
def test_rt2_a_copied_thread_starts_its_own_waiting_clock(open_saver: Opener) -> None:
    clock = Clock()
    saver = opened(open_saver, clock)
    write(saver, "source")
    clock.advance(500)
    saver.copy_thread("source", "copy")
    clock.advance(101)  # the source is past 600 minutes, the copy is 101 minutes old
    assert sweep_checkpoints(saver).waiting_swept == 1
    assert (exists(saver, "source"), exists(saver, "copy")) == (False, True)


def test_sw7_the_sweep_refuses_a_runs_own_saver(tmp_path: Any) -> None:
    from threadkeep import ConfigurationError
    from threadkeep.registry import close_savers, saver_for

    try:
        saver = saver_for("sqlite", str(tmp_path / "s.sqlite"), waiting_minutes=30, settings=Settings())
        with pytest.raises(ConfigurationError, match="apply that run's retention to every thread"):
            sweep_checkpoints(saver)
    finally:
        close_savers()


@pytest.mark.providers("redis")
def test_sw_a_run_that_starts_as_redis_deletes_its_thread_keeps_it(open_saver: Opener) -> None:
    """The sweep checked that the thread is past due and not parked; a run starts on it, or
    parks, before the delete reaches Redis: the delete must see that and keep the thread."""
    clock = Clock()
    saver = opened(open_saver, clock)
    for thread in ("started", "parked", "done"):
        write(saver, thread)
    saver.mark_finished(["started", "parked", "done"])
    clock.advance(61)
    engine, space = saver.backend.engine, saver.backend.space
    execute = engine._execute
    moved: list[str] = []

    def meanwhile(client: Any, request: Any) -> Any:
        # Just before each thread's delete: another worker starts a run on it, or parks it.
        keys = list(getattr(request, "keys", ()))[:1]
        thread = next((t for t in ("started", "parked") if keys == list(space.thread(t)[:1])), None)
        if getattr(request, "name", None) == "delete" and thread and thread not in moved:
            moved.append(thread)
            engine._execute = execute
            if thread == "started":
                saver.start_threads(["started"])
            else:
                saver.record_park("parked", "park-1", T0 + 300 * MINUTE)
            engine._execute = meanwhile
        return execute(client, request)

    engine._execute = meanwhile
    result = sweep_checkpoints(saver)
    engine._execute = execute
    assert sorted(moved) == ["parked", "started"]
    assert (exists(saver, "started"), exists(saver, "parked"), exists(saver, "done")) == (True, True, False)
    assert result.finished_swept == 1


@pytest.mark.providers(*SWEPT)
def test_sw3_a_run_started_on_a_thread_past_its_waiting_horizon_restarts_its_clock(
    open_saver: Opener,
) -> None:
    """A run resumes a thread nobody wrote for longer than the waiting horizon: until its
    first checkpoint lands, the start is the thread's newest activity, and the sweep keeps it."""
    clock = Clock()
    saver = opened(open_saver, clock)
    for thread in ("resumed", "idle"):
        write(saver, thread)
    clock.advance(601)  # both are past the waiting horizon (600 minutes)
    saver.start_threads(["resumed"])
    clock.advance(599)  # the start is still within it
    result = sweep_checkpoints(saver)
    assert (exists(saver, "resumed"), exists(saver, "idle")) == (True, False)
    assert result.waiting_swept == 1
    clock.advance(2)  # and the start's own horizon ends like any other
    assert sweep_checkpoints(saver).waiting_swept == 1
    assert not exists(saver, "resumed")
