"""What a person sees of a checkpoint (SPEC SV1, SV3): JSON-ready views, free of I/O.

The HTTP API (``/api/threads/...``), the CLI (``threadkeep threads show | history | diff``) and
the inspector page render the same views, built here once from LangGraph's
:class:`~langgraph.checkpoint.base.CheckpointTuple`; sync and async callers read the tuple
their own way and share these functions. None reads a store, and none raises on what a
checkpoint holds: :func:`jsonable` turns any value into JSON (an object it does not know
becomes its type and a shortened ``repr``).

Views:

- :func:`state_view`: one checkpoint: ids, time, step, source, the nodes to run next, the
  state's channels (``values``), its messages, pending interrupts and metadata;
- :func:`history_view`: one row of a thread's history (no channel values: cheap for long
  histories);
- :func:`diff_view`: what changed between two checkpoints, channel by channel, messages by id;
- :func:`message_view`: one LangChain message (or a message dict) as a chat shows it;
- :func:`retention_view`: when a thread is due to leave, and what would spare it.

Bounds: a string longer than :data:`MAX_STRING` characters (:data:`MAX_TEXT` for a message's
text) is cut and ends with ``…[+N chars]``; a container past :data:`MAX_ITEMS` items ends with
a ``"…[+N items]"`` entry (a dict: under the key ``"…"``); nesting past :data:`MAX_DEPTH`
becomes ``{"type", "repr"}``; bytes become ``{"$bytes": base64, "size": n}`` (base64 of at most
:data:`MAX_BYTES` bytes, ``"truncated": true`` when cut).
"""

from __future__ import annotations

import base64
import dataclasses
import datetime as dt
import enum
import json
import math
import uuid
from collections.abc import Iterable, Mapping
from decimal import Decimal
from pathlib import PurePath
from typing import Any, Final

from langchain_core.messages import BaseMessage
from langgraph.checkpoint.base import CheckpointTuple

from threadkeep.core.listing import ThreadRow, summarize
from threadkeep.core.retention import PlatformRetention, ThreadRetention

__all__ = [
    "MAX_BYTES",
    "MAX_DEPTH",
    "MAX_ITEMS",
    "MAX_STRING",
    "MAX_TEXT",
    "checkpoint_time",
    "diff_view",
    "history_view",
    "jsonable",
    "message_view",
    "preview",
    "retention_view",
    "state_view",
]

MAX_STRING: Final = 2_000
MAX_TEXT: Final = 20_000
MAX_ITEMS: Final = 200
MAX_DEPTH: Final = 12
MAX_BYTES: Final = 1_024
MAX_REPR: Final = 200
PREVIEW: Final = 80

# LangGraph's own channels: triggers and bookkeeping, not the graph's state.
_TRIGGER_PREFIXES: Final = ("branch:", "start:", "join:")
_START: Final = "__start__"
_INTERRUPT: Final = "__interrupt__"
_RESUME: Final = "__resume__"
_TASKS: Final = "__pregel_tasks"
_MESSAGES: Final = "messages"
# Message classes whose ``type`` is not the role a chat shows (chunks: "AIMessageChunk").
_CHUNK_SUFFIX: Final = "MessageChunk"
_ROLES: Final = {"user": "human", "assistant": "ai", "developer": "system"}


# --- values ------------------------------------------------------------------------------------


def jsonable(
    value: object, *, max_string: int = MAX_STRING, max_items: int = MAX_ITEMS, max_depth: int = MAX_DEPTH
) -> Any:
    """``value`` as JSON-ready data (dicts with string keys, lists, strings, numbers, bools,
    ``None``), bounded as the module says. Never raises.

    LangChain messages become :func:`message_view`; dataclasses and pydantic models
    ``{"type": qualname, "value": {field: ...}}``; datetimes ISO 8601 text; UUIDs, decimals and
    paths text; enums their value; a float that JSON cannot hold (NaN, infinities) its text.
    """
    try:
        return _jsonable(value, max_string, max_items, max_depth)
    except Exception:  # total on purpose: a view never fails on what a checkpoint holds
        return _opaque(value)


