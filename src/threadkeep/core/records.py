"""Mapping between LangGraph's objects and stored rows, free of I/O.

``prepare_*`` turn a saver call into the rows a program writes (encoding every value, so a
refused value fails before any I/O); ``assemble`` turns rows read back into a
``CheckpointTuple``. Engines and programs never encode or decode on their own.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from functools import partial
from typing import Any, Final, cast

from langchain_core.messages import BaseMessage
from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import (
    WRITES_IDX_MAP,
    ChannelVersions,
    Checkpoint,
    CheckpointMetadata,
    CheckpointTuple,
    get_serializable_checkpoint_metadata,
)
from langgraph.checkpoint.serde.base import SerializerProtocol
from langgraph.checkpoint.serde.types import _DeltaSnapshot

from threadkeep.codec.faithful import FaithfulCodec
from threadkeep.codec.serde import JSON_TYPE, list_decoder, typed_decoder
from threadkeep.core.delta import COUNTERS
from threadkeep.core.identity import Actor, actor_for
from threadkeep.core.ids import MAX_NAMESPACE_BYTES, checked_id
from threadkeep.core.messages import (
    CHAIN_TYPE,
    ContentCache,
    EncodingMemo,
    MessageChain,
    chain_ref,
    digest_of,
    is_message_list,
    parse_chain_ref,
    split_digests,
)
from threadkeep.core.rules import named_checkpoint
from threadkeep.errors import CheckpointSerializationError

__all__ = [
    "EMPTY_TYPE",
    "REFS_TYPES",
    "BlobRow",
    "ListQuery",
    "PutStep",
    "StoredCheckpoint",
    "Target",
    "WriteRow",
    "WritesStep",
    "assemble",
    "decode_value",
    "decode_values",
    "filter_as_stored",
    "matches_filter",
    "prepare_put",
    "prepare_writes",
    "target_of",
    "version_key",
]

EMPTY_TYPE: Final = "empty"
# A pending write of messages stored by reference (SPEC S1): its value is the 16-byte
# digests of its messages, which the store keeps once per thread with the message lists.
# "refs" is a list of messages, "ref" a single message.
REFS_TYPE: Final = "refs"
REF_TYPE: Final = "ref"
REFS_TYPES: Final = frozenset({REFS_TYPE, REF_TYPE})
# Checkpoint structure and metadata are always written with the faithful codec, whatever
# codec stores channel values: they must stay readable and filterable as JSON.
STRUCTURE: Final = FaithfulCodec()


# Parts of a checkpoint not stored in its structure: the values go their own ways, and the
# id is the key the checkpoint is stored under.
_KEYED: Final = frozenset({"channel_values", "id"})
# The structure's list of the channels whose value is a DeltaChannel snapshot of a message
# list: the list is stored as a chain like any other (SPEC S1), and read back wrapped again.
_DELTA_LISTS: Final = "tk_delta_lists"


def _is_delta_list(value: object) -> bool:
    return type(value) is _DeltaSnapshot and is_message_list(value.value)


def version_key(version: object) -> str:
    """The text a channel version is stored under, as SQL renders the JSON value too.

    Raises:
        CheckpointSerializationError: the version is neither a string nor an integer.
    """
    if type(version) is str:
        return version
    if type(version) is int:
        return str(version)
    raise CheckpointSerializationError(
        f"channel version {version!r} is a {type(version).__name__}; threadkeep stores string "
        "or integer versions (LangGraph's own and threadkeep's get_next_version produce strings)"
    )


@dataclass(frozen=True, slots=True)
class Target:
    """The thread, namespace and checkpoint a call addresses, and who is asking."""

    thread_id: str
    checkpoint_ns: str
    checkpoint_id: str | None
    actor: Actor


def target_of(config: RunnableConfig, *, isolate: bool) -> Target:
    """Read the target of a call from its config.

    Raises:
        CheckpointSerializationError: the config names no ``thread_id``.
        InvalidInputError: an id it names is not a valid id (:mod:`threadkeep.core.ids`).
    """
    configurable = config.get("configurable") or {}
    thread_id = configurable.get("thread_id")
    if thread_id is None:
        raise CheckpointSerializationError(
            'the config has no "thread_id"; pass {"configurable": {"thread_id": ...}}',
            path='configurable["thread_id"]',
        )
    ns, checkpoint_id = configurable.get("checkpoint_ns") or "", configurable.get("checkpoint_id") or None
    return Target(
        thread_id=checked_id(str(thread_id), "thread_id"),
        checkpoint_ns=checked_id(ns, "checkpoint_ns", MAX_NAMESPACE_BYTES),
        checkpoint_id=None if checkpoint_id is None else checked_id(checkpoint_id, "checkpoint_id"),
        actor=actor_for(configurable, isolate=isolate),
    )


@dataclass(frozen=True, slots=True)
class BlobRow:
    channel: str
    version: str
    type: str
    value: bytes


@dataclass(frozen=True, slots=True)
class PutStep:
    """Everything one ``put`` writes, encoded."""

    target: Target  # checkpoint_id is the parent the put continues from
    checkpoint_id: str
    run_id: str | None
    source: object
    named: str | None  # the checkpoint the run's caller named (rules.named_checkpoint)
    checkpoint: bytes
    metadata: bytes
    versions: tuple[tuple[str, str], ...]  # (channel, version key) of every channel it holds
    blobs: tuple[BlobRow, ...]
    chains: tuple[MessageChain, ...]
    now: float
    history_limit: int | None
    # The same step with every channel of the checkpoint, not only the changed ones: for a
    # store that does not hold the parent (the tiered cache after a miss). Built on demand.
    whole: Callable[[], PutStep] | None = field(default=None, compare=False, repr=False)
    # Encodes the value a channel holds in this checkpoint, with its message chain if it is a
    # message list (None: it holds none), for a store that keeps small values in every
    # checkpoint's row and cannot take an unchanged one from the parent's (a parent it does
    # not hold). Absent when the step has no values.
    encode: Callable[[str], tuple[BlobRow, MessageChain | None] | None] | None = field(
        default=None, compare=False, repr=False
    )
    # The parent, if a cache served it as the newest state (the tiered backend sets it): it
    # must still be the head (threadkeep.core.rules.required_head).
    served_head: str | None = None

    @property
    def changed(self) -> frozenset[str]:
        """The channels this step writes a value (or an emptying) for."""
        return frozenset(blob.channel for blob in self.blobs)

    @property
    def parent_id(self) -> str | None:
        return self.target.checkpoint_id

    def result_config(self) -> RunnableConfig:
        return {
            "configurable": {
                "thread_id": self.target.thread_id,
                "checkpoint_ns": self.target.checkpoint_ns,
                "checkpoint_id": self.checkpoint_id,
            }
        }


def _encode(serde: SerializerProtocol, value: object, path: str) -> tuple[str, bytes]:
    try:
        return serde.dumps_typed(value)
    except CheckpointSerializationError as error:
        raise error.under(path) from None


def _encode_structure(value: object, path: str) -> bytes:
    try:
        return STRUCTURE.encode(value)
    except CheckpointSerializationError as error:
        raise error.under(path) from None


def prepare_put(
    config: RunnableConfig,
    checkpoint: Checkpoint,
    metadata: CheckpointMetadata,
    new_versions: ChannelVersions,
    serde: SerializerProtocol,
    *,
    isolate: bool,
    history_limit: int | None,
    now: float,
    memo: EncodingMemo | None = None,
    content: ContentCache | None = None,
) -> PutStep:
    """Encode a ``put``: the changed channels, their message chains, the checkpoint."""
    target = target_of(config, isolate=isolate)
    checkpoint_id = checked_id(checkpoint["id"], 'checkpoint["id"]')
    stored_metadata = get_serializable_checkpoint_metadata(config, metadata)
    run_id = stored_metadata.get("run_id")
    run_id = None if run_id is None else checked_id(str(run_id), "run_id")
    values = checkpoint["channel_values"]
    blobs: list[BlobRow] = []
    chains: list[MessageChain] = []
    for channel, version in new_versions.items():
        key = version_key(version)
        if channel not in values:
            blobs.append(BlobRow(channel, key, EMPTY_TYPE, b""))
            continue
        blob, chain = _encode_value(
            channel, key, values[channel], serde=serde, memo=memo, target=target, content=content
        )
        blobs.append(blob)
        if chain is not None:
            chains.append(chain)
    # The id is the key the checkpoint is stored under: not stored again (see assemble).
    structure = {k: v for k, v in checkpoint.items() if k not in _KEYED}
    delta_lists = sorted(channel for channel, value in values.items() if _is_delta_list(value))
    if delta_lists:
        structure[_DELTA_LISTS] = delta_lists
    counters = stored_metadata.get(COUNTERS)
    if counters:
        # LangGraph's savers store the (updates, supersteps) pairs as JSON lists, and read
        # them back so; a user reads the same metadata from ours.
        pairs: dict[str, Any] = {channel: list(pair) for channel, pair in counters.items()}
        stored_metadata[COUNTERS] = pairs
    every = checkpoint["channel_versions"]
    whole: Callable[[], PutStep] | None = None
    if any(channel not in new_versions for channel in every):
        whole = partial(
            prepare_put, config, checkpoint, metadata, every, serde,
            isolate=isolate, history_limit=history_limit, now=now, memo=memo,
        )  # fmt: skip

    versions = tuple((channel, version_key(version)) for channel, version in every.items())
    return PutStep(
        target=target,
        checkpoint_id=checkpoint_id,
        run_id=run_id,
        source=stored_metadata.get("source"),
        named=named_checkpoint(config),
        checkpoint=_encode_structure(structure, "checkpoint"),
        metadata=_encode_structure(stored_metadata, "metadata"),
        versions=versions,
        blobs=tuple(blobs),
        chains=tuple(chains),
        now=now,
        history_limit=history_limit,
        whole=whole,
        encode=partial(_encode_current, checkpoint=checkpoint, serde=serde, memo=memo, target=target),
    )


def _encode_value(
    channel: str,
    version: str,
    value: Any,
    *,
    serde: SerializerProtocol,
    memo: EncodingMemo | None,
    target: Target,
    content: ContentCache | None = None,
) -> tuple[BlobRow, MessageChain | None]:
    """The stored form of a channel's value, and its message chain if it is a message list
    (known to ``content``, when given, so a later read in this process need not walk it)."""
    path = f"channel_values.{channel}"
    if _is_delta_list(value):
        value = value.value
    if not is_message_list(value):
        return BlobRow(channel, version, *_encode(serde, value, path)), None
    try:
        memo_key = (target.thread_id, target.checkpoint_ns, channel)
        chain = MessageChain(channel, version, value, serde, memo=memo, memo_key=memo_key)
        if content is not None:
            chain.known_through(content.tails_of(target.thread_id))
            content.keep_chain(chain, target.thread_id)
    except CheckpointSerializationError as error:
        raise error.under(path) from None
    return BlobRow(channel, version, CHAIN_TYPE, chain_ref(chain)), chain


def _encode_current(
    channel: str,
    *,
    checkpoint: Checkpoint,
    serde: SerializerProtocol,
    memo: EncodingMemo | None,
    target: Target,
) -> tuple[BlobRow, MessageChain | None] | None:
    """The stored form of the value ``channel`` holds in ``checkpoint``, and its message
    chain if it is a message list (None: it holds none)."""
    values, versions = checkpoint["channel_values"], checkpoint["channel_versions"]
    if channel not in values or channel not in versions:
        return None
    version = version_key(versions[channel])
    return _encode_value(channel, version, values[channel], serde=serde, memo=memo, target=target)


@dataclass(frozen=True, slots=True)
class WriteRow:
    """One pending write, encoded. A write of messages by reference (type ``ref``/``refs``)
    carries the (digest, type, payload) of each message it refers to, to store with it."""

    task_id: str
    idx: int
    task_path: str
    channel: str
    type: str
    value: bytes
    messages: tuple[tuple[bytes, str, bytes], ...] = ()

    @property
    def special(self) -> bool:
        """Special writes (errors, interrupts, ...) overwrite; regular ones never do."""
        return self.idx < 0


@dataclass(frozen=True, slots=True)
class WritesStep:
    target: Target
    rows: tuple[WriteRow, ...]
    now: float
    history_limit: int | None


def prepare_writes(
    config: RunnableConfig,
    writes: Sequence[tuple[str, Any]],
    task_id: str,
    task_path: str,
    serde: SerializerProtocol,
    *,
    isolate: bool,
    history_limit: int | None,
    now: float,
    by_reference: bool = False,
) -> WritesStep:
    """Encode a ``put_writes``; each write keyed as LangGraph's ``WRITES_IDX_MAP`` says.

    With ``by_reference`` (a store that keeps messages once per thread), a write of a
    message, or of a list of messages, is stored as their digests (SPEC S1): the same
    messages enter the thread's history at the next put, and are then stored only once.
    Only messages that have an id are: ``add_messages`` gives an id-less message one when
    it applies the write, so its stored form would not be the history's.
    """
    target = target_of(config, isolate=isolate)
    if target.checkpoint_id is None:
        raise CheckpointSerializationError(
            "put_writes needs the checkpoint the writes belong to",
            path='configurable["checkpoint_id"]',
        )
    task_id = checked_id(task_id, "task_id")
    rows = []
    for idx, (position, channel, value) in _keyed_writes(writes).items():
        path = f"writes[{position}].{channel}"
        single = isinstance(value, BaseMessage)
        messages = [value] if single else value
        if by_reference and (single or is_message_list(value)) and all(m.id is not None for m in messages):
            encoded = []
            for index, message in enumerate(messages):
                kind, payload = _encode(serde, message, path if single else f"{path}[{index}]")
                encoded.append((digest_of(kind, payload), kind, payload))
            refs = b"".join(digest for digest, _, _ in encoded)
            rows.append(
                WriteRow(
                    task_id, idx, task_path, channel, REF_TYPE if single else REFS_TYPE, refs, tuple(encoded)
                )
            )
            continue
        kind, payload = _encode(serde, value, path)
        rows.append(WriteRow(task_id, idx, task_path, channel, kind, payload))
    return WritesStep(target, tuple(rows), now, history_limit)


def _keyed_writes(writes: Sequence[tuple[str, Any]]) -> dict[int, tuple[int, str, Any]]:
    """The writes one ``put_writes`` stores, by idx (LangGraph's ``WRITES_IDX_MAP`` for a
    special channel, the position for a regular one), each with its position.

    A special channel written twice in one call (a node that called ``interrupt()`` twice
    sends two resume writes) is stored once, with its last value in its first place, as
    LangGraph's ``InMemorySaver`` does; every store then writes each key at most once per
    call (a SQL upsert cannot touch one row twice in a statement).
    """
    keyed: dict[int, tuple[int, str, Any]] = {}
    for position, (channel, value) in enumerate(writes):
        keyed[WRITES_IDX_MAP.get(channel, position)] = (position, channel, value)
    return keyed


def split_refs(value: bytes) -> list[bytes]:
    """The digests a ``ref``/``refs`` write holds, in order."""
    return split_digests(value)


def decode_value(serde: SerializerProtocol, kind: str, payload: bytes, path: str) -> Any:
    """Decode one stored value, naming ``path`` if it cannot be read back."""
    try:
        return serde.loads_typed((kind, bytes(payload)))
    except Exception as exc:
        raise _unreadable(exc, kind, path)  # noqa: B904 (_unreadable sets its cause)


def decode_values(serde: SerializerProtocol, stored: Sequence[tuple[str, bytes]], path: str) -> list[Any]:
    """Decode stored values in order (a message list), naming ``path[i]`` for one that
    cannot be read back."""
    many = list_decoder(serde)
    if many is not None and all(kind == JSON_TYPE for kind, _ in stored):
        with contextlib.suppress(Exception):  # decoded again one by one below, to name the one
            return many([payload for _, payload in stored])
    decode = typed_decoder(serde)
    values: list[Any] = []
    kind = ""
    try:
        for kind, payload in stored:
            values.append(decode(kind, payload))
    except Exception as exc:
        raise _unreadable(exc, kind, f"{path}[{len(values)}]")  # noqa: B904 (_unreadable sets its cause)
    return values


def _unreadable(exc: Exception, kind: str, path: str) -> CheckpointSerializationError:
    """The error for a stored value at ``path`` that ``exc`` kept from being read back: a
    serialization error placed under ``path``, anything else wrapped (and kept as the
    cause)."""
    if isinstance(exc, CheckpointSerializationError):
        error = exc.under(path)
    else:
        error = CheckpointSerializationError(f"cannot read back stored {kind!r} value: {exc}", path=path)
        error.__cause__ = exc
    error.__suppress_context__ = True
    return error


def decode_structure(payload: bytes | str, path: str) -> Any:
    """Decode a checkpoint structure or metadata blob."""
    try:
        return STRUCTURE.decode(payload)
    except CheckpointSerializationError as error:
        raise error.under(path) from None


def assemble(
    *,
    thread_id: str,
    checkpoint_ns: str,
    checkpoint_id: str,
    parent_id: str | None,
    structure: Mapping[str, Any],
    metadata: Mapping[str, Any],
    channel_values: dict[str, Any],
    pending_writes: Iterable[tuple[str, str, Any]],
) -> CheckpointTuple:
    """Build the ``CheckpointTuple`` LangGraph expects from decoded parts: its configs hold
    what LangGraph's savers' hold, nothing more."""
    configurable: dict[str, Any] = {
        "thread_id": thread_id,
        "checkpoint_ns": checkpoint_ns,
        "checkpoint_id": checkpoint_id,
    }
    # A structure written before ids were left out of it holds the same id.
    checkpoint: Checkpoint = {**structure, "id": checkpoint_id, "channel_values": channel_values}  # type: ignore[typeddict-item]
    parent: RunnableConfig | None = None
    if parent_id is not None:
        parent = {
            "configurable": {
                "thread_id": thread_id,
                "checkpoint_ns": checkpoint_ns,
                "checkpoint_id": parent_id,
            }
        }
    return CheckpointTuple(
        config={"configurable": configurable},
        checkpoint=checkpoint,
        metadata=cast(CheckpointMetadata, metadata),
        parent_config=parent,
        pending_writes=list(pending_writes),
    )


@dataclass(slots=True)
class StoredCheckpoint:
    """A checkpoint as read back from a store, before its values are decoded.

    Attributes:
        values: (channel, type, stored value) of each channel of the checkpoint.
        writes: (task_path, task_id, idx, channel, type, stored value) of its pending writes.
        key: The store's own key of the thread (SQL: ``tid``), when it has one.
        messages: (type, stored value) by digest of the messages its ``ref``/``refs``
            writes refer to, as read back.
    """

    thread_id: str
    checkpoint_ns: str
    checkpoint_id: str = ""
    parent_id: str | None = None
    structure: dict[str, Any] = field(default_factory=dict)
    metadata: dict[str, Any] = field(default_factory=dict)
    values: list[tuple[str, str, bytes]] = field(default_factory=list)
    writes: list[tuple[str, str, int, str, str, bytes]] = field(default_factory=list)
    key: int = 0
    messages: dict[bytes, tuple[str, bytes]] = field(default_factory=dict)

    def chains(self) -> list[tuple[bytes, int]]:
        """The (tail, length) of every message list this checkpoint refers to."""
        return [parse_chain_ref(value) for _, vtype, value in self.values if vtype == CHAIN_TYPE]

    def referenced(self) -> set[bytes]:
        """The digests of the messages its pending writes refer to."""
        return {
            digest
            for _, _, _, _, vtype, value in self.writes
            if vtype in REFS_TYPES
            for digest in split_refs(value)
        }

    def missing_channels(self) -> list[str]:
        """Channels the structure names that have no stored value (a store that lost keys)."""
        held = {channel for channel, _, _ in self.values}
        return [channel for channel in self.structure.get("channel_versions", {}) if channel not in held]

    def as_put_step(
        self, actor: Actor, lists: Mapping[bytes, Sequence[tuple[str, bytes]]], now: float
    ) -> PutStep:
        """The put that would store this checkpoint whole, from its stored forms (nothing is
        encoded again): how the tiered provider seeds its cache after a miss. A channel with
        no stored value is empty (a SQL store keeps no row for one) and is written so."""
        versions = {
            channel: version_key(version)
            for channel, version in self.structure.get("channel_versions", {}).items()
        }
        blobs: list[BlobRow] = []
        chains: list[MessageChain] = []
        for channel, vtype, value in self.values:
            if vtype == CHAIN_TYPE:
                tail, _ = parse_chain_ref(value)
                chains.append(MessageChain.from_encoded(channel, versions[channel], lists[tail]))
            blobs.append(BlobRow(channel, versions[channel], vtype, value))
        held = {blob.channel for blob in blobs}
        blobs += [BlobRow(c, version, EMPTY_TYPE, b"") for c, version in versions.items() if c not in held]
        run_id = self.metadata.get("run_id")
        return PutStep(
            target=Target(self.thread_id, self.checkpoint_ns, self.parent_id, actor),
            checkpoint_id=self.checkpoint_id,
            run_id=None if run_id is None else str(run_id),
            source=self.metadata.get("source"),
            named=None,
            checkpoint=_encode_structure(self.structure, "checkpoint"),
            metadata=_encode_structure(self.metadata, "metadata"),
            versions=tuple(versions.items()),
            blobs=tuple(blobs),
            chains=tuple(chains),
            now=now,
            history_limit=None,
        )

    def as_writes_step(self, actor: Actor, now: float, serde: SerializerProtocol) -> WritesStep:
        """The put_writes that would store this checkpoint's pending writes, as stored; a
        write of messages by reference is stored whole (re-encoded with ``serde``)."""
        rows = []
        for path, task_id, idx, channel, vtype, value in self.writes:
            stored = (vtype, value)
            if vtype in REFS_TYPES:
                stored = _encode(serde, self._referenced_value(serde, vtype, value, channel), channel)
            rows.append(WriteRow(task_id, idx, path, channel, *stored))
        return WritesStep(
            Target(self.thread_id, self.checkpoint_ns, self.checkpoint_id, actor), tuple(rows), now, None
        )

    def _referenced_value(self, serde: SerializerProtocol, vtype: str, value: bytes, channel: str) -> Any:
        """The message (``ref``) or messages (``refs``) a write by reference holds."""
        path = f"pending_writes.{channel}"
        stored = []
        for digest in split_refs(value):
            if digest not in self.messages:
                raise CheckpointSerializationError(
                    f"a pending write refers to message {digest.hex()}, which is not stored", path=path
                )
            stored.append(self.messages[digest])
        messages = decode_values(serde, stored, path)
        return messages[0] if vtype == REF_TYPE else messages

    def _write_value(self, serde: SerializerProtocol, vtype: str, value: bytes, channel: str) -> Any:
        if vtype in REFS_TYPES:
            return self._referenced_value(serde, vtype, value, channel)
        return decode_value(serde, vtype, value, f"pending_writes.{channel}")

    def to_tuple(
        self,
        serde: SerializerProtocol,
        lists: Mapping[bytes, Sequence[tuple[str, bytes]]],
        content: ContentCache | None = None,
        memo: EncodingMemo | None = None,
    ) -> CheckpointTuple:
        """Decode every value (message lists from ``lists``, by tail) into a CheckpointTuple.
        A read that hands the state to a run gives its saver's ``memo`` and the ``content``
        cache it read through (which holds each list's digests), so that the run's next put
        knows the messages decoded here (:meth:`EncodingMemo.seed`)."""
        values: dict[str, Any] = {}
        structure = self.structure
        delta_lists = frozenset(structure.get(_DELTA_LISTS, ()))
        if delta_lists:
            structure = {k: v for k, v in structure.items() if k != _DELTA_LISTS}
        for channel, vtype, value in self.values:
            path = f"channel_values.{channel}"
            if vtype == EMPTY_TYPE:
                continue
            if vtype == CHAIN_TYPE:
                tail, _ = parse_chain_ref(value)
                values[channel] = decode_values(serde, lists[tail], path)
                digests = None if memo is None or content is None else content.digests(tail)
                if memo is not None and digests is not None:
                    key = (self.thread_id, self.checkpoint_ns, channel)
                    memo.seed(key, tail, values[channel], digests, lists[tail])
                if channel in delta_lists:
                    values[channel] = _DeltaSnapshot(values[channel])
            else:
                values[channel] = decode_value(serde, vtype, value, path)
        return assemble(
            thread_id=self.thread_id,
            checkpoint_ns=self.checkpoint_ns,
            checkpoint_id=self.checkpoint_id,
            parent_id=self.parent_id,
            structure=structure,
            metadata=self.metadata,
            channel_values=values,
            pending_writes=[
                (task_id, channel, self._write_value(serde, vtype, value, channel))
                for _, task_id, _, channel, vtype, value in sorted(self.writes, key=lambda w: w[:3])
            ],
        )


def filter_as_stored(wanted: Mapping[str, Any] | None) -> Mapping[str, object] | None:
    """A ``list`` filter's values as metadata stores them (the codec's JSON form), which
    :func:`matches_filter` compares.

    Raises:
        CheckpointSerializationError: a value metadata could not hold (a NaN, an object the
            codec refuses), named by its path under ``filter``.
    """
    if not wanted:
        return None
    stored: dict[str, object] = {}
    for key, value in wanted.items():
        try:
            stored[key] = STRUCTURE.to_json(value)
        except CheckpointSerializationError as error:
            raise error.under(f"filter.{key}") from None
    return stored


def matches_filter(metadata: Mapping[str, Any], wanted: Mapping[str, object] | None) -> bool:
    """Whether ``metadata`` holds every key of ``wanted`` (:func:`filter_as_stored`) with the
    same value, compared as stored: the codec's JSON forms of the two, equal as JSON values
    (:func:`_same_json`). So every store answers a filter alike: Postgres narrows a page by
    jsonb containment first, which lets through every checkpoint this then keeps."""
    if not wanted:
        return True
    for key, value in wanted.items():
        if key not in metadata:
            return False
        try:
            stored = STRUCTURE.to_json(metadata[key])
        except CheckpointSerializationError:  # what no filter can name
            return False
        if not _same_json(stored, value):
            return False
    return True


def _same_json(stored: object, wanted: object) -> bool:
    """Equality of JSON values: objects by their members, arrays in order, numbers by value
    (``1`` is ``1.0``), a boolean only a boolean (``True == 1`` in Python)."""
    if isinstance(stored, bool) or isinstance(wanted, bool):
        return type(stored) is type(wanted) and stored == wanted
    if isinstance(stored, dict) and isinstance(wanted, dict):
        return stored.keys() == wanted.keys() and all(_same_json(stored[key], wanted[key]) for key in wanted)
    if isinstance(stored, list) and isinstance(wanted, list):
        return len(stored) == len(wanted) and all(map(_same_json, stored, wanted))
    if isinstance(stored, (dict, list)) or isinstance(wanted, (dict, list)):
        return False
    return bool(stored == wanted)


@dataclass(frozen=True, slots=True)
class ListQuery:
    """One ``list`` call, and how far it has got."""

    thread_id: str | None
    checkpoint_ns: str | None
    checkpoint_id: str | None
    before: str | None
    filter: Mapping[str, object] | None  # as stored (filter_as_stored)
    remaining: int | None
    owner: str | None
    page_size: int
    cursor: tuple[str, int, str] | None = field(default=None)

    @classmethod
    def from_call(
        cls,
        config: RunnableConfig | None,
        *,
        filter: Mapping[str, Any] | None,
        before: RunnableConfig | None,
        limit: int | None,
        isolate: bool,
        page_size: int = 100,
    ) -> ListQuery:
        configurable = (config or {}).get("configurable") or {}
        thread_id, ns = configurable.get("thread_id"), configurable.get("checkpoint_ns")
        checkpoint_id = configurable.get("checkpoint_id")
        before_id = ((before or {}).get("configurable") or {}).get("checkpoint_id")
        thread_id = None if thread_id is None else checked_id(str(thread_id), "thread_id")
        ns = None if ns is None else checked_id(ns, "checkpoint_ns", MAX_NAMESPACE_BYTES)
        checkpoint_id = None if checkpoint_id is None else checked_id(checkpoint_id, "checkpoint_id")
        before_id = None if before_id is None else checked_id(before_id, 'before["checkpoint_id"]')
        actor = actor_for(configurable, isolate=isolate)
        return cls(
            thread_id=thread_id,
            checkpoint_ns=ns,
            checkpoint_id=checkpoint_id,
            before=before_id,
            filter=filter_as_stored(filter),
            remaining=limit,
            owner=actor.owner_filter,
            page_size=page_size if limit is None or filter else max(1, min(page_size, limit)),
        )

    @property
    def done(self) -> bool:
        return self.remaining is not None and self.remaining <= 0

    def advanced(self, cursor: tuple[str, int, str], returned: int, exhausted: bool) -> ListQuery | None:
        """The query for the next page, or ``None`` when there is none."""
        remaining = None if self.remaining is None else self.remaining - returned
        if exhausted or (remaining is not None and remaining <= 0):
            return None
        return replace(self, cursor=cursor, remaining=remaining)
