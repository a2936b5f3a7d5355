"""Exceptions as readable records (SPEC C4).

An exception in a checkpoint (LangGraph stores a failed task's error as a pending write) is
kept as a record ``{id, message, kwargs, repr_kwargs, cause, repr}``. It reads back as what
LangGraph's own serializer stores for an exception, its ``repr()`` text (a ``str``:
``"ValueError('Input is too large')"``), which carries the record: a
:class:`CheckpointedException` that :meth:`CheckpointedException.of` returns. No class named
by a record is ever imported.
"""

from __future__ import annotations

from typing import Any

__all__ = ["CheckpointedException", "ExceptionText", "exception_cause"]


class CheckpointedException(Exception):
    """The record of an exception stored in a checkpoint.

    Attributes:
        id: The original class as module path parts then class name,
            e.g. ``["myapp", "errors", "StepFailed"]``.
        message: ``str()`` of the original exception.
        kwargs: Its attributes; those JSON could not hold are their ``repr()``.
        repr_kwargs: The names in ``kwargs`` stored as ``repr()``.
        cause: The exception it was raised from, as another ``CheckpointedException``.
        text: ``repr()`` of the original, what LangGraph's serializer stores for it.
    """

    def __init__(
        self,
        id: list[str],
        message: str,
        kwargs: dict[str, Any] | None = None,
        repr_kwargs: list[str] | None = None,
        cause: CheckpointedException | None = None,
        *,
        text: str | None = None,
    ) -> None:
        super().__init__(message)
        self.id = list(id)
        self.message = message
        self.kwargs = dict(kwargs or {})
        self.repr_kwargs = list(repr_kwargs or [])
        self.cause = cause
        self.__cause__ = cause
        if text is None:  # a record stored without it (by an earlier version)
            # exact for an exception built from its message alone
            name = self.id[-1] if self.id else "Exception"
            text = f"{name}({message!r})" if message else f"{name}()"
        self.text = text

    @classmethod
    def of(cls, value: object) -> CheckpointedException | None:
        """The record behind an error read back from a checkpoint, or None.

        A failed task's error reads back as LangGraph's savers return it, the exception's
        ``repr()`` text; that text carries the record::

            error = graph.get_state(config).tasks[0].error  # "ValueError('Input is too large')"
            record = CheckpointedException.of(error)  # .id, .message, .kwargs, .cause

        Args:
            value: A value read back from a checkpoint.

        Returns:
            The record, if ``value`` is an exception's text read back by the faithful codec;
            None for any other value.
        """
        return value.exception if isinstance(value, ExceptionText) else None

    @property
    def exc_type(self) -> str:
        """The original class's dotted path, e.g. ``myapp.errors.StepFailed``."""
        return ".".join(self.id)

    def record(self) -> dict[str, Any]:
        """The record this exception carries, with the cause as a nested record."""
        return {
            "id": self.id,
            "message": self.message,
            "repr": self.text,
            "kwargs": self.kwargs,
            "repr_kwargs": self.repr_kwargs,
            "cause": None if self.cause is None else self.cause.record(),
        }

    def __str__(self) -> str:
        return f"{self.exc_type}: {self.message}"

    def __repr__(self) -> str:
        return f"CheckpointedException({self.exc_type!r}, {self.message!r})"

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, CheckpointedException):
            return NotImplemented
        return self.record() == other.record()

    def __hash__(self) -> int:
        return hash((tuple(self.id), self.message))

    def __reduce__(self) -> tuple[Any, ...]:
        return (
            CheckpointedException,
            (self.id, self.message, self.kwargs, self.repr_kwargs, self.cause),
            {"text": self.text},
        )


class ExceptionText(str):
    """An exception read back from a checkpoint: the ``repr()`` text LangGraph's serializer
    stores for it (equal to that ``str``), carrying its record as :attr:`exception`.

    Written again, it is stored as the record it carries.
    """

    exception: CheckpointedException

    def __new__(cls, text: str, exception: CheckpointedException) -> ExceptionText:
        self = super().__new__(cls, text)
        self.exception = exception
        return self

    def __reduce__(self) -> tuple[Any, ...]:
        return (ExceptionText, (str(self), self.exception))


def exception_cause(exc: BaseException) -> BaseException | None:
    """The exception ``exc`` was raised from: ``__cause__``, else an unsuppressed context."""
    if exc.__cause__ is not None:
        return exc.__cause__
    if exc.__suppress_context__:
        return None
    return exc.__context__
