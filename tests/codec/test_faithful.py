"""SPEC C1-C4, C6: the faithful JSON codec keeps every value's type, refuses what it cannot keep,
stores exceptions as records, and never imports or calls what a payload names."""

from __future__ import annotations

import collections
import copy
import dataclasses
import enum
import math
import pickle
import sys
import uuid
import zoneinfo
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, time, timedelta, timezone, tzinfo
from decimal import Decimal
from pathlib import Path
from typing import Any, NamedTuple
from zoneinfo import ZoneInfo

import orjson
import pytest
from hypothesis import HealthCheck, given
from hypothesis import settings as hypothesis_settings
from hypothesis import strategies as st
from langchain_core.documents import Document
from langchain_core.load.serializable import Serializable
from langchain_core.messages import AIMessage, HumanMessage, RemoveMessage, SystemMessage, ToolMessage
from langchain_core.prompts import ChatPromptTemplate
from langgraph.types import Command, Interrupt, Send
from pydantic import BaseModel, ConfigDict, PrivateAttr

from threadkeep.codec import CheckpointedException, FaithfulCodec
from threadkeep.errors import CheckpointSerializationError

CODEC = FaithfulCodec()
PARIS = ZoneInfo("Europe/Paris")

# --- module-level types the codec may store ------------------------------------------------


class Color(enum.Enum):
    RED = "red"
    GREEN = "green"


class Priority(enum.IntEnum):
    LOW = 1
    HIGH = 2


class Perm(enum.Flag):
    R = 1
    W = 2
    X = 4


class Corner(enum.Enum):
    ORIGIN = (0, 0)
    FAR = (9, 9)


class Mood(enum.StrEnum):
    CALM = "calm"
    TENSE = "tense"


@dataclass
class Point:
    x: int
    y: float


@dataclass(frozen=True)
class Tag:
    name: str
    color: Color


@dataclass
class Box:
    item: Any
    points: list[Point] = field(default_factory=list)
    count: int = field(init=False)

    def __post_init__(self) -> None:
        self.count = len(self.points)


@dataclass
class Shelf:
    boxes: tuple[Box, ...]
    label: Tag


AUDIT: list[str] = []


@dataclass
class Audited:
    name: str

    def __post_init__(self) -> None:
        AUDIT.append(self.name)


class Address(BaseModel):
    street: str
    zone: Any = None


class Person(BaseModel):
    name: str
    born: date
    address: Address
    tags: tuple[str, ...] = ()
    payload: Any = None


class Money(BaseModel):
    model_config = ConfigDict(frozen=True)

    amount: Decimal
    currency: str = "EUR"


class Flexible(BaseModel):
    model_config = ConfigDict(extra="allow")

    kind: str
    note: str = "none"
    _secret: Any = PrivateAttr(default=None)


class Stamped(BaseModel):
    when: datetime


class MyMsg(AIMessage):
    """A message subclass LangChain's loader will not revive."""


class Pair(NamedTuple):
    a: int
    b: int


class Name(str):
    pass


class Shifted(tzinfo):
    """A tzinfo that is neither a fixed offset nor a keyed ZoneInfo."""

    def utcoffset(self, dt: datetime | None) -> timedelta:
        return timedelta(hours=3)

    def dst(self, dt: datetime | None) -> timedelta:
        return timedelta(0)

    def tzname(self, dt: datetime | None) -> str:
        return "SHIFTED"


class StepFailed(Exception):
    def __init__(self, message: str, **attrs: Any) -> None:
        super().__init__(message)
        for name, value in attrs.items():
            setattr(self, name, value)


class Opaque:
    def __repr__(self) -> str:
        return "<Opaque handle>"


PROMPT = ChatPromptTemplate.from_messages([("system", "You are {persona}."), ("human", "{question}")])


# --- a checker that walks two values and compares the type of every node ------------------


def assert_same_tz(original: tzinfo | None, decoded: tzinfo | None, where: str) -> None:
    assert type(decoded) is type(original), f"{where}: tzinfo {original!r} became {decoded!r}"
    if isinstance(original, ZoneInfo):
        assert isinstance(decoded, ZoneInfo)
        assert decoded.key == original.key, where
    elif original is not None:
        assert decoded is not None
        assert decoded.utcoffset(None) == original.utcoffset(None), where
        assert decoded.tzname(None) == original.tzname(None), where


def assert_same(original: Any, decoded: Any, where: str = "value") -> None:
    """Fail unless ``decoded`` equals ``original`` with the same type at every node."""
    kind = type(original)
    assert type(decoded) is kind, f"{where}: {kind.__name__} became {type(decoded).__name__}"
    if kind is float:
        assert decoded == original, where
        assert math.copysign(1.0, decoded) == math.copysign(1.0, original), f"{where}: sign of zero"
    elif kind is Decimal:
        assert str(decoded) == str(original), where
    elif kind in (datetime, time):
        assert decoded == original, where
        assert decoded.replace(tzinfo=None) == original.replace(tzinfo=None), f"{where}: wall clock"
        assert decoded.fold == original.fold, f"{where}: fold"
        assert_same_tz(original.tzinfo, decoded.tzinfo, where)
    elif isinstance(original, tzinfo):
        assert_same_tz(original, decoded, where)
    elif kind in (list, tuple):
        assert len(decoded) == len(original), where
        for index, (a, b) in enumerate(zip(original, decoded, strict=True)):
            assert_same(a, b, f"{where}[{index}]")
    elif kind is dict:
        assert list(decoded) == list(original), f"{where}: keys"
        for (ka, va), (kb, vb) in zip(original.items(), decoded.items(), strict=True):
            assert_same(ka, kb, f"{where} key {ka!r}")
            assert_same(va, vb, f"{where}[{ka!r}]")
    elif kind in (set, frozenset):
        assert decoded == original, where
        for item in decoded:
            (match,) = [o for o in original if o == item]
            assert_same(match, item, f"{where} member {item!r}")
    elif isinstance(original, enum.Enum):
        assert decoded == original, where
    elif isinstance(original, BaseModel):
        assert decoded == original, where
        for name in type(original).model_fields:
            assert_same(original.__dict__[name], decoded.__dict__[name], f"{where}.{name}")
        assert_same(original.__pydantic_extra__, decoded.__pydantic_extra__, f"{where} extra")
        assert_same(original.__pydantic_private__, decoded.__pydantic_private__, f"{where} private")
        if not isinstance(original, Serializable):
            # LangChain objects are rebuilt from their constructor kwargs, as LangChain's
            # own loader does; for plain models, which fields were set is part of the value.
            assert decoded.model_fields_set == original.model_fields_set, f"{where} fields set"
    elif dataclasses.is_dataclass(original):
        assert decoded == original, where
        for f in dataclasses.fields(original):
            assert_same(getattr(original, f.name), getattr(decoded, f.name), f"{where}.{f.name}")
    elif kind is Send:
        assert decoded.node == original.node, where
        assert_same(original.arg, decoded.arg, f"{where}.arg")
    else:
        assert decoded == original, where


