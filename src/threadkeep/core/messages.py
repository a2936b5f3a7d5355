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

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Final

from langchain_core.messages import BaseMessage
from langgraph.checkpoint.serde.base import SerializerProtocol

from threadkeep.errors import CheckpointSerializationError

__all__ = ["CHAIN_TYPE", "MessageChain", "build_chain", "chain_ref", "is_message_list", "parse_chain_ref"]

CHAIN_TYPE: Final = "chain"
_HASH_BYTES: Final = 16


def is_message_list(value: object) -> bool:
    """Whether ``value`` is a non-empty list made only of LangChain messages."""
    return type(value) is list and bool(value) and all(isinstance(m, BaseMessage) for m in value)


def _digest(kind: str, payload: bytes) -> bytes:
    return hashlib.blake2b(kind.encode() + b"\x00" + payload, digest_size=_HASH_BYTES).digest()


def _link(prev: bytes | None, digest: bytes) -> bytes:
    return hashlib.blake2b((prev or b"") + digest, digest_size=_HASH_BYTES).digest()


@dataclass(frozen=True, slots=True)
class MessageChain:
    """One message list, encoded: per position its link node, message digest and payload."""

    channel: str
    version: str
    nodes: tuple[bytes, ...]
    digests: tuple[bytes, ...]
    payloads: tuple[tuple[str, bytes], ...]

    @property
    def tail(self) -> bytes:
        return self.nodes[-1]

    def prev(self, position: int) -> bytes | None:
        """The node before ``position``, ``None`` for the first."""
        return self.nodes[position - 1] if position else None


def build_chain(
    channel: str, version: str, messages: Sequence[Any], serde: SerializerProtocol
) -> MessageChain:
    """Encode ``messages`` and link them into a chain.

    Raises:
        CheckpointSerializationError: a message cannot be stored; the path names its index.
    """
    nodes: list[bytes] = []
    digests: list[bytes] = []
    payloads: list[tuple[str, bytes]] = []
    prev: bytes | None = None
    for position, message in enumerate(messages):
        try:
            kind, payload = serde.dumps_typed(message)
        except CheckpointSerializationError as error:
            raise error.under(f"[{position}]") from None
        digest = _digest(kind, payload)
        prev = _link(prev, digest)
        nodes.append(prev)
        digests.append(digest)
        payloads.append((kind, payload))
    return MessageChain(channel, version, tuple(nodes), tuple(digests), tuple(payloads))


def chain_ref(chain: MessageChain) -> bytes:
    """The blob a checkpoint stores for a message list: its tail node and its length."""
    return chain.tail + len(chain.nodes).to_bytes(4, "big")


def parse_chain_ref(ref: bytes) -> tuple[bytes, int]:
    """The (tail node, length) a :func:`chain_ref` blob holds."""
    return ref[:_HASH_BYTES], int.from_bytes(ref[_HASH_BYTES:], "big")
