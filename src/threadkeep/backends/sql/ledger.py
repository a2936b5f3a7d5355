"""The tool-call ledger (SPEC TM5) as programs, written once for every SQL dialect.

A thread's entries are rows of ``tk_tool_calls``, keyed by the thread's ``tid``, the message
id and the call id, so they go wherever the thread goes: ``copy_thread`` copies them, a
delete or the sweep deletes them with the thread's other rows, in the same transaction.
A begin needs no transaction (``atomic=False``): its write is one guarded statement (the
owner rule, W3, is in the statement that writes), and the read after it sees what it, or a
concurrent begin of the same call, committed. An end is one transaction (one round trip).
Each commits as every write does: acknowledged once the store says it is durable.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

from threadkeep.core.ledger import CallBegin, CallEnd, StoredCall
from threadkeep.core.program import Batch, Program, Sql
from threadkeep.core.rules import check_owner, required_owner
from threadkeep.errors import StorageError

__all__ = ["LedgerDialect", "begin_tool_call", "end_tool_call", "tool_calls"]


class LedgerDialect(Protocol):
    """The statements of the ledger's programs (each dialect's ``queries`` module).

    ``BEGIN_CALL`` inserts a started entry unless the thread already holds one for the
    call, only on a thread of ``required_owner``; ``SELECT_CALL`` returns the thread's owner
    and the call's entry (NULLs: none), no row for no thread; ``END_CALL`` ends a started
    entry of a thread of ``required_owner``, returning a row if it did; ``LIST_CALLS`` is
    the thread's entries, oldest first, if ``owner`` (NULL: any) owns it.
    """

    INSERT_THREAD: str
    BEGIN_CALL: str
    SELECT_CALL: str
    END_CALL: str
    LIST_CALLS: str


def _stored(message_id: str, call_id: str, row: Sequence[Any]) -> StoredCall:
    tool, key, claim, status, kind, value, error, started_at, finished_at = row
    return StoredCall(
        message_id=message_id,
        call_id=call_id,
        tool=tool,
        key=key,
        claim=int(claim),
        status=status,
        type=kind,
        value=None if value is None else bytes(value),
        error=error,
        started_at=float(started_at),
        finished_at=None if finished_at is None else float(finished_at),
    )


def begin_tool_call(q: LedgerDialect, step: CallBegin) -> Program[StoredCall]:
    """Record a started entry unless the ledger has one for the call; the entry as stored.

    One round trip: the guarded insert, then the read of the entry and the thread's owner.
    A thread whose first checkpoint is still on its way is created for the caller first, as
    its put would have.

    Raises:
        StorageForbiddenError: the thread belongs to another user.
    """
    params = {
        "thread_id": step.thread_id,
        "message_id": step.message_id,
        "call_id": step.call_id,
        "tool": step.tool,
        "key": step.key,
        "claim": step.claim,
        "now": step.now,
        "required_owner": required_owner(step.actor),
    }
    request = Batch((Sql(q.BEGIN_CALL, params), Sql(q.SELECT_CALL, params)))
    rows = (yield request)[1]
    if not rows:
        thread = {"thread_id": step.thread_id, "owner": step.actor.user_id, "now": step.now}
        yield Sql(q.INSERT_THREAD, thread)
        rows = (yield request)[1]
    if not rows:
        raise StorageError(
            f"thread {step.thread_id!r} was deleted while a tool call was begun on it; try again"
        )
    ((owner, *entry),) = rows
    check_owner(
        thread_id=step.thread_id, owner=owner, user_id=step.actor.user_id, enforce=step.actor.checks_owner
    )
    if entry[2] is None:
        # The thread's row was committed between the insert and the read (its first put
        # raced this begin, on another connection): the insert found no thread, the read
        # found it without the entry. Begin again: the insert finds it now.
        rows = (yield request)[1]
        if not rows or rows[0][3] is None:
            raise StorageError(
                f"thread {step.thread_id!r} changed while a tool call was begun on it; try again"
            )
        ((owner, *entry),) = rows
    return _stored(step.message_id, step.call_id, entry)


def end_tool_call(q: LedgerDialect, step: CallEnd) -> Program[None]:
    """End a started entry with its outcome (one round trip, one transaction: the guarded
    update, then the entry as it is now, which decides an update that changed nothing).

    Raises:
        StorageForbiddenError: the thread belongs to another user.
        InvalidInputError: no such entry, or one that ended otherwise
            (:meth:`CallEnd.check_ended`).
    """
    params = {
        "thread_id": step.thread_id,
        "message_id": step.message_id,
        "call_id": step.call_id,
        "status": step.status,
        "type": step.type,
        "value": step.value,
        "error": step.error,
        "now": step.now,
        "required_owner": required_owner(step.actor),
    }
    ended, rows = yield Batch((Sql(q.END_CALL, params), Sql(q.SELECT_CALL, params)), ends=True)
    if ended:
        return
    entry = None
    if rows:
        ((owner, *row),) = rows
        check_owner(
            thread_id=step.thread_id, owner=owner, user_id=step.actor.user_id, enforce=step.actor.checks_owner
        )
        if row[0] is not None:
            entry = _stored(step.message_id, step.call_id, row)
    step.check_ended(entry)


def tool_calls(q: LedgerDialect, thread_id: str, owner: str | None) -> Program[list[StoredCall]]:
    """The thread's entries, oldest first; none for a thread of another owner than ``owner``
    (``None``: any owner)."""
    rows = yield Sql(q.LIST_CALLS, {"thread_id": thread_id, "owner": owner})
    return [_stored(row[0], row[1], row[2:]) for row in rows]
