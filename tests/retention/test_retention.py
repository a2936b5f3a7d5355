"""Retention on every provider (SPEC RT1-RT5): horizons, declared retention, owners and parks.

Time is a controllable clock handed to the saver; nothing sleeps.
"""

from __future__ import annotations

import datetime as dt
import operator
import time
from typing import Annotated, Any, TypedDict

import pytest
from langgraph.graph import END, START, StateGraph
from langgraph.types import Command, interrupt

from tests.providers import Opener
from threadkeep import (
    ConfigurationError,
    ParkRefusedError,
    PlatformRetention,
    RunGroup,
    Settings,
    StorageForbiddenError,
    ThreadRetention,
    ThreadRetentionError,
    arun_agent,
    ask,
    declare_retention,
    operator_scope,
    run_agent,
    sweep_checkpoints,
    user_scope,
)

T0 = 1_800_000_000.0
MINUTE = 60.0
ALL = ("memory", "sqlite", "postgres", "redis", "tiered")
SWEPT = ("sqlite", "postgres", "tiered")  # waiting threads leave by the sweep
PARKING = ("postgres", "redis", "tiered")  # can hold a parked run


class Clock:
    def __init__(self) -> None:
        self.now = T0

    def __call__(self) -> float:
        return self.now

    def advance(self, minutes: float) -> None:
        self.now += minutes * MINUTE


class State(TypedDict):
    log: Annotated[list[str], operator.add]


def _step(state: State) -> dict[str, Any]:
    return {"log": ["step"]}


def simple_graph(saver: Any) -> Any:
    builder = StateGraph(State)
    builder.add_node("step", _step)
    builder.add_edge(START, "step")
    builder.add_edge("step", END)
    return builder.compile(checkpointer=saver)


def asking_graph(saver: Any, deadline: Any) -> Any:
    def wait(state: State) -> dict[str, Any]:
        return {"log": [str(ask("approve?", deadline=deadline))]}

    builder = StateGraph(State)
    builder.add_node("step", _step)
    builder.add_node("wait", wait)
    builder.add_edge(START, "step")
    builder.add_edge("step", "wait")
    builder.add_edge("wait", END)
    return builder.compile(checkpointer=saver)


def interrupting_graph(saver: Any) -> Any:
    def wait(state: State) -> dict[str, Any]:
        return {"log": [str(interrupt("continue?"))]}

    builder = StateGraph(State)
    builder.add_node("wait", wait)
    builder.add_edge(START, "wait")
    builder.add_edge("wait", END)
    return builder.compile(checkpointer=saver)


def cfg(thread_id: str) -> Any:
    return {"configurable": {"thread_id": thread_id}}


def write(saver: Any, thread_id: str) -> None:
    simple_graph(saver).invoke({"log": []}, cfg(thread_id))


def exists(saver: Any, thread_id: str) -> bool:
    with operator_scope():
        return saver.get_tuple(cfg(thread_id)) is not None


# --- RT1-RT3: horizons and declared retention ------------------------------------------------


def test_rt3_a_declared_retention_may_only_be_shorter() -> None:
    platform = PlatformRetention(waiting_minutes=600, finished_minutes=60)
    assert declare_retention(platform, waiting_minutes=30) == ThreadRetention(30, None)
    assert declare_retention(platform, finished_minutes=10).finished(platform) == 10
    assert declare_retention(platform, waiting_minutes=30).finished(platform) == 30  # capped
    with pytest.raises(ThreadRetentionError, match=r"waiting_minutes=601 exceeds the platform's 600"):
        declare_retention(platform, waiting_minutes=601)
    with pytest.raises(ThreadRetentionError, match=r"finished_minutes=61 exceeds the platform's 60"):
        declare_retention(platform, finished_minutes=61)
    with pytest.raises(ThreadRetentionError, match=r"finished_minutes=50 exceeds the thread's waiting .* 40"):
        declare_retention(platform, waiting_minutes=40, finished_minutes=50)
    with pytest.raises(ThreadRetentionError, match=r"positive whole number"):
        declare_retention(platform, waiting_minutes=0)


def test_rt1_finished_above_waiting_is_refused_at_boot_naming_both() -> None:
    with pytest.raises(ConfigurationError, match=r"FINISHED_MINUTES=700 exceeds .*WAITING_MINUTES=600"):
        Settings.from_env(
            {
                "LLM_PROVIDER_CHECKPOINT_RETENTION_WAITING_MINUTES": "600",
                "LLM_PROVIDER_CHECKPOINT_RETENTION_FINISHED_MINUTES": "700",
            }
        )


