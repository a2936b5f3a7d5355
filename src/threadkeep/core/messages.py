"""Message histories stored once per thread (SPEC S1).

A channel whose value is a list of LangChain messages (``MessagesState["messages"]``) is not
stored whole at every step. Each message is stored once per thread under the digest of its
encoding; the list is a *chain* of links, link ``k`` naming message ``k`` and link ``k-1``::

    node(k) = H(node(k-1) || digest(message k))         node(-1) = empty

A checkpoint stores only the tail node of its list. Appending a message adds one link;
lists that share a prefix share its links, so a fork or an edit stores only what differs,
and an old checkpoint still reads back exactly the messages it had. Links are removed only
with their thread, so every stored link's ancestors are stored too (the set is prefix-closed),
which lets a writer find the new links of a list by probing from its tail.
"""

from __future__ import annotations

import functools
import hashlib
import marshal
import operator
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterable, Sequence
from itertools import chain as chained
from itertools import repeat
from typing import Any, Final

import orjson
from langchain_core.messages import BaseMessage
from langgraph.checkpoint.serde.base import SerializerProtocol

from threadkeep.errors import CheckpointSerializationError

__all__ = [
    "CHAIN_TYPE",
    "LINK_PAGE",
    "ContentCache",
    "EncodingMemo",
    "MessageChain",
    "chain_ref",
    "chain_tail",
    "digest_of",
    "is_message_list",
    "parse_chain_ref",
    "split_digests",
]

CHAIN_TYPE: Final = "chain"
_HASH_BYTES: Final = 16
# A SQL store may give every LINK_PAGE-th link of a list its page: the digests of the
# LINK_PAGE messages it closes, oldest first, and the node before the first of them; a
# reader then walks the list a page at a time (Postgres: migration 6, whose readers unpack
# pages of up to 32 digests).
LINK_PAGE: Final = 32


def is_message_list(value: object) -> bool:
    """Whether ``value`` is a non-empty list made only of LangChain messages."""
    return type(value) is list and bool(value) and all(map(isinstance, value, repeat(BaseMessage)))


def digest_of(kind: str, payload: bytes) -> bytes:
    """The digest a stored message is kept under: its type and its encoding."""
    return hashlib.blake2b(kind.encode() + b"\x00" + payload, digest_size=_HASH_BYTES).digest()


def _link(prev: bytes | None, digest: bytes) -> bytes:
    return hashlib.blake2b((prev or b"") + digest, digest_size=_HASH_BYTES).digest()


def split_digests(joined: bytes) -> list[bytes]:
    """The digests ``joined`` holds end to end, in order."""
    return [joined[at : at + _HASH_BYTES] for at in range(0, len(joined), _HASH_BYTES)]


def chain_tail(digests: Sequence[bytes]) -> bytes | None:
    """The tail node of the list of messages ``digests`` (oldest first); None if empty."""
    node: bytes | None = None
    for digest in digests:
        node = _link(node, digest)
    return node


# Field values of these types cannot change in place: the same object is the same value.
_IMMUTABLE: Final = frozenset({str, int, float, bool, bytes, type(None)})

# marshal's format 2 writes no back-references: a rendering does not depend on how many
# references each object has elsewhere, and takes about half as long as the default's.
_RENDERING: Final = 2

# What a put saw of one message: its class, its field values (kept alive, so an identity
# check is sound), which of them could change in place (a getter of those values), and a
# type-exact summary of those.
_Seen = tuple[type, tuple[Any, ...], Callable[[tuple[Any, ...]], Any], int]


def _no_values(values: tuple[Any, ...]) -> tuple[()]:
    return ()


def _mutable_values(values: tuple[Any, ...]) -> Callable[[tuple[Any, ...]], Any]:
    """A getter of the ``values`` that could change in place (containers), as one tuple."""
    return _getter(tuple([i for i, value in enumerate(values) if type(value) not in _IMMUTABLE]))


@functools.lru_cache(maxsize=1024)
def _getter(at: tuple[int, ...]) -> Callable[[tuple[Any, ...]], Any]:
    """The getter of the values at positions ``at``: one per set of positions, shared by
    every message (and block) with its containers there, so what the memo keeps of each
    message does not hold an object of its own for it."""
    if not at:
        return _no_values
    if len(at) == 1:
        return operator.itemgetter(slice(at[0], at[0] + 1))
    return operator.itemgetter(*at)


