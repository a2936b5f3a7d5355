"""SPEC C5, C7: the serializers savers store values with: compression, msgpack, allowlists."""

from __future__ import annotations

import dataclasses
import importlib
import sys
import uuid
import zlib
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import orjson
import pytest
from langchain_core.messages import HumanMessage
from langgraph.checkpoint.serde.jsonplus import JsonPlusSerializer

from threadkeep.codec import CompressingSerializer, FaithfulSerializer, build_serde, with_allowlist
from threadkeep.codec.msgpack import StrictMsgpackSerializer
from threadkeep.codec.serde import compress
from threadkeep.errors import CheckpointSerializationError


@dataclasses.dataclass
class Note:
    text: str
    at: datetime


def big_value() -> dict[str, Any]:
    """A value whose encoding is a few kilobytes of repetitive text, as chat state is."""
    return {
        "messages": [HumanMessage(f"message number {i}: " + "lorem ipsum " * 20) for i in range(20)],
        "notes": (Note("n", datetime(2024, 1, 1, tzinfo=UTC)),),
    }


def encoded_size(value: Any) -> int:
    return len(FaithfulSerializer().dumps_typed(value)[1])


# --- C5 --------------------------------------------------------------------------------------


def test_c5_value_larger_than_the_threshold_is_stored_compressed_and_smaller() -> None:
    value = big_value()
    plain_size = encoded_size(value)
    serde = build_serde("json", compress_threshold=plain_size - 1)
    kind, payload = serde.dumps_typed(value)
    assert kind == "json+zstd"
    assert len(payload) < plain_size
    assert serde.loads_typed((kind, payload)) == value


def test_c5_value_at_or_below_the_threshold_is_stored_plain() -> None:
    value = big_value()
    plain_size = encoded_size(value)
    for threshold in (plain_size, plain_size + 1):
        kind, payload = build_serde("json", compress_threshold=threshold).dumps_typed(value)
        assert kind == "json"
        assert len(payload) == plain_size
        assert orjson.loads(payload)  # readable JSON as stored


def test_c5_default_threshold_is_65536() -> None:
    assert build_serde("json").threshold == 65536
    small = {"k": "v" * 1000}
    assert build_serde("json").dumps_typed(small)[0] == "json"
    large = {"k": "v" * 70000}
    assert build_serde("json").dumps_typed(large)[0] == "json+zstd"


def test_c5_threshold_none_never_compresses() -> None:
    serde = build_serde("json", compress_threshold=None)
    value = {"k": "v" * 200_000, "more": big_value()}
    kind, payload = serde.dumps_typed(value)
    assert kind == "json"
    assert serde.loads_typed((kind, payload)) == value


@pytest.mark.parametrize(
    ("writer_threshold", "reader_threshold"),
    [(16, None), (None, 16), (16, 10**9), (10**9, 16)],
    ids=["compressed-read-by-off", "plain-read-by-on", "compressed-read-by-high", "plain-read-by-low"],
)
def test_c5_reads_accept_both_forms_whatever_the_current_threshold(
    writer_threshold: int | None, reader_threshold: int | None
) -> None:
    value = big_value()
    stored = build_serde("json", compress_threshold=writer_threshold).dumps_typed(value)
    assert stored[0] == ("json+zstd" if writer_threshold == 16 else "json")
    assert build_serde("json", compress_threshold=reader_threshold).loads_typed(stored) == value


def test_c5_values_earlier_versions_stored_zlib_compressed_still_read() -> None:
    value = big_value()
    stored = ("json+zlib", zlib.compress(FaithfulSerializer().dumps_typed(value)[1]))
    for threshold in (None, 16, 65536):
        assert build_serde("json", compress_threshold=threshold).loads_typed(stored) == value