def round_trip(value: Any, codec: FaithfulCodec = CODEC) -> Any:
    return codec.decode(codec.encode(value))


# --- strategies ------------------------------------------------------------------------------

ZONE_KEYS = [
    "Europe/Paris",
    "America/New_York",
    "Asia/Kolkata",
    "Australia/Lord_Howe",
    "America/St_Johns",
    "Pacific/Chatham",
    "UTC",
]
OFFSETS = st.timedeltas(
    min_value=timedelta(hours=-23, minutes=-59), max_value=timedelta(hours=23, minutes=59)
)
ZONES = st.sampled_from(ZONE_KEYS).map(ZoneInfo)
FIXED = st.one_of(
    st.just(UTC),
    OFFSETS.map(timezone),
    st.builds(timezone, OFFSETS, st.text(min_size=1, max_size=8)),
)
TZINFOS = st.one_of(st.none(), FIXED, ZONES)
DATETIMES = st.builds(
    lambda d, tz, fold: d.replace(tzinfo=tz, fold=fold),
    st.datetimes(min_value=datetime(1900, 1, 1), max_value=datetime(2200, 1, 1)),
    TZINFOS,
    st.integers(0, 1),
)
TIMES = st.builds(lambda t, tz, fold: t.replace(tzinfo=tz, fold=fold), st.times(), TZINFOS, st.integers(0, 1))
INTS = st.one_of(
    st.integers(),
    st.integers(min_value=2**63 - 3, max_value=2**64 + 3),
    st.integers(min_value=2**64, max_value=2**300),
    st.integers(max_value=-(2**63) + 3, min_value=-(2**300)),
)
FLOATS = st.one_of(
    st.floats(allow_nan=False, allow_infinity=False), st.sampled_from([-0.0, 0.0, 1e308, 5e-324])
)
ENUMS = st.sampled_from([*Color, *Priority, *Perm, Perm.R | Perm.W, *Corner, *Mood])
TEXT = st.text(max_size=12)
STR_KEYS = st.one_of(TEXT, TEXT.map(lambda s: "~" + s))

HASHABLE_LEAVES = st.one_of(
    st.none(),
    st.booleans(),
    TEXT,
    INTS,
    FLOATS,
    st.binary(max_size=16),
    DATETIMES,
    st.dates(),
    TIMES,
    st.timedeltas(),
    st.decimals(allow_nan=False, allow_infinity=False),
    st.uuids(),
    ENUMS,
    st.builds(Tag, TEXT, st.sampled_from(Color)),
    st.decimals(allow_nan=False, allow_infinity=False, places=2).map(lambda d: Money(amount=d)),
)
HASHABLES = st.recursive(
    HASHABLE_LEAVES,
    lambda inner: st.one_of(
        st.lists(inner, max_size=3).map(tuple),
        st.frozensets(inner, max_size=3),
    ),
    max_leaves=6,
)


def build(factory: Any, *args: st.SearchStrategy[Any], **kwargs: st.SearchStrategy[Any]) -> Any:
    """Like st.builds, but never infers an argument from a type hint."""
    return st.tuples(st.tuples(*args), st.fixed_dictionaries(kwargs)).map(lambda ak: factory(*ak[0], **ak[1]))


POINTS = build(Point, st.integers(), FLOATS)
TAGS = build(Tag, TEXT, st.sampled_from(Color))
TOOL_CALLS = st.lists(
    st.fixed_dictionaries(
        {
            "name": TEXT,
            "args": st.dictionaries(TEXT, st.one_of(TEXT, st.integers(), st.booleans()), max_size=3),
            "id": TEXT,
        }
    ),
    max_size=2,
)
LEAVES = st.one_of(
    HASHABLE_LEAVES,
    st.binary(max_size=16).map(bytearray),
    FIXED,
    ZONES,
    POINTS,
    st.just(PROMPT),
    build(SystemMessage, TEXT),
    build(RemoveMessage, id=TEXT),
    build(ToolMessage, TEXT, tool_call_id=TEXT, status=st.sampled_from(["success", "error"])),
    build(AIMessage, TEXT, tool_calls=TOOL_CALLS, id=st.one_of(st.none(), TEXT)),
)