def _see(message: Any) -> _Seen | None:
    """What :func:`_unchanged` compares a message with later, or ``None`` when it cannot be
    taken.

    A message's large fields (its content, mostly) are immutable strings: they are compared
    by identity, in constant time. Containers, which a node may edit in place, are summed up
    with ``marshal``, which renders builtin values exactly (a tuple is not a list, ``-0.0``
    is not ``0.0``) but for buffers and sets, and refuses everything else; a message whose
    containers hold those types is never memoized (:func:`_exactly_rendered`). The summary
    includes the extra fields and the set of fields marked set, which the encoding depends
    on too (assigning a field its own value marks it set).

    Taken before the message is encoded: a message edited while it is encoded then differs
    from what was seen, and is encoded again by the next put.
    """
    try:
        values = tuple(message.__dict__.values())
        mutable = _mutable_values(values)
        containers = mutable(values)
        summary = _summary(containers, message)
        _exactly_rendered((containers, message.__pydantic_extra__))
        return type(message), values, mutable, summary
    except (ValueError, AttributeError, TypeError):
        return None


def _exactly_rendered(values: Any) -> None:
    """Raise ``TypeError`` if ``values`` hold what ``marshal`` renders inexactly: a buffer
    other than ``bytes`` (a ``bytearray`` renders as the same bytes would) or a set (whose
    elements it sorts, where an encoding keeps their order); ``bytes`` go with them, since
    a ``bytes`` swapped in place for an equal ``bytearray`` would then pass for itself.

    ``orjson`` refuses exactly those (and some other values, which are then just not
    memoized) in one pass in C. Checked when a message is first seen: a later rendering
    equal to that one holds values of the same types, so none of them either.
    """
    orjson.dumps(values, option=orjson.OPT_NON_STR_KEYS)


def _summary(mutable: Any, message: Any) -> int:
    """A type-exact summary of what of ``message`` can change without a field's object
    changing. Raises ``ValueError`` for a value ``marshal`` cannot render."""
    rendered = marshal.dumps((mutable, message.__pydantic_extra__), _RENDERING)
    return hash(rendered) ^ hash(frozenset(message.__pydantic_fields_set__))


def _unchanged(seen: _Seen, message: Any, is_: Callable[[Any, Any], bool] = operator.is_) -> bool:
    """Whether a message is as a previous put saw it: the same class, every field the very
    same object, and its containers holding the same values."""
    cls, values, mutable, summary = seen
    try:
        fields = message.__dict__
        return (
            type(message) is cls
            and len(fields) == len(values)
            and all(map(is_, values, fields.values()))
            and _summary(mutable(values), message) == summary
        )
    except (ValueError, AttributeError):
        return False


_FIELDS: Final = operator.attrgetter("__dict__")
_EXTRA: Final = operator.attrgetter("__pydantic_extra__")
_FIELDS_SET: Final = operator.attrgetter("__pydantic_fields_set__")


class _Block:
    """What a put saw of a run of consecutive messages of a list, taken before any of them
    was encoded: their classes, every field value (kept alive, so an identity check is
    sound), a getter of those that could change in place, a type-exact summary of those
    with the extra fields, and copies of the sets of fields marked set.

    :func:`_block_unchanged` checks a whole block with a few calls that each run over all
    of its messages, where :func:`_unchanged` checks one message at a time; a list's
    messages are checked a block at a time wherever the previous put's blocks still fit.
    """

    __slots__ = ("classes", "fields_set", "mutable", "sizes", "summary", "values")

    def __init__(self, messages: Sequence[Any]) -> None:
        self.classes = tuple(map(type, messages))
        self.sizes, self.values = _block_fields(messages)
        self.mutable = _mutable_values(self.values)
        containers = self.mutable(self.values)
        self.summary = _block_summary(containers, messages)
        _exactly_rendered((containers, tuple(map(_EXTRA, messages))))
        self.fields_set = tuple(map(_shared, map(frozenset, map(_FIELDS_SET, messages))))


