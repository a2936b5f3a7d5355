"""SPEC C6, C7: with LLM_PROVIDER_CHECKPOINT_CODEC=msgpack a stored value imports and calls
nothing it names outside LangGraph's safe types, the graph's own (imported) classes and the
allowlist; the read fails instead, naming it. LLM_PROVIDER_CHECKPOINT_MSGPACK_STRICT=false
reads as LangGraph does by default.

The hostile values are what anyone with write access to the store could plant: LangGraph's
own msgpack extensions, naming ``os.system`` or a module that has a side effect on import.
"""

from __future__ import annotations

import asyncio
import dataclasses
import sys
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypedDict

import ormsgpack
import pytest
from langgraph.checkpoint.base import empty_checkpoint
from langgraph.graph import END, START, StateGraph
from pydantic import BaseModel

from tests.providers import Opener
from threadkeep import CheckpointSerializationError, Settings
from threadkeep.codec import build_serde, with_allowlist
from threadkeep.codec.msgpack import StrictMsgpackSerializer

MSGPACK = Settings(codec="msgpack")
# LangGraph's msgpack extension codes (langgraph.checkpoint.serde.jsonplus, its stored format)
CALL_ONE_ARG, CALL_KWARGS, CALL_METHOD = 0, 2, 3


def extension(code: int, *fields: Any) -> bytes:
    """A stored ``msgpack`` value: one LangGraph extension holding ``fields``."""
    return ormsgpack.packb(ormsgpack.Ext(code, ormsgpack.packb(list(fields))))


@dataclasses.dataclass
class Booking:
    room: str
    nights: int


class Guest(BaseModel):
    name: str
    vip: bool = False


class Hostile:
    """A writer's serializer that stores ``payload`` as every pending write's value."""

    def __init__(self, payload: bytes) -> None:
        self.payload = payload
        self.plain = build_serde("msgpack")

    def dumps_typed(self, obj: Any) -> tuple[str, bytes]:
        return ("msgpack", self.payload) if obj == "hostile" else self.plain.dumps_typed(obj)

    def loads_typed(self, data: tuple[str, bytes]) -> Any:
        return self.plain.loads_typed(data)


@dataclasses.dataclass
class Probe:
    """What a hostile value would leave behind if it ran: a file, or a module imported."""

    marker: Path
    module: str

    def untouched(self) -> bool:
        return not self.marker.exists() and self.module not in sys.modules


@pytest.fixture
def probe(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Probe]:
    """A module on sys.path, not imported, that writes the marker file when imported."""
    module = f"tk_side_effect_{uuid.uuid4().hex}"
    marker = tmp_path / "marker"
    source = (
        f"import dataclasses, pathlib\npathlib.Path({str(marker)!r}).write_text('imported')\n"
        "@dataclasses.dataclass\nclass Thing:\n    x: int = 0\n"
    )
    (tmp_path / f"{module}.py").write_text(source)
    monkeypatch.syspath_prepend(str(tmp_path))
    yield Probe(marker, module)
    sys.modules.pop(module, None)


def payloads(probe: Probe) -> dict[str, bytes]:
    return {
        "os.system": extension(CALL_ONE_ARG, "os", "system", f"touch {probe.marker}"),
        "import": extension(CALL_KWARGS, probe.module, "Thing", {"x": 1}),
    }


def plant(open_saver: Opener, payload: bytes) -> dict[str, Any]:
    """A checkpoint of thread ``t`` with a pending write whose stored value is ``payload``."""
    writer = open_saver(settings=MSGPACK, serde=Hostile(payload))
    start = {"configurable": {"thread_id": "t", "checkpoint_ns": ""}}
    config: dict[str, Any] = writer.put(start, empty_checkpoint(), {"source": "loop", "step": 0}, {})
    writer.put_writes(config, [("x", "hostile")], "task-1")
    return config


class State(TypedDict, total=False):
    x: int
    booking: Booking
    guest: Guest


def graph_of(saver: Any) -> Any:
    def book(state: State) -> dict[str, Any]:
        return {"booking": Booking("12", state["x"]), "guest": Guest(name="Ada", vip=True)}

    builder = StateGraph(State)
    builder.add_node("book", book)
    builder.add_edge(START, "book")
    builder.add_edge("book", END)
    return builder.compile(checkpointer=saver)


def reads(saver: Any, config: dict[str, Any]) -> dict[str, Callable[[], Any]]:
    """Every way a reader meets the planted write: list, get_tuple, get_state; sync, async."""
    graph = graph_of(saver)

    async def alist() -> list[Any]:
        return [item async for item in saver.alist(None)]

    return {
        "list": lambda: list(saver.list(None)),
        "get_tuple": lambda: saver.get_tuple(config),
        "get_state": lambda: graph.get_state(config),
        "alist": lambda: asyncio.run(alist()),
        "aget_tuple": lambda: asyncio.run(saver.aget_tuple(config)),
        "aget_state": lambda: asyncio.run(graph.aget_state(config)),
    }


READS = ["list", "get_tuple", "get_state", "alist", "aget_tuple", "aget_state"]