def plain_containers(children: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    small = {"max_size": 3}
    return st.one_of(
        st.lists(children, **small),
        st.lists(children, **small).map(tuple),
        st.dictionaries(STR_KEYS, children, **small),
        st.dictionaries(HASHABLES, children, **small),
        st.sets(HASHABLES, **small),
        st.frozensets(HASHABLES, **small),
    )


def containers(children: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    plain = plain_containers(children)
    objects = st.one_of(
        build(Box, children, st.lists(POINTS, max_size=2)),
        build(Shelf, st.lists(build(Box, children), max_size=2).map(tuple), TAGS),
        build(
            Person,
            name=TEXT,
            born=st.dates(),
            address=build(Address, street=TEXT, zone=st.one_of(st.none(), ZONES, children)),
            payload=children,
        ),
        build(
            Person,
            name=TEXT,
            born=st.dates(),
            address=build(Address, street=TEXT),
            tags=st.lists(TEXT, max_size=2).map(tuple),
        ),
        build(Flexible, kind=TEXT),
        build(HumanMessage, TEXT, additional_kwargs=st.dictionaries(TEXT, children, max_size=2)),
        build(Document, page_content=TEXT, metadata=st.dictionaries(TEXT, children, max_size=2)),
        build(Send, TEXT, children),
        build(Interrupt, children, id=TEXT),
        build(
            Command,
            update=children,
            resume=st.one_of(st.none(), children),
            goto=st.one_of(TEXT, st.lists(build(Send, TEXT, children), max_size=2)),
        ),
    )
    return st.one_of(plain, plain, objects)


VALUES = st.recursive(LEAVES, containers, max_leaves=12)
PLAIN_VALUES = st.recursive(LEAVES, plain_containers, max_leaves=16)
FAST = hypothesis_settings(
    max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large]
)


# --- C1 --------------------------------------------------------------------------------------


@FAST
@given(VALUES)
def test_c1_nested_values_round_trip_with_their_types(value: Any) -> None:
    assert_same(value, round_trip(value))


@FAST
@given(PLAIN_VALUES)
def test_c1_nested_containers_of_every_leaf_round_trip_with_their_types(value: Any) -> None:
    assert_same(value, round_trip(value))


@FAST
@given(st.lists(DATETIMES, max_size=4), st.lists(TIMES, max_size=4))
def test_c1_datetimes_and_times_keep_wall_clock_fold_and_tzinfo(
    datetimes: list[datetime], times: list[time]
) -> None:
    assert_same(datetimes, round_trip(datetimes))
    assert_same(times, round_trip(times))


def test_c1_every_leaf_kind_round_trips_in_one_state() -> None:
    state = {
        "text": "héllo",
        "huge": 2**80,
        "negative_huge": -(2**70),
        "u64": 2**64 - 1,
        "neg_zero": -0.0,
        "flag": True,
        "nothing": None,
        "raw": b"\x00\xff",
        "buffer": bytearray(b"abc"),
        "naive": datetime(2024, 5, 1, 10, 30),
        "offset": datetime(2024, 5, 1, 10, 30, tzinfo=timezone(timedelta(hours=-5))),
        "named_offset": datetime(2024, 5, 1, 10, 30, tzinfo=timezone(timedelta(hours=5, minutes=30), "IST")),
        "zoned": datetime(2024, 5, 1, 10, 30, tzinfo=PARIS),
        "day": date(2024, 2, 29),
        "clock": time(23, 59, 59, 999999),
        "clock_tz": time(8, 0, tzinfo=timezone(timedelta(hours=2), "CEST")),
        "span": timedelta(days=-3, seconds=5, microseconds=7),
        "tz": timezone(timedelta(hours=-3, minutes=-30)),
        "utc": UTC,
        "zone": PARIS,
        "money": Decimal("-12.3400"),
        "exponent": Decimal("1E+5"),
        "id": uuid.UUID("12345678-1234-5678-1234-567812345678"),
        "color": Color.GREEN,
        "flags": Perm.R | Perm.X,
        "tuple": (1, (2, "3")),
        "set": {1, "a", (2, 3)},
        "frozen": frozenset({Color.RED, uuid.UUID(int=1)}),
        "by_int": {1: "one", 2: "two"},
        "by_tuple": {(1, "a"): [1], (2, "b"): [2]},
        "by_uuid": {uuid.UUID(int=7): "seven"},
        "by_enum": {Color.RED: 1, Priority.HIGH: 2},
        "by_date": {date(2024, 1, 1): "new year"},
        "mixed_keys": {1: "int", "1": "str", (1,): "tuple"},
    }
    assert_same(state, round_trip(state))


@pytest.mark.parametrize(
    "value",
    [
        {"~datetime": "x"},
        {"~tuple": [1, 2]},
        {"~": 1},
        {"~lc": [["langchain", "schema", "messages", "HumanMessage"], {"content": "hi"}]},
        {"outer": {"~dataclass": ["os", "system", {}]}},
        [{"~bytes": "AAAA"}],
        {"~a": 1, "~b": 2},
    ],
    ids=["datetime-marker", "tuple-marker", "bare-tilde", "lc-marker", "nested", "in-list", "two-keys"],
)
def test_c1_dict_whose_key_looks_like_an_envelope_round_trips_as_a_plain_dict(value: Any) -> None:
    assert_same(value, round_trip(value))


def test_c1_plain_dict_shaped_like_langchain_serialization_stays_a_dict() -> None:
    value = {
        "lc": 1,
        "type": "constructor",
        "id": ["langchain", "schema", "messages", "HumanMessage"],
        "kwargs": {"content": "hi"},
    }
    secret = {"lc": 1, "type": "secret", "id": ["HOME"]}
    decoded = round_trip({"doc": value, "secret": secret})
    assert_same({"doc": value, "secret": secret}, decoded)


def test_c1_pydantic_fixed_offset_reads_back_as_datetime_timezone() -> None:
    stamped = Stamped.model_validate({"when": "2024-05-01T10:00:00+02:00"})
    parsed_tz = stamped.when.tzinfo
    assert parsed_tz is not None
    assert type(parsed_tz).__name__ == "TzInfo"  # pydantic_core's own fixed offset

    decoded = round_trip({"model": stamped, "bare_value": stamped.when, "bare_tz": parsed_tz})

    for tz in (decoded["model"].when.tzinfo, decoded["bare_value"].tzinfo, decoded["bare_tz"]):
        assert type(tz) is timezone
        assert tz.utcoffset(None) == timedelta(hours=2)
        assert tz.tzname(None) == parsed_tz.tzname(None)
    assert decoded["model"].when == stamped.when
    assert decoded["bare_value"].replace(tzinfo=None) == datetime(2024, 5, 1, 10, 0)


def test_c1_pydantic_utc_offset_keeps_its_name() -> None:
    stamped = Stamped.model_validate({"when": "2024-05-01T10:00:00Z"})
    decoded = round_trip(stamped.when)
    assert type(decoded.tzinfo) is timezone
    assert decoded.utcoffset() == timedelta(0)
    assert decoded.tzname() == stamped.when.tzname()


def test_c1_nested_and_frozen_dataclasses_keep_init_false_fields_and_frozenness() -> None:
    shelf = Shelf(boxes=(Box("a", [Point(1, 2.5)]), Box(None)), label=Tag("top", Color.RED))
    decoded = round_trip(shelf)
    assert_same(shelf, decoded)
    assert decoded.boxes[0].count == 1  # the init=False field came back
    with pytest.raises(dataclasses.FrozenInstanceError):
        decoded.label.name = "other"  # type: ignore[misc]
    assert hash(decoded.label) == hash(shelf.label)


def test_c1_reading_a_dataclass_runs_none_of_its_code() -> None:
    value = Audited("once")
    AUDIT.clear()
    decoded = round_trip(value)
    assert decoded == value
    assert AUDIT == []


def test_c1_pydantic_models_keep_nesting_frozenness_and_unset_fields() -> None:
    person = Person(name="Ada", born=date(1815, 12, 10), address=Address(street="St James's Square"))
    money = Money(amount=Decimal("9.90"))
    decoded = round_trip({"person": person, "money": money})
    assert_same({"person": person, "money": money}, decoded)
    assert decoded["person"].model_dump(exclude_unset=True) == person.model_dump(exclude_unset=True)
    assert hash(decoded["money"]) == hash(money)


def test_c1_pydantic_extra_fields_and_private_attrs_round_trip() -> None:
    flexible = Flexible(kind="k", seen_at=datetime(2024, 1, 1, tzinfo=PARIS), ids=(1, 2))
    flexible._secret = {"token": b"\x01"}
    decoded = round_trip(flexible)
    assert decoded == flexible
    assert_same(flexible.__pydantic_extra__, decoded.__pydantic_extra__)
    assert_same(flexible.__pydantic_private__, decoded.__pydantic_private__)
    assert decoded._secret == {"token": b"\x01"}


def test_c1_pydantic_extra_fields_stay_in_the_fields_set() -> None:
    # pydantic counts extra fields as set: model_dump(exclude_unset=True) keeps them.
    flexible = Flexible(kind="k", seen_at=date(2024, 1, 1))
    decoded = round_trip(flexible)
    assert decoded.model_fields_set == flexible.model_fields_set
    assert decoded.model_dump(exclude_unset=True) == flexible.model_dump(exclude_unset=True)


def test_c1_langchain_messages_documents_and_prompts_round_trip() -> None:
    messages = [
        SystemMessage("be brief"),
        HumanMessage(
            "when?", id="h1", additional_kwargs={"when": datetime(2024, 3, 31, 2, 30, tzinfo=PARIS)}
        ),
        AIMessage(
            "",
            id="a1",
            tool_calls=[{"name": "lookup", "args": {"q": "x", "n": 2}, "id": "call-1"}],
        ),
        ToolMessage("42", tool_call_id="call-1"),
        RemoveMessage(id="h0"),
    ]
    document = Document(page_content="body", metadata={"source": "s3", "at": date(2024, 1, 1), "k": (1, 2)})
    decoded = round_trip({"messages": messages, "doc": document, "prompt": PROMPT})
    assert_same({"messages": messages, "doc": document, "prompt": PROMPT}, decoded)
    assert decoded["messages"][2].tool_calls[0]["args"] == {"q": "x", "n": 2}
    assert decoded["prompt"].invoke({"persona": "kind", "question": "hi"}) == PROMPT.invoke(
        {"persona": "kind", "question": "hi"}
    )


def test_c1_langgraph_types_round_trip() -> None:
    value = {
        "send": Send("worker", {"job": (1, 2), "at": date(2024, 1, 1)}),
        "interrupt": Interrupt(value={"question": "ok?", "options": {"yes", "no"}}, id="int-1"),
        "schema_interrupt": Interrupt(value="age?", id="int-2", response_schema={"type": "integer"}),
        "command": Command(update={"n": Decimal("1.5")}, goto=[Send("a", 1), Send("b", (2,))]),
        "resume": Command(resume={"int-1": "yes"}),
        "parent": Command(graph=Command.PARENT, goto="next"),
    }
    assert_same(value, round_trip(value))


# --- C2 --------------------------------------------------------------------------------------


def refusal(value: Any) -> CheckpointSerializationError:
    with pytest.raises(CheckpointSerializationError) as caught:
        CODEC.encode(value)
    return caught.value


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), float("-inf")], ids=["nan", "inf", "-inf"])
def test_c2_nan_and_infinite_floats_are_refused_with_their_path(bad: float) -> None:
    error = refusal({"channel": {"messages": ["a", "b", bad]}})
    assert error.path == "channel.messages[2]"
    assert error.path in str(error)
    assert error.code == "CODEC_001"