# One instance of each set of field names the memo keeps (a thread's messages have a
# handful), so a block does not hold a set of its own per message; bounded, past which a
# set is kept as it is.
_FIELD_SETS: dict[frozenset[str], frozenset[str]] = {}


def _shared(names: frozenset[str]) -> frozenset[str]:
    shared = _FIELD_SETS.get(names)
    if shared is not None:
        return shared
    if len(_FIELD_SETS) < 4096:
        _FIELD_SETS[names] = names
    return names


def _block_fields(messages: Sequence[Any]) -> tuple[tuple[int, ...], tuple[Any, ...]]:
    """How many fields each of ``messages`` has, and every field value, in order, as one
    tuple (the counts keep a value from passing for the next message's)."""
    fields = list(map(_FIELDS, messages))
    return tuple(map(len, fields)), tuple(chained.from_iterable(map(dict.values, fields)))


def _block_summary(mutable: Any, messages: Sequence[Any]) -> int:
    """As :func:`_summary`, for a run of messages, without their sets of fields marked set
    (``marshal`` sorts a set's elements). Raises ``ValueError`` for a value ``marshal``
    cannot render."""
    return hash(marshal.dumps((mutable, tuple(map(_EXTRA, messages))), _RENDERING))


def _see_block(messages: Sequence[Any]) -> _Block | None:
    """What :func:`_block_unchanged` compares ``messages`` with later, or ``None`` when it
    cannot be taken. Taken before they are encoded, as :func:`_see` is."""
    try:
        return _Block(messages)
    except (ValueError, AttributeError, TypeError):
        return None


def _block_unchanged(seen: _Block, messages: Sequence[Any]) -> bool:
    """Whether ``messages`` are as a previous put saw them: the same classes, every field
    the very same object, and their containers, extra fields and sets of fields marked set
    holding the same values."""
    try:
        if tuple(map(type, messages)) != seen.classes:
            return False
        sizes, values = _block_fields(messages)
        return (
            sizes == seen.sizes
            and all(map(operator.is_, seen.values, values))
            and tuple(map(_FIELDS_SET, messages)) == seen.fields_set
            and _block_summary(seen.mutable(seen.values), messages) == seen.summary
        )
    except (ValueError, AttributeError, TypeError):
        return False


class _Remembered:
    """What one put of a list saw: ``id -> (what it saw of the object, digest)``, the
    objects, the list's digests and link nodes by position, and what it saw of each whole
    block of the list (``blocks[i]``: positions ``i * size`` to ``(i + 1) * size``, ``None``
    where it could not be taken). What a read remembered (:meth:`EncodingMemo.seed`) has
    ``None`` for what it saw of a message it saw only as part of its block.

    ``objects`` keeps every remembered object alive, so an id in ``digests`` can only be
    that object's.
    """

    __slots__ = ("blocks", "digests", "list_digests", "nodes", "objects", "stored")

    def __init__(self) -> None:
        # digest -> stored form, of the messages a read decoded (see EncodingMemo.seed)
        self.stored: dict[bytes, tuple[str, bytes]] = {}
        self.digests: dict[int, tuple[_Seen | None, bytes]] = {}
        self.objects: list[object] = []
        self.list_digests: tuple[bytes, ...] = ()
        self.nodes: tuple[bytes, ...] = ()
        self.blocks: list[_Block | None] = []


_NOTHING = _Remembered()


