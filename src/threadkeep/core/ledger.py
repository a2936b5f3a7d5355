"""The tool-call ledger's rules (SPEC TM5): its entries, their keys, how a call ends. No I/O.

A thread's ledger holds one entry per tool call, keyed by the thread, the assistant message
that issued the call and the call's id: ``started`` when the call is begun, then
``succeeded`` with its result or ``failed`` with an error. Every store keeps it with its
thread (copied, deleted and swept with it, owned by the thread's owner); the stores only
move the stored forms this module builds and reads.
"""

from __future__ import annotations

import hashlib
import secrets
from dataclasses import dataclass
from typing import Any, Final, Literal

from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.serde.base import SerializerProtocol

from threadkeep.core.identity import Actor
from threadkeep.core.ids import checked_id
from threadkeep.core.records import target_of
from threadkeep.errors import InvalidInputError

__all__ = [
    "FAILED",
    "MISSING",
    "STARTED",
    "SUCCEEDED",
    "CallBegin",
    "CallEnd",
    "Status",
    "StoredCall",
    "ToolCall",
    "call_key",
    "prepare_begin",
    "prepare_end",
]

Status = Literal["started", "succeeded", "failed"]
STARTED: Final = "started"
SUCCEEDED: Final = "succeeded"
FAILED: Final = "failed"
_STATUSES: Final = frozenset({STARTED, SUCCEEDED, FAILED})


class _Missing:
    def __repr__(self) -> str:
        return "MISSING"


# end_tool_call's default result: none given (``None`` is a result).
MISSING: Final[Any] = _Missing()


def call_key(thread_id: str, message_id: str, call_id: str) -> str:
    """The idempotency key of a call: ``"tk-"`` and the first 32 hex digits of the SHA-256
    of its thread id, message id and call id (joined by NUL, which no id holds). The same
    call gets the same key on every store and in every process."""
    digest = hashlib.sha256("\0".join((thread_id, message_id, call_id)).encode()).hexdigest()
    return "tk-" + digest[:32]


@dataclass(frozen=True, slots=True)
class ToolCall:
    """One entry of a thread's tool-call ledger.

    Attributes:
        thread_id: The thread the entry belongs to.
        message_id: The assistant message that issued the call.
        call_id: The call's id in that message (LangChain's ``ToolCall["id"]``).
        tool: The tool's name, as the call was begun.
        status: ``"started"``, ``"succeeded"`` or ``"failed"``.
        key: The call's idempotency key, to hand to external APIs (:func:`call_key` of the
            thread it was begun on; a copy of the thread keeps it: the copied entry is the
            same call).
        result: The recorded result of a succeeded call (decoded), else ``None``.
        error: The recorded error of a failed call, else ``None``.
        started_at: When the call was begun (epoch seconds, the saver's clock).
        finished_at: When it ended, or ``None`` while it is started.
        fresh: Whether this very ``begin_tool_call`` recorded the entry (``False``: the
            ledger held it already, and this is the earlier entry as stored).
    """

    thread_id: str
    message_id: str
    call_id: str
    tool: str
    status: Status
    key: str
    result: Any
    error: str | None
    started_at: float
    finished_at: float | None
    fresh: bool = False


@dataclass(frozen=True, slots=True)
class StoredCall:
    """An entry as a store holds it: its result still encoded (``type``, ``value``), and the
    claim of the ``begin_tool_call`` that recorded it."""

    message_id: str
    call_id: str
    tool: str
    key: str
    claim: int
    status: str
    type: str | None
    value: bytes | None
    error: str | None
    started_at: float
    finished_at: float | None

    def decoded(self, thread_id: str, serde: SerializerProtocol, *, fresh: bool = False) -> ToolCall:
        """The entry as :class:`ToolCall`, its result decoded with ``serde``."""
        if self.status not in _STATUSES:
            raise ValueError(f"tool call {self.call_id!r} has an unknown status {self.status!r}")
        result = None
        if self.status == SUCCEEDED and self.type is not None and self.value is not None:
            result = serde.loads_typed((self.type, bytes(self.value)))
        return ToolCall(
            thread_id=thread_id,
            message_id=self.message_id,
            call_id=self.call_id,
            tool=self.tool,
            status=self.status,  # type: ignore[arg-type]  # checked above
            key=self.key,
            result=result,
            error=self.error,
            started_at=float(self.started_at),
            finished_at=None if self.finished_at is None else float(self.finished_at),
            fresh=fresh,
        )