def test_c2_arbitrary_object_is_refused_with_its_path() -> None:
    assert refusal({"a": {"b": [1, object()]}}).path == "a.b[1]"


@pytest.mark.parametrize(
    ("value", "path"),
    [
        ({"x y": object()}, "['x y']"),
        ({"ok": {1: object()}}, "ok[1]"),
        ({"t": (1, (2, float("nan")))}, "t[1][1]"),
        ({"s": {object()}}, "s[0]"),
        ({"points": [Point(1, 2.0), Point(3, float("inf"))]}, "points[1].y"),
        (
            {"person": Person(name="a", born=date(2000, 1, 1), address=Address(street="s", zone=object()))},
            "person.address.zone",
        ),
        ({"send": [Send("n", {"arg": object()})]}, "send[0].arg"),
    ],
    ids=["non-identifier-key", "int-key", "tuple", "set", "dataclass-field", "model-field", "send-arg"],
)
def test_c2_refusal_path_names_the_location(value: Any, path: str) -> None:
    assert refusal(value).path == path


def test_c2_path_through_a_message_matches_the_spec_example() -> None:
    messages = [HumanMessage(str(i)) for i in range(3)]
    messages.append(HumanMessage("x", additional_kwargs={"when": datetime(2024, 1, 1, tzinfo=Shifted())}))
    error = refusal({"channel_values": {"messages": messages}})
    assert error.path == "channel_values.messages[3].additional_kwargs.when"


