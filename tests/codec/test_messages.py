"""C1 for LangChain messages: every field, its type and its 'set' mark survive a round trip,
and the fast rebuild of trusted message classes equals LangChain's own constructor."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest
from hypothesis import given
from hypothesis import settings as hypothesis_settings
from hypothesis import strategies as st
from langchain_core.messages import AIMessage, HumanMessage, SystemMessage, ToolMessage

from threadkeep.codec import FaithfulCodec
from threadkeep.codec.faithful import _lc_class, _lc_kwargs, _lc_spec, _rebuilder
from threadkeep.errors import CheckpointSerializationError

CODEC = FaithfulCodec()
TEXT = st.text(max_size=40)
JSONISH = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**40), 2**40) | TEXT,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(TEXT, inner, max_size=3),
    max_leaves=8,
)
KWARGS = st.dictionaries(
    st.sampled_from(["a", "b", "when", "nested"]),
    JSONISH | st.just(datetime(2024, 1, 1, tzinfo=UTC)),
    max_size=3,
)
CONTENT = TEXT | st.lists(st.fixed_dictionaries({"type": st.just("text"), "text": TEXT}), max_size=2)
IDS = st.none() | st.uuids().map(str)
TOOL_CALLS = st.lists(
    st.fixed_dictionaries(
        {
            "name": st.sampled_from(["lookup", "charge"]),
            "args": st.dictionaries(TEXT, JSONISH, max_size=2),
            "id": st.uuids().map(str),
        }
    ),
    max_size=2,
)

MESSAGES = st.one_of(
    st.builds(HumanMessage, content=CONTENT, id=IDS, additional_kwargs=KWARGS, name=st.none() | TEXT),
    st.builds(SystemMessage, content=CONTENT, id=IDS),
    st.builds(AIMessage, content=CONTENT, id=IDS, tool_calls=TOOL_CALLS, additional_kwargs=KWARGS),
    st.builds(
        ToolMessage,
        content=CONTENT,
        tool_call_id=st.uuids().map(str),
        id=IDS,
        status=st.sampled_from(["success", "error"]),
        artifact=st.none() | JSONISH,
    ),
    st.builds(  # usage_metadata given, tool calls given or not (as a model's reply)
        lambda content, id_, calls, used, made: AIMessage(
            content=content,
            id=id_,
            usage_metadata={"input_tokens": used, "output_tokens": made, "total_tokens": used + made},
            **({} if calls is None else {"tool_calls": calls}),
        ),
        CONTENT,
        IDS,
        st.none() | TOOL_CALLS,
        st.integers(0, 10**6),
        st.integers(0, 10**6),
    ),
    st.builds(
        lambda extra: AIMessage(content="with extra", **extra),
        st.dictionaries(st.sampled_from(["foo", "bar"]), JSONISH, min_size=1),
    ),
)


@hypothesis_settings(max_examples=300, deadline=None)
@given(MESSAGES)
def test_c1_messages_round_trip_with_fields_types_and_set_marks(message: Any) -> None:
    back = CODEC.decode(CODEC.encode(message))
    assert type(back) is type(message)
    assert back == message
    assert back.model_fields_set == message.model_fields_set | {
        name for name in ("tool_calls", "invalid_tool_calls") if name in type(message).model_fields
    }
    assert back.__pydantic_extra__ == message.__pydantic_extra__


@hypothesis_settings(max_examples=300, deadline=None)
@given(MESSAGES)
def test_s1_a_decoded_message_encodes_back_to_the_bytes_it_was_read_from(message: Any) -> None:
    """A message's digest is of its encoding: a thread resumed from the store (new objects,
    decoded) must encode its history back to the same bytes, or each such message is
    stored a second time. (An AIMessage built with usage_metadata once wrote the
    tool-call fields LangChain always includes after it, and in declaration order once
    decoded.)"""
    stored = CODEC.encode(message)
    assert CODEC.encode(CODEC.decode(stored)) == stored


@hypothesis_settings(max_examples=300, deadline=None)
@given(MESSAGES)
def test_c1_fast_rebuild_equals_the_langchain_constructor(message: Any) -> None:
    cls = type(message)
    kwargs = CODEC.from_json(CODEC.to_json(_lc_kwargs(message, _lc_spec(cls))))
    rebuilt = _rebuilder(cls)(dict(kwargs))
    constructed = cls(**dict(kwargs))
    assert rebuilt == constructed
    assert rebuilt.model_fields_set == constructed.model_fields_set
    assert rebuilt.model_dump() == constructed.model_dump()
    assert _lc_class(tuple(cls.lc_id())) is cls


def test_c1_rebuilt_messages_never_share_a_default_container() -> None:
    stored = CODEC.encode(HumanMessage("hi", id="1"))
    first, second = CODEC.decode(stored), CODEC.decode(stored)
    first.additional_kwargs["edited"] = True
    first.response_metadata["edited"] = True
    assert second.additional_kwargs == {}
    assert second.response_metadata == {}
    assert CODEC.decode(stored) == HumanMessage("hi", id="1")


def test_c1_a_stored_message_missing_a_required_field_is_refused() -> None:
    stored = CODEC.encode(ToolMessage("result", tool_call_id="call-1", id="1"))
    broken = stored.replace(b'"tool_call_id":"call-1"', b'"status":"success"')
    assert broken != stored
    with pytest.raises(CheckpointSerializationError, match="lacks its field 'tool_call_id'"):
        CODEC.decode(broken)


def test_c1_a_rebuild_is_the_same_whatever_order_the_stored_fields_come_in() -> None:
    kwargs = {"content": "x", "id": "2", "tool_calls": [], "name": "bot"}
    build = _rebuilder(AIMessage)
    for order in (list(kwargs), list(reversed(kwargs)), ["name", "content", "tool_calls", "id"]):
        rebuilt = build({name: kwargs[name] for name in order})
        constructed = AIMessage(**kwargs)
        assert list(rebuilt.__dict__.items()) == list(constructed.__dict__.items())
        assert rebuilt.model_fields_set == constructed.model_fields_set
