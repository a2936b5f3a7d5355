"""SQL stores keep small channel values in their checkpoint's row (``vals``) and large ones
once in ``tk_blobs``; stores written before that layout (every value in ``tk_blobs``) are
read and continued as they are."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import orjson
import pytest
from langgraph.checkpoint.base import empty_checkpoint

from tests.providers import Opener
from threadkeep import CheckpointSerializationError, Settings
from threadkeep.backends.sql.programs import INLINE_VALUE_BYTES, inline_values
from threadkeep.core.program import Sql, SqlMany
from threadkeep.workload import MESSAGES_PER_TURN, build_agent, run_turns

pytestmark = pytest.mark.providers("sqlite", "postgres")

BIG = "x" * (INLINE_VALUE_BYTES + 100)


def run_sql(saver: Any, statement: str | Sql | SqlMany, *, write: bool = False) -> Any:
    """One statement on the saver's own store (its engine, its connection settings)."""

    def program() -> Iterator[Any]:
        rows = yield Sql(statement, {}) if isinstance(statement, str) else statement
        return rows

    return saver.backend.engine.run(program, write=write)


def stored_values(saver: Any) -> tuple[dict[str, set[str]], set[tuple[str, str]]]:
    """The channels each checkpoint holds in its row, and the (channel, version) in tk_blobs."""
    rows = run_sql(saver, "SELECT checkpoint_id, CAST(vals AS TEXT) FROM tk_checkpoints")
    inline = {checkpoint_id: {c for c, _, _ in inline_values(vals)} for checkpoint_id, vals in rows}
    blobs = {
        (channel, version) for channel, version in run_sql(saver, "SELECT channel, version FROM tk_blobs")
    }
    return inline, blobs


def put(
    saver: Any, config: Any, values: dict[str, Any], versions: dict[str, str], new: dict[str, str]
) -> Any:
    checkpoint = {**empty_checkpoint(), "channel_values": values, "channel_versions": versions}
    return saver.put(config, checkpoint, {"source": "loop", "step": 0}, new)


def test_small_values_sit_in_every_checkpoint_that_holds_them_and_large_ones_once(open_saver: Opener) -> None:
    saver = open_saver()
    start = {"configurable": {"thread_id": "t", "checkpoint_ns": ""}}
    first = put(saver, start, {"small": "s", "big": BIG, "n": 1}, {"small": "1", "big": "1", "n": "1"},
                {"small": "1", "big": "1", "n": "1"})  # fmt: skip
    second = put(saver, first, {"small": "s", "big": BIG, "n": 2}, {"small": "1", "big": "1", "n": "2"},
                 {"n": "2"})  # fmt: skip
    third = put(saver, second, {"small": "s", "big": BIG + "!", "n": 2}, {"small": "1", "big": "3", "n": "2"},
                {"big": "3"})  # fmt: skip

    inline, blobs = stored_values(saver)
    assert list(inline.values()) == [{"small", "n"}] * 3
    assert blobs == {("big", "1"), ("big", "3")}  # each large version once, unchanged ones not again
    assert saver.stats()["channel_values"] == 2 + 3 * 2
    for config, expected in ((first, (BIG, 1)), (second, (BIG, 2)), (third, (BIG + "!", 2))):
        values = saver.get_tuple(config).checkpoint["channel_values"]
        assert (values["big"], values["n"], values["small"]) == (*expected, "s")


def test_an_unchanged_value_the_parent_does_not_hold_is_stored_with_the_checkpoint(
    open_saver: Opener,
) -> None:
    saver = open_saver()
    start = {"configurable": {"thread_id": "t", "checkpoint_ns": ""}}
    # a first checkpoint that names channels it does not list as new (no parent holds them)
    first = put(saver, start, {"a": 1, "b": 2, "big": BIG}, {"a": "1", "b": "1", "big": "1"}, {"a": "1"})
    # and a child claiming a version of "a" its parent does not hold
    second = put(saver, first, {"a": 5, "b": 2, "big": BIG}, {"a": "4", "b": "1", "big": "1"}, {})
    assert saver.get_tuple(first).checkpoint["channel_values"] == {"a": 1, "b": 2, "big": BIG}
    assert saver.get_tuple(second).checkpoint["channel_values"] == {"a": 5, "b": 2, "big": BIG}
    assert stored_values(saver)[1] == {("big", "1")}