@pytest.mark.providers(*SWEPT)
def test_rt2_the_waiting_clock_restarts_at_each_write_and_not_at_a_read(open_saver: Opener) -> None:
    clock = Clock()
    saver = open_saver(
        clock=clock, settings=Settings(retention_waiting_minutes=100, retention_finished_minutes=60)
    )
    write(saver, "t")
    clock.advance(90)
    assert saver.get_tuple(cfg("t")) is not None  # a read: the clock does not restart
    clock.advance(11)
    assert sweep_checkpoints(saver).waiting_swept == 1
    assert not exists(saver, "t")

    write(saver, "u")
    clock.advance(90)
    write(saver, "u")  # a write: it restarts
    clock.advance(11)
    assert sweep_checkpoints(saver).swept_count == 0
    clock.advance(90)
    assert sweep_checkpoints(saver).waiting_swept == 1
    assert not exists(saver, "u")


@pytest.mark.providers("sqlite", "postgres", "redis", "tiered")
def test_rt2_a_mark_keeps_the_retention_in_force_when_it_was_made(open_saver: Opener) -> None:
    clock = Clock()
    before = open_saver(clock=clock, settings=Settings(retention_finished_minutes=60))
    write(before, "old")
    due_old = before.mark_finished(["old"])["old"]
    assert due_old == T0 + 60 * MINUTE
    # The platform's finished retention changes: only new marks move.
    after = open_saver(clock=clock, settings=Settings(retention_finished_minutes=30))
    write(after, "new")
    assert after.mark_finished(["new"])["new"] == T0 + 30 * MINUTE
    assert after.thread_retention("old") == (ThreadRetention(), due_old)
    clock.advance(31)
    result = sweep_checkpoints(after)
    assert (result.finished_swept, exists(after, "new"), exists(after, "old")) == (1, False, True)
    clock.advance(30)
    assert sweep_checkpoints(after).finished_swept == 1
    assert not exists(after, "old")


@pytest.mark.providers(*SWEPT)
def test_rt3_a_declared_waiting_is_read_by_the_sweep_and_a_later_run_replaces_it(open_saver: Opener) -> None:
    clock = Clock()
    saver = open_saver(clock=clock)
    declared = declare_retention(saver.retention, waiting_minutes=30)
    saver.start_threads(["short", "replaced"], retention=declared)
    write(saver, "short")
    write(saver, "replaced")
    saver.start_threads(["replaced"])  # a later run: the platform's retention again
    assert saver.thread_retention("short") == (ThreadRetention(30, None), None)
    assert saver.thread_retention("replaced") == (ThreadRetention(), None)
    clock.advance(31)
    assert sweep_checkpoints(saver).waiting_swept == 1
    assert (exists(saver, "short"), exists(saver, "replaced")) == (False, True)


@pytest.mark.providers("redis")
def test_rt3_on_redis_the_declared_waiting_is_the_ttl_of_the_threads_keys(open_saver: Opener) -> None:
    import redis

    from tests.providers import REDIS_URL

    saver = open_saver()
    saver.start_threads(["t"], retention=declare_retention(saver.retention, waiting_minutes=30))
    write(saver, "t")
    client = redis.Redis.from_url(REDIS_URL)
    ttls = [client.pttl(key) for key in saver.backend.space.thread("t") if client.exists(key)]
    assert len(ttls) >= 4
    assert all(29 * 60_000 < ttl <= 30 * 60_000 for ttl in ttls)
    saver.start_threads(["t"])  # the platform's waiting again
    write(saver, "t")
    ttls = [client.pttl(key) for key in saver.backend.space.thread("t") if client.exists(key)]
    assert all(ttl > 10079 * 60_000 for ttl in ttls)


@pytest.mark.providers("sqlite", "postgres", "redis", "tiered")
def test_starting_a_run_on_another_users_thread_is_refused(open_saver: Opener) -> None:
    saver = open_saver()
    with user_scope("alice"):
        simple_graph(saver).invoke({"log": []}, {"configurable": {"thread_id": "t", "user_id": "alice"}})
        saver.mark_finished(["t"])
    with user_scope("bob"), pytest.raises(StorageForbiddenError):
        saver.start_threads(["t"])
    with user_scope("bob"), pytest.raises(StorageForbiddenError):
        saver.mark_finished(["t"])
    with user_scope("alice"):
        assert saver.thread_retention("t")[1] is not None  # still alice's mark


# --- RT4: owners -------------------------------------------------------------------------------


