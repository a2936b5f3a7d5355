"""Serializers in LangGraph's ``SerializerProtocol`` shape: the faithful codec, compression.

A stored value is a pair ``(type, bytes)``. The faithful codec writes ``("json", ...)``;
:class:`CompressingSerializer` turns any pair whose bytes exceed the inline threshold into
``(type + "+zstd", ...)``, zstd with :data:`~threadkeep.codec.dictionary.ZSTD_DICTIONARY_1`
(SPEC C5). Reads accept plain, ``+zstd`` and ``+zlib`` (what earlier versions wrote),
whatever the threshold is now, and refuse a value that would expand past
:data:`MAX_EXPANDED_BYTES` before allocating it.
"""

from __future__ import annotations

import logging
import threading
import zlib
from collections.abc import Callable, Collection, Iterator, Sequence
from functools import partial
from typing import Any, Final

import zstandard
from langgraph.checkpoint.serde.base import SerializerProtocol
from langgraph.checkpoint.serde.encrypted import EncryptedSerializer
from langgraph.checkpoint.serde.jsonplus import JsonPlusSerializer

from threadkeep.codec.dictionary import ZSTD_DICTIONARY_1
from threadkeep.codec.faithful import FaithfulCodec
from threadkeep.codec.msgpack import StrictMsgpackSerializer
from threadkeep.errors import CheckpointSerializationError

logger = logging.getLogger("threadkeep.codec")

__all__ = ["CompressingSerializer", "FaithfulSerializer", "build_serde", "typed_decoder", "with_allowlist"]

JSON_TYPE = "json"
ZSTD_SUFFIX: Final = "+zstd"
ZLIB_SUFFIX: Final = "+zlib"
_ZSTD_LEVEL: Final = 3
# The most one stored value may expand to on read, whatever compressed it: a 1.5 MB zlib
# value can hold 1.5 GiB. Larger is refused before it is allocated (no store holds a plain
# value this large: Postgres's bytea and SQLite's blobs stop at 1 GB, Redis's strings at 512 MB).
MAX_EXPANDED_BYTES: Final = 1 << 30
# What a value whose compressed form does not state its size is measured in, chunk by chunk.
_MEASURE_CHUNK: Final = 1 << 20
_DICTIONARY: Final = zstandard.ZstdCompressionDict(
    ZSTD_DICTIONARY_1, dict_type=zstandard.DICT_TYPE_RAWCONTENT
)
_DICTIONARY.precompute_compress(level=_ZSTD_LEVEL)


class _Zstd(threading.local):
    """A compressor and a decompressor per thread (zstandard's are not shared across threads)."""

    def __init__(self) -> None:
        self.compressor = zstandard.ZstdCompressor(
            level=_ZSTD_LEVEL, dict_data=_DICTIONARY, write_checksum=True, write_dict_id=False
        )
        self.decompressor = zstandard.ZstdDecompressor(dict_data=_DICTIONARY)


_ZSTD: Final = _Zstd()


def compress(payload: bytes) -> bytes:
    """``payload`` as a zstd frame with the dictionary (``+zstd``)."""
    return _ZSTD.compressor.compress(payload)


def decompress(suffix: str, payload: bytes) -> bytes:
    """The bytes a ``+zstd`` or ``+zlib`` payload holds.

    The size is known before the output is allocated: a zstd frame states it (a frame that
    does not, and a zlib stream, is first decompressed chunk by chunk, counting and keeping
    nothing), and more than :data:`MAX_EXPANDED_BYTES` is refused.

    Raises:
        CheckpointSerializationError: the bytes are not a valid frame of that kind, or they
            expand to more than :data:`MAX_EXPANDED_BYTES`.
    """
    try:
        if suffix == ZLIB_SUFFIX:
            return zlib.decompress(payload, bufsize=max(_measured(_inflated(payload)), 1))
        size = zstandard.frame_content_size(payload)
        if size > MAX_EXPANDED_BYTES:
            raise _too_large(f"claims {size} bytes")
        if size < 0:  # not stated (a streaming writer's frame)
            reader = _ZSTD.decompressor.stream_reader(payload)
            size = _measured(iter(partial(reader.read, _MEASURE_CHUNK), b""))
            return _ZSTD.decompressor.decompress(payload, max_output_size=max(size, 1))
        return _ZSTD.decompressor.decompress(payload)
    except (zlib.error, zstandard.ZstdError) as exc:
        raise CheckpointSerializationError(f"compressed value is corrupt: {exc}") from exc


def _too_large(what: str) -> CheckpointSerializationError:
    return CheckpointSerializationError(
        f"compressed value {what}; a stored value may expand to {MAX_EXPANDED_BYTES} bytes "
        "(1 GiB) at most, so it is not read (no threadkeep writer stores such a value: the row "
        "is damaged or was written by other means; delete the thread or restore the row)"
    )


def _measured(chunks: Iterator[bytes]) -> int:
    """How many bytes ``chunks`` hold, counted as they come, refused past the bound."""
    size = 0
    for chunk in chunks:
        size += len(chunk)
        if size > MAX_EXPANDED_BYTES:
            raise _too_large(f"expands to more than {MAX_EXPANDED_BYTES} bytes")
    return size