class EncodingMemo:
    """Remembers, per message list, the digests of the message objects last put.

    Consecutive puts of a run re-send every message of the thread, mostly the very same
    objects; encoding them all again would be most of a put's cost. For each (thread,
    namespace, channel) the memo keeps the last put's objects and digests; an object seen
    there whose fields are unchanged (same type-exact fingerprint) keeps its digest. Only
    the ``lists`` most recently put lists are kept, so memory stays bounded. Messages are
    checked ``block`` at a time where the previous put's blocks still fit (a list mostly
    grows at its end), else one by one.

    A memo belongs to one serializer: digests depend on the encoding.
    """

    def __init__(self, lists: int = 128, block: int = 32) -> None:
        if block < 1:
            raise ValueError(f"block must be at least 1, got {block}")
        self.lists = lists
        self.block = block
        self._lists: OrderedDict[tuple[str, ...], _Remembered] = OrderedDict()
        # What the latest read of a list decoded since its last put (see seed).
        self._reads: OrderedDict[tuple[str, ...], _Remembered] = OrderedDict()
        self._guard = threading.Lock()

    def previous(self, key: tuple[str, ...], first: object = None) -> _Remembered:
        """What the last put of list ``key`` encoded; or what the latest read of it decoded,
        if the list being put starts with a message of that read (``first``) and not of
        the last put (a run resuming from that read, not one the read came in the middle
        of)."""
        with self._guard:
            put = self._lists.get(key, _NOTHING)
            read = self._reads.get(key)
        if read is not None and id(first) in read.digests and id(first) not in put.digests:
            return read
        return put

    def keep(self, key: tuple[str, ...], remembered: _Remembered) -> None:
        """Remember what this put of list ``key`` encoded, forgetting the oldest lists, and
        what a read of it decoded before."""
        with self._guard:
            self._reads.pop(key, None)
            self._lists[key] = remembered
            self._lists.move_to_end(key)
            while len(self._lists) > self.lists:
                self._lists.popitem(last=False)

    def seed(
        self,
        key: tuple[str, ...],
        tail: bytes,
        messages: Sequence[Any],
        digests: Sequence[bytes],
        stored: Sequence[tuple[str, bytes]],
    ) -> None:
        """Remember ``messages``, just decoded from the list ending at ``tail`` (their
        ``digests``, and their ``stored`` forms), as a put of list ``key`` that
        encoded them would have: a run loads its thread, then puts the same messages back
        (new objects, which the memo would otherwise encode again).

        Only for a list whose last put this memo remembers, starting as this one does: this
        process is running the thread, so a put is likely to follow, and that put's link
        nodes serve for the shared part. A process that only reads pays nothing. What a
        message is seen as is taken here, before anyone can edit it, as a put takes it
        before encoding: an edit made later is found by the put's check. The read is kept
        beside the last put, not instead of it (:meth:`previous` picks one for a put): a
        read made while a run goes on does not cost that run's next put its memo. A put
        that sends a message the memo answered sends its stored form, under its digest.
        """
        with self._guard:
            previous = self._lists.get(key, _NOTHING)
        shared = 0
        for before, digest in zip(previous.list_digests, digests, strict=False):
            if before != digest:
                break
            shared += 1
        if not shared or not len(messages) == len(digests) == len(stored):
            return
        nodes = list(previous.nodes[:shared])
        for digest in digests[shared:]:
            nodes.append(_link(nodes[-1], digest))
        if nodes[-1] != tail:  # not the list the digests say: remember nothing
            return
        current = _Remembered()
        current.list_digests, current.nodes = tuple(digests), tuple(nodes)
        current.stored = dict(zip(digests, stored, strict=True))
        for start in range(0, len(messages), self.block):
            block = messages[start : start + self.block]
            at = digests[start : start + self.block]
            seen_block = _see_block(block) if len(block) == self.block else None
            if seen_block is not None:
                # Checked as a block: its messages are remembered without what each was
                # seen as, so a put that finds them elsewhere encodes them again.
                current.blocks.append(seen_block)
                current.objects.extend(block)
                current.digests.update(zip(map(id, block), zip(repeat(None), at), strict=True))
                continue
            if len(block) == self.block:
                current.blocks.append(None)
            for message, digest in zip(block, at, strict=True):
                seen = _see(message)
                if seen is not None:
                    current.digests[id(message)] = (seen, digest)
                    current.objects.append(message)
        with self._guard:
            if self._lists.get(key) is not previous:  # a put came meanwhile: it is newer
                return
            self._reads[key] = current
            self._reads.move_to_end(key)
            while len(self._reads) > self.lists:
                self._reads.popitem(last=False)


