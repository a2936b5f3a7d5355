"""The one error tree of threadkeep.

Every error threadkeep raises on purpose derives from :class:`ThreadkeepError`, carries a
stable ``code`` and renders itself with :meth:`ThreadkeepError.to_dict`. Driver errors
(``sqlite3``, ``psycopg``, ``redis``) are mapped into this tree at one boundary per backend,
always with ``raise ... from exc`` so the original stays on ``__cause__``::

    ThreadkeepError                      THREADKEEP_000
    ├── ConfigurationError               CONFIG_001      invalid      (bad or removed setting)
    │   └── MissingExtraError            CONFIG_002      invalid      (driver extra not installed)
    ├── CheckpointSerializationError     CODEC_001       invalid      (value refused or unreadable)
    ├── CheckpointStoreFormatError       STORE_FORMAT_001 unavailable (store needs a reset)
    ├── ThreadRetentionError             RETENTION_001   invalid
    ├── ParkRefusedError                 PARK_001        invalid      (ask() cannot park here)
    ├── InvalidInputError                INPUT_001       invalid      (a bad id; a refused tool-call end)
    ├── TurnFailedError                  TURN_001        unavailable  (retries spent; SPEC TM2)
    ├── NoResumableTurnError             TURN_002        invalid      (nothing to resume; TM4)
    ├── ToolCallError                    TOOL_001        unavailable  (a tool call failed; TM5)
    │                                    TOOL_UNKNOWN_001  started, never finished: outcome unknown
    │                                    TOOL_RESULT_001   a tool returned an error result
    ├── ThreadNotFoundError              THREAD_NOT_FOUND_001 not_found (none the caller may see)
    ├── AuthenticationError              AUTH_001        unauthorized (no or unknown API key)
    ├── PermissionDeniedError            AUTH_002        forbidden    (the key's role may not)
    └── StorageError                     STORAGE_000     unavailable
        ├── StaleStateError              STORAGE_CONFLICT_001  conflict
        ├── StorageForbiddenError        STORAGE_FORBIDDEN_001 forbidden (another user's thread)
        ├── CheckpointDeleteError        STORAGE_DELETE_001    unavailable  (no longer raised)
        └── StorageRefusedError          STORAGE_REFUSED_001   unavailable  (the server refused: not retried)
                                         STORAGE_AUTH_001        login refused
                                         STORAGE_DATABASE_001    no such database
                                         STORAGE_PERMISSION_001  a privilege missing

``kind`` groups the errors the HTTP layer maps to a status once: ``conflict`` 409,
``forbidden`` 403, ``unavailable`` 503, ``invalid`` 422, ``not_found`` 404, ``unauthorized`` 401.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar, Literal

ErrorKind = Literal["conflict", "forbidden", "unavailable", "invalid", "not_found", "unauthorized"]

__all__ = [
    "AuthenticationError",
    "CheckpointDeleteError",
    "CheckpointSerializationError",
    "CheckpointStoreFormatError",
    "ConfigurationError",
    "ErrorKind",
    "InvalidInputError",
    "MissingExtraError",
    "NoResumableTurnError",
    "ParkRefusedError",
    "PermissionDeniedError",
    "StaleStateError",
    "StorageError",
    "StorageForbiddenError",
    "StorageRefusedError",
    "ThreadNotFoundError",
    "ThreadRetentionError",
    "ThreadkeepError",
    "ToolCallError",
    "TurnFailedError",
]


class ThreadkeepError(Exception):
    """Base of every error threadkeep raises on purpose.

    Args:
        message: What went wrong and what to do about it.
        code: A stable identifier; defaults to the class's ``default_code``.
        context: Structured facts about the failure (thread ids, values, ...).
    """

    default_code: ClassVar[str] = "THREADKEEP_000"
    kind: ClassVar[ErrorKind] = "unavailable"

    def __init__(
        self, message: str, *, code: str | None = None, context: dict[str, Any] | None = None
    ) -> None:
        super().__init__(message)
        self.message = message
        self.code = code or self.default_code
        self.context: dict[str, Any] = dict(context or {})

    def __str__(self) -> str:
        return f"[{self.code}] {self.message}"

    def to_dict(self) -> dict[str, Any]:
        """Return the error as a JSON-ready dict: ``error``, ``code``, ``message``, ``context``."""
        return {
            "error": type(self).__name__,
            "code": self.code,
            "message": self.message,
            "context": self.context,
        }


class ConfigurationError(ThreadkeepError):
    """A setting is invalid, removed, or contradicts another; refused at start."""

    default_code = "CONFIG_001"
    kind: ClassVar[ErrorKind] = "invalid"


class MissingExtraError(ConfigurationError):
    """A provider needs a driver that is not installed; the message names the extra."""

    default_code = "CONFIG_002"


class CheckpointSerializationError(ThreadkeepError):
    """A value cannot be stored faithfully, or a stored value cannot be read back.

    ``path`` names where the value sits, for example
    ``channel_values.messages[3].additional_kwargs.when``.
    """

    default_code = "CODEC_001"
    kind: ClassVar[ErrorKind] = "invalid"

    def __init__(self, reason: str, *, path: str = "", code: str | None = None) -> None:
        self.reason = reason
        self.path = path
        super().__init__(f"{path}: {reason}" if path else reason, code=code, context={"path": path})

    def under(self, prefix: str) -> CheckpointSerializationError:
        """Return the same error with ``prefix`` put in front of its path."""
        if not prefix:
            return self
        joined = prefix + (self.path if self.path.startswith("[") or not self.path else "." + self.path)
        error = CheckpointSerializationError(self.reason, path=joined, code=self.code)
        error.__cause__ = self.__cause__
        return error


class CheckpointStoreFormatError(ThreadkeepError):
    """The store holds checkpoints of another format generation, or none recorded."""

    default_code = "STORE_FORMAT_001"
    kind: ClassVar[ErrorKind] = "unavailable"


class ThreadRetentionError(ThreadkeepError):
    """A declared retention is longer than the platform allows, or contradicts itself."""

    default_code = "RETENTION_001"
    kind: ClassVar[ErrorKind] = "invalid"


class ParkRefusedError(ThreadkeepError):
    """``ask()`` refused to park a run: no deadline, a deadline past the thread's waiting
    horizon, or a store that cannot hold a parked run. Nothing was parked."""

    default_code = "PARK_001"
    kind: ClassVar[ErrorKind] = "invalid"


class InvalidInputError(ThreadkeepError):
    """A call named an id no store can key: not a string, a lone surrogate, a NUL, or longer
    than its limit (see :mod:`threadkeep.core.ids`). Refused before any I/O: the call read
    and stored nothing, and is not retried. ``context`` names the ``field`` and the
    ``problem`` (``type``, ``surrogate``, ``nul``, ``too_long``), with ``position`` or
    ``size`` and ``limit``, and the ``value``'s first 40 characters.

    Also an ``end_tool_call`` the ledger refuses, having stored nothing (``problem``
    ``outcome``: not exactly one of result and error; ``not_begun``; ``ended``: the call
    ended otherwise already), with the ``thread_id``, ``message_id`` and ``call_id``."""

    default_code = "INPUT_001"
    kind: ClassVar[ErrorKind] = "invalid"


class TurnFailedError(ThreadkeepError):
    """A turn failed more often than its ``max_retries`` allow (SPEC TM2), or timed out.

    ``__cause__`` is the last failure's error; :attr:`failures` holds every failure of the
    turn, oldest first (each a :class:`threadkeep.turns.ToolFailure` with its ``error``).
    ``context`` names the ``user_id``, the ``thread_id``, the ``attempts`` and whether the
    turn was kept for :meth:`~threadkeep.turns.TurnManager.resume_last_turn` (``resumable``).
    """

    default_code = "TURN_001"
    kind: ClassVar[ErrorKind] = "unavailable"

    def __init__(
        self, message: str, *, failures: tuple[Any, ...] = (), context: dict[str, Any] | None = None
    ) -> None:
        super().__init__(message, context=context)
        self.failures = failures


class NoResumableTurnError(ThreadkeepError):
    """:meth:`~threadkeep.turns.TurnManager.resume_last_turn` found no turn to resume: resume
    is off, the user has none, or it expired (SPEC TM4). Nothing was run."""

    default_code = "TURN_002"
    kind: ClassVar[ErrorKind] = "invalid"


class ToolCallError(ThreadkeepError):
    """A tool call did not succeed, as the model and the caller see it (SPEC TM5).

    ``code`` says how: ``TOOL_001`` the ledger recorded the call as failed (a replay raises
    the recorded error again, without running the tool); ``TOOL_UNKNOWN_001`` the call
    started and never finished (a crash between its start and its end), so whether its side
    effect happened is not known, and the tool is not declared idempotent; ``TOOL_RESULT_001``
    a tool returned an error result (a ``ToolMessage`` with ``status="error"``). ``context``
    names the ``tool``, and where known the ``thread_id``, ``message_id``, ``call_id`` and the
    idempotency ``key``.
    """

    default_code = "TOOL_001"
    kind: ClassVar[ErrorKind] = "unavailable"


class ThreadNotFoundError(ThreadkeepError):
    """No thread (or no checkpoint of it) by that id that the caller may see: none is stored,
    or another user owns it; the two are not told apart, so that a user learns nothing of
    another's threads. ``context`` names the ``thread_id`` and, for a checkpoint, the
    ``checkpoint_id``."""

    default_code = "THREAD_NOT_FOUND_001"
    kind: ClassVar[ErrorKind] = "not_found"

    def __init__(self, thread_id: str, checkpoint_id: str | None = None) -> None:
        if checkpoint_id is None:
            what, context = f"thread {thread_id!r}", {"thread_id": thread_id}
        else:
            what = f"checkpoint {checkpoint_id!r} of thread {thread_id!r}"
            context = {"thread_id": thread_id, "checkpoint_id": checkpoint_id}
        super().__init__(
            f"no {what} that you may see: check the id (the threads listing and the thread's "
            "history show the ids you may open)",
            context=context,
        )


class AuthenticationError(ThreadkeepError):
    """A request to ``threadkeep serve``'s ``/api`` carried no API key, or one the server
    does not know (``LLM_PROVIDER_CHECKPOINT_API_KEYS``)."""

    default_code = "AUTH_001"
    kind: ClassVar[ErrorKind] = "unauthorized"


class PermissionDeniedError(ThreadkeepError):
    """An API key's role may not do what the request asks (an admin-only route, or a user
    key naming another user); nothing was done. ``context`` names the key's ``user``."""

    default_code = "AUTH_002"
    kind: ClassVar[ErrorKind] = "forbidden"