def _jsonable(value: object, max_string: int, max_items: int, depth: int) -> Any:
    if value is None or isinstance(value, bool | int):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else repr(value)
    if isinstance(value, str):
        return _cut(value, max_string)
    if isinstance(value, bytes | bytearray | memoryview):
        raw = bytes(value)
        out: dict[str, Any] = {"$bytes": base64.b64encode(raw[:MAX_BYTES]).decode(), "size": len(raw)}
        if len(raw) > MAX_BYTES:
            out["truncated"] = True
        return out
    if depth <= 0:
        return _opaque(value)
    if isinstance(value, BaseMessage):
        return message_view(value)
    nested = depth - 1
    if isinstance(value, Mapping):
        result: dict[str, Any] = {}
        for count, (key, item) in enumerate(value.items()):
            if count == max_items:
                result["…"] = f"…[+{len(value) - max_items} items]"
                break
            name = key if isinstance(key, str) else json.dumps(_jsonable(key, max_string, 8, 2))
            result[name] = _jsonable(item, max_string, max_items, nested)
        return result
    if isinstance(value, list | tuple | set | frozenset):
        items = sorted(value, key=repr) if isinstance(value, set | frozenset) else value
        shown = [_jsonable(item, max_string, max_items, nested) for item in items[:max_items]]
        if len(value) > max_items:
            shown.append(f"…[+{len(value) - max_items} items]")
        return shown
    if isinstance(value, dt.datetime | dt.date | dt.time):
        return value.isoformat()
    if isinstance(value, dt.timedelta):
        return value.total_seconds()
    if isinstance(value, enum.Enum):
        return _jsonable(value.value, max_string, max_items, nested)
    if isinstance(value, uuid.UUID | Decimal | PurePath):
        return str(value)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        fields = {f.name: getattr(value, f.name, None) for f in dataclasses.fields(value)}
        return {"type": _qualname(value), "value": _jsonable(fields, max_string, max_items, nested)}
    dump = getattr(type(value), "model_dump", None)  # a pydantic v2 model
    if callable(dump):
        return {"type": _qualname(value), "value": _jsonable(dump(value), max_string, max_items, nested)}
    return _opaque(value)


def _opaque(value: object) -> dict[str, str]:
    try:
        text = repr(value)
    except Exception:
        text = f"<{_qualname(value)} object: repr failed>"
    return {"type": _qualname(value), "repr": _cut(text, MAX_REPR)}


def _qualname(value: object) -> str:
    kind = type(value)
    return f"{kind.__module__}.{kind.__qualname__}"


def _cut(text: str, limit: int) -> str:
    return text if len(text) <= limit else f"{text[:limit]}…[+{len(text) - limit} chars]"


def preview(value: object, width: int = PREVIEW) -> str:
    """A one-line text of ``value`` at most ``width`` characters long (``…`` ends a cut one):
    a message as ``type: text``, anything else as compact JSON."""
    if isinstance(value, BaseMessage):
        view = message_view(value)
        calls = ", ".join(call["name"] or "?" for call in view["tool_calls"])
        text = f"{view['type']}: {view['content']}" + (f" [calls {calls}]" if calls else "")
    elif isinstance(value, str):
        text = value
    else:
        small = jsonable(value, max_string=width, max_items=8, max_depth=4)
        text = json.dumps(small, ensure_ascii=False, separators=(",", ":"))
    text = " ".join(text.split())
    return text if len(text) <= width else text[: max(width - 1, 0)] + "…"


# --- messages ----------------------------------------------------------------------------------


def message_view(message: object) -> dict[str, Any]:
    """One message as a chat shows it: ``id``, ``type`` (``human``, ``ai``, ``tool``,
    ``system``; other LangChain types as they name themselves), ``content`` (text: a list of
    parts joined, a part that is not text described in brackets, e.g. ``[image]``), ``name``,
    ``tool_calls`` (``[{"id", "name", "args"}]``), ``tool_call_id`` and ``status`` (a tool
    result's ``success`` or ``error``). Takes a LangChain message or a message dict
    (``type`` or OpenAI-style ``role``). Never raises."""
    try:
        if isinstance(message, BaseMessage):
            fields: Mapping[str, Any] = {
                "id": message.id,
                "type": message.type,
                "content": message.content,
                "name": message.name,
                "tool_calls": getattr(message, "tool_calls", None),
                "tool_call_id": getattr(message, "tool_call_id", None),
                "status": getattr(message, "status", None),
            }
        elif isinstance(message, Mapping):
            fields = message
        else:
            return _message_of_text(message)
        kind = str(fields.get("type") or fields.get("role") or "unknown")
        if kind.endswith(_CHUNK_SUFFIX):
            kind = kind[: -len(_CHUNK_SUFFIX)].lower() or "ai"
        calls = fields.get("tool_calls") or []
        return {
            "id": _str_or_none(fields.get("id")),
            "type": _ROLES.get(kind, kind),
            "content": _text_of(fields.get("content")),
            "name": _str_or_none(fields.get("name")),
            "tool_calls": [_tool_call(call) for call in calls] if isinstance(calls, list) else [],
            "tool_call_id": _str_or_none(fields.get("tool_call_id")),
            "status": _str_or_none(fields.get("status")) if kind == "tool" else None,
        }
    except Exception:
        return _message_of_text(message)


