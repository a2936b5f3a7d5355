"""The tool-call ledger (SPEC TM5) for Redis: programs over ``lua/tool_call.lua``.

A thread's entries are fields of its calls hash, one of its keys (``keys.py``): they share
its hash slot and its TTL (SPEC R2), and go with it when it is deleted, swept or copied.
"""

from __future__ import annotations

from typing import Any

from threadkeep.backends.redis.engine import Script
from threadkeep.backends.redis.keys import KeySpace
from threadkeep.backends.redis.programs import refuse_lost
from threadkeep.core.ledger import FAILED, STARTED, CallBegin, CallEnd, StoredCall
from threadkeep.core.program import Program
from threadkeep.core.rules import required_owner
from threadkeep.errors import StorageForbiddenError

__all__ = ["begin_tool_call", "end_tool_call", "tool_calls"]

NUL = b"\0"
_EVICTED = (
    "an eviction by Redis (run Redis with maxmemory-policy noeviction); an operator can delete what is left"
)


def _field(message_id: str, call_id: str) -> bytes:
    return message_id.encode() + NUL + call_id.encode()


def _stored(field: bytes, entry: bytes) -> StoredCall:
    """An entry as tool_call.lua stores it (see its header)."""
    message_id, call_id = field.split(NUL, 1)
    _, started, tool, key, claim, status, finished, kind, outcome = entry.split(NUL, 8)
    state = status.decode()
    succeeded = state not in (STARTED, FAILED)
    return StoredCall(
        message_id=message_id.decode(),
        call_id=call_id.decode(),
        tool=tool.decode(),
        key=key.decode(),
        claim=int(claim),
        status=state,
        type=kind.decode() if succeeded else None,
        value=bytes(outcome) if succeeded else None,
        error=outcome.decode() if state == FAILED else None,
        started_at=float(started),
        finished_at=float(finished) if finished else None,
    )


def _order(entry: bytes) -> tuple[float, int]:
    seq, started, _ = entry.split(NUL, 2)
    return float(started), int(seq)


def begin_tool_call(space: KeySpace, step: CallBegin, ttl_ms: int) -> Program[StoredCall]:
    """Record a started entry unless the ledger holds one for the call (one script).

    Raises:
        StorageForbiddenError: the thread belongs to another user.
    """
    field = _field(step.message_id, step.call_id)
    args: list[object] = [
        "begin",
        field,
        step.thread_id,
        step.actor.user_id,
        step.now,
        required_owner(step.actor) or "",
        ttl_ms,
        step.tool,
        step.key,
        step.claim,
    ]
    reply = yield Script("tool_call", space.thread(step.thread_id), args)
    if reply[0] == b"forbidden":
        raise StorageForbiddenError(step.thread_id, step.actor.user_id)
    return _stored(field, reply[1])


def end_tool_call(space: KeySpace, step: CallEnd, ttl_ms: int) -> Program[None]:
    """End a started entry (one script); one that is not started is decided by
    :meth:`CallEnd.check_ended`.

    Raises:
        StorageForbiddenError: the thread belongs to another user.
        InvalidInputError: no such entry, or one that ended otherwise.
    """
    field = _field(step.message_id, step.call_id)
    outcome = step.value if step.value is not None else (step.error or "").encode()
    args: list[object] = [
        "end",
        field,
        step.thread_id,
        required_owner(step.actor) or "",
        ttl_ms,
        step.status,
        step.now,
        step.type or "",
        outcome,
    ]
    reply = yield Script("tool_call", space.thread(step.thread_id), args)
    status = reply[0]
    if status == b"ok":
        return
    if status == b"forbidden":
        raise StorageForbiddenError(step.thread_id, step.actor.user_id)
    step.check_ended(_stored(field, reply[1]) if status == b"ended" else None)


def tool_calls(space: KeySpace, thread_id: str, owner: str | None) -> Program[list[StoredCall]]:
    """The thread's entries, oldest first (by when each was begun, then by its sequence);
    none for a thread of another owner than ``owner`` (``None``: any owner)."""
    reply = yield Script("tool_call", space.thread(thread_id), ["list", owner or ""])
    refuse_lost(thread_id, reply)
    if reply[0] != b"ok":
        return []
    fields = _pairs(reply[1])
    fields.sort(key=lambda pair: _order(pair[1]))
    return [_stored(field, entry) for field, entry in fields]


def _pairs(flat: Any) -> list[tuple[bytes, bytes]]:
    return list(zip(flat[::2], flat[1::2], strict=True))