def test_c5_a_short_chat_message_compresses_well_with_the_dictionary() -> None:
    message = HumanMessage("Where is my parcel?", id="5f0c4a7e-2f5b-4c1e-9a43-0d2b6f1e8c11")
    plain = FaithfulSerializer().dumps_typed(message)[1]
    kind, payload = build_serde("json", compress_threshold=16).dumps_typed(message)
    assert kind == "json+zstd"
    assert len(payload) < len(plain) * 0.75
    assert build_serde("json").loads_typed((kind, payload)) == message


def _zstd_frame(data: bytes) -> bytes:
    return build_serde("json", compress_threshold=0).dumps_typed(data.decode())[1]


@pytest.mark.parametrize(
    ("kind", "payload"),
    [
        ("json+zstd", b"not zstd at all"),
        ("json+zstd", _zstd_frame(b"a longer value, truncated")[:-4]),
        ("json+zstd", b""),
        ("json+zlib", b"not zlib at all"),
        ("json+zlib", zlib.compress(b'{"a": 1}')[:-4]),
    ],
    ids=["zstd-garbage", "zstd-truncated", "zstd-empty", "zlib-garbage", "zlib-truncated"],
)
def test_c5_corrupt_compressed_bytes_fail_the_read(kind: str, payload: bytes) -> None:
    with pytest.raises(CheckpointSerializationError):
        build_serde("json").loads_typed((kind, payload))


def test_c5_a_frame_claiming_a_huge_size_is_refused_not_allocated() -> None:
    # a zstd frame header (magic, single segment, 8-byte content size) claiming 1 TiB
    header = b"\x28\xb5\x2f\xfd" + b"\xe0" + (1 << 40).to_bytes(8, "little")
    with pytest.raises(CheckpointSerializationError, match="claims 1099511627776 bytes"):
        build_serde("json").loads_typed(("json+zstd", header + b"\x01\x00\x00"))


def test_c5_compressed_bytes_that_hold_no_json_fail_the_read() -> None:
    with pytest.raises(CheckpointSerializationError):
        build_serde("json").loads_typed(("json+zstd", compress(b"\x80\x81 not json")))
    with pytest.raises(CheckpointSerializationError):
        build_serde("json").loads_typed(("json+zlib", zlib.compress(b"\x80\x81 not json")))


# --- C7 --------------------------------------------------------------------------------------


def test_c7_msgpack_codec_uses_langgraphs_serializer() -> None:
    serde = build_serde("msgpack", compress_threshold=None)
    assert isinstance(serde.inner, StrictMsgpackSerializer)
    assert isinstance(serde.inner.serde, JsonPlusSerializer)
    assert isinstance(build_serde("msgpack", msgpack_strict=False).inner, JsonPlusSerializer)
    value = {"messages": [HumanMessage("hi")], "n": 1}
    kind, payload = serde.dumps_typed(value)
    assert kind == "msgpack"
    assert serde.loads_typed((kind, payload)) == value
    assert JsonPlusSerializer().loads_typed((kind, payload)) == value  # LangGraph's own bytes


def test_c7_msgpack_values_are_compressed_too() -> None:
    value = {"messages": big_value()["messages"]}  # msgpack itself turns tuples into lists
    serde = build_serde("msgpack", compress_threshold=64)
    kind, payload = serde.dumps_typed(value)
    assert kind == "msgpack+zstd"
    assert serde.loads_typed((kind, payload)) == value


def test_c7_faithful_serializer_refuses_a_msgpack_payload_clearly() -> None:
    stored = build_serde("msgpack", compress_threshold=None).dumps_typed({"a": 1})
    with pytest.raises(CheckpointSerializationError) as caught:
        build_serde("json").loads_typed(stored)
    assert "msgpack" in str(caught.value)
    assert "LLM_PROVIDER_CHECKPOINT_CODEC" in str(caught.value)


def test_c7_faithful_serializer_refuses_a_compressed_msgpack_payload() -> None:
    stored = build_serde("msgpack", compress_threshold=1).dumps_typed(big_value())
    assert stored[0] == "msgpack+zstd"
    with pytest.raises(CheckpointSerializationError, match="msgpack"):
        build_serde("json").loads_typed(stored)


