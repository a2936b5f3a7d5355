"""What an id may hold, the same on every store. No I/O.

The ids a call names are keys in every store: thread ids and user ids (a thread's owner),
checkpoint namespaces and checkpoint ids, task ids, run ids and park ids. An id is a ``str``
that

- UTF-8 can encode: no lone surrogate (U+D800-U+DFFF not in a pair), which no store can
  write as text;
- holds no NUL (U+0000): Postgres text cannot hold it, and Redis fields use it to separate
  the parts of a key (``"<ns>\\0<checkpoint id>"``);
- is at most its limit long, in UTF-8 bytes: :data:`MAX_NAMESPACE_BYTES` for a namespace,
  :data:`MAX_PARK_ID_BYTES` for a park id, :data:`MAX_ID_BYTES` for every other id.

The limits keep every key within a Postgres btree index row (2,704 bytes on 8 kB pages) with
room to spare, whatever the ids hold (a large value is not compressed below the limit if it
does not compress). The widest key is ``tk_writes``' primary key: a thread's 8-byte key, a
namespace, a checkpoint id, a task id and a 4-byte index, under 2,100 bytes with each text's
4-byte header and alignment; ``tk_checkpoints``' (thread, namespace, checkpoint id) and
``tk_parks``' (thread, park id) are smaller, and the thread id, the owner and the run id are
each indexed alone. The same ids are accepted on every store, so a thread moves between
providers unchanged.

An id that breaks a rule is refused before any I/O with :class:`InvalidInputError`, naming
the field, what is wrong and the limit: the call reads and stores nothing, and is not retried.
A read is refused like a write: an id no store could hold is a mistake the caller should see,
not a thread that happens to be empty.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Final

from threadkeep.errors import InvalidInputError

__all__ = [
    "MAX_ID_BYTES",
    "MAX_NAMESPACE_BYTES",
    "MAX_PARK_ID_BYTES",
    "checked_id",
    "checked_ids",
    "checked_park",
]

MAX_ID_BYTES: Final = 512
MAX_NAMESPACE_BYTES: Final = 1024
# What ask() composes: "<namespace>|<task id>".
MAX_PARK_ID_BYTES: Final = MAX_NAMESPACE_BYTES + 1 + MAX_ID_BYTES

_SHOWN: Final = 40  # characters of a refused id its error's context shows


def checked_id(value: object, field: str, limit: int = MAX_ID_BYTES) -> str:
    """``value`` if it is a valid id (see the module), else the error that names ``field``.

    Raises:
        InvalidInputError: ``value`` is not a string, holds a lone surrogate or a NUL, or is
            longer than ``limit`` UTF-8 bytes.
    """
    if not isinstance(value, str):
        what = f"is of type {type(value).__name__}, not str; pass the id as text"
        raise _refused(field, what, problem="type", value=value)
    if value.isascii():  # the usual case: one byte a character, no surrogate
        size = len(value)
    else:
        try:
            size = len(value.encode("utf-8"))
        except UnicodeEncodeError as exc:
            raise _refused(
                field,
                f"holds a lone surrogate (U+{ord(value[exc.start]):04X}) at character {exc.start}, which "
                "UTF-8 cannot encode (often bytes decoded with errors='surrogateescape'); pass valid "
                "Unicode text",
                problem="surrogate",
                value=value,
                position=exc.start,
            ) from None
    nul = value.find("\0")
    if nul >= 0:
        raise _refused(
            field,
            f"holds a NUL character (U+0000) at character {nul}; ids may not contain NUL "
            "(Postgres cannot store it, Redis keys use it as a separator): remove or replace it",
            problem="nul",
            value=value,
            position=nul,
        )
    if size > limit:
        raise _refused(
            field,
            f"is {size} bytes in UTF-8, over the limit of {limit} bytes that every store can key; "
            "use a shorter id (for example a digest of this one)",
            problem="too_long",
            value=value,
            size=size,
            limit=limit,
        )
    return value


def checked_ids(values: Iterable[object], field: str) -> list[str]:
    """Each of ``values`` as text (``str()``), checked by :func:`checked_id`; a refused one
    is named ``field[i]``."""
    return [checked_id(str(value), f"{field}[{i}]") for i, value in enumerate(values)]


def checked_park(thread_id: object, park_id: object) -> tuple[str, str]:
    """A park's thread id (as text) and park id, each checked by :func:`checked_id`."""
    return checked_id(str(thread_id), "thread_id"), checked_id(park_id, "park_id", MAX_PARK_ID_BYTES)


def _refused(field: str, what: str, *, problem: str, value: object, **facts: int) -> InvalidInputError:
    if isinstance(value, str):
        shown = repr(value[:_SHOWN]) + ("..." if len(value) > _SHOWN else "")
    else:
        shown = repr(value)[:_SHOWN]
    return InvalidInputError(
        f"{field} {what}. Nothing was read or stored.",
        context={"field": field, "problem": problem, "value": shown, **facts},
    )