def _message_of_text(message: object) -> dict[str, Any]:
    return {
        "id": None,
        "type": "unknown",
        "content": _cut(preview(message, MAX_REPR) if not isinstance(message, str) else message, MAX_TEXT),
        "name": None,
        "tool_calls": [],
        "tool_call_id": None,
        "status": None,
    }


def _str_or_none(value: object) -> str | None:
    return None if value is None else str(value)


def _text_of(content: object) -> str:
    if isinstance(content, str):
        return _cut(content, MAX_TEXT)
    if isinstance(content, list):
        return _cut("\n".join(_part_text(part) for part in content), MAX_TEXT)
    return _cut(preview(content, MAX_STRING), MAX_TEXT) if content is not None else ""


def _part_text(part: object) -> str:
    if isinstance(part, str):
        return part
    if isinstance(part, Mapping):
        kind = str(part.get("type", "part"))
        if kind == "text" and isinstance(part.get("text"), str):
            return str(part["text"])
        named = part.get("name")
        return f"[{kind}: {named}]" if isinstance(named, str) else f"[{kind}]"
    return f"[{type(part).__name__}]"


def _tool_call(call: object) -> dict[str, Any]:
    if isinstance(call, Mapping):
        function = call.get("function")  # OpenAI's shape: {"function": {"name", "arguments"}}
        if isinstance(function, Mapping):
            name, args = function.get("name"), function.get("arguments")
        else:
            name, args = call.get("name"), call.get("args")
        return {"id": _str_or_none(call.get("id")), "name": _str_or_none(name), "args": jsonable(args)}
    return {"id": None, "name": None, "args": jsonable(call)}


# --- checkpoints -------------------------------------------------------------------------------


def checkpoint_time(found: CheckpointTuple) -> float | None:
    """When the checkpoint was written (epoch seconds), from its ``ts``; ``None`` if unreadable."""
    ts: object = found.checkpoint.get("ts")
    if not isinstance(ts, str):
        return None
    try:
        when = dt.datetime.fromisoformat(ts)
    except ValueError:
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=dt.UTC)
    return when.timestamp()


def _ids(found: CheckpointTuple) -> dict[str, Any]:
    configurable = found.config.get("configurable", {})
    parent = (found.parent_config or {}).get("configurable", {})
    return {
        "thread_id": configurable.get("thread_id"),
        "checkpoint_ns": configurable.get("checkpoint_ns", ""),
        "checkpoint_id": configurable.get("checkpoint_id") or found.checkpoint.get("id"),
        "parent_id": parent.get("checkpoint_id"),
        "created_at": checkpoint_time(found),
        "step": found.metadata.get("step") if found.metadata else None,
        "source": found.metadata.get("source") if found.metadata else None,
    }


def _is_state_channel(name: str) -> bool:
    return (
        not name.startswith(_TRIGGER_PREFIXES)
        and not (name.startswith("__") and name.endswith("__"))
        and (name != _TASKS)
    )


def _is_messages(name: str, value: object) -> bool:
    if not isinstance(value, list):
        return False
    if not value:
        return name == _MESSAGES
    return all(isinstance(item, BaseMessage) for item in value)


def _state(found: CheckpointTuple) -> dict[str, Any]:
    values = found.checkpoint.get("channel_values") or {}
    return {name: value for name, value in values.items() if _is_state_channel(name)}


def _messages_channel(state: Mapping[str, Any]) -> str | None:
    if _is_messages(_MESSAGES, state.get(_MESSAGES)):
        return _MESSAGES
    return next((name for name, value in state.items() if value and _is_messages(name, value)), None)