def test_c1_classes_defined_inside_a_function_round_trip_in_the_process_that_stored_them() -> None:
    @dataclass
    class LocalPoint:
        x: int

    class LocalColor(enum.Enum):
        RED = 1

    class LocalModel(BaseModel):
        x: int
        color: LocalColor

    value = {
        "state": {
            "point": LocalPoint(1),
            "color": LocalColor.RED,
            "model": LocalModel(x=1, color=LocalColor.RED),
        }
    }
    assert_same(value, round_trip(value))


def test_c3_a_class_defined_inside_a_function_this_process_never_stored_fails_the_read() -> None:
    stored = {"~dataclass": [__name__, "elsewhere.<locals>.Point", {"x": 1}]}
    with pytest.raises(CheckpointSerializationError) as caught:
        CODEC.decode(orjson.dumps({"state": stored}))
    assert caught.value.path == "state"
    assert "define the class at module level" in caught.value.reason


def test_c2_subclass_of_a_langchain_message_is_refused() -> None:
    error = refusal({"messages": [HumanMessage("ok"), MyMsg("custom")]})
    assert error.path == "messages[1]"
    assert "MyMsg" in error.reason


@pytest.mark.parametrize(
    "value",
    [datetime(2024, 1, 1, tzinfo=Shifted()), time(10, 0, tzinfo=Shifted()), Shifted()],
    ids=["datetime", "time", "bare"],
)
def test_c2_custom_tzinfo_is_refused(value: Any) -> None:
    assert refusal({"when": value}).path == "when"


def _zone_file() -> Path:
    for root in zoneinfo.TZPATH:
        candidate = Path(root) / "Europe" / "Paris"
        if candidate.is_file():
            return candidate
    import importlib.resources

    return Path(str(importlib.resources.files("tzdata.zoneinfo") / "Europe" / "Paris"))


def test_c2_zone_read_from_a_file_is_refused() -> None:
    with _zone_file().open("rb") as handle:
        keyless = ZoneInfo.from_file(handle)
    assert keyless.key is None
    assert refusal({"when": datetime(2024, 1, 1, tzinfo=keyless)}).path == "when"
    assert refusal({"zone": keyless}).path == "zone"
    assert refusal({"at": time(9, 0, tzinfo=keyless)}).path == "at"


class Count(int):
    pass


class Ratio(float):
    pass


class Row(list[int]):
    pass


@pytest.mark.parametrize(
    ("value", "nearest"),
    [
        (Name("alice"), "alice"),
        (Count(3), 3),
        (Ratio(0.5), 0.5),
        (Row([1, 2]), [1, 2]),
        (Pair(1, 2), (1, 2)),
        (collections.OrderedDict(a=1), {"a": 1}),
        (collections.defaultdict(list, a=[1]), {"a": [1]}),
        (collections.Counter("aab"), {"a": 2, "b": 1}),
    ],
    ids=["str", "int", "float", "list", "namedtuple", "ordereddict", "defaultdict", "counter"],
)
def test_c1_subclass_of_a_builtin_reads_back_as_the_builtin(value: Any, nearest: Any) -> None:
    decoded = round_trip({"v": [value], value if isinstance(value, str) else "k": value})
    assert_same({"v": [nearest], nearest if isinstance(nearest, str) else "k": nearest}, decoded)


def test_c2_a_subclass_that_is_not_finite_is_still_refused() -> None:
    assert refusal({"v": Ratio("nan")}).path == "v"


@pytest.mark.parametrize(
    "value",
    [collections.deque([1]), range(3), {"a": 1}.keys()],
    ids=["deque", "range", "keys-view"],
)
def test_c2_other_types_are_refused(value: Any) -> None:
    assert refusal({"v": [value]}).path == "v[0]"


def encode_or_refusal(value: Any) -> bytes | CheckpointSerializationError:
    """The encoding, or the CheckpointSerializationError refusing it (any other error fails)."""
    try:
        return CODEC.encode(value)
    except CheckpointSerializationError as error:
        return error


def test_c2_deeply_nested_value_is_stored_or_refused_with_a_serialization_error() -> None:
    # JSON writers have a depth limit; a value past it must not escape as another error type.
    value: list[Any] = []
    for _ in range(300):
        value = [value]
    outcome = encode_or_refusal({"deep": value})
    if not isinstance(outcome, CheckpointSerializationError):
        assert CODEC.decode(outcome) == {"deep": value}


def test_c2_string_with_a_lone_surrogate_is_stored_or_refused_with_its_path() -> None:
    # A Python str may hold a lone surrogate (e.g. from json.loads('"\\ud83d"')); UTF-8 cannot.
    value = {"msg": {"content": "half an emoji \ud83d"}}
    outcome = encode_or_refusal(value)
    if isinstance(outcome, CheckpointSerializationError):
        assert outcome.path == "msg.content"
    else:
        assert CODEC.decode(outcome) == value


# --- C3 --------------------------------------------------------------------------------------