class StorageError(ThreadkeepError):
    """The store failed, or stayed unreachable past the retries; nothing was half-written."""

    default_code = "STORAGE_000"
    kind: ClassVar[ErrorKind] = "unavailable"


class StaleStateError(StorageError):
    """A put continued a thread whose head moved on; it stored nothing.

    The thread is usable at once: the next run loads the true head.
    """

    default_code = "STORAGE_CONFLICT_001"
    kind: ClassVar[ErrorKind] = "conflict"

    def __init__(self, thread_id: str, checkpoint_ns: str, expected: str | None, current: str | None) -> None:
        where = f"thread {thread_id!r}" + (f" namespace {checkpoint_ns!r}" if checkpoint_ns else "")
        super().__init__(
            f"{where} moved on: this run continued from checkpoint {expected!r} but the head is "
            f"now {current!r}; nothing was stored. Load the thread again and retry.",
            context={
                "thread_id": thread_id,
                "checkpoint_ns": checkpoint_ns,
                "expected_head": expected,
                "current_head": current,
            },
        )
        self.thread_id = thread_id
        self.expected = expected
        self.current = current


class StorageForbiddenError(StorageError):
    """A user tried to write, delete, copy or prune a thread another user owns (SPEC W3)."""

    default_code = "STORAGE_FORBIDDEN_001"
    kind: ClassVar[ErrorKind] = "forbidden"

    def __init__(self, thread_id: str, user_id: str, *, action: str = "write") -> None:
        if action == "write":
            hint, context = "Use a thread id of your own.", {"thread_id": thread_id, "user_id": user_id}
        else:
            hint = (
                "Nothing was changed. Act as its owner (configurable user_id, or threadkeep.user_scope), "
                "or as the operator (threadkeep.operator_scope())."
            )
            context = {"thread_id": thread_id, "user_id": user_id, "action": action}
        super().__init__(
            f"thread {thread_id!r} belongs to another user; user {user_id!r} may not {action} it. {hint}",
            context=context,
        )

    @classmethod
    def operator_only(cls, operation: str, user_id: str) -> StorageForbiddenError:
        """The refusal of a call that acts on every user's threads (the sweep's own)."""
        error = cls.__new__(cls)
        ThreadkeepError.__init__(
            error,
            f"{operation} acts on every user's threads; user {user_id!r} may not call it. Call it "
            "inside threadkeep.operator_scope(), as the sweep and the operator CLI do",
            context={"operation": operation, "user_id": user_id},
        )
        return error

    @classmethod
    def listing(cls, owner: str, user_id: str) -> StorageForbiddenError:
        """The refusal of a thread listing, in ``user_id``'s scope, of another user's threads."""
        error = cls.__new__(cls)
        ThreadkeepError.__init__(
            error,
            f"user {user_id!r} may not list the threads of user {owner!r}: a user lists only their "
            "own threads. Leave the owner filter out (or name yourself), or list as the operator "
            "(threadkeep.operator_scope())",
            context={"owner": owner, "user_id": user_id, "action": "list"},
        )
        return error

    @classmethod
    def owned(cls, owners: Mapping[str, str], user: str) -> StorageForbiddenError:
        """The refusal to hand threads another user owns to ``user`` (``assign_owner``)."""
        named = ", ".join(f"{thread_id!r} (owner {owner!r})" for thread_id, owner in sorted(owners.items()))
        error = cls.__new__(cls)
        ThreadkeepError.__init__(
            error,
            f"not assigning to user {user!r}: thread(s) {named} belong to another user, not to the "
            "anonymous owner; no thread changed owner. Take them anyway with force=True "
            "(threadkeep threads assign-owner --force)",
            context={"user_id": user, "owners": dict(owners)},
        )
        return error


class CheckpointDeleteError(StorageError):
    """Deleting a thread made no progress against a writer that keeps adding to it.

    No store raises it any more: every store deletes a thread whole, in one transaction or
    script, and what is written after belongs to a new thread, which stays. Kept so that
    code catching it still imports.
    """

    default_code = "STORAGE_DELETE_001"


class StorageRefusedError(StorageError):
    """The server answered, and refused: a login, a database that does not exist, a
    privilege the role lacks, or a statement or command (an SQL error, a script error). It
    is not a dropped connection, so it is raised at its first try, not retried; the message
    names what was refused and what to do. ``code`` says which: ``STORAGE_AUTH_001``,
    ``STORAGE_DATABASE_001``, ``STORAGE_PERMISSION_001``, or ``STORAGE_REFUSED_001`` for a
    statement or command."""

    default_code = "STORAGE_REFUSED_001"