def _next(found: CheckpointTuple) -> list[str]:
    """The nodes a checkpoint triggers: each whose trigger channel (``branch:to:<node>``, or
    ``__start__``) holds a value at a version past the one the node last saw (LangGraph's
    rule), and each pending ``Send``."""
    checkpoint = found.checkpoint
    versions: Mapping[str, Any] = checkpoint.get("channel_versions") or {}
    seen: Mapping[str, Mapping[str, Any]] = checkpoint.get("versions_seen") or {}
    available = checkpoint.get("channel_values") or {}
    nodes: list[str] = []
    for channel, version in versions.items():
        if channel not in available:  # consumed: a trigger holds a value until its node runs
            continue
        if channel == _START:
            node = _START
        elif channel.startswith("branch:to:"):
            node = channel[len("branch:to:") :]
        else:
            continue
        last = seen.get(node, {}).get(channel)
        if last is None or _newer(version, last):
            nodes.append(node)
    for send in available.get(_TASKS) or ():
        target = getattr(send, "node", None)
        if isinstance(target, str) and target not in nodes:
            nodes.append(target)
    return nodes


def _newer(version: object, last: object) -> bool:
    try:
        return bool(version > last)  # type: ignore[operator]
    except TypeError:
        return str(version) > str(last)


def _interrupts(found: CheckpointTuple) -> list[dict[str, Any]]:
    """The interrupts of tasks that have not been resumed."""
    writes = found.pending_writes or []
    resumed = {task for task, channel, _ in writes if channel == _RESUME}
    out: list[dict[str, Any]] = []
    for task, channel, value in writes:
        if channel != _INTERRUPT or task in resumed:
            continue
        for item in value if isinstance(value, list | tuple) else (value,):
            found_id = _str_or_none(getattr(item, "id", None))
            out.append({"id": found_id, "task_id": task, "value": jsonable(getattr(item, "value", item))})
    return out


def state_view(found: CheckpointTuple) -> dict[str, Any]:
    """One checkpoint as JSON: ``thread_id``, ``checkpoint_ns``, ``checkpoint_id``,
    ``parent_id``, ``created_at`` (epoch seconds), ``step``, ``source``, ``next`` (the nodes
    it triggers, derived from its channel versions; ``[]`` at the end of a run), ``values``
    (every state channel but LangGraph's own, and but the message channel), ``messages`` (the
    message list, see :func:`message_view`) and ``messages_channel`` (its channel: ``messages``
    when that is one, else the first channel holding messages, else ``None``),
    ``interrupts`` (``[{"id", "task_id", "value"}]`` not yet resumed) and ``metadata``."""
    state = _state(found)
    channel = _messages_channel(state)
    messages = state.pop(channel) if channel is not None else []
    return {
        **_ids(found),
        "next": _next(found),
        "values": jsonable(state),
        "messages": [message_view(message) for message in messages],
        "messages_channel": channel,
        "interrupts": _interrupts(found),
        "metadata": jsonable(found.metadata or {}),
    }


def history_view(found: CheckpointTuple) -> dict[str, Any]:
    """One row of a thread's history: the ids, ``created_at``, ``step`` and ``source`` of
    :func:`state_view`, and ``writes``: ``[{"task_id", "channel", "preview"}]``, the writes
    its metadata records (older LangGraph: ``metadata["writes"]``, by node) followed by the
    pending writes tasks made from it."""
    writes: list[dict[str, Any]] = []
    recorded = (found.metadata or {}).get("writes")
    if isinstance(recorded, Mapping):
        for node, update in recorded.items():
            items = update.items() if isinstance(update, Mapping) else [("", update)]
            for channel, value in items:
                writes.append({"task_id": str(node), "channel": str(channel), "preview": preview(value)})
    for task, channel, value in found.pending_writes or []:
        writes.append({"task_id": str(task), "channel": str(channel), "preview": preview(value)})
    return {**_ids(found), "writes": writes}


def diff_view(a: CheckpointTuple, b: CheckpointTuple) -> dict[str, Any]:
    """What changed from checkpoint ``a`` to checkpoint ``b``.

    Returns:
        ``{"a": id, "b": id, "added": [channel], "removed": [channel], "changed": [channel],
        "channels": {channel: change}}``, a change being ``{"change": "added" | "removed" |
        "changed", "before": preview | None, "after": preview | None}``; for a message
        channel also ``messages_added`` and ``messages_removed`` (message views, matched by
        id, else by type and text) and ``messages_changed`` (``[{"id", "before", "after"}]``).
        Channels in name order; unchanged ones are left out.
    """
    before, after = _state(a), _state(b)
    channels: dict[str, dict[str, Any]] = {}
    for name in sorted(before.keys() | after.keys()):
        old, new = before.get(name, _ABSENT), after.get(name, _ABSENT)
        if old is _ABSENT or new is _ABSENT:
            change = "added" if old is _ABSENT else "removed"
        elif jsonable(old) != jsonable(new):
            change = "changed"
        else:
            continue
        entry: dict[str, Any] = {
            "change": change,
            "before": None if old is _ABSENT else preview(old),
            "after": None if new is _ABSENT else preview(new),
        }
        if _is_messages(name, old) or _is_messages(name, new):
            entry.update(_message_changes(_as_list(old), _as_list(new)))
        channels[name] = entry
    return {
        "a": _ids(a)["checkpoint_id"],
        "b": _ids(b)["checkpoint_id"],
        **{
            kind: [n for n, c in channels.items() if c["change"] == kind]
            for kind in ("added", "removed", "changed")
        },
        "channels": channels,
    }