# Schema version 3 and format generation 2, as a store written before version 4 holds them.
_BACK_TO_VERSION_3 = {
    "postgres": (
        "ALTER TABLE tk_checkpoints DROP COLUMN vals,"
        " ALTER COLUMN checkpoint TYPE JSONB USING checkpoint::jsonb,"
        " ALTER COLUMN metadata TYPE JSONB USING metadata::jsonb",
        "UPDATE tk_checkpoints SET checkpoint = jsonb_set(checkpoint, '{id}', to_jsonb(checkpoint_id))",
    ),
    "sqlite": (
        "ALTER TABLE tk_checkpoints DROP COLUMN vals",
        "UPDATE tk_checkpoints SET checkpoint = json_set(checkpoint, '$.id', checkpoint_id)",
    ),
}


def test_a_store_of_schema_version_3_upgrades_and_is_read_and_continued(open_saver: Opener) -> None:
    """Before schema version 4 every value was a row of tk_blobs, the structure held the
    checkpoint's id, and Postgres kept structure and metadata as jsonb."""
    saver = open_saver()
    config = {"configurable": {"thread_id": "old"}}
    run_turns(build_agent(saver), "old", 2)
    before = [(t.checkpoint, t.metadata, t.pending_writes) for t in saver.list(config)]
    q = saver.backend.dialect
    rows = run_sql(
        saver, "SELECT tid, checkpoint_ns, CAST(checkpoint AS TEXT), CAST(vals AS TEXT) FROM tk_checkpoints"
    )
    for tid, ns, structure, vals in rows:
        versions = orjson.loads(structure)["channel_versions"]
        entries = [
            {"channel": c, "version": str(versions[c]), "type": kind, "value": value}
            for c, kind, value in inline_values(vals)
        ]
        if entries:
            run_sql(saver, q.many("blob", {"tid": tid, "checkpoint_ns": ns}, entries), write=True)
    for statement in (
        *_BACK_TO_VERSION_3[q.NAME],
        "DELETE FROM tk_migrations WHERE version = 4",
        "UPDATE tk_meta SET value = '2' WHERE key = 'format_generation'",
    ):
        run_sql(saver, statement, write=True)
    saver.close()

    reopened = open_saver()  # applies migration 4
    assert not any(stored_values(reopened)[0].values())
    assert [(t.checkpoint, t.metadata, t.pending_writes) for t in reopened.list(config)] == before
    run_turns(build_agent(reopened), "old", 1, first=2)
    state = reopened.get_tuple(config)
    assert len(state.checkpoint["channel_values"]["messages"]) == 3 * MESSAGES_PER_TURN
    assert stored_values(reopened)[0][state.checkpoint["id"]]  # new checkpoints use the new layout
    # metadata filters still work on the upgraded rows and the new ones
    inputs = [t.checkpoint["id"] for t in reopened.list(config) if t.metadata["source"] == "input"]
    assert [t.checkpoint["id"] for t in reopened.list(config, filter={"source": "input"})] == inputs
    assert len(inputs) == 3  # one per turn


def test_unreadable_stored_values_fail_the_read_naming_them(open_saver: Opener) -> None:
    saver = open_saver()
    config = put(
        saver, {"configurable": {"thread_id": "t", "checkpoint_ns": ""}}, {"a": 1}, {"a": "1"}, {"a": "1"}
    )
    run_sql(saver, """UPDATE tk_checkpoints SET vals = '{"a": "json:not base64!"}'""", write=True)
    with pytest.raises(CheckpointSerializationError, match="stored values are unreadable"):
        saver.get_tuple(config)


def test_binary_values_of_langgraphs_own_serializer_sit_in_the_row_too(open_saver: Opener) -> None:
    saver = open_saver(settings=Settings(codec="msgpack"))
    values = {"bytes": b"\x00\xff", "text": "é", "n": 7, "none": None}
    versions = dict.fromkeys(values, "1")
    config = put(saver, {"configurable": {"thread_id": "t", "checkpoint_ns": ""}}, values, versions, versions)
    inline, blobs = stored_values(saver)
    assert inline[config["configurable"]["checkpoint_id"]] == set(values)
    assert not blobs
    assert saver.get_tuple(config).checkpoint["channel_values"] == values


def test_an_unchanged_message_list_the_parent_does_not_hold_is_stored_whole(open_saver: Opener) -> None:
    from langchain_core.messages import AIMessage, HumanMessage

    saver = open_saver()
    messages = [HumanMessage("hi", id="h1"), AIMessage("hello", id="a1")]
    start = {"configurable": {"thread_id": "t", "checkpoint_ns": ""}}
    # the list is named by the checkpoint but not listed as new, and there is no parent
    config = put(saver, start, {"messages": messages, "n": 1}, {"messages": "1", "n": "1"}, {"n": "1"})
    assert saver.get_tuple(config).checkpoint["channel_values"] == {"messages": messages, "n": 1}
    fresh = open_saver()  # a reader that walks the stored links, not this process's cache
    assert fresh.get_tuple(config).checkpoint["channel_values"]["messages"] == messages