def test_c3_ambiguous_wall_time_keeps_fold_and_follows_the_zone() -> None:
    # 2024-10-27 02:30 happens twice in Paris; fold=1 is the second (CET, +01:00).
    second = datetime(2024, 10, 27, 2, 30, tzinfo=PARIS, fold=1)
    first = second.replace(fold=0)
    decoded_second, decoded_first = round_trip([second, first])

    assert decoded_second.fold == 1
    assert decoded_first.fold == 0
    assert decoded_second.utcoffset() == timedelta(hours=1)
    assert decoded_first.utcoffset() == timedelta(hours=2)
    assert decoded_second.astimezone(UTC) == second.astimezone(UTC)
    assert isinstance(decoded_second.tzinfo, ZoneInfo)
    assert decoded_second.tzinfo.key == "Europe/Paris"

    # Still follows the zone's rules: half a year later it is summer time again.
    later = decoded_second + timedelta(days=160)
    assert later == second + timedelta(days=160)
    assert later.utcoffset() == timedelta(hours=2)
    assert later.astimezone(UTC) == (second + timedelta(days=160)).astimezone(UTC)


def test_c3_arithmetic_across_spring_forward_matches_the_original() -> None:
    before = datetime(2024, 3, 30, 12, 0, tzinfo=PARIS)
    decoded = round_trip(before)
    assert decoded.utcoffset() == timedelta(hours=1)
    after = decoded + timedelta(days=1)
    assert after.utcoffset() == timedelta(hours=2)
    assert after.astimezone(UTC) == (before + timedelta(days=1)).astimezone(UTC)


def test_c3_time_keeps_fold_and_tzinfo() -> None:
    value = [time(2, 30, fold=1, tzinfo=PARIS), time(2, 30, tzinfo=timezone(timedelta(hours=1), "CET"))]
    assert_same(value, round_trip(value))


def read_failure(data: bytes) -> CheckpointSerializationError:
    """The CheckpointSerializationError decoding ``data`` raises; a returned value fails the test."""
    try:
        result = CODEC.decode(data)
    except CheckpointSerializationError as error:
        return error
    pytest.fail(f"decode returned {result!r} instead of failing")


def test_c3_zone_key_the_host_lacks_fails_the_read() -> None:
    data = orjson.dumps({"~datetime": ["2024-01-01T00:00:00", {"~zoneinfo": "Nowhere/Atlantis"}, 0]})
    assert "Nowhere/Atlantis" in str(read_failure(data))
    assert "Nowhere/Atlantis" in str(read_failure(orjson.dumps({"~zoneinfo": "Nowhere/Atlantis"})))


def test_c3_read_failure_names_the_path() -> None:
    data = orjson.dumps({"channel": {"items": [1, {"~zoneinfo": "Nowhere/Atlantis"}]}})
    assert read_failure(data).path == "channel.items[1]"


@pytest.mark.parametrize(
    "payload",
    [
        {"~nope": 1},
        {"~datetime": 5},
        {"~datetime": ["not a date", None, 0]},
        {"~datetime": ["2024-01-01T00:00:00", None, 2]},
        {"~datetime": ["2024-01-01T00:00:00", {"~bogus": 1}, 0]},
        {"~timezone": [999999, None]},
        {"~date": "2024-13-01"},
        {"~time": ["25:00", None, 0]},
        {"~timedelta": "soon"},
        {"~decimal": "twelve"},
        {"~uuid": "not-a-uuid"},
        {"~bytes": "!!!"},
        {"~int": "forty"},
        {"~tuple": 5},
        {"~set": [[1]]},
        {"~dict": [[1]]},
        {"~exc": "boom"},
        {"~enum": ["tests.codec.test_faithful", "Color", "purple"]},
        {"~enum": ["tests.codec.test_faithful", "Gone", "red"]},
        {"~dataclass": ["tests.codec.test_faithful", "Color", {}]},
        {"~model": ["tests.codec.test_faithful", "Point", {}]},
        {"~lc": [["langchain", "schema", "messages", "NoSuchMessage"], {"content": "x"}]},
        {"~lc": "HumanMessage"},
    ],
)
def test_c3_envelope_that_cannot_be_read_back_fails_the_read(payload: Any) -> None:
    read_failure(orjson.dumps({"state": [payload]}))


@pytest.mark.parametrize(
    "payload",
    [
        {"~send": "node"},
        {"~tuple": "abc"},
        {"~set": "abc"},
        {"~dict": ["ab"]},
        {"~exc": {"id": "abc", "message": "m"}},
        {"~datetime": ["2024-01-01T00:00:00+05:00", None, 0]},
    ],
    ids=["send-as-str", "tuple-as-str", "set-as-str", "dict-pair-as-str", "exc-id-as-str", "offset-in-naive"],
)
def test_c3_envelope_payload_of_the_wrong_shape_fails_the_read(payload: Any) -> None:
    # Indexing or iterating a string payload must not yield a plausible but wrong value.
    read_failure(orjson.dumps({"state": [payload]}))


@pytest.mark.parametrize(
    "data", [b"\x80not json", b"{", b"", b"[1, 2"], ids=["binary", "open", "empty", "cut"]
)
def test_c3_non_json_bytes_fail_the_read(data: bytes) -> None:
    read_failure(data)


def test_c3_deeply_nested_bytes_read_back_or_fail_with_a_serialization_error() -> None:
    plain = b"[" * 200 + b"]" * 200
    nested: Any = []
    for _ in range(199):
        nested = [nested]
    assert CODEC.decode(plain) == nested
    read_failure(b'{"~tuple":' * 900 + b"[]" + b"}" * 900)


# --- C4 --------------------------------------------------------------------------------------


def _raise_step_failed(**attrs: Any) -> StepFailed:
    try:
        try:
            raise TimeoutError("upstream timed out")
        except TimeoutError as timeout:
            raise StepFailed("step fetch failed", **attrs) from timeout
    except StepFailed as exc:
        return exc