class ContentCache:
    """Message lists and messages by their hashes, kept in process memory.

    Both mappings are pure: a tail node determines its list's digests, and a digest its
    payload, whatever store or thread they are read from. So entries never go stale; a
    reader that has read a checkpoint referring to a tail may take the list from here
    instead of walking the links again. Bounded: ``max_lists`` lists, ``max_bytes`` of
    payloads, least recently used first out.
    """

    def __init__(self, max_lists: int = 1024, max_bytes: int = 32 * 1024 * 1024) -> None:
        self.max_lists = max_lists
        self.max_bytes = max_bytes
        self._lists: OrderedDict[bytes, tuple[bytes, ...]] = OrderedDict()
        self._payloads: OrderedDict[bytes, tuple[str, bytes]] = OrderedDict()
        self._bytes = 0
        self._guard = threading.Lock()
        # thread id -> tails lately kept for it: a store that can skip sending lists the
        # reader holds (Redis) is told these.
        self._recent: OrderedDict[str, list[bytes]] = OrderedDict()

    def messages(self, tail: bytes) -> list[tuple[str, bytes]] | None:
        """The (type, payload) of every message of the list ending at ``tail``, if all known."""
        with self._guard:
            digests = self._lists.get(tail)
            if digests is None:
                return None
            payloads = self._payloads
            out = [payloads.get(digest) for digest in digests]
            if None in out:
                return None
            self._lists.move_to_end(tail)
            return out  # type: ignore[return-value]

    def digests(self, tail: bytes) -> tuple[bytes, ...] | None:
        """The digests of the messages of the list ending at ``tail``, if this cache holds
        them (maybe not every payload)."""
        with self._guard:
            return self._lists.get(tail)

    def payload(self, digest: bytes) -> tuple[str, bytes] | None:
        """The (type, payload) of the message stored under ``digest``, if this cache holds it."""
        with self._guard:
            return self._payloads.get(digest)

    def keep(
        self, tail: bytes, digests: Sequence[bytes], entries: Sequence[tuple[str, bytes]], thread_id: str = ""
    ) -> None:
        """Remember the list ending at ``tail``: its messages' ``digests`` and their (type,
        payload) ``entries``, in list order."""
        self._keep(tail, tuple(digests), zip(digests, entries, strict=True), thread_id)

    def keep_chain(self, chain: MessageChain, thread_id: str = "") -> None:
        """Remember what a put encoded: its list, and the payloads it has at hand."""
        digests = chain.digests
        self._keep(chain.tail, digests, ((digests[at], entry) for at, entry in chain.encoded()), thread_id)

    def recent_tails(self, thread_id: str) -> list[bytes]:
        """Tails lately kept for ``thread_id`` whose whole list this cache still holds."""
        with self._guard:
            tails = list(self._recent.get(thread_id, ()))
        return [tail for tail in tails if self.messages(tail) is not None]

    def tails_of(self, thread_id: str) -> frozenset[bytes]:
        """The tails of the lists lately read or written for ``thread_id``: lists the store
        holds (their payloads may since have left this cache)."""
        with self._guard:
            return frozenset(self._recent.get(thread_id, ()))

    def holds_lists_of(self, thread_id: str) -> bool:
        """Whether a list of ``thread_id`` was kept lately (its payloads may since have left)."""
        with self._guard:
            return any(tail in self._lists for tail in self._recent.get(thread_id, ()))

    def _keep(
        self,
        tail: bytes,
        digests: tuple[bytes, ...],
        payloads: Iterable[tuple[bytes, tuple[str, bytes]]],
        thread_id: str,
    ) -> None:
        with self._guard:
            if thread_id:
                recent = self._recent.setdefault(thread_id, [])
                if tail not in recent:
                    recent.append(tail)
                    del recent[:-4]
                self._recent.move_to_end(thread_id)
                while len(self._recent) > self.max_lists:
                    self._recent.popitem(last=False)
            self._lists[tail] = digests
            self._lists.move_to_end(tail)
            while len(self._lists) > self.max_lists:
                self._lists.popitem(last=False)
            # A cold read keeps every message of a long list: one loop, names bound once.
            kept, largest, added = self._payloads, self.max_bytes // 8, 0
            for digest, entry in payloads:
                if digest in kept:
                    kept.move_to_end(digest)
                elif len(entry[1]) <= largest:
                    kept[digest] = entry
                    added += len(entry[1])
            self._bytes += added
            while self._bytes > self.max_bytes:
                _, (_, dropped) = kept.popitem(last=False)
                self._bytes -= len(dropped)


