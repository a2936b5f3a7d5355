"""The faithful JSON codec (SPEC C1-C4, C6).

Values JSON holds natively are written as JSON. Every other supported value is written as an
*envelope*: a one-key object whose key starts with ``~`` and names the kind::

    {"~datetime": ["2026-03-29T02:30:00", {"~zoneinfo": "Europe/Paris"}, 0]}
    {"~lc": [["langchain", "schema", "messages", "AIMessage"], {"content": "hi", ...}]}

A plain dict that would read as an envelope (one key starting with ``~``) is written as a
``~dict`` of pairs, so no user data is ever mistaken for one. Decoding never imports or calls
anything but enum, dataclass and pydantic classes from modules already imported or named in
the allowlist (or that this process stored, for a class no module names), LangChain classes
its own loader revives, and threadkeep's own types; no pickle. A subclass of a builtin is
written as its base type's value; an exception as a record that reads back as its ``repr()``
text, as LangGraph's savers return it.
"""

from __future__ import annotations

import base64
import dataclasses
import enum
import importlib
import inspect
import math
import secrets
import sys
import uuid
import weakref
from collections.abc import Callable, Collection, Iterable, Sequence
from datetime import date, datetime, time, timedelta, timezone, tzinfo
from decimal import Decimal
from functools import lru_cache
from typing import Any, Final
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

import orjson
from langchain_core.load.load import Reviver, default_init_validator
from langchain_core.load.serializable import Serializable
from langgraph.checkpoint.serde.types import _DeltaSnapshot
from langgraph.types import Send
from pydantic import BaseModel

from threadkeep.codec.exceptions import CheckpointedException, ExceptionText, exception_cause
from threadkeep.errors import CheckpointSerializationError

__all__ = ["FaithfulCodec"]

_INT_MIN: Final = -(2**63)
_INT_MAX: Final = 2**64 - 1
_SCALARS: Final = frozenset({str, int, float, bool, type(None)})