@pytest.mark.providers(*ALL)
def test_rt4_run_agent_marks_a_thread_it_minted_and_never_a_callers(open_saver: Opener) -> None:
    clock = Clock()
    saver = open_saver(clock=clock)
    graph = simple_graph(saver)
    minted = run_agent(graph, {"log": []})
    assert minted.marked_finished
    assert saver.thread_retention(minted.thread_id)[1] == T0 + 1440 * MINUTE
    supplied = run_agent(graph, {"log": []}, thread_id="mine")
    assert not supplied.marked_finished
    assert saver.thread_retention("mine")[1] is None
    # A run starting on a finished thread takes it out of the finished set.
    run_agent(graph, {"log": []}, thread_id=minted.thread_id)
    assert saver.thread_retention(minted.thread_id)[1] is None


@pytest.mark.providers("sqlite", "postgres", "redis", "tiered")
def test_rt4_run_agent_acts_for_the_user_its_config_names(open_saver: Opener) -> None:
    saver = open_saver()
    graph = simple_graph(saver)
    alice = {"configurable": {"user_id": "alice"}}
    outcome = run_agent(graph, {"log": []}, config=alice)
    assert outcome.marked_finished
    with user_scope("alice"):
        assert saver.thread_retention(outcome.thread_id)[1] is not None
    with pytest.raises(StorageForbiddenError):
        run_agent(
            graph, {"log": []}, thread_id=outcome.thread_id, config={"configurable": {"user_id": "bob"}}
        )
    group = RunGroup(saver, "alice-session", config=alice)
    with group.running():
        graph.invoke({"log": []}, {"configurable": {"thread_id": group.child("r1"), "user_id": "alice"}})
    assert all(saver.thread_retention(t, config=alice)[1] is not None for t in group.threads)


@pytest.mark.providers(*ALL)
def test_rt3_a_retention_built_by_hand_is_still_checked(open_saver: Opener) -> None:
    saver = open_saver()
    with pytest.raises(ThreadRetentionError, match="exceeds the platform's"):
        saver.start_threads(["t"], retention=ThreadRetention(waiting_minutes=99_999))
    with pytest.raises(ThreadRetentionError, match="exceeds the thread's waiting"):
        run_agent(simple_graph(saver), {"log": []}, retention=ThreadRetention(10, 20))


@pytest.mark.providers("sqlite", "postgres", "redis", "tiered")
async def test_rt4_arun_agent_marks_and_spares_as_run_agent_does(open_saver: Opener) -> None:
    saver = open_saver()
    minted = await arun_agent(simple_graph(saver), {"log": []})
    parked = await arun_agent(interrupting_graph(saver), {"log": []})
    supplied = await arun_agent(simple_graph(saver), {"log": []}, thread_id="mine")
    assert (minted.marked_finished, parked.marked_finished, supplied.marked_finished) == (True, False, False)
    assert parked.parked
    assert (await saver.aget_tuple(cfg(minted.thread_id))) is not None
    assert saver.thread_retention(minted.thread_id)[1] is not None
    assert saver.thread_retention("mine")[1] is None


@pytest.mark.providers(*ALL)
def test_rt4_run_agent_does_not_mark_a_run_that_parked(open_saver: Opener) -> None:
    saver = open_saver()
    outcome = run_agent(interrupting_graph(saver), {"log": []})
    assert outcome.parked
    assert not outcome.marked_finished
    assert saver.thread_retention(outcome.thread_id)[1] is None


@pytest.mark.providers(*ALL)
def test_rt4_run_agent_marks_a_minted_thread_when_the_run_fails(open_saver: Opener) -> None:
    saver = open_saver()

    def boom(state: State) -> dict[str, Any]:
        raise RuntimeError("tool failed")

    builder = StateGraph(State)
    builder.add_node("step", _step)
    builder.add_node("boom", boom)
    builder.add_edge(START, "step")
    builder.add_edge("step", "boom")
    graph = builder.compile(checkpointer=saver)
    with pytest.raises(RuntimeError, match="tool failed") as raised:
        run_agent(graph, {"log": []})
    thread = next(
        note for note in raised.value.__notes__ if note.startswith("threadkeep marked thread")
    ).split("'")[1]
    assert saver.thread_retention(thread)[1] is not None