_ABSENT: Final[Any] = object()


def _as_list(value: object) -> list[Any]:
    return value if isinstance(value, list) else []


def _message_changes(old: Iterable[Any], new: Iterable[Any]) -> dict[str, Any]:
    def keyed(messages: Iterable[Any]) -> dict[str, dict[str, Any]]:
        views = (message_view(message) for message in messages)
        return {view["id"] or f"{view['type']}:{view['content']}": view for view in views}

    before, after = keyed(old), keyed(new)
    return {
        "messages_added": [view for key, view in after.items() if key not in before],
        "messages_removed": [view for key, view in before.items() if key not in after],
        "messages_changed": [
            {"id": key, "before": before[key], "after": view}
            for key, view in after.items()
            if key in before and before[key] != view
        ],
    }


def retention_view(
    head: CheckpointTuple,
    declared: ThreadRetention,
    finished_due: float | None,
    platform: PlatformRetention,
    *,
    now: float,
    parked: bool,
    row: ThreadRow | None = None,
) -> dict[str, Any]:
    """A thread's retention, from its newest checkpoint ``head``, what its owner declared,
    its finished due time (``None``: not marked finished), the platform's horizons, the
    clock, whether a run on it is parked now, and its listing row (``row``; ``None``: a store
    that cannot read one, Redis).

    With ``row``, ``written_at``, ``due`` and ``status`` are the listing's
    (:func:`threadkeep.core.listing.summarize`): the thread's waiting clock (its newest
    checkpoint, or a run's start if later, as the sweep counts it) and "interrupted" as the
    listing means it (its newest root checkpoint holds an interrupt write). Without it, they
    are read from ``head``.

    Returns:
        ``thread_id``; ``status`` (as the threads listing's: ``parked``, ``interrupted``,
        ``finished`` or ``waiting``); ``written_at``; ``due`` (the finished mark's due time,
        else the waiting clock plus the waiting horizon; ``None`` if the write time is
        unreadable); ``horizons`` in force and ``declared`` (minutes, ``None``: the
        platform's) and ``platform``; ``spared_by``: what would make a sweep past ``due``
        spare the thread (``park``: a live park; ``interrupt``: it waits on an interrupt
        younger than the platform's interrupt horizon); registered live-thread filters are
        not asked.
    """
    stored_at = checkpoint_time(head)
    waiting = declared.waiting(platform)
    written_at: float | None
    due: float | None
    if row is not None:
        listed = summarize(row, platform)
        written_at, due, status = listed.written_at, listed.due, listed.status
        interrupted, parked = row.interrupted, parked or row.parked_until is not None
    else:
        written_at = stored_at
        interrupted = bool(_interrupts(head))
        due = (
            finished_due
            if finished_due is not None
            else None
            if written_at is None
            else written_at + 60 * waiting
        )
        status = (
            "parked"
            if parked
            else "interrupted"
            if interrupted
            else "finished"
            if finished_due
            else "waiting"
        )
    since = platform.interrupted_since(now)
    spared_by = ["park"] if parked else []
    # The sweep spares an interrupt by its checkpoint's time (Backend.interrupted's since).
    if interrupted and (since is None or (stored_at is not None and stored_at >= since)):
        spared_by.append("interrupt")
    return {
        "thread_id": _ids(head)["thread_id"],
        "status": status,
        "written_at": written_at,
        "due": due,
        "horizons": {"waiting_minutes": waiting, "finished_minutes": declared.finished(platform)},
        "declared": {
            "waiting_minutes": declared.waiting_minutes,
            "finished_minutes": declared.finished_minutes,
        },
        "platform": {
            "waiting_minutes": platform.waiting_minutes,
            "finished_minutes": platform.finished_minutes,
            "interrupt_minutes": platform.interrupt_minutes,
        },
        "spared_by": spared_by,
    }