@pytest.mark.providers("sqlite", "postgres")
@pytest.mark.parametrize("read", READS)
@pytest.mark.parametrize("payload", ["os.system", "import"])
def test_c6_a_stored_msgpack_value_naming_a_call_or_a_module_is_refused_and_never_run(
    open_saver: Opener, probe: Probe, payload: str, read: str
) -> None:
    config = plant(open_saver, payloads(probe)[payload])
    reader = open_saver(settings=MSGPACK)
    with pytest.raises(CheckpointSerializationError) as caught:
        reads(reader, config)[read]()
    named = "os.system" if payload == "os.system" else f"{probe.module}.Thing"
    assert named in caught.value.message
    assert "with_allowlist" in caught.value.message
    assert "LLM_PROVIDER_CHECKPOINT_MSGPACK_STRICT=false" in caught.value.message
    assert caught.value.path.startswith("pending_writes")
    assert probe.untouched()


@pytest.mark.providers("sqlite", "postgres")
@pytest.mark.parametrize("api", ["sync", "async"])
def test_c6_the_graphs_own_state_types_round_trip_under_strict_msgpack(open_saver: Opener, api: str) -> None:
    config = {"configurable": {"thread_id": f"book-{api}"}}
    writer = graph_of(open_saver(settings=MSGPACK))
    if api == "sync":
        writer.invoke({"x": 3}, config)
    else:
        asyncio.run(writer.ainvoke({"x": 3}, config))
    reader = graph_of(open_saver(settings=MSGPACK))  # a saver that has read nothing yet
    state = reader.get_state(config) if api == "sync" else asyncio.run(reader.aget_state(config))
    assert state.values == {"x": 3, "booking": Booking("12", 3), "guest": Guest(name="Ada", vip=True)}
    assert type(state.values["booking"]) is Booking
    assert type(state.values["guest"]) is Guest


@pytest.mark.providers("sqlite", "postgres")
def test_c7_the_opt_out_reads_as_langgraph_does_by_default(open_saver: Opener, probe: Probe) -> None:
    config = plant(open_saver, payloads(probe)["import"])
    settings = Settings.from_env(
        {"LLM_PROVIDER_CHECKPOINT_CODEC": "msgpack", "LLM_PROVIDER_CHECKPOINT_MSGPACK_STRICT": "false"}
    )
    assert settings.msgpack_strict is False
    with pytest.raises(CheckpointSerializationError):
        open_saver(settings=MSGPACK).get_tuple(config)
    assert probe.untouched()
    permissive = open_saver(settings=settings).get_tuple(config)
    ((_, _, value),) = permissive.pending_writes
    assert type(value) is sys.modules[probe.module].Thing  # imported and built, as LangGraph does
    assert probe.marker.read_text() == "imported"


# --- without a server ------------------------------------------------------------------------


def test_c6_strict_is_the_default_and_refuses_a_method_call_too(probe: Probe) -> None:
    serde = build_serde("msgpack")
    assert isinstance(serde.inner, StrictMsgpackSerializer)
    for payload in payloads(probe).values():
        with pytest.raises(CheckpointSerializationError, match="neither imported nor called"):
            serde.loads_typed(("msgpack", payload))
    method = extension(CALL_METHOD, "os", "system", f"touch {probe.marker}", "__call__")
    with pytest.raises(CheckpointSerializationError, match=r"calls os\.system\.__call__"):
        serde.loads_typed(("msgpack", method))
    nested = ormsgpack.packb(
        {"ok": [1, ormsgpack.Ext(CALL_ONE_ARG, ormsgpack.packb(["os", "system", "true"]))]}
    )
    with pytest.raises(CheckpointSerializationError, match=r"os\.system"):
        serde.loads_typed(("msgpack", nested))
    assert probe.untouched()


def test_c6_an_allowlisted_class_is_imported_and_built(probe: Probe) -> None:
    stored = ("msgpack", payloads(probe)["import"])
    allowed = with_allowlist(build_serde("msgpack"), [(probe.module, "Thing")])
    thing = allowed.loads_typed(stored)
    assert type(thing) is sys.modules[probe.module].Thing
    assert thing.x == 1


def test_c6_langgraphs_safe_types_and_imported_state_classes_read_back() -> None:
    from datetime import UTC, datetime
    from decimal import Decimal

    from langchain_core.messages import AIMessage, HumanMessage

    value = {
        "messages": [HumanMessage("hi", id="h"), AIMessage("hello", id="a")],
        "when": datetime(2026, 1, 2, tzinfo=UTC),
        "amount": Decimal("1.10"),
        "booking": Booking("7", 2),
        "guest": Guest(name="Lin"),
    }
    serde = build_serde("msgpack")
    stored = serde.dumps_typed(value)
    for reader in (serde, build_serde("msgpack")):  # twice on one serializer, and afresh
        for _ in range(2):
            assert reader.loads_typed(stored) == value


def test_c7_the_strict_setting_defaults_to_true_and_refuses_a_non_boolean() -> None:
    from threadkeep import ConfigurationError

    assert Settings.from_env({}).msgpack_strict is True
    assert Settings.from_env({"LLM_PROVIDER_CHECKPOINT_MSGPACK_STRICT": "no"}).msgpack_strict is False
    with pytest.raises(ConfigurationError, match="LLM_PROVIDER_CHECKPOINT_MSGPACK_STRICT"):
        Settings.from_env({"LLM_PROVIDER_CHECKPOINT_MSGPACK_STRICT": "maybe"})