@pytest.mark.providers(*ALL)
def test_rt4_a_run_group_marks_nothing_at_a_pause_and_everything_at_an_error(open_saver: Opener) -> None:
    saver = open_saver()
    group = RunGroup(saver, "session-1", child_template="{session}/run/{run_id}")
    graph = simple_graph(saver)
    with group.running():
        write(saver, group.session_thread)
        graph.invoke({"log": []}, cfg(group.child("r1")))
        group.pause()
    assert [saver.thread_retention(t)[1] for t in group.threads] == [None, None]
    # The group resumes (rebuilt elsewhere from its run ids) and ends with an error.
    resumed = RunGroup(saver, "session-1", child_template="{session}/run/{run_id}", run_ids=("r1",))

    def failing_flow() -> None:
        with resumed.running():
            graph.invoke({"log": []}, cfg(resumed.child("r2")))
            raise RuntimeError("the flow failed")

    with pytest.raises(RuntimeError):
        failing_flow()
    assert resumed.threads == ["session-1", "session-1/run/r1", "session-1/run/r2"]
    assert all(saver.thread_retention(t)[1] is not None for t in resumed.threads)
    resumed.start()  # a run starts on the session: every thread leaves the finished set
    assert all(saver.thread_retention(t)[1] is None for t in resumed.threads)
    with pytest.raises(ConfigurationError, match="pause is not a terminal"):
        resumed.end("pause")  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError, match="must contain"):
        RunGroup(saver, "s", child_template="{session}-child")


# --- RT5: parks --------------------------------------------------------------------------------


@pytest.mark.providers(*PARKING)
def test_rt5_a_live_park_is_recorded_and_cleared_on_resolve(open_saver: Opener) -> None:
    clock = Clock()
    saver = open_saver(clock=clock)
    graph = asking_graph(saver, deadline=T0 + 60 * MINUTE)
    graph.invoke({"log": []}, cfg("p"))
    assert saver.live_parks(["p", "other"], clock()) == {"p"}
    assert saver.live_parks(["p"], T0 + 61 * MINUTE) == set()  # past its deadline: not live
    result = graph.invoke(Command(resume="yes"), cfg("p"))
    assert result["log"] == ["step", "yes"]
    assert saver.live_parks(["p"], clock()) == set()


def _late_first_call(method: Any) -> Any:
    calls = 0

    def late(*args: Any, **kwargs: Any) -> Any:
        nonlocal calls
        calls += 1
        if calls == 1:
            time.sleep(0.5)
        return method(*args, **kwargs)

    return late


@pytest.mark.providers(*PARKING)
def test_rt5_a_park_may_land_before_the_threads_first_checkpoint(open_saver: Opener) -> None:
    # LangGraph's default durability ("async") writes a step's checkpoint while the next
    # step runs: ask() may record its park before the thread's first put has landed.
    clock = Clock()
    saver = open_saver(clock=clock)
    for name in ("put", "put_writes"):  # the thread's first put and first writes land late
        setattr(saver, name, _late_first_call(getattr(saver, name)))
    graph = asking_graph(saver, deadline=T0 + 60 * MINUTE)
    with user_scope("alice"):
        graph.invoke({"log": []}, {"configurable": {"thread_id": "early", "user_id": "alice"}})
        assert saver.live_parks(["early"], clock()) == {"early"}
        assert saver.get_tuple(cfg("early")) is not None
    with pytest.raises(StorageForbiddenError):  # the park made the thread alice's
        saver.record_park("early", "other", T0 + 10 * MINUTE, config={"configurable": {"user_id": "bob"}})


@pytest.mark.providers(*PARKING)
def test_rt5_ask_refuses_before_anything_is_parked(open_saver: Opener) -> None:
    clock = Clock()
    saver = open_saver(
        clock=clock, settings=Settings(retention_waiting_minutes=600, retention_finished_minutes=60)
    )
    for deadline, message in (
        (None, "needs a deadline"),
        (T0 + 601 * MINUTE, "past thread 'x'.s waiting horizon"),
        (dt.datetime(2030, 1, 1), "no time zone"),
    ):
        with pytest.raises(ParkRefusedError, match=message):
            asking_graph(saver, deadline).invoke({"log": []}, cfg("x"))
        assert saver.live_parks(["x"], clock()) == set()
    # A declared, shorter waiting retention is the thread's horizon.
    saver.start_threads(["y"], retention=declare_retention(saver.retention, waiting_minutes=30))
    with pytest.raises(ParkRefusedError, match="30 minutes from now"):
        asking_graph(saver, T0 + 31 * MINUTE).invoke({"log": []}, cfg("y"))
    aware = dt.datetime.fromtimestamp(T0 + 20 * MINUTE, dt.UTC)
    asking_graph(saver, aware).invoke({"log": []}, cfg("y"))
    assert saver.live_parks(["y"], clock()) == {"y"}


@pytest.mark.providers("memory", "sqlite")
def test_rt5_a_store_that_cannot_hold_a_parked_run_refuses_to_park(open_saver: Opener) -> None:
    saver = open_saver()
    assert not saver.facts.holds_parked_runs
    with pytest.raises(ParkRefusedError, match=f"the {saver.facts.name} provider cannot hold a parked run"):
        asking_graph(saver, T0 + 10 * MINUTE).invoke({"log": []}, cfg("x"))