@dataclass(frozen=True, slots=True)
class CallBegin:
    """A ``begin_tool_call``, checked: what a store records if the ledger has no entry.

    ``claim`` is a random number drawn once per call: a store that runs the call again (a
    retry after a lost reply) finds its own claim on the entry and knows it recorded it.
    """

    thread_id: str
    message_id: str
    call_id: str
    tool: str
    key: str
    claim: int
    now: float
    actor: Actor

    def entry(self, stored: StoredCall, serde: SerializerProtocol) -> ToolCall:
        """The entry as the store holds it; ``fresh`` if it carries this call's claim."""
        return stored.decoded(self.thread_id, serde, fresh=stored.claim == self.claim)


@dataclass(frozen=True, slots=True)
class CallEnd:
    """An ``end_tool_call``, checked and encoded."""

    thread_id: str
    message_id: str
    call_id: str
    status: Status
    type: str | None
    value: bytes | None
    error: str | None
    now: float
    actor: Actor

    def check_ended(self, stored: StoredCall | None) -> None:
        """Decide an end that found the entry not ``started``: nothing to do if the entry
        ended the same way (the same status, and the same encoded result or error: this end
        ran already, or was retried); else refused.

        Raises:
            InvalidInputError: the ledger has no such entry, or it ended otherwise.
        """
        where = f"tool call {self.call_id!r} of message {self.message_id!r} on thread {self.thread_id!r}"
        context = {
            "field": "call_id",
            "thread_id": self.thread_id,
            "message_id": self.message_id,
            "call_id": self.call_id,
        }
        if stored is None:
            raise InvalidInputError(
                f"{where} was never begun: call begin_tool_call first. Nothing was stored.",
                context={**context, "problem": "not_begun"},
            )
        same = (stored.status, stored.type, _bytes(stored.value), stored.error) == (
            self.status,
            self.type,
            self.value,
            self.error,
        )
        if same:
            return
        raise InvalidInputError(
            f"{where} has {stored.status} already; it cannot end as {self.status} with another "
            "outcome. Nothing was stored.",
            context={**context, "problem": "ended", "status": stored.status},
        )


def _bytes(value: bytes | memoryview | None) -> bytes | None:
    return None if value is None else bytes(value)


def _call_ids(message_id: object, call_id: object) -> tuple[str, str]:
    return checked_id(message_id, "message_id"), checked_id(call_id, "call_id")


def prepare_begin(
    config: RunnableConfig, message_id: str, call_id: str, tool: str, *, isolate: bool, now: float
) -> CallBegin:
    """Check a ``begin_tool_call``'s ids and build what the store records.

    Raises:
        InvalidInputError: an id no store can key (the tool's name is checked as one).
        CheckpointSerializationError: the config names no thread.
    """
    target = target_of(config, isolate=isolate)
    message_id, call_id = _call_ids(message_id, call_id)
    return CallBegin(
        thread_id=target.thread_id,
        message_id=message_id,
        call_id=call_id,
        tool=checked_id(tool, "tool"),
        key=call_key(target.thread_id, message_id, call_id),
        claim=secrets.randbits(62),
        now=now,
        actor=target.actor,
    )


def prepare_end(
    config: RunnableConfig,
    message_id: str,
    call_id: str,
    *,
    result: Any,
    error: str | None,
    serde: SerializerProtocol,
    isolate: bool,
    now: float,
) -> CallEnd:
    """Check an ``end_tool_call`` and encode its outcome: ``succeeded`` with ``result``, or
    ``failed`` with ``error``.

    Raises:
        InvalidInputError: an id no store can key, both or neither of ``result`` and
            ``error`` given, or an ``error`` that is not a string.
    """
    target = target_of(config, isolate=isolate)
    message_id, call_id = _call_ids(message_id, call_id)
    if (result is MISSING) == (error is None):
        raise InvalidInputError(
            "end_tool_call takes either result= (the call succeeded) or error= (it failed), "
            "not both and not neither. Nothing was stored.",
            context={"field": "result" if result is MISSING else "error", "problem": "outcome"},
        )
    if error is not None:
        if not isinstance(error, str):
            raise InvalidInputError(
                f"error must be a str, not {type(error).__name__}. Nothing was stored.",
                context={"field": "error", "problem": "type"},
            )
        # Every store keeps the text as it is, but Postgres text holds no NUL and no store
        # holds a lone surrogate: those characters are replaced, here, so that every store
        # records (and compares) the same text.
        error = error.replace("\0", "\ufffd").encode("utf-8", "replace").decode("utf-8")
        status: Status = FAILED
        kind, value = None, None
    else:
        status = SUCCEEDED
        kind, value = serde.dumps_typed(result)
    return CallEnd(
        thread_id=target.thread_id,
        message_id=message_id,
        call_id=call_id,
        status=status,
        type=kind,
        value=value,
        error=error,
        now=now,
        actor=target.actor,
    )