def test_c4_exception_is_stored_as_a_record_and_read_back() -> None:
    at = datetime(2024, 5, 1, 9, 0, tzinfo=PARIS)
    handle = Opaque()
    exc = _raise_step_failed(attempts=3, at=at, handle=handle, inner=ValueError("bad row 7"))

    text = round_trip({"error": exc})["error"]

    # What LangGraph's serializer stores for an exception: its repr, a str.
    assert isinstance(text, str)
    assert text == repr(exc) == "StepFailed('step fetch failed')"
    decoded = CheckpointedException.of(text)
    assert type(decoded) is CheckpointedException
    assert decoded.text == text
    assert decoded.id == ["tests", "codec", "test_faithful", "StepFailed"]
    assert decoded.exc_type == "tests.codec.test_faithful.StepFailed"
    assert decoded.message == "step fetch failed"
    assert decoded.kwargs["attempts"] == 3
    assert_same(at, decoded.kwargs["at"])
    assert decoded.kwargs["handle"] == repr(handle) == "<Opaque handle>"
    assert decoded.repr_kwargs == ["handle"]
    inner = decoded.kwargs["inner"]
    assert type(inner) is CheckpointedException
    assert inner.id == ["builtins", "ValueError"]
    assert inner.message == "bad row 7"
    assert type(decoded.cause) is CheckpointedException
    assert decoded.cause.id == ["builtins", "TimeoutError"]
    assert decoded.cause.message == "upstream timed out"
    assert decoded.cause.cause is None
    assert decoded.__cause__ is decoded.cause


def test_c4_record_has_the_documented_shape() -> None:
    exc = _raise_step_failed(step="fetch", attempts=3)
    record = CODEC.to_json(exc)["~exc"]  # type: ignore[index]
    assert record == {
        "id": ["tests", "codec", "test_faithful", "StepFailed"],
        "message": "step fetch failed",
        "repr": "StepFailed('step fetch failed')",
        "kwargs": {"step": "fetch", "attempts": 3},
        "repr_kwargs": [],
        "cause": {
            "id": ["builtins", "TimeoutError"],
            "message": "upstream timed out",
            "repr": "TimeoutError('upstream timed out')",
            "kwargs": {},
            "repr_kwargs": [],
            "cause": None,
        },
    }


def test_c4_a_record_stored_without_its_text_reads_back_as_the_repr_of_its_message() -> None:
    record = {"id": ["builtins", "ValueError"], "message": "Input is too large", "kwargs": {}, "cause": None}
    text = CODEC.decode(orjson.dumps({"~exc": record}))
    assert text == "ValueError('Input is too large')"
    assert CheckpointedException.of(text) == CheckpointedException(
        ["builtins", "ValueError"], "Input is too large"
    )
    assert CheckpointedException.of("ValueError('Input is too large')") is None


def test_c4_exception_text_survives_pickle_and_copy() -> None:
    text = round_trip(_raise_step_failed(attempts=3))
    for again in (pickle.loads(pickle.dumps(text)), copy.deepcopy(text), copy.copy(text)):
        assert again == text
        assert CheckpointedException.of(again) == CheckpointedException.of(text)


def test_c4_implicit_context_is_the_cause() -> None:
    try:
        try:
            {}["missing"]
        except KeyError:
            raise StepFailed("lookup failed")  # noqa: B904
    except StepFailed as exc:
        caught = exc
    decoded = CheckpointedException.of(round_trip(caught))
    assert decoded is not None
    assert decoded.cause is not None
    assert decoded.cause.id == ["builtins", "KeyError"]


def test_c4_raise_from_none_has_no_cause() -> None:
    try:
        try:
            {}["missing"]
        except KeyError:
            raise StepFailed("lookup failed") from None
    except StepFailed as exc:
        caught = exc
    decoded = CheckpointedException.of(round_trip(caught))
    assert decoded is not None
    assert decoded.cause is None


def test_c4_cause_chain_is_kept_in_order() -> None:
    try:
        try:
            try:
                raise ConnectionResetError("reset")
            except ConnectionResetError as reset:
                raise TimeoutError("timed out") from reset
        except TimeoutError as timeout:
            raise StepFailed("gave up") from timeout
    except StepFailed as exc:
        caught = exc
    decoded = CheckpointedException.of(round_trip(caught))
    chain = []
    node: CheckpointedException | None = decoded
    while node is not None:
        chain.append(node.id[-1])
        node = node.cause
    assert chain == ["StepFailed", "TimeoutError", "ConnectionResetError"]


def test_c4_cause_is_kept_when_the_exception_also_holds_it_as_an_attribute() -> None:
    # A common shape: raise Wrapped(original=e) from e.
    try:
        try:
            raise TimeoutError("upstream timed out")
        except TimeoutError as timeout:
            raise StepFailed("step failed", original=timeout) from timeout
    except StepFailed as exc:
        caught = exc
    decoded = CheckpointedException.of(round_trip(caught))
    assert decoded is not None
    assert decoded.kwargs["original"].id == ["builtins", "TimeoutError"]
    assert decoded.cause is not None
    assert decoded.cause.id == ["builtins", "TimeoutError"]


def test_c4_checkpointed_exception_re_encodes_to_an_equal_value() -> None:
    exc = _raise_step_failed(attempts=3, at=date(2024, 1, 1), handle=Opaque(), inner=KeyError("k"))
    text = round_trip(exc)
    again_text = round_trip(text)
    assert again_text == text == repr(exc)
    decoded, again = CheckpointedException.of(text), CheckpointedException.of(again_text)
    assert decoded is not None
    assert again is not None
    assert again == decoded
    assert again.cause == decoded.cause
    assert again.kwargs["inner"] == decoded.kwargs["inner"]
    assert_same(decoded.kwargs["at"], again.kwargs["at"])
    assert CODEC.encode(text) == CODEC.encode(decoded) == CODEC.encode(exc)


# --- C6 --------------------------------------------------------------------------------------