def _inflated(payload: bytes) -> Iterator[bytes]:
    """The bytes a zlib stream holds, a chunk at a time (a truncated stream just ends)."""
    stream = zlib.decompressobj()
    pending = payload
    while not stream.eof:
        chunk = stream.decompress(pending, _MEASURE_CHUNK)
        if not chunk and not pending:
            return
        yield chunk
        pending = stream.unconsumed_tail


# The dictionary's decompression tables are built on first use; build them now, once, rather
# than in whichever threads first read at the same time.
decompress(ZSTD_SUFFIX, compress(b"{}"))


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
        threshold: Payloads longer than this are stored zstd-compressed; ``None`` turns
            compression off (reads still accept compressed values).
    """

    def __init__(self, inner: SerializerProtocol, threshold: int | None) -> None:
        self.inner = inner
        self.threshold = threshold

    def dumps_typed(self, obj: Any) -> tuple[str, bytes]:
        kind, payload = self.inner.dumps_typed(obj)
        if self.threshold is not None and len(payload) > self.threshold:
            return kind + ZSTD_SUFFIX, compress(payload)
        return kind, payload

    def loads_typed(self, data: tuple[str, bytes]) -> Any:
        kind, payload = data
        for suffix in (ZSTD_SUFFIX, ZLIB_SUFFIX):
            if kind.endswith(suffix):
                return self.inner.loads_typed((kind[: -len(suffix)], decompress(suffix, bytes(payload))))
        return self.inner.loads_typed((kind, payload))


def _faithful_codec(serde: SerializerProtocol) -> FaithfulCodec | None:
    """The codec a ``json`` value goes straight to: the faithful codec under compression,
    exactly those classes (a subclass may read values its own way)."""
    if type(serde) is CompressingSerializer and type(serde.inner) is FaithfulSerializer:
        return serde.inner.codec
    return None


def typed_decoder(serde: SerializerProtocol) -> Callable[[str, bytes], Any]:
    """``serde.loads_typed`` as a function of (type, bytes), for decoding many values in a
    row: with the faithful codec under compression, a plain ``json`` value goes straight
    to the codec (a message list's every message, on every read)."""
    codec = _faithful_codec(serde)
    if codec is not None:
        decode, loads = codec.decode, serde.loads_typed

        def decoded(kind: str, payload: bytes) -> Any:
            return decode(payload) if kind == JSON_TYPE else loads((kind, payload))

        return decoded
    return lambda kind, payload: serde.loads_typed((kind, payload))


def list_decoder(serde: SerializerProtocol) -> Callable[[Sequence[bytes]], list[Any]] | None:
    """How to decode a list of plain ``json`` values (a message list) in one pass:
    :meth:`~threadkeep.codec.faithful.FaithfulCodec.decode_many` with the faithful codec
    under compression; ``None`` otherwise (decode them one by one)."""
    codec = _faithful_codec(serde)
    return None if codec is None else codec.decode_many


def build_serde(
    codec: str = "json",
    *,
    compress_threshold: int | None = 65536,
    inner: SerializerProtocol | None = None,
    msgpack_strict: bool = True,
) -> CompressingSerializer:
    """The serializer a saver stores values with.

    Args:
        codec: ``"json"`` for the faithful codec, ``"msgpack"`` for LangGraph's own
            ``JsonPlusSerializer`` (SPEC C7).
        compress_threshold: See :class:`CompressingSerializer`.
        inner: A serializer to use instead of the one ``codec`` names (e.g. an
            ``EncryptedSerializer``), used as given.
        msgpack_strict: ``msgpack`` reads strictly (:class:`StrictMsgpackSerializer`);
            ``False``: as ``JsonPlusSerializer()`` does by default, importing and calling
            what a stored value names.
    """
    if inner is None:
        if codec == "json":
            inner = FaithfulSerializer()
        else:
            inner = StrictMsgpackSerializer() if msgpack_strict else JsonPlusSerializer()
    return CompressingSerializer(inner, compress_threshold)


def with_allowlist(serde: SerializerProtocol, extra: Collection[tuple[str, ...]]) -> SerializerProtocol:
    """The same serializer with ``extra`` classes allowed on read (strict msgpack, or ours)."""
    if isinstance(serde, CompressingSerializer):
        return CompressingSerializer(with_allowlist(serde.inner, extra), serde.threshold)
    if isinstance(serde, FaithfulSerializer):
        return FaithfulSerializer(serde.codec.with_allowlist(extra))
    if isinstance(serde, StrictMsgpackSerializer):
        return serde.with_allowlist(extra)
    if isinstance(serde, JsonPlusSerializer):
        return serde.with_msgpack_allowlist(extra)
    if isinstance(serde, EncryptedSerializer):
        inner = with_allowlist(serde.serde, extra)
        return serde if inner is serde.serde else EncryptedSerializer(serde.cipher, inner)
    logger.warning(
        "serializer %s takes no allowlist: the graph's types are not added to what it may read",
        type(serde).__name__,
    )
    return serde
