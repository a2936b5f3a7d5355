"""LangGraph's msgpack serializer, read strictly (SPEC C6, C7).

``LLM_PROVIDER_CHECKPOINT_CODEC=msgpack`` stores values with LangGraph's ``JsonPlusSerializer``.
By default its reader rebuilds a stored object by importing the module the value names and
calling the attribute it names: whoever can write to the store can make the next read run
``os.system``. :class:`StrictMsgpackSerializer` reads with LangGraph's strict allowlist and
fails a read that allowlist refused, naming what it refused; nothing refused is imported or
called (LangGraph checks before it imports). A read builds:

- LangGraph's safe types (datetimes, UUIDs, decimals, LangChain messages, its own types);
- the classes of the allowlist (``with_allowlist``: what ``StateGraph.compile`` passes under
  ``LANGGRAPH_STRICT_MSGPACK``, or what an application adds);
- as the faithful codec does, enum, dataclass and pydantic classes of modules already imported
  (a graph's state types are imported by the graph that uses them). LangGraph's reader builds
  them by calling the class, as it does every class it allows.

Refusals are learned from LangGraph's serde events (``register_serde_event_listener``), which
it emits as it refuses; a read notes those of its own thread or task only.
"""

from __future__ import annotations

import dataclasses
import enum
import inspect
import sys
from collections.abc import Collection
from contextvars import ContextVar
from typing import Any, Final

from langgraph.checkpoint.serde.event_hooks import SerdeEvent, register_serde_event_listener
from langgraph.checkpoint.serde.jsonplus import JsonPlusSerializer
from pydantic import BaseModel

from threadkeep.errors import CheckpointSerializationError

__all__ = ["STRICT_VARIABLE", "StrictMsgpackSerializer"]

STRICT_VARIABLE: Final = "LLM_PROVIDER_CHECKPOINT_MSGPACK_STRICT"
_REFUSALS: Final = frozenset({"msgpack_blocked", "msgpack_method_blocked"})
# The refusals LangGraph reported during the read in progress (None: no strict read is).
_REFUSED: Final[ContextVar[list[SerdeEvent] | None]] = ContextVar("threadkeep_msgpack_refused", default=None)


def _note_refusal(event: SerdeEvent) -> None:
    refused = _REFUSED.get()
    if refused is not None and event["kind"] in _REFUSALS:
        refused.append(event)


register_serde_event_listener(_note_refusal)


class StrictMsgpackSerializer:
    """LangGraph's ``JsonPlusSerializer``, writing as it does and reading strictly.

    Args:
        allowlist: Classes reads may also import and build: ``(module, name)`` or the class.
    """

    def __init__(self, allowlist: Collection[tuple[str, ...] | type] = ()) -> None:
        self.allowlist: frozenset[tuple[str, ...]] = frozenset(_key(entry) for entry in allowlist)
        self.serde = JsonPlusSerializer(allowed_msgpack_modules=tuple(self.allowlist) or None)
        # self.serde, also allowing the imported classes reads have met so far
        self._reader = self.serde

    def with_allowlist(self, extra: Collection[tuple[str, ...] | type]) -> StrictMsgpackSerializer:
        """A serializer whose allowlist also holds ``extra``."""
        return StrictMsgpackSerializer(self.allowlist | {_key(entry) for entry in extra})

    def dumps_typed(self, obj: Any) -> tuple[str, bytes]:
        return self.serde.dumps_typed(obj)

    def loads_typed(self, data: tuple[str, bytes]) -> Any:
        """The stored value, read back.

        Raises:
            CheckpointSerializationError: the value names a class or call strict reads do
                not build; it names it, and how to allow it.
        """
        reader = self._reader
        value, refused = _read(reader, data)
        if not refused:
            return value
        for event in refused:
            if event["kind"] != "msgpack_blocked" or not _imported_class(event["module"], event["name"]):
                raise _refusal(event)
        reader = self._reader = reader.with_msgpack_allowlist({(e["module"], e["name"]) for e in refused})
        value, refused = _read(reader, data)
        if refused:  # pragma: no cover - what was just allowed is not refused again
            raise _refusal(refused[0])
        return value


def _read(reader: JsonPlusSerializer, data: tuple[str, bytes]) -> tuple[Any, list[SerdeEvent]]:
    refused: list[SerdeEvent] = []
    token = _REFUSED.set(refused)
    try:
        return reader.loads_typed(data), refused
    finally:
        _REFUSED.reset(token)


def _key(entry: tuple[str, ...] | type) -> tuple[str, ...]:
    return (entry.__module__, entry.__name__) if isinstance(entry, type) else tuple(entry)


def _imported_class(module: object, name: object) -> bool:
    """Whether ``module.name`` is an enum, dataclass or pydantic class of a module already
    imported. A static lookup: no module ``__getattr__`` (a lazy import) runs."""
    if not (isinstance(module, str) and isinstance(name, str)) or name.startswith("__"):
        return False
    loaded = sys.modules.get(module)
    if loaded is None:
        return False
    try:
        cls = inspect.getattr_static(loaded, name)
    except AttributeError:
        return False
    return isinstance(cls, type) and (
        issubclass(cls, (enum.Enum, BaseModel)) or dataclasses.is_dataclass(cls)
    )


def _refusal(event: SerdeEvent) -> CheckpointSerializationError:
    module, name = event["module"], event["name"]
    if event["kind"] == "msgpack_method_blocked":
        return CheckpointSerializationError(
            f"stored msgpack value calls {module}.{name}.{event.get('method')}, which no msgpack "
            "read calls (LangGraph writes no such value); it was not called. The store holds a "
            "value written by other means: delete the thread or restore it"
        )
    return CheckpointSerializationError(
        f"stored msgpack value names {module}.{name}; it was neither imported nor called. Strict "
        "msgpack reads build LangGraph's safe types, the enum, dataclass and pydantic classes of "
        "modules already imported, and the allowlist. If the store is trusted and this is your "
        f"class, import its module before reading or allow it: saver.with_allowlist([({module!r}, "
        f"{name!r})]); {STRICT_VARIABLE}=false reads as LangGraph does by default, where a stored "
        "value can import and call anything"
    )