@pytest.fixture
def calls(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Replace os.system and subprocess.Popen with recorders; the test asserts they stay unused."""
    import os
    import subprocess

    seen: list[str] = []
    monkeypatch.setattr(os, "system", lambda *a, **k: seen.append("os.system"))
    monkeypatch.setattr(subprocess, "Popen", lambda *a, **k: seen.append("subprocess.Popen"))
    return seen


@pytest.mark.parametrize(
    "payload",
    [
        {"~dataclass": ["subprocess", "Popen", {"args": "echo pwned"}]},
        {"~enum": ["os", "system", "echo pwned"]},
        {"~model": ["os", "system", {}]},
        {"~model": ["subprocess", "Popen", {"args": "echo pwned"}, {}, {}, []]},
        {"~dataclass": ["os", "path.__class__", {}]},
        {"~dataclass": ["builtins", "object.__subclasses__", {}]},
        {"~enum": ["tests.codec.test_faithful", "Color.__init__.__globals__", "x"]},
        {"~lc": [["langchain_openai", "ChatOpenAI"], {"model": "gpt-4o"}]},
        {"~lc": [["langchain", "chat_models", "openai", "ChatOpenAI"], {"model": "gpt-4o"}]},
        {"~lc": [["langchain", "schema", "runnable", "RunnableLambda"], {}]},
        {"~lc": [["os", "system"], {"command": "echo pwned"}]},
    ],
)
def test_c6_crafted_payloads_import_and_call_nothing(payload: Any, calls: list[str]) -> None:
    modules_before = set(sys.modules)
    read_failure(orjson.dumps({"state": payload}))
    assert calls == []
    assert set(sys.modules) - modules_before == set()


@pytest.fixture
def scratch_modules(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A directory on sys.path for modules a test writes; whatever it imported is forgotten after."""
    monkeypatch.syspath_prepend(str(tmp_path))
    yield tmp_path
    for name in [n for n, m in sys.modules.items() if str(tmp_path) in str(getattr(m, "__file__", None))]:
        del sys.modules[name]


def _probe_module(root: Path) -> tuple[str, Path]:
    """A module, not imported yet, whose import writes a marker file."""
    name = f"tk_c6_probe_{uuid.uuid4().hex}"
    marker = root / f"{name}.marker"
    (root / f"{name}.py").write_text(
        "import dataclasses, pathlib\n"
        f"pathlib.Path({str(marker)!r}).write_text('imported')\n"
        "@dataclasses.dataclass\n"
        "class Thing:\n"
        "    x: int\n"
    )
    return name, marker


def test_c6_class_in_a_module_not_imported_yet_is_not_imported(scratch_modules: Path) -> None:
    name, marker = _probe_module(scratch_modules)
    data = orjson.dumps({"~dataclass": [name, "Thing", {"x": 1}]})
    error = read_failure(data)
    assert name in str(error)
    assert not marker.exists()
    assert name not in sys.modules
    # An allowlist entry for another class of that module does not open the module.
    other_class_allowed = FaithfulCodec(allowlist=[(name, "Other")])
    with pytest.raises(CheckpointSerializationError):
        other_class_allowed.decode(data)
    assert not marker.exists()
    assert name not in sys.modules


@pytest.mark.parametrize("entry", ["module", "class"])
def test_c6_allowlisted_module_may_be_imported(scratch_modules: Path, entry: str) -> None:
    name, marker = _probe_module(scratch_modules)
    allowlist = [(name,)] if entry == "module" else [(name, "Thing")]
    codec = FaithfulCodec(allowlist=allowlist)
    decoded = codec.decode(orjson.dumps({"~dataclass": [name, "Thing", {"x": 1}]}))
    assert marker.exists()
    assert name in sys.modules
    assert type(decoded) is sys.modules[name].Thing
    assert decoded.x == 1


def test_c6_name_lookup_never_runs_a_module_level_getattr(scratch_modules: Path) -> None:
    # Many packages (langchain_core.language_models, pydantic, ...) import submodules lazily
    # from a module-level __getattr__; looking a stored name up must not trigger it.
    package = f"tk_c6_lazy_{uuid.uuid4().hex}"
    marker = scratch_modules / "heavy.marker"
    root = scratch_modules / package
    root.mkdir()
    (root / "__init__.py").write_text(
        "import importlib\n"
        "def __getattr__(name):\n"
        "    return getattr(importlib.import_module(__name__ + '.heavy'), name)\n"
    )
    (root / "heavy.py").write_text(
        f"import pathlib\npathlib.Path({str(marker)!r}).write_text('imported')\nclass Heavy:\n    pass\n"
    )
    __import__(package)  # the application imported the package itself: it is "already imported"

    read_failure(orjson.dumps({"~dataclass": [package, "Heavy", {}]}))

    assert not marker.exists()
    assert f"{package}.heavy" not in sys.modules


def test_c6_round_trip_uses_no_pickle(monkeypatch: pytest.MonkeyPatch) -> None:
    def forbidden(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("pickle was used")

    for name in ("loads", "dumps", "load", "dump", "Pickler", "Unpickler"):
        monkeypatch.setattr(pickle, name, forbidden)
    value = {
        "messages": [HumanMessage("hi"), AIMessage("", tool_calls=[{"name": "f", "args": {}, "id": "1"}])],
        "shelf": Shelf(boxes=(Box({1, 2}, [Point(1, 1.5)]),), label=Tag("t", Color.GREEN)),
        "person": Person(name="n", born=date(2000, 1, 1), address=Address(street="s", zone=PARIS)),
        "when": datetime(2024, 10, 27, 2, 30, tzinfo=PARIS, fold=1),
        "error": _raise_step_failed(handle=Opaque()),
        "keys": {(1, 2): Decimal("3.14"), uuid.UUID(int=5): b"\x00"},
        "send": Send("n", frozenset({1})),
        "command": Command(goto="x", update={"a": (1,)}),
    }
    decoded = round_trip(value)
    error = decoded.pop("error")
    expected = dict(value)
    expected.pop("error")
    assert_same(expected, decoded)
    assert error == "StepFailed('step fetch failed')"
    assert CheckpointedException.of(error).id[-1] == "StepFailed"  # type: ignore[union-attr]
