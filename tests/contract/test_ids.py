"""What an id may hold (threadkeep.core.ids), the same on every provider, sync and async.

An id too long for the store's keys, one holding a NUL, or one holding a lone surrogate is
refused before any I/O with ``InvalidInputError`` (``INPUT_001``) naming the field, what is
wrong and the limit: nothing is stored, nothing is retried. An id exactly at its limit, of
multi-byte characters that do not compress, is stored and read back everywhere.
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest
from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import Checkpoint, empty_checkpoint

from threadkeep import InvalidInputError, ThreadkeepSaver, operator_scope, user_scope
from threadkeep.core.ids import MAX_ID_BYTES, MAX_NAMESPACE_BYTES, MAX_PARK_ID_BYTES, checked_id
from threadkeep.workload import build_agent, turn_input

LIMITS = {"thread_id": MAX_ID_BYTES, "checkpoint_ns": MAX_NAMESPACE_BYTES, "user_id": MAX_ID_BYTES}
DEADLINE = 4_102_444_800.0  # 2100-01-01: a park's deadline no test reaches


def incompressible(size: int, seed: int = 33) -> str:
    """Text of exactly ``size`` UTF-8 bytes, of 1- to 4-byte characters drawn at random: a
    Postgres index cannot compress it below its size."""
    rng = random.Random(seed)
    ranges = ((0x61, 0x7A), (0xC0, 0x17F), (0x4E00, 0x9FFF), (0x1F300, 0x1F5FF))
    chars: list[str] = []
    left = size
    while left >= 4:
        low, high = rng.choice(ranges)
        char = chr(rng.randint(low, high))
        chars.append(char)
        left -= len(char.encode())
    chars.append("z" * left)
    text = "".join(chars)
    assert len(text.encode()) == size
    return text


# The case: 20,000 characters that do not compress (hex of random bytes).
TOO_LONG = random.Random(20_000).randbytes(10_000).hex()
BAD = {"too_long": TOO_LONG, "nul": "bad\0id", "surrogate": "bad\ud800id"}


def cfg(thread_id: str, **extra: Any) -> RunnableConfig:
    return {"configurable": {"thread_id": thread_id, **extra}}


def a_checkpoint(checkpoint_id: str | None = None) -> Checkpoint:
    checkpoint = empty_checkpoint()
    if checkpoint_id is not None:
        checkpoint["id"] = checkpoint_id
    return checkpoint


async def collect(items: AsyncIterator[Any]) -> list[Any]:
    return [item async for item in items]


Sync = Callable[[], Any]
Async = Callable[[], Awaitable[Any]]
Call = tuple[str, Sync, Async | None]  # a call's name, the call, and its async twin (if any)


def twins(saver: ThreadkeepSaver, method: str, *args: Any, **kwargs: Any) -> tuple[Sync, Async]:
    """A saver call and its async twin with the same arguments (a list's items collected)."""
    if method == "list":
        return lambda: list(saver.list(*args, **kwargs)), lambda: collect(saver.alist(*args, **kwargs))
    sync, async_ = getattr(saver, method), getattr(saver, "a" + method)
    return lambda: sync(*args, **kwargs), lambda: async_(*args, **kwargs)


def scoped(user_id: str, sync: Sync, async_: Async) -> tuple[Sync, Async]:
    """A call and its twin, each made under ``user_scope(user_id)``."""

    def in_scope() -> Any:
        with user_scope(user_id):
            return sync()

    async def in_scope_async() -> Any:
        with user_scope(user_id):
            return await async_()

    return in_scope, in_scope_async


def calls(saver: ThreadkeepSaver, field: str, bad: str) -> list[Call]:
    """Every entry of the saver (and a graph's invoke) that takes ``field``, given ``bad``."""
    good = "good-thread"
    config = {
        "thread_id": cfg(bad),
        "checkpoint_ns": cfg(good, checkpoint_ns=bad),
        "user_id": cfg(good, user_id=bad),
    }[field]
    writes_config: RunnableConfig = {"configurable": {**config["configurable"], "checkpoint_id": "1"}}
    found: list[Call] = [
        ("put", *twins(saver, "put", config, a_checkpoint(), {}, {})),
        ("put_writes", *twins(saver, "put_writes", writes_config, [("a", 1)], "task")),
        ("get_tuple", *twins(saver, "get_tuple", config)),
        ("list", *twins(saver, "list", config)),
    ]
    if field in ("thread_id", "user_id"):
        graph = build_agent(saver)
        found.append(
            (
                "invoke",
                lambda: graph.invoke(turn_input(0), config),
                lambda: graph.ainvoke(turn_input(0), config),
            )
        )
    if field == "thread_id":
        found += [
            ("delete_thread", *twins(saver, "delete_thread", bad)),
            ("copy_thread source", *twins(saver, "copy_thread", bad, good)),
            ("copy_thread target", *twins(saver, "copy_thread", good, bad)),
            ("prune", *twins(saver, "prune", [good, bad])),
            ("start_threads", *twins(saver, "start_threads", [bad])),
            ("mark_finished", *twins(saver, "mark_finished", [bad])),
            ("thread_retention", lambda: saver.thread_retention(bad), None),
            ("record_park", lambda: saver.record_park(bad, "park", DEADLINE), None),
            ("clear_park", lambda: saver.clear_park(bad, "park"), None),
        ]
    if field == "user_id":
        found += [
            ("start_threads", *twins(saver, "start_threads", [good], config=config)),
            ("mark_finished", *twins(saver, "mark_finished", [good], config=config)),
            ("record_park", lambda: saver.record_park(good, "park", DEADLINE, config=config), None),
            ("scope put", *scoped(bad, *twins(saver, "put", cfg(good), a_checkpoint(), {}, {}))),
            ("scope list", *scoped(bad, *twins(saver, "list", None))),
            ("scope delete_thread", *scoped(bad, *twins(saver, "delete_thread", good))),
            ("scope copy_thread", *scoped(bad, *twins(saver, "copy_thread", good, "other"))),
            ("scope prune", *scoped(bad, *twins(saver, "prune", [good]))),
            ("scope delete_for_runs", *scoped(bad, *twins(saver, "delete_for_runs", ["run"]))),
        ]
    return found


def assert_refusal(error: InvalidInputError, field: str, problem: str, limit: int, call: str) -> None:
    """One error for every provider: its class and code, the field, what is wrong, the limit."""
    assert type(error) is InvalidInputError, call
    assert (error.code, error.kind) == ("INPUT_001", "invalid"), call
    named = error.context["field"]
    # A field is named as the call names it: thread_id, source_thread_id, thread_ids[1], ...
    assert field in named, (call, named)
    assert error.message.startswith(f"{named} "), (call, error.message)
    assert error.context["problem"] == problem, (call, error.message)
    assert error.message.endswith("Nothing was read or stored."), call
    if problem == "too_long":
        size = len(BAD[problem].encode())
        assert (error.context["size"], error.context["limit"]) == (size, limit), call
        assert f"is {size} bytes in UTF-8, over the limit of {limit} bytes" in error.message, call
    elif problem == "nul":
        assert error.context["position"] == 3, call
        assert "NUL character (U+0000) at character 3" in error.message, call
    else:
        assert error.context["position"] == 3, call
        assert "lone surrogate (U+D800) at character 3" in error.message, call


def assert_nothing_stored(saver: ThreadkeepSaver) -> None:
    with operator_scope():
        assert list(saver.list(None)) == []
        assert saver.threads_named(["good-thread", "other"]) == []
    stats = saver.stats()
    assert (stats["threads"], stats["checkpoints"], stats["writes"]) == (0, 0, 0), stats


def assert_no_retry(caplog: pytest.LogCaptureFixture) -> None:
    """No call reached a store: no retry logged, no store error logged."""
    assert [r for r in caplog.records if r.name.startswith("threadkeep")] == []


FIELDS = ["thread_id", "checkpoint_ns", "user_id"]
PROBLEMS = ["too_long", "nul", "surrogate"]


@pytest.mark.parametrize("problem", PROBLEMS)
@pytest.mark.parametrize("field", FIELDS)
def test_w4_an_invalid_id_is_refused_alike_and_stores_nothing(
    saver: ThreadkeepSaver, field: str, problem: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, logger="threadkeep")
    for name, call, _ in calls(saver, field, BAD[problem]):
        with pytest.raises(InvalidInputError) as caught:
            call()
        assert_refusal(caught.value, field, problem, LIMITS[field], name)
    assert_no_retry(caplog)
    assert_nothing_stored(saver)


@pytest.mark.parametrize("problem", PROBLEMS)
@pytest.mark.parametrize("field", FIELDS)
def test_w4_an_invalid_id_is_refused_alike_and_stores_nothing_async(
    saver: ThreadkeepSaver, field: str, problem: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, logger="threadkeep")

    async def scenario() -> None:
        for name, _, call in calls(saver, field, BAD[problem]):
            if call is None:  # no async twin (thread_retention, record_park, clear_park)
                continue
            with pytest.raises(InvalidInputError) as caught:
                await call()
            assert_refusal(caught.value, field, problem, LIMITS[field], name)

    asyncio.run(scenario())
    assert_no_retry(caplog)
    assert_nothing_stored(saver)


def test_w4_ids_at_their_limit_are_stored_and_read_back(saver: ThreadkeepSaver) -> None:
    """Every id at its limit, in multi-byte characters that do not compress, on every store:
    Postgres's widest keys (a pending write's namespace, checkpoint id and task id; a value's
    namespace and channel) fit. One byte more is refused."""
    thread_id, ns, user = (
        incompressible(MAX_ID_BYTES, 1),
        incompressible(MAX_NAMESPACE_BYTES, 2),
        incompressible(MAX_ID_BYTES, 3),
    )
    checkpoint_id, task_id, run_id = (incompressible(MAX_ID_BYTES, seed) for seed in (4, 5, 6))
    park_id, copy_id = incompressible(MAX_PARK_ID_BYTES, 7), incompressible(MAX_ID_BYTES, 8)
    value = incompressible(4000, 9)  # too large to sit in the checkpoint's row: a value of its own
    config = cfg(thread_id, checkpoint_ns=ns, user_id=user)
    checkpoint = a_checkpoint(checkpoint_id)
    checkpoint["channel_values"] = {"big": value}
    checkpoint["channel_versions"] = {"big": saver.get_next_version(None, None)}

    stored = saver.put(config, checkpoint, {"run_id": run_id}, checkpoint["channel_versions"])
    assert stored["configurable"]["checkpoint_id"] == checkpoint_id
    saver.put_writes({"configurable": {**stored["configurable"], "user_id": user}}, [("big", "w")], task_id)
    saver.record_park(thread_id, park_id, DEADLINE, config=config)
    saver.clear_park(thread_id, park_id, config=config)
    got = saver.get_tuple(config)
    assert got is not None
    assert got.config["configurable"] == {
        "thread_id": thread_id,
        "checkpoint_ns": ns,
        "checkpoint_id": checkpoint_id,
    }
    assert got.checkpoint["channel_values"] == {"big": value}
    assert got.metadata["run_id"] == run_id
    assert got.pending_writes == [(task_id, "big", "w")]
    assert [t.checkpoint["id"] for t in saver.list(cfg(thread_id, user_id=user))] == [checkpoint_id]
    with user_scope(user):
        saver.copy_thread(thread_id, copy_id)
        copied = saver.get_tuple(cfg(copy_id, checkpoint_ns=ns))
        assert copied is not None
        assert copied.pending_writes == [(task_id, "big", "w")]
        saver.delete_for_runs([run_id])
        assert saver.get_tuple(cfg(copy_id, checkpoint_ns=ns)) is None
    assert saver.thread_retention(thread_id, config=config) is not None

    def over(limit: int) -> str:
        return incompressible(limit + 1)

    refused: list[tuple[str, Sync]] = [
        ("thread_id", lambda: saver.get_tuple(cfg(over(MAX_ID_BYTES)))),
        ("checkpoint_ns", lambda: saver.get_tuple(cfg("t", checkpoint_ns=over(MAX_NAMESPACE_BYTES)))),
        ("user_id", lambda: saver.get_tuple(cfg("t", user_id=over(MAX_ID_BYTES)))),
        ("checkpoint_id", lambda: saver.get_tuple(cfg("t", checkpoint_id=over(MAX_ID_BYTES)))),
        ('checkpoint["id"]', lambda: saver.put(cfg("t"), a_checkpoint(over(MAX_ID_BYTES)), {}, {})),
        ("run_id", lambda: saver.put(cfg("t"), a_checkpoint(), {"run_id": over(MAX_ID_BYTES)}, {})),
        ("task_id", lambda: saver.put_writes(cfg("t", checkpoint_id="1"), [], over(MAX_ID_BYTES))),
        ("park_id", lambda: saver.record_park("t", over(MAX_PARK_ID_BYTES), DEADLINE)),
    ]
    for field, call in refused:
        with pytest.raises(InvalidInputError) as caught:
            call()
        context = caught.value.context
        assert (context["field"], context["problem"]) == (field, "too_long")
        assert context["size"] == context["limit"] + 1, field
    with operator_scope():
        assert saver.threads_named(["t"]) == []


@pytest.mark.parametrize("problem", PROBLEMS)
def test_w4_the_other_ids_are_refused_alike(saver: ThreadkeepSaver, problem: str) -> None:
    """Checkpoint ids (a config's, a put's, list's ``before``), task ids, run ids and park ids:
    the same rule and the same error, sync and async, nothing stored. (LangGraph removes a
    NUL from metadata strings itself, so a run id is never refused for one.)"""

    def bad(limit: int) -> str:
        return incompressible(limit + 1) if problem == "too_long" else BAD[problem]

    cid, task, run, park = bad(MAX_ID_BYTES), bad(MAX_ID_BYTES), bad(MAX_ID_BYTES), bad(MAX_PARK_ID_BYTES)
    found: list[Call] = [
        ("checkpoint_id", *twins(saver, "get_tuple", cfg("t", checkpoint_id=cid))),
        ("checkpoint_id", *twins(saver, "list", cfg("t", checkpoint_id=cid))),
        ('before["checkpoint_id"]', *twins(saver, "list", cfg("t"), before=cfg("t", checkpoint_id=cid))),
        ('checkpoint["id"]', *twins(saver, "put", cfg("t"), a_checkpoint(cid), {}, {})),
        ("checkpoint_id", *twins(saver, "put_writes", cfg("t", checkpoint_id=cid), [("a", 1)], "task")),
        ("task_id", *twins(saver, "put_writes", cfg("t", checkpoint_id="1"), [("a", 1)], task)),
        ("run_ids[1]", *twins(saver, "delete_for_runs", ["run", run])),
        ("park_id", lambda: saver.record_park("t", park, DEADLINE), None),
        ("park_id", lambda: saver.clear_park("t", park), None),
    ]
    if problem != "nul":
        found.append(("run_id", *twins(saver, "put", cfg("t"), a_checkpoint(), {"run_id": run}, {})))

    async def refused_async(call: Async) -> InvalidInputError:
        with pytest.raises(InvalidInputError) as caught:
            await call()
        return caught.value

    for field, sync, async_ in found:
        with pytest.raises(InvalidInputError) as caught:
            sync()
        errors = [caught.value] + ([] if async_ is None else [asyncio.run(refused_async(async_))])
        for error in errors:
            assert error.code == "INPUT_001", field
            assert (error.context["field"], error.context["problem"]) == (field, problem), error
            assert error.message.startswith(f"{field} "), error
    assert_nothing_stored(saver)


def test_w4_an_id_that_is_not_text_is_refused() -> None:
    """A namespace, checkpoint id, task id or park id must be a str (a thread, user or run id
    is its ``str()``); no I/O is needed to say so."""
    with pytest.raises(InvalidInputError) as caught:
        checked_id(5, "checkpoint_ns", MAX_NAMESPACE_BYTES)
    assert caught.value.context["problem"] == "type"
    assert caught.value.message.startswith("checkpoint_ns is of type int, not str; pass the id as text.")