class _Refused(Exception):
    """Internal: a value was refused; ``path`` collects segments innermost first."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason
        self.path: list[str] = []

    def error(self) -> CheckpointSerializationError:
        return CheckpointSerializationError(self.reason, path=_join(reversed(self.path)))


def _join(segments: Iterable[str]) -> str:
    out = ""
    for segment in segments:
        out += segment if segment.startswith("[") or not out else "." + segment
    return out


def _key_segment(key: object) -> str:
    if isinstance(key, str) and key.isidentifier():
        return key
    return f"[{key!r}]"


# Classes this process stored whose name no module holds: a class defined inside a function
# (a graph's schema in a test or a factory), a parametrized generic model (``Page[int]``).
# Read back by this name in this process only; held weakly, as the class is.
_UNNAMED: Final[weakref.WeakValueDictionary[tuple[str, str], type]] = weakref.WeakValueDictionary()


def _unnamed(qualname: str) -> bool:
    """Whether no module can hold a class under ``qualname``."""
    return "<locals>" in qualname or "[" in qualname


def _importable(cls: type) -> tuple[str, str]:
    """The (module, qualname) that names ``cls``. A class no module can name is remembered,
    so this process reads it back (LangGraph's savers store it too)."""
    names = cls.__module__, cls.__qualname__
    if _unnamed(names[1]) and _UNNAMED.get(names) is not cls:
        _UNNAMED[names] = cls
    return names


@lru_cache(maxsize=1)
def _reviver() -> Reviver:
    return Reviver(allowed_objects="core")


_LC_VALIDATOR: Final = _reviver().init_validator
# The key LangChain's own validator looks at: it refuses kwargs whose template_format is
# "jinja2" and passes any others, so kwargs without the key need no call. None for any
# other validator, which sees every kwargs.
_LC_VALIDATED_KEY: Final = "template_format" if _LC_VALIDATOR is default_init_validator else None
_LC_PREFIX: Final = b'{"~lc":['
_MARK: Final = b'"~'
_NOT_PLAIN: Final = object()
# id bytes -> (the id, how to build the class from its kwargs), filled as ids are first read.
_LC_BY_BYTES: dict[bytes, tuple[tuple[str, ...], Callable[[dict[str, Any]], object]]] = {}


# Message classes rebuilt from their stored fields without running their validators: the
# fields were validated when the message was built, and the constructor is most of the
# cost of every read. Chunk classes derive fields after validation and use the constructor.
_TRUSTED_MESSAGES: Final = frozenset({"HumanMessage", "AIMessage", "SystemMessage", "ToolMessage"})


# The slots every pydantic model has, set without pydantic's own __setattr__.
_SET_DICT: Final = BaseModel.__dict__["__dict__"].__set__
_SET_FIELDS_SET: Final = BaseModel.__dict__["__pydantic_fields_set__"].__set__
_SET_EXTRA: Final = BaseModel.__dict__["__pydantic_extra__"].__set__
_SET_PRIVATE: Final = BaseModel.__dict__["__pydantic_private__"].__set__
_NEW: Final = object.__new__


class _Shape:
    """How to rebuild a model from kwargs naming one set of its fields, in one order: the
    instance's ``__dict__`` starts as ``template`` (every field in declaration order, the
    defaults filled in), takes the kwargs, then a fresh value from each missing field's
    default factory. Kwargs that name every field in declaration order (``whole``: the
    encoding of a message whose every field was given, as LangGraph's agents' are) are the
    ``__dict__`` as they are."""

    __slots__ = ("factories", "given", "template", "whole")

    def __init__(
        self,
        template: dict[str, Any],
        factories: tuple[tuple[str, Callable[[], Any]], ...],
        given: frozenset[str],
        whole: bool,
    ) -> None:
        self.template, self.factories, self.given, self.whole = template, factories, given, whole


class _Rebuild:
    """Rebuilds one pydantic model class from validated field values, as ``model_construct``
    does, without its per-field default deep copies (``copy.deepcopy`` of ``None`` and of
    strings is the identity) and with the class's plan computed once.

    Stored messages name only the fields given when they were built (``lc_kwargs``), and a
    thread's messages name a handful of field sets: each set's :class:`_Shape` is worked
    out once, so a rebuild is a dict copy and update, not a loop over the fields, or no copy
    at all when the kwargs name every field. The kwargs passed in become the instance's:
    the caller must not use them after.
    """

    _MAX_SHAPES: Final = 64

    def __init__(self, cls: type[BaseModel]) -> None:
        if cls.__new__ is not object.__new__:
            raise TypeError(f"{cls.__qualname__} defines __new__")
        self.cls = cls
        self.plan: list[tuple[str, Callable[[], Any] | None, Any]] = []
        for name, info in cls.model_fields.items():
            if info.is_required():
                self.plan.append((name, None, _NO_DEFAULT))
            elif info.default_factory is not None:
                self.plan.append((name, info.default_factory, _NO_DEFAULT))  # type: ignore[arg-type]
            elif info.default is None or isinstance(info.default, (str, int, float, bool)):
                self.plan.append((name, None, info.default))
            else:
                raise TypeError(f"{cls.__qualname__}.{name} has a mutable default")
        self.extra = cls.model_config.get("extra") == "allow"
        self.shapes: dict[tuple[str, ...], _Shape] = {}

    def build(self, kwargs: dict[str, Any]) -> BaseModel:
        """The instance ``kwargs`` describe (the rebuilder :func:`_rebuilder` hands out: a
        bound method, which costs less to call than an instance's ``__call__``)."""
        shape = self.shapes.get(tuple(kwargs))
        if shape is None:
            shape = self._shape(tuple(kwargs))
            if shape is None:  # unknown or missing fields
                return self._general(kwargs)
        if shape.whole:
            values = kwargs
        else:
            values = shape.template.copy()
            values.update(kwargs)
            for name, factory in shape.factories:
                values[name] = factory()
        instance = _NEW(self.cls)
        _SET_DICT(instance, values)
        _SET_FIELDS_SET(instance, set(shape.given))
        _SET_EXTRA(instance, {} if self.extra else None)
        _SET_PRIVATE(instance, None)
        return instance

    def _shape(self, names: tuple[str, ...]) -> _Shape | None:
        """The shape of kwargs naming ``names``, remembered; None if they name a field the
        class does not declare or miss a required one (the general path says which)."""
        given = frozenset(names)
        if not given <= {name for name, _, _ in self.plan}:
            return None
        template: dict[str, Any] = {}
        factories: list[tuple[str, Callable[[], Any]]] = []
        for name, factory, default in self.plan:
            template[name] = None
            if name in given:
                continue
            if factory is not None:
                factories.append((name, factory))
            elif default is _NO_DEFAULT:
                return None
            else:
                template[name] = default
        whole = names == tuple(template)
        shape = _Shape(template, tuple(factories), given, whole)
        if len(self.shapes) < self._MAX_SHAPES:
            self.shapes[names] = shape
        return shape

    def _general(self, kwargs: dict[str, Any]) -> BaseModel:
        values: dict[str, Any] = {}
        given: set[str] = set()
        for name, factory, default in self.plan:
            if name in kwargs:
                values[name] = kwargs.pop(name)
                given.add(name)
            elif factory is not None:
                values[name] = factory()
            elif default is _NO_DEFAULT:
                raise _Refused(f"stored {self.cls.__qualname__} lacks its field {name!r}")
            else:
                values[name] = default
        if kwargs and not self.extra:
            raise _Refused(f"stored {self.cls.__qualname__} has unknown fields {sorted(kwargs)}")
        instance = _NEW(self.cls)
        object.__setattr__(instance, "__dict__", values)
        object.__setattr__(instance, "__pydantic_fields_set__", given | set(kwargs))
        object.__setattr__(instance, "__pydantic_extra__", kwargs if self.extra else None)
        object.__setattr__(instance, "__pydantic_private__", None)
        return instance


@lru_cache(maxsize=64)
def _rebuilder(cls: type[Serializable]) -> Callable[[dict[str, Any]], object]:
    """How to build ``cls`` from stored kwargs: the fast rebuild for trusted messages."""
    if (
        cls.__name__ in _TRUSTED_MESSAGES
        and cls.__module__.startswith("langchain_core.messages")
        and not cls.__pydantic_post_init__
    ):
        try:
            return _Rebuild(cls).build
        except TypeError:
            pass
    return lambda kwargs: cls(**kwargs)


@lru_cache(maxsize=256)
def _lc_class_by_bytes(id_bytes: bytes) -> tuple[type[Serializable], tuple[str, ...]]:
    """:func:`_lc_class` keyed by the stored bytes of the id list, e.g. ``["langchain",...]``."""
    try:
        key = tuple(orjson.loads(id_bytes))
    except (orjson.JSONDecodeError, TypeError):
        raise _Refused(f"malformed LangChain id {id_bytes!r:.80}") from None
    return _lc_class(key), key


@lru_cache(maxsize=256)
def _lc_class(key: tuple[str, ...]) -> type[Serializable]:
    """The class LangChain's loader would build for ``key``, with the loader's own checks.

    The same decisions as ``Reviver.__call__`` (allowlist, trusted namespaces, import mapping,
    a ``Serializable`` subclass), taken once per class instead of once per value.
    """
    if not all(type(part) is str for part in key):
        raise _Refused(f"malformed LangChain id {key!r:.80}")
    reviver = _reviver()
    allowed = reviver.allowed_class_paths
    if (allowed is not None and key not in allowed) or key not in reviver.import_mappings:
        raise _Refused(f"LangChain's loader does not revive {'.'.join(key)}")
    *module_path, name = reviver.import_mappings[key]
    if key[0] not in reviver.valid_namespaces or module_path[0] not in reviver.valid_namespaces:
        raise _Refused(f"LangChain's loader does not trust the namespace of {'.'.join(key)}")
    cls = getattr(importlib.import_module(".".join(module_path)), name)
    if not (isinstance(cls, type) and issubclass(cls, Serializable)):
        raise _Refused(f"{'.'.join(key)} is not a LangChain Serializable")
    return cls


@dataclasses.dataclass(frozen=True, slots=True)
class _LcSpec:
    """How one LangChain class is written: its loader id and its fields."""

    lc_id: list[str]
    # (name, required, default) for each field the loader's constructor takes
    fields: tuple[tuple[str, bool, Any], ...]
    # lc_attributes getters along the MRO: their keys are always written, as to_json does
    attribute_getters: tuple[Callable[[Any], dict[str, Any]], ...]
    slow: bool  # declares secrets: serialize through to_json and refuse what it would drop


_NO_DEFAULT: Final = object()

# A subclass of these types (langchain-core's TextAccessor, a str subclass; an OrderedDict; a
# named tuple) is stored as the base type's value and reads back as the base type, as
# LangGraph's own serializer does for str, int, dict and list: its class is not rebuilt, so no
# code of it runs on read. Each function copies the value out as the exact base type.
_NEAREST: Final[dict[type, Callable[[Any], object]]] = {
    str: str.__str__,
    int: int.__int__,
    float: float.__float__,
    bytes: lambda v: bytes(memoryview(v)),
    bytearray: bytearray,
    list: list,
    tuple: tuple,
    dict: dict,
    set: set,
    frozenset: frozenset,
    Decimal: Decimal,
    uuid.UUID: lambda v: uuid.UUID(int=v.int),
}


@lru_cache(maxsize=256)
def _lc_spec(cls: type[Serializable]) -> _LcSpec:
    if not cls.is_lc_serializable():
        raise _Refused(f"{cls.__module__}.{cls.__qualname__} is not LangChain-serializable")
    lc_id = list(cls.lc_id())
    try:
        revived = _lc_class(tuple(lc_id))
    except _Refused:
        revived = None
    if revived is not cls:
        raise _Refused(
            f"LangChain's loader will not revive {cls.__module__}.{cls.__qualname__} "
            f"(id {'.'.join(lc_id)}); store a plain LangChain class or convert the value"
        )
    fields: list[tuple[str, bool, Any]] = []
    for name, info in cls.model_fields.items():
        if info.exclude:
            continue
        if info.is_required():
            fields.append((name, True, _NO_DEFAULT))
        elif info.default_factory is not None:
            fields.append((name, False, info.default_factory()))  # type: ignore[call-arg]
        else:
            fields.append((name, False, info.default))
    lineage = cls.mro()[: cls.mro().index(Serializable)]
    getters = tuple(
        klass.__dict__["lc_attributes"].fget
        for klass in reversed(lineage)
        if isinstance(klass.__dict__.get("lc_attributes"), property)
    )
    slow = any("lc_secrets" in klass.__dict__ for klass in lineage)
    return _LcSpec(lc_id=lc_id, fields=tuple(fields), attribute_getters=getters, slow=slow)


def _lc_kwargs(value: Serializable, spec: _LcSpec) -> dict[str, Any]:
    """The constructor kwargs that rebuild ``value``: the fields it was given or that differ
    from their defaults, its extra fields, and what its ``lc_attributes`` always include."""
    if spec.slow:
        data = value.to_json()
        if data.get("type") != "constructor":
            raise _Refused(f"{type(value).__qualname__} does not serialize as a constructor")
        kwargs = dict(data["kwargs"])  # type: ignore[typeddict-item]
        if _holds_secret(kwargs):
            raise _Refused(f"{type(value).__qualname__} holds secrets that LangChain's loader would drop")
        return kwargs
    attrs = value.__dict__
    given = value.model_fields_set
    always: dict[str, Any] = {}
    for getter in spec.attribute_getters:
        always.update(getter(value))
    # Fields in declaration order, those lc_attributes always include among them: decoded,
    # they are marked given, so a message read back encodes to the same bytes (its digest).
    kwargs = {}
    for name, required, default in spec.fields:
        if name in always:
            kwargs[name] = always.pop(name)
            continue
        item = attrs.get(name)
        if required or name in given or _useful(item, default):
            kwargs[name] = item
    kwargs.update(always)
    if value.__pydantic_extra__:
        kwargs.update(value.__pydantic_extra__)
    return kwargs


def _useful(item: object, default: object) -> bool:
    """Whether a field left unset still needs writing: it no longer holds its default."""
    try:
        return type(item) is not type(default) or bool(item != default)
    except Exception:
        return True


def _holds_secret(value: object) -> bool:
    if isinstance(value, dict):
        if value.get("lc") == 1 and value.get("type") == "secret":
            return True
        return any(_holds_secret(v) for v in value.values())
    if isinstance(value, list):
        return any(_holds_secret(v) for v in value)
    return False


def _message(exc: BaseException) -> str:
    try:
        return str(exc)
    except Exception:
        return repr(exc)


def _text_of(exc: BaseException) -> str:
    """What LangGraph's serializer stores for ``exc``: its ``repr()``."""
    try:
        return repr(exc)
    except Exception:
        return f"{type(exc).__qualname__}({_message(exc)!r})"


def _tz_payload(tz: tzinfo | None) -> object:
    if tz is None:
        return None
    if type(tz) is ZoneInfo:
        if tz.key is None:
            raise _Refused("a zone read from a file has no key and cannot be read back; use ZoneInfo(key)")
        return {"~zoneinfo": tz.key}
    if type(tz) is timezone or _is_pydantic_tz(tz):
        offset = tz.utcoffset(None)
        assert offset is not None
        name = tz.tzname(None)
        default_name = timezone(offset).tzname(None)
        return {"~timezone": [offset.total_seconds(), None if name == default_name else name]}
    raise _Refused(
        f"tzinfo {type(tz).__module__}.{type(tz).__qualname__} is neither a fixed offset nor a "
        "keyed ZoneInfo; convert the value to datetime.timezone or zoneinfo.ZoneInfo"
    )


def _is_pydantic_tz(tz: tzinfo) -> bool:
    kind = type(tz)
    return kind.__name__ == "TzInfo" and kind.__module__.startswith("pydantic")


def _decode_tz(payload: object) -> tzinfo | None:
    if payload is None:
        return None
    if isinstance(payload, dict) and len(payload) == 1:
        ((kind, body),) = payload.items()
        if kind == "~zoneinfo" and isinstance(body, str):
            try:
                return ZoneInfo(body)
            except (ZoneInfoNotFoundError, ValueError) as exc:
                raise _Refused(f"zone {body!r} is not in this host's zone database") from exc
        if (
            kind == "~timezone"
            and type(body) is list
            and len(body) == 2
            and type(body[0]) in (int, float)
            and (body[1] is None or type(body[1]) is str)
        ):
            offset = timedelta(seconds=body[0])
            return timezone(offset) if body[1] is None else timezone(offset, body[1])
    raise _Refused(f"unreadable tzinfo envelope {payload!r}")


def _unencodable_text(tree: object, path: str = "") -> str | None:
    """The path of the first string in ``tree`` that UTF-8 cannot encode, if any."""
    items: list[tuple[str, object]]
    if isinstance(tree, str):
        try:
            tree.encode()
        except UnicodeEncodeError:
            return path
        return None
    if isinstance(tree, list):
        items = [(f"{path}[{i}]", item) for i, item in enumerate(tree)]
    elif isinstance(tree, dict):
        items = []
        for key, item in tree.items():
            here = _join([path, _key_segment(key)]) if path else _key_segment(key)
            if _unencodable_text(key) is not None:
                return here
            items.append((here, item))
    else:
        return None
    for here, item in items:
        found = _unencodable_text(item, here)
        if found is not None:
            return found
    return None


def _revive_failure(exc: Exception) -> CheckpointSerializationError:
    """The error for a LangChain object that could not be revived: a refusal as itself,
    anything else wrapped (and kept as the cause)."""
    if isinstance(exc, _Refused):
        error = exc.error()
    else:
        error = CheckpointSerializationError(f"cannot revive a LangChain object: {exc}")
        error.__cause__ = exc
    error.__suppress_context__ = True
    return error


def _plain(tree: Any) -> bool:
    """Whether a parsed JSON tree holds no envelope (a one-key object whose key starts ``~``)."""
    if type(tree) is dict:
        if len(tree) == 1 and next(iter(tree))[:1] == "~":
            return False
        items = tree.values()
    else:
        items = tree
    for item in items:
        kind = type(item)
        if (kind is dict or kind is list) and not _plain(item):
            return False
    return True


def _text(payload: object) -> str:
    if type(payload) is not str:
        raise _Refused(f"malformed envelope: expected text, found {type(payload).__name__}")
    return payload


def _seq(payload: object) -> list[Any]:
    if type(payload) is not list:
        raise _Refused(f"malformed envelope: expected a list, found {type(payload).__name__}")
    return payload


def _fields(payload: object, *kinds: type) -> list[Any]:
    """``payload`` as a list of exactly ``kinds`` (``object`` admits anything)."""
    items = _seq(payload)
    if len(items) != len(kinds) or not all(
        kind is object or (type(item) is kind) for item, kind in zip(items, kinds, strict=False)
    ):
        names = ", ".join(k.__name__ for k in kinds)
        raise _Refused(f"malformed envelope: expected [{names}], found {items!r:.80}")
    return items


def _dec_clock(kind: type[datetime] | type[time], payload: object) -> datetime | time:
    wall, tz, fold = _fields(payload, str, object, int)
    value = kind.fromisoformat(wall)
    if value.tzinfo is not None or fold not in (0, 1):
        raise _Refused(f"malformed {kind.__name__} envelope {payload!r:.80}")
    return value.replace(tzinfo=_decode_tz(tz), fold=fold)


class FaithfulCodec:
    """Encode values to JSON bytes and back, keeping their types (SPEC C1-C4, C6).

    Args:
        allowlist: Extra classes decoding may import when their module is not imported yet:
            ``(module,)`` for a whole module or ``(module, qualname)`` for one class.
    """

    def __init__(self, allowlist: Collection[tuple[str, ...]] = ()) -> None:
        self.allowlist: frozenset[tuple[str, ...]] = frozenset(tuple(entry) for entry in allowlist)
        self._encoders: dict[type, Callable[[Any], object]] = {
            tuple: lambda v: {"~tuple": self._seq(v)},
            set: lambda v: {"~set": self._seq(v)},
            frozenset: lambda v: {"~frozenset": self._seq(v)},
            bytes: lambda v: {"~bytes": base64.b64encode(v).decode()},
            bytearray: lambda v: {"~bytearray": base64.b64encode(v).decode()},
            datetime: lambda v: {
                "~datetime": [v.replace(tzinfo=None).isoformat(), _tz_payload(v.tzinfo), v.fold]
            },
            date: lambda v: {"~date": v.isoformat()},
            time: lambda v: {"~time": [v.replace(tzinfo=None).isoformat(), _tz_payload(v.tzinfo), v.fold]},
            timedelta: lambda v: {"~timedelta": [v.days, v.seconds, v.microseconds]},
            timezone: _tz_payload,
            ZoneInfo: _tz_payload,
            Decimal: lambda v: {"~decimal": str(v)},
            uuid.UUID: lambda v: {"~uuid": v.hex},
            Send: lambda v: {"~send": [v.node, self._enc(v.arg)]},
            CheckpointedException: lambda v: {"~exc": self._exc_record(v)},
            ExceptionText: lambda v: {"~exc": self._exc_record(v.exception, text=str.__str__(v))},
            # A DeltaChannel's snapshot (langgraph 1.2): the value its ancestor walk stops at.
            _DeltaSnapshot: lambda v: {"~delta": self._enc(v.value)},
        }
        self._decoders: dict[str, Callable[[Any], object]] = {
            "~dict": self._dec_pairs,
            "~int": lambda p: int(_text(p)),
            "~tuple": lambda p: tuple(self._dec_list(_seq(p))),
            "~set": lambda p: set(self._dec_list(_seq(p))),
            "~frozenset": lambda p: frozenset(self._dec_list(_seq(p))),
            "~bytes": lambda p: base64.b64decode(_text(p), validate=True),
            "~bytearray": lambda p: bytearray(base64.b64decode(_text(p), validate=True)),
            "~datetime": lambda p: _dec_clock(datetime, p),
            "~date": lambda p: date.fromisoformat(_text(p)),
            "~time": lambda p: _dec_clock(time, p),
            "~timedelta": lambda p: timedelta(*_fields(p, int, int, int)),
            "~timezone": lambda p: _decode_tz({"~timezone": p}),
            "~zoneinfo": lambda p: _decode_tz({"~zoneinfo": p}),
            "~decimal": lambda p: Decimal(_text(p)),
            "~uuid": lambda p: uuid.UUID(_text(p)),
            "~send": lambda p: Send(_fields(p, str, object)[0], self._dec(p[1])),
            "~enum": self._dec_enum,
            "~dataclass": self._dec_dataclass,
            "~model": self._dec_model,
            "~lc": self._dec_lc,
            "~exc": self._dec_exc,
            "~delta": lambda p: _DeltaSnapshot(self._dec(p)),
        }

    def with_allowlist(self, extra: Collection[tuple[str, ...]]) -> FaithfulCodec:
        """A codec whose allowlist also holds ``extra``."""
        return FaithfulCodec(self.allowlist | {tuple(e) for e in extra})

    # encoding ---------------------------------------------------------------------------

    def encode(self, value: object) -> bytes:
        """Encode ``value`` to JSON bytes.

        Raises:
            CheckpointSerializationError: the value, or something inside it, cannot be
                stored faithfully; the error's ``path`` says where.
        """
        tree = self.to_json(value)
        try:
            return orjson.dumps(tree)
        except orjson.JSONEncodeError as exc:
            path = _unencodable_text(tree)
            if path is not None:
                raise CheckpointSerializationError(
                    "text holds a lone surrogate, which UTF-8 cannot store; clean it up first",
                    path=path,
                ) from None
            raise CheckpointSerializationError(f"value cannot be written as JSON: {exc}") from None

    def to_json(self, value: object) -> object:
        """The JSON-native structure :meth:`encode` would write."""
        try:
            return self._enc(value)
        except _Refused as refused:
            raise refused.error() from None
        except RecursionError:
            raise CheckpointSerializationError("value is nested too deeply or contains itself") from None

    def _enc(self, value: object) -> object:
        kind = type(value)
        if kind is str or kind is bool or value is None:
            return value
        if kind is int:
            return value if _INT_MIN <= value <= _INT_MAX else {"~int": str(value)}  # type: ignore[operator]
        if kind is float:
            if math.isfinite(value):  # type: ignore[arg-type]
                return value
            raise _Refused(f"float {value!r} cannot be stored (JSON has no NaN or infinity)")
        if kind is list:
            return self._seq(value)  # type: ignore[arg-type]
        if kind is dict:
            return self._dict(value)  # type: ignore[arg-type]
        encoder = self._encoders.get(kind)
        if encoder is not None:
            return encoder(value)
        return self._enc_object(value)

    def _seq(self, values: Iterable[object]) -> list[object]:
        out: list[object] = []
        try:
            for item in values:
                out.append(item if type(item) is str else self._enc(item))
        except _Refused as refused:
            refused.path.append(f"[{len(out)}]")
            raise
        return out

    def _dict(self, value: dict[Any, Any]) -> object:
        plain = all(type(k) is str for k in value) and not (
            len(value) == 1 and next(iter(value)).startswith("~")
        )
        key: Any = None
        try:
            if plain:
                out: dict[str, object] = {}
                for key, item in value.items():
                    out[key] = item if type(item) is str else self._enc(item)
                return out
            pairs = []
            for key, item in value.items():
                pairs.append([self._enc(key), self._enc(item)])
            return {"~dict": pairs}
        except _Refused as refused:
            refused.path.append(_key_segment(key))
            raise

    def _enc_object(self, value: object) -> object:
        kind = type(value)
        if isinstance(value, enum.Enum):
            module, qualname = _importable(kind)
            return {"~enum": [module, qualname, self._enc(value.value)]}
        if isinstance(value, BaseException):
            return {"~exc": self._exc_record(value)}
        if isinstance(value, Serializable):
            spec = _lc_spec(type(value))
            return {"~lc": [spec.lc_id, self._dict(_lc_kwargs(value, spec))]}
        if isinstance(value, tzinfo) and _is_pydantic_tz(value):
            return _tz_payload(value)
        if dataclasses.is_dataclass(value) and not isinstance(value, type):
            module, qualname = _importable(kind)
            fields = {f.name: getattr(value, f.name) for f in dataclasses.fields(value)}
            return {"~dataclass": [module, qualname, self._dict(fields)]}
        if isinstance(value, BaseModel):
            return {"~model": self._model_payload(value)}
        for base in kind.__mro__[1:-1]:
            nearest = _NEAREST.get(base)
            if nearest is not None:
                return self._enc(nearest(value))
        raise _Refused(
            f"{kind.__module__}.{kind.__qualname__} cannot be stored faithfully; use a JSON type, "
            "a standard value type, an enum, a dataclass or a pydantic model"
        )

    def _model_payload(self, value: BaseModel) -> list[object]:
        module, qualname = _importable(type(value))
        fields = {name: value.__dict__[name] for name in type(value).model_fields if name in value.__dict__}
        payload: list[object] = [module, qualname, self._dict(fields)]
        extra = value.__pydantic_extra__ or {}
        private = value.__pydantic_private__ or {}
        fields_set = value.model_fields_set
        unset = sorted(set(fields) - fields_set)
        if extra or private or unset:
            payload.append(self._dict(dict(extra)))
            payload.append(self._dict(dict(private)))
            payload.append(unset)
        return payload

    def _exc_record(
        self, exc: BaseException, ancestors: frozenset[int] = frozenset(), text: str | None = None
    ) -> dict[str, object]:
        """The record of ``exc``; ``ancestors`` are the exceptions being recorded around it;
        ``text`` its ``repr()`` text, if known."""
        path = ancestors | {id(exc)}
        if isinstance(exc, CheckpointedException):
            kwargs: dict[str, object] = {k: self._enc(v) for k, v in exc.kwargs.items()}
            repr_kwargs = list(exc.repr_kwargs)
            record_id, message = exc.id, exc.message
            text = text if text is not None else exc.text
            cause: BaseException | None = exc.cause
        else:
            kwargs, repr_kwargs = {}, []
            for name, attr in getattr(exc, "__dict__", {}).items():
                if name.startswith("__"):
                    continue
                try:
                    if isinstance(attr, BaseException):
                        if id(attr) in path:  # an exception holding itself (or an ancestor)
                            raise _Refused("exception refers to itself")
                        kwargs[name] = {"~exc": self._exc_record(attr, path)}
                    else:
                        kwargs[name] = self._enc(attr)
                except _Refused:
                    kwargs[name] = repr(attr)
                    repr_kwargs.append(name)
            kind = type(exc)
            record_id = [*kind.__module__.split("."), kind.__qualname__]
            message = _message(exc)
            text = _text_of(exc)
            cause = exception_cause(exc)
        return {
            "id": record_id,
            "message": message,
            "repr": text,
            "kwargs": kwargs,
            "repr_kwargs": repr_kwargs,
            "cause": None if cause is None or id(cause) in path else self._exc_record(cause, path),
        }

    # decoding ---------------------------------------------------------------------------

    def decode(self, data: bytes | str) -> Any:
        """Decode bytes written by :meth:`encode`.

        Raises:
            CheckpointSerializationError: the bytes are not JSON, or an envelope cannot be
                read back (unknown kind, a class this host cannot or may not load, a zone
                key missing from this host's database). Never a silent ``None`` or dict.
        """
        raw = data if type(data) is bytes else data.encode() if isinstance(data, str) else bytes(data)
        if raw.startswith(_LC_PREFIX):
            revived = self._revive_plain(raw)
            if revived is not _NOT_PLAIN:
                return revived
        try:
            tree = orjson.loads(raw)
        except orjson.JSONDecodeError as exc:
            raise CheckpointSerializationError(f"stored value is not JSON: {exc}") from exc
        # Every envelope key starts with the bytes `"~`; bytes without them hold plain JSON
        # that needs no walking. (A string containing `"~` only costs the walk.)
        if _MARK not in raw:
            return tree
        return self.from_json(tree)

    def decode_many(self, raws: Sequence[bytes]) -> list[Any]:
        """Decode values written by :meth:`encode`, in order (a message list): the kwargs
        of every plain LangChain envelope among them (the hot path of a cold read) are
        parsed by one JSON call over them all, and each is then revived as
        :meth:`_revive_plain` revives one. Anything else is decoded one by one.

        Raises:
            CheckpointSerializationError: as :meth:`decode`; the caller decodes again one
                by one to name the value that fails.
        """
        start = len(_LC_PREFIX)
        builders: list[tuple[tuple[str, ...], Callable[[dict[str, Any]], object]] | None] = []
        parts: list[bytes] = []
        lookup = _LC_BY_BYTES.get
        for raw in raws:
            found = None
            # Kwargs are one JSON object: "{" right after the id, "}" before the end. (An id
            # cut short by a "],{" inside it is not a known id: the lookup misses.)
            if type(raw) is bytes and raw.startswith(_LC_PREFIX) and raw.endswith(b"}]}"):
                end = raw.find(b"],{", start)
                if end >= 0:
                    found = lookup(raw[start : end + 1])
                    if found is not None:
                        parts.append(raw[end + 2 : -2])
            builders.append(found)
        if not parts:
            return [self.decode(raw) for raw in raws]
        # The parts go between copies of a number drawn now, which no stored bytes can
        # know: parsed, the list alternates kwargs and that number only if every part is
        # one JSON value by itself. A part that is not (an unclosed string or bracket, two
        # objects) moves or swallows a copy, so stored bytes cannot shift a neighbour's
        # kwargs into a message; they are decoded one by one instead, and refused.
        nonce = secrets.randbits(62)
        joined = b"[" + (b",%d," % nonce).join(parts) + b"]"
        try:
            every = orjson.loads(joined)
        except orjson.JSONDecodeError:
            return [self.decode(raw) for raw in raws]
        if len(every) != 2 * len(parts) - 1 or every[1::2] != [nonce] * (len(parts) - 1):
            return [self.decode(raw) for raw in raws]
        parsed = iter(every[::2])
        # As in _revive_plain: kwargs whose bytes hold no "~" hold no envelope.
        marked = b"~" in joined
        validate, validated_key = _LC_VALIDATOR, _LC_VALIDATED_KEY
        out: list[Any] = []
        try:
            for raw, found in zip(raws, builders, strict=True):
                if found is None:
                    out.append(self.decode(raw))
                    continue
                kwargs = next(parsed)
                if type(kwargs) is not dict or (marked and not _plain(kwargs)):
                    out.append(self.decode(raw))
                    continue
                key, build = found
                if validate is not None and (validated_key is None or validated_key in kwargs):
                    validate(key, kwargs)
                out.append(build(kwargs))
        except CheckpointSerializationError:  # a value decoded one by one
            raise
        except Exception as exc:
            raise _revive_failure(exc)  # noqa: B904 (it sets the cause)
        return out

    def _revive_plain(self, raw: bytes) -> object:
        """Revive a LangChain envelope whose kwargs hold no envelope, without a tree walk.

        The hot path of every message read: the class is found from the id's bytes, and
        only the kwargs are parsed. Anything unusual returns ``_NOT_PLAIN`` (full decode).
        """
        end = raw.find(b"],", len(_LC_PREFIX))
        if end < 0 or not raw.endswith(b"]}"):
            return _NOT_PLAIN
        try:
            id_bytes = raw[len(_LC_PREFIX) : end + 1]
            found = _LC_BY_BYTES.get(id_bytes)
            if found is None:
                cls, key = _lc_class_by_bytes(id_bytes)
                found = _LC_BY_BYTES[id_bytes] = (key, _rebuilder(cls))
            key, build = found
            kwargs = orjson.loads(raw[end + 2 : -2])
            if type(kwargs) is not dict:
                return _NOT_PLAIN
            # Every envelope key starts with "~": kwargs whose bytes have none need no walk
            # (a one-byte search is far cheaper than walking the parsed kwargs).
            if raw.find(b"~", end) >= 0 and not _plain(kwargs):
                return _NOT_PLAIN
            if _LC_VALIDATOR is not None and (_LC_VALIDATED_KEY is None or _LC_VALIDATED_KEY in kwargs):
                _LC_VALIDATOR(key, kwargs)
            return build(kwargs)
        except orjson.JSONDecodeError:
            return _NOT_PLAIN
        except Exception as exc:
            raise _revive_failure(exc)  # noqa: B904 (it sets the cause)

    def from_json(self, tree: object) -> Any:
        """Decode the JSON-native structure :meth:`to_json` returned."""
        try:
            return self._dec(tree)
        except _Refused as refused:
            raise refused.error() from None
        except RecursionError:
            raise CheckpointSerializationError("stored value is nested too deeply to read") from None

    def _dec(self, value: object) -> Any:
        kind = type(value)
        if kind is dict:
            if len(value) == 1:  # type: ignore[arg-type]
                ((key, payload),) = value.items()  # type: ignore[attr-defined]
                if key[:1] == "~":
                    return self._envelope(key, payload)
            out = {}
            key = None
            try:
                for key, item in value.items():  # type: ignore[attr-defined]
                    out[key] = item if type(item) in _SCALARS else self._dec(item)
            except _Refused as refused:
                refused.path.append(_key_segment(key))
                raise
            return out
        if kind is list:
            return self._dec_list(value)  # type: ignore[arg-type]
        return value

    def _dec_list(self, values: list[object]) -> list[Any]:
        out: list[Any] = []
        try:
            for item in values:
                out.append(item if type(item) in _SCALARS else self._dec(item))
        except _Refused as refused:
            refused.path.append(f"[{len(out)}]")
            raise
        return out

    def _envelope(self, kind: str, payload: Any) -> Any:
        decoder = self._decoders.get(kind)
        if decoder is None:
            raise _Refused(f"unknown envelope {kind!r}; was this written by a newer threadkeep?")
        try:
            return decoder(payload)
        except _Refused:
            raise
        except Exception as exc:
            raise _Refused(f"cannot read back a {kind[1:]} envelope: {exc}") from exc

    def _resolve(self, module: str, qualname: str, what: str) -> Any:
        if any(part.startswith("__") for part in qualname.split(".")):
            raise _Refused(f"refusing to look up {module}.{qualname}")
        if _unnamed(qualname):
            unnamed = _UNNAMED.get((module, qualname))
            if unnamed is None:
                raise _Refused(
                    f"{what} {module}.{qualname} has no name in its module (defined inside a "
                    "function, or a parametrized generic), so only the process that stored it can "
                    "read it back; define the class at module level"
                )
            return unnamed
        loaded = sys.modules.get(module)
        if loaded is None:
            if (module,) not in self.allowlist and (module, qualname) not in self.allowlist:
                raise _Refused(
                    f"{what} {module}.{qualname}: module {module!r} is not imported; import it "
                    "before loading the thread or add it to the codec allowlist"
                )
            loaded = importlib.import_module(module)
        # A static lookup: a module's __getattr__ (lazy imports) or a class's descriptors
        # never run for a name read from the store.
        target: Any = loaded
        for part in qualname.split("."):
            try:
                target = inspect.getattr_static(target, part)
            except AttributeError:
                raise _Refused(f"{module}.{qualname} does not exist on this host") from None
        return target

    def _dec_enum(self, payload: list[Any]) -> enum.Enum:
        module, qualname, value = _fields(payload, str, str, object)
        cls = self._resolve(module, qualname, "enum")
        if not (isinstance(cls, type) and issubclass(cls, enum.Enum)):
            raise _Refused(f"{module}.{qualname} is not an enum")
        return cls(self._dec(value))

    def _dec_dataclass(self, payload: list[Any]) -> object:
        module, qualname, fields = _fields(payload, str, str, dict)
        cls = self._resolve(module, qualname, "dataclass")
        if not (isinstance(cls, type) and dataclasses.is_dataclass(cls)):
            raise _Refused(f"{module}.{qualname} is not a dataclass")
        # Rebuilt without running __init__: the stored fields are the value, and no code of
        # the class runs on read.
        instance = object.__new__(cls)
        for name, item in self._dec(fields).items():
            object.__setattr__(instance, name, item)
        return instance

    def _dec_model(self, payload: list[Any]) -> BaseModel:
        if len(_seq(payload)) == 3:
            module, qualname, fields = _fields(payload, str, str, dict)
        else:
            module, qualname, fields, _, _, _ = _fields(payload, str, str, dict, dict, dict, list)
        cls = self._resolve(module, qualname, "pydantic model")
        if not (isinstance(cls, type) and issubclass(cls, BaseModel)):
            raise _Refused(f"{module}.{qualname} is not a pydantic model")
        values = self._dec(fields)
        if len(payload) == 3:
            return cls.model_construct(**values)
        extra, private, unset = self._dec(payload[3]), self._dec(payload[4]), payload[5]
        fields_set = (set(values) - set(unset)) | set(extra)
        instance = cls.model_construct(_fields_set=fields_set, **values, **extra)
        if private:
            object.__setattr__(instance, "__pydantic_private__", private)
        return instance

    def _dec_lc(self, payload: list[Any]) -> object:
        return self._revive(payload, walk=True)

    def _revive(self, payload: list[Any], *, walk: bool) -> object:
        # The hot path of every read of a message: checks inlined, class looked up once.
        if not (type(payload) is list and len(payload) == 2 and type(payload[1]) is dict):
            raise _Refused(f"malformed LangChain envelope {payload!r:.80}")
        lc_id, kwargs = payload
        try:
            key = tuple(lc_id)
            cls = _lc_class(key)
        except TypeError:
            raise _Refused(f"malformed LangChain id {lc_id!r:.80}") from None
        decoded = self._dec(kwargs) if walk else kwargs
        try:
            if _LC_VALIDATOR is not None:
                _LC_VALIDATOR(key, decoded)
            return _rebuilder(cls)(decoded)
        except Exception as exc:
            raise _Refused(f"cannot revive {'.'.join(key)}: {exc}") from exc

    def _dec_exc(self, record: object) -> ExceptionText:
        """An exception as LangGraph's savers return it, its ``repr()`` text, carrying the
        record (C4)."""
        exception = self._dec_exc_record(record)
        return ExceptionText(exception.text, exception)

    def _dec_exc_record(self, record: object) -> CheckpointedException:
        if not (
            type(record) is dict
            and type(record.get("id")) is list
            and record["id"]
            and all(type(part) is str for part in record["id"])
            and type(record.get("message")) is str
            and type(record.get("repr", "")) is str
            and type(record.get("kwargs", {})) is dict
            and type(record.get("repr_kwargs", [])) is list
        ):
            raise _Refused(f"malformed exception record {record!r:.80}")
        cause = record.get("cause")
        # An exception held by an attribute is a record too, not text.
        kwargs = {
            name: self._dec_exc_record(item["~exc"])
            if type(item) is dict and len(item) == 1 and "~exc" in item
            else self._dec(item)
            for name, item in (record.get("kwargs") or {}).items()
        }
        return CheckpointedException(
            id=list(record["id"]),
            message=record["message"],
            kwargs=kwargs,
            repr_kwargs=[str(name) for name in record.get("repr_kwargs") or []],
            cause=None if cause is None else self._dec_exc_record(cause),
            text=record.get("repr"),
        )

    def _dec_pairs(self, payload: object) -> dict[Any, Any]:
        out = {}
        for pair in _seq(payload):
            key, value = _fields(pair, object, object)
            out[self._dec(key)] = self._dec(value)
        return out