@pytest.fixture
def module_with_a_class(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """The name of a module on sys.path, not imported yet, holding dataclass ``Thing``."""
    name = f"tk_serde_probe_{uuid.uuid4().hex}"
    source = "import dataclasses\n@dataclasses.dataclass\nclass Thing:\n    x: int\n"
    (tmp_path / f"{name}.py").write_text(source)
    monkeypatch.syspath_prepend(str(tmp_path))
    yield name
    sys.modules.pop(name, None)


def test_c7_with_allowlist_extends_the_faithful_codecs_allowlist(module_with_a_class: str) -> None:
    name = module_with_a_class
    serde = build_serde("json", compress_threshold=123)
    extended = with_allowlist(serde, [(name,), (name, "Thing")])

    assert isinstance(extended, CompressingSerializer)
    assert extended.threshold == 123
    assert isinstance(extended.inner, FaithfulSerializer)
    assert {(name,), (name, "Thing")} <= extended.inner.codec.allowlist
    assert isinstance(serde.inner, FaithfulSerializer)
    assert (name,) not in serde.inner.codec.allowlist  # the original is unchanged

    stored = ("json", orjson.dumps({"~dataclass": [name, "Thing", {"x": 5}]}))
    with pytest.raises(CheckpointSerializationError):
        serde.loads_typed(stored)
    assert name not in sys.modules
    thing = extended.loads_typed(stored)
    assert type(thing) is sys.modules[name].Thing
    assert thing.x == 5


def test_c7_with_allowlist_is_honoured_by_strict_msgpack(module_with_a_class: str) -> None:
    module = importlib.import_module(module_with_a_class)
    strict = build_serde(
        "msgpack", compress_threshold=None, inner=JsonPlusSerializer(allowed_msgpack_modules=None)
    )
    stored = strict.dumps_typed({"thing": module.Thing(7)})
    assert stored[0] == "msgpack"

    blocked = strict.loads_typed(stored)["thing"]
    assert not isinstance(blocked, module.Thing)

    extended = with_allowlist(strict, [(module_with_a_class, "Thing")])
    assert isinstance(extended, CompressingSerializer)
    assert isinstance(extended.inner, JsonPlusSerializer)
    assert extended.loads_typed(stored) == {"thing": module.Thing(7)}


@pytest.mark.parametrize(
    "serde",
    [build_serde(), build_serde(compress_threshold=1), build_serde("msgpack")],
    ids=["json", "zstd", "msgpack"],
)
def test_a_stored_message_list_reads_back_in_order_and_a_bad_entry_is_named(serde: Any) -> None:
    from threadkeep.core.records import decode_values

    messages = [HumanMessage(f"m{i}" * 50, id=str(i)) for i in range(4)]
    stored = [serde.dumps_typed(message) for message in messages]
    assert decode_values(serde, stored, "channel_values.messages") == messages
    kind, _ = stored[2]
    stored[2] = (kind, b"\xc1")  # not JSON, msgpack (0xc1 is never used) or zstd
    with pytest.raises(CheckpointSerializationError) as caught:
        decode_values(serde, stored, "channel_values.messages")
    assert caught.value.path == "channel_values.messages[2]"


def test_a_list_read_in_one_pass_is_what_each_value_reads_back_as_alone() -> None:
    """The one-parse read of a message list (FaithfulCodec.decode_many) takes the plain
    envelopes together and the rest one by one: the result is the same either way."""
    from langchain_core.messages import AIMessage, ToolMessage

    from threadkeep.core.records import decode_values

    serde = build_serde()
    values = [
        HumanMessage("plain", id="h1"),
        AIMessage("", id="a1", tool_calls=[{"name": "look", "args": {"q": "x"}, "id": "c1"}]),
        ToolMessage("found ~ it", tool_call_id="c1", id="t1"),  # a "~" in the bytes
        HumanMessage('{"~lc": ["not", "an", "envelope"]}', id="h2"),
        AIMessage("when", id="a2", additional_kwargs={"at": datetime(2026, 1, 2, tzinfo=UTC)}),
        {"not": "a message"},
        HumanMessage("last", id="h3", name="someone"),
    ]
    stored = [serde.dumps_typed(value) for value in values]
    read = decode_values(serde, stored, "channel_values.messages")
    alone = [serde.loads_typed(entry) for entry in stored]
    assert read == alone == values
    assert [type(value) for value in read] == [type(value) for value in values]
    assert read[4].additional_kwargs["at"] == datetime(2026, 1, 2, tzinfo=UTC)
    assert read[6].model_fields_set == values[6].model_fields_set


def test_a_message_naming_a_jinja2_template_is_refused_alone_and_in_a_list() -> None:
    """LangChain's loader refuses kwargs with ``template_format="jinja2"`` (a template that
    could run code); threadkeep's reads refuse them too, on the one-pass read of a list as
    alone, and read every other message (another template format included) as stored."""
    from threadkeep.core.records import decode_values

    serde = build_serde()
    fine = HumanMessage("f-string", id="f", template_format="f-string")
    stored = [serde.dumps_typed(m) for m in (HumanMessage("a", id="a"), fine)]
    assert decode_values(serde, stored, "messages") == [HumanMessage("a", id="a"), fine]
    stored.append(serde.dumps_typed(HumanMessage("{{ x }}", id="j", template_format="jinja2")))
    with pytest.raises(CheckpointSerializationError, match="Jinja2 templates are not allowed"):
        serde.loads_typed(stored[2])
    with pytest.raises(CheckpointSerializationError, match="Jinja2 templates are not allowed") as listed:
        decode_values(serde, stored, "messages")
    assert listed.value.path == "messages[2]"


def test_a_malformed_envelope_in_a_list_is_refused_and_shifts_nothing() -> None:
    """An envelope whose ``~lc`` array holds an extra value parses inside the one-pass read
    of its list; it must still be refused, naming its index, as it is alone."""
    from threadkeep.core.records import decode_values

    serde = build_serde()
    stored = [serde.dumps_typed(HumanMessage(text, id=text)) for text in ("a", "b", "c")]
    assert decode_values(serde, stored, "messages") == [HumanMessage(t, id=t) for t in ("a", "b", "c")]
    kind, raw = stored[1]
    stored[1] = (kind, raw[:-2] + b',{"content":"x","type":"human","id":"x"}]}')
    with pytest.raises(CheckpointSerializationError, match="malformed LangChain envelope"):
        serde.loads_typed(stored[1])
    with pytest.raises(CheckpointSerializationError, match="malformed LangChain envelope") as listed:
        decode_values(serde, stored, "messages")
    assert listed.value.path == "messages[1]"


def test_kwargs_that_are_not_one_json_value_each_are_refused_not_shifted_into_neighbours() -> None:
    """Three stored messages whose kwargs are each broken (an unclosed string, a stray
    object) but which, joined, would parse as three objects: the one-pass read of their
    list must not hand one message's bytes to another; it refuses the first broken one, as
    reading it alone does."""
    from threadkeep.core.records import decode_values

    serde = build_serde()
    stored = [serde.dumps_typed(HumanMessage(text, id=text)) for text in ("a", "b", "c")]
    kind, raw = stored[0]
    prefix = raw[: raw.index(b"],{") + 2]
    broken = [b'{"content":"}', b'{"}', b'{"content":"a","id":"a"},{"content":"b","id":"b"}']
    stored = [(kind, prefix + kwargs + b"]}") for kwargs in broken]
    with pytest.raises(CheckpointSerializationError):
        serde.loads_typed(stored[0])
    with pytest.raises(CheckpointSerializationError) as listed:
        decode_values(serde, stored, "messages")
    assert listed.value.path == "messages[0]"
