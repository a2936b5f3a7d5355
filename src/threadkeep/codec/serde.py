"""Serializers in LangGraph's ``SerializerProtocol`` shape: the faithful codec, compression.

A stored value is a pair ``(type, bytes)``. The faithful codec writes ``("json", ...)``;
:class:`CompressingSerializer` turns any pair whose bytes exceed the inline threshold into
``(type + "+zlib", ...)`` (SPEC C5). Reads accept both, whatever the threshold is now.
"""

from __future__ import annotations

import zlib
from collections.abc import Collection
from typing import Any

from langgraph.checkpoint.base import _with_msgpack_allowlist
from langgraph.checkpoint.serde.base import SerializerProtocol
from langgraph.checkpoint.serde.jsonplus import JsonPlusSerializer

from threadkeep.codec.faithful import FaithfulCodec
from threadkeep.errors import CheckpointSerializationError

__all__ = ["CompressingSerializer", "FaithfulSerializer", "build_serde", "with_allowlist"]

JSON_TYPE = "json"
COMPRESSED_SUFFIX = "+zlib"
# Level 1: most of the gain on text-heavy state at a fraction of the time of the default.
_ZLIB_LEVEL = 1


class FaithfulSerializer:
    """The faithful JSON codec as a LangGraph serializer; the default on every provider."""

    def __init__(self, codec: FaithfulCodec | None = None) -> None:
        self.codec = codec or FaithfulCodec()

    def dumps_typed(self, obj: Any) -> tuple[str, bytes]:
        return JSON_TYPE, self.codec.encode(obj)

    def loads_typed(self, data: tuple[str, bytes]) -> Any:
        kind, payload = data
        if kind != JSON_TYPE:
            raise CheckpointSerializationError(
                f"stored value has type {kind!r}; the faithful codec reads only {JSON_TYPE!r} "
                "(was the store written with LLM_PROVIDER_CHECKPOINT_CODEC=msgpack?)"
            )
        return self.codec.decode(payload)


class CompressingSerializer:
    """Compress what an inner serializer writes when it is larger than ``threshold`` bytes.

    Args:
        inner: The serializer that encodes values.
        threshold: Payloads longer than this are stored zlib-compressed; ``None`` turns
            compression off (reads still accept compressed values).
    """

    def __init__(self, inner: SerializerProtocol, threshold: int | None) -> None:
        self.inner = inner
        self.threshold = threshold

    def dumps_typed(self, obj: Any) -> tuple[str, bytes]:
        kind, payload = self.inner.dumps_typed(obj)
        if self.threshold is not None and len(payload) > self.threshold:
            return kind + COMPRESSED_SUFFIX, zlib.compress(payload, _ZLIB_LEVEL)
        return kind, payload

    def loads_typed(self, data: tuple[str, bytes]) -> Any:
        kind, payload = data
        if kind.endswith(COMPRESSED_SUFFIX):
            try:
                payload = zlib.decompress(payload)
            except zlib.error as exc:
                raise CheckpointSerializationError(f"compressed value is corrupt: {exc}") from exc
            kind = kind[: -len(COMPRESSED_SUFFIX)]
        return self.inner.loads_typed((kind, payload))


def build_serde(
    codec: str = "json",
    *,
    compress_threshold: int | None = 65536,
    inner: SerializerProtocol | None = None,
) -> CompressingSerializer:
    """The serializer a saver stores values with.

    Args:
        codec: ``"json"`` for the faithful codec, ``"msgpack"`` for LangGraph's own
            ``JsonPlusSerializer`` (SPEC C7).
        compress_threshold: See :class:`CompressingSerializer`.
        inner: A serializer to use instead of the one ``codec`` names (e.g. an
            ``EncryptedSerializer``).
    """
    if inner is None:
        inner = FaithfulSerializer() if codec == "json" else JsonPlusSerializer()
    return CompressingSerializer(inner, compress_threshold)


def with_allowlist(serde: SerializerProtocol, extra: Collection[tuple[str, ...]]) -> SerializerProtocol:
    """The same serializer with ``extra`` classes allowed on read (strict msgpack, or ours)."""
    if isinstance(serde, CompressingSerializer):
        return CompressingSerializer(with_allowlist(serde.inner, extra), serde.threshold)
    if isinstance(serde, FaithfulSerializer):
        return FaithfulSerializer(serde.codec.with_allowlist(extra))
    if isinstance(serde, JsonPlusSerializer):
        return serde.with_msgpack_allowlist(extra)
    return _with_msgpack_allowlist(serde, extra)