class _Links:
    """A list's digests and link nodes, worked out position by position. While the list
    starts as the previous put's did, its nodes are that put's."""

    __slots__ = ("digests", "nodes", "prev", "previous", "shared")

    def __init__(self, previous: _Remembered, count: int) -> None:
        self.previous = previous
        self.digests: list[bytes] = []
        self.nodes: list[bytes] = []
        self.prev: bytes | None = None
        self.shared = min(len(previous.list_digests), count)

    def add(self, position: int, digest: bytes) -> None:
        if position < self.shared and self.previous.list_digests[position] == digest:
            self.prev = self.previous.nodes[position]
        else:
            self.shared = 0
            self.prev = _link(self.prev, digest)
        self.nodes.append(self.prev)
        self.digests.append(digest)

    def add_previous(self, start: int, end: int) -> None:
        """The previous put's digests at positions ``start`` to ``end``."""
        digests = self.previous.list_digests[start:end]
        self.digests.extend(digests)
        if self.shared:
            self.nodes.extend(self.previous.nodes[start:end])
            self.prev = self.nodes[-1]
            return
        for digest in digests:
            self.prev = _link(self.prev, digest)
            self.nodes.append(self.prev)


class MessageChain:
    """One message list, encoded (reusing what ``memo`` remembers of list ``memo_key``):
    per position its link node and message digest.

    Raises:
        CheckpointSerializationError: a message cannot be stored; the path names its index.

    Payloads of messages encoded for this put are kept; a memoized message is encoded again
    only if the store turns out not to hold it (:meth:`payload`).
    """

    __slots__ = (
        "_messages",
        "_payloads",
        "_serde",
        "_stored",
        "channel",
        "digests",
        "nodes",
        "reused",
        "version",
    )

    def __init__(
        self,
        channel: str,
        version: str,
        messages: Sequence[Any],
        serde: SerializerProtocol,
        *,
        memo: EncodingMemo | None = None,
        memo_key: tuple[str, ...] = (),
    ) -> None:
        self.channel = channel
        self.version = version
        self._messages = tuple(messages)
        self._serde = serde
        self._payloads: dict[int, tuple[str, bytes]] = {}
        first = self._messages[0] if self._messages else None
        previous = memo.previous(memo_key, first) if memo is not None else _NOTHING
        self._stored = previous.stored
        current = _Remembered()
        count = len(self._messages)
        links = _Links(previous, count)
        size = memo.block if memo is not None else max(count, 1)
        for start in range(0, count, size):
            block = self._messages[start : start + size]
            if memo is not None and len(block) == size:
                if self._reuse_block(block, start // size, previous, current):
                    links.add_previous(start, start + size)
                    continue
                seen = _see_block(block)  # before any of them is encoded
                whole = self._one_by_one(start, block, previous, current, links)
                # Kept only if every message is remembered and the block is still as seen:
                # a message edited meanwhile (even one encoded after the edit) must not pass
                # for what was seen, should the edit be undone later.
                current.blocks.append(
                    seen if whole and seen is not None and _block_unchanged(seen, block) else None
                )
                continue
            self._one_by_one(start, block, previous, current, links)
        self.nodes = tuple(links.nodes)
        self.digests = tuple(links.digests)
        if memo is not None:
            current.list_digests, current.nodes = self.digests, self.nodes
            memo.keep(memo_key, current)
        # How many leading messages the memo answered: the previous put of this list sent
        # them, so they are likely stored (a store that must know checks the last one's link).
        self.reused = min(self._payloads, default=count)

    @staticmethod
    def _reuse_block(block: Sequence[Any], index: int, previous: _Remembered, current: _Remembered) -> bool:
        """Whether block ``index`` is as the previous put saw it; if so, remember its
        messages as that put did, one by one too (a later put may find the block changed, or
        its messages at other positions)."""
        seen = previous.blocks[index] if index < len(previous.blocks) else None
        if seen is None or not _block_unchanged(seen, block):
            return False
        current.objects.extend(block)  # first: every remembered id is of a live object
        ids = list(map(id, block))
        try:
            current.digests.update(zip(ids, map(previous.digests.__getitem__, ids), strict=True))
        except KeyError:  # never: a block is kept only where each of its messages is
            return False
        current.blocks.append(seen)
        return True

    def _one_by_one(
        self, start: int, messages: Sequence[Any], previous: _Remembered, current: _Remembered, links: _Links
    ) -> bool:
        """Digest ``messages`` (from position ``start``) one at a time: what the memo knows
        of each unchanged object, else a fresh encoding. Whether every one of them is
        remembered (none is edited while it is encoded, and each can be seen)."""
        whole = True
        lookup, remembered, objects = previous.digests.get, current.digests, current.objects
        for position, message in enumerate(messages, start):
            entry = lookup(id(message))
            if entry is not None and entry[0] is not None and _unchanged(entry[0], message):
                digest = entry[1]
                remembered[id(message)] = entry
                objects.append(message)
            else:
                seen = _see(message)
                kind, payload = self._encode(position)
                digest = digest_of(kind, payload)
                self._payloads[position] = (kind, payload)
                if seen is not None and _unchanged(seen, message):  # not edited while encoded
                    remembered[id(message)] = (seen, digest)
                    objects.append(message)
                else:
                    whole = False
            links.add(position, digest)
        return whole

    def known_through(self, tails: frozenset[bytes]) -> None:
        """Count as likely stored every message up to the last of ``tails`` in this list
        (lists this process read from the store, whose objects the memo does not know)."""
        if not tails:
            return
        for position in range(len(self.nodes) - 1, self.reused - 1, -1):
            if self.nodes[position] in tails:
                self.reused = position + 1
                return

    @classmethod
    def from_encoded(cls, channel: str, version: str, payloads: Sequence[tuple[str, bytes]]) -> MessageChain:
        """The chain of a list read back from a store, from its messages' stored forms."""
        chain = cls.__new__(cls)
        chain.channel = channel
        chain.version = version
        chain._messages = ()
        chain._serde = None  # type: ignore[assignment]  # every payload is at hand
        chain._stored = {}
        chain._payloads = dict(enumerate(payloads))
        nodes: list[bytes] = []
        digests: list[bytes] = []
        prev: bytes | None = None
        for kind, payload in payloads:
            digest = digest_of(kind, payload)
            prev = _link(prev, digest)
            nodes.append(prev)
            digests.append(digest)
        chain.nodes = tuple(nodes)
        chain.digests = tuple(digests)
        chain.reused = 0
        return chain

    def _encode(self, position: int) -> tuple[str, bytes]:
        try:
            return self._serde.dumps_typed(self._messages[position])
        except CheckpointSerializationError as error:
            raise error.under(f"[{position}]") from None

    @property
    def tail(self) -> bytes:
        return self.nodes[-1]

    def prev(self, position: int) -> bytes | None:
        """The node before ``position``, ``None`` for the first."""
        return self.nodes[position - 1] if position else None

    def page(self, position: int) -> tuple[bytes, bytes | None] | None:
        """The page the link at ``position`` closes, if it closes one (every
        :data:`LINK_PAGE`-th): the digests of its messages, oldest first, and the node
        before the first of them (None for a list's first page)."""
        if (position + 1) % LINK_PAGE:
            return None
        first = position + 1 - LINK_PAGE
        return b"".join(self.digests[first : position + 1]), self.prev(first)

    def encoded(self) -> list[tuple[int, tuple[str, bytes]]]:
        """The positions this chain has encoded payloads for, with them."""
        return list(self._payloads.items())

    def payload(self, position: int) -> tuple[str, bytes]:
        """The stored form of the message at ``position``."""
        if position not in self._payloads:
            # A message the memo answered from a read is sent as it is stored: its form
            # then matches its digest, even where this codec would now write it otherwise.
            stored = self._stored.get(self.digests[position])
            self._payloads[position] = stored if stored is not None else self._encode(position)
        return self._payloads[position]


def chain_ref(chain: MessageChain) -> bytes:
    """The blob a checkpoint stores for a message list: its tail node and its length."""
    return chain.tail + len(chain.nodes).to_bytes(4, "big")


def parse_chain_ref(ref: bytes) -> tuple[bytes, int]:
    """The (tail node, length) a :func:`chain_ref` blob holds."""
    return ref[:_HASH_BYTES], int.from_bytes(ref[_HASH_BYTES:], "big")
