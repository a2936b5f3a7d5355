"""Array parameters sent in Postgres's binary array format, typed in advance.

A step's rows go to Postgres as one array per column (``unnest(%(digest)b::bytea[], ...)``).
Given a plain list, psycopg works out the array's element type on every call (it scans the
list for a non-NULL element and picks a dumper for it) and dumps each element through that
dumper: for a put of a few rows, more client CPU than the rest of the statement's
parameters. The statements declare each array's type already (its cast), so
:func:`typed_arrays` wraps each list in the array class its cast names, whose dumper writes
the whole array in one loop. A list without a wrapper still works (psycopg's own dumper).

The dumpers are registered on psycopg's global adapters, for these classes only, so they
also serve connections of pools an application hands in (if created after this import; an
older connection uses psycopg's dumper, with the same result).
"""

from __future__ import annotations

import functools
import re
import struct
from typing import Any, ClassVar

import psycopg
from psycopg.adapt import Dumper
from psycopg.pq import Format

__all__ = ["ByteaArray", "IntegerArray", "TextArray", "typed_arrays"]

# ndim, has NULLs, element type; for a non-empty array its length and lower bound (1).
_EMPTY = struct.Struct(">iiI")
_HEADER = struct.Struct(">iiIii")
_LENGTH = struct.Struct(">i")
_NULL = _LENGTH.pack(-1)
_INT4 = struct.Struct(">ii")  # an int4 element: its length (4) and value


class _Array(list[Any]):
    """A list sent as a one-dimensional Postgres array of ``ELEMENT_OID``."""

    ELEMENT_OID: ClassVar[int]

    @staticmethod
    def element(value: Any, encoding: str) -> bytes:
        """One non-NULL element in Postgres's binary form (text in ``encoding``, the
        connection's client encoding, as the server reads it)."""
        raise NotImplementedError


class ByteaArray(_Array):
    """``bytea[]``: bytes-like values, or None."""

    ELEMENT_OID = 17

    @staticmethod
    def element(value: Any, encoding: str) -> bytes:
        return value if type(value) is bytes else bytes(memoryview(value))


class TextArray(_Array):
    """``text[]``: strings, or None."""

    ELEMENT_OID = 25

    @staticmethod
    def element(value: Any, encoding: str) -> bytes:
        # str.encode takes a subclass's own text (an Enum's value), not its __str__.
        return str.encode(value, encoding) if isinstance(value, str) else str(value).encode(encoding)


class IntegerArray(_Array):
    """``integer[]``: ints that fit in 32 bits, or None."""

    ELEMENT_OID = 23


class _ArrayDumper(Dumper):
    format = Format.BINARY

    def __init__(self, cls: type, context: Any = None) -> None:
        super().__init__(cls, context)
        self.encoding = self.connection.info.encoding if self.connection is not None else "utf-8"

    def dump(self, obj: Any) -> bytes:
        if not obj:
            return _EMPTY.pack(0, 0, obj.ELEMENT_OID)
        if type(obj) is IntegerArray:
            return self._integers(obj)
        parts = [b""]
        add, length, element, encoding, nulls = parts.append, _LENGTH.pack, obj.element, self.encoding, 0
        for value in obj:
            if value is None:
                add(_NULL)
                nulls = 1
            else:
                data = element(value, encoding)
                add(length(len(data)))
                add(data)
        parts[0] = _HEADER.pack(1, nulls, obj.ELEMENT_OID, len(obj), 1)
        return b"".join(parts)

    @staticmethod
    def _integers(obj: IntegerArray) -> bytes:
        pack = _INT4.pack
        try:
            parts = [_NULL if value is None else pack(4, value) for value in obj]
        except struct.error:
            raise psycopg.DataError(
                f"an integer[] parameter holds a value out of the 32-bit range: {obj!r}"
            ) from None
        nulls = 1 if None in obj else 0
        return _HEADER.pack(1, nulls, obj.ELEMENT_OID, len(obj), 1) + b"".join(parts)


class _ByteaArrayDumper(_ArrayDumper):
    oid = 1001


class _TextArrayDumper(_ArrayDumper):
    oid = 1009


class _IntegerArrayDumper(_ArrayDumper):
    oid = 1007


psycopg.adapters.register_dumper(ByteaArray, _ByteaArrayDumper)
psycopg.adapters.register_dumper(TextArray, _TextArrayDumper)
psycopg.adapters.register_dumper(IntegerArray, _IntegerArrayDumper)

_CASTS: dict[str, type[_Array]] = {"bytea": ByteaArray, "text": TextArray, "integer": IntegerArray}
_ARRAY_PARAMETER = re.compile(r"%\((\w+)\)b::(bytea|text|integer)\[\]")


@functools.lru_cache(maxsize=64)
def _array_parameters(sql: str) -> dict[str, type[_Array]]:
    return {name: _CASTS[cast] for name, cast in _ARRAY_PARAMETER.findall(sql)}


def typed_arrays(sql: str, params: dict[str, Any]) -> dict[str, Any]:
    """``params`` with each list a binary array parameter of ``sql`` takes
    (``%(name)b::bytea[]``, ``text[]``, ``integer[]``) wrapped in its array class."""
    arrays = _array_parameters(sql)
    for name, kind in arrays.items():
        value = params.get(name)
        if type(value) is list:
            params[name] = kind(value)
    return params
