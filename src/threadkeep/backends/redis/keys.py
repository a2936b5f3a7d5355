"""Where a thread lives in Redis: its ten keys, one hash tag (SPEC R1). No I/O.

Every key of a thread shares the hash tag ``{<tag>}``, where the tag is a short digest of the
thread id: any thread id is safe in a key, and every script touches one Redis Cluster slot.
A key space has a prefix (default ``tk``), so several deployments, or tests, share a server.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

__all__ = ["KEY_SUFFIXES", "KeySpace"]

# In the order every script takes them as KEYS (see lua/_prelude.lua).
KEY_SUFFIXES = ("thread", "cps", "heads", "order", "blobs", "writes", "windex", "msgs", "links", "calls")


@dataclass(frozen=True, slots=True)
class KeySpace:
    """The keys of one deployment's store.

    Args:
        prefix: Put in front of every key; it may not contain ``{`` or ``}``.
    """

    prefix: str = "tk"

    def __post_init__(self) -> None:
        if "{" in self.prefix or "}" in self.prefix or not self.prefix:
            raise ValueError(f"redis key prefix {self.prefix!r} must be non-empty and hold no braces")

    @staticmethod
    def tag(thread_id: str) -> str:
        """The hash tag of a thread: 20 hex digits of a digest of its id."""
        return hashlib.blake2b(thread_id.encode(), digest_size=10).hexdigest()

    def thread(self, thread_id: str) -> tuple[str, ...]:
        """The ten keys of a thread, in script order."""
        return self.of_tag(self.tag(thread_id))

    def of_tag(self, tag: str) -> tuple[str, ...]:
        return tuple(f"{self.prefix}:{{{tag}}}:{suffix}" for suffix in KEY_SUFFIXES)

    def tag_of_key(self, key: str) -> str:
        """The tag in one of a thread's keys (as a scan finds them)."""
        return key[key.index("{") + 1 : key.index("}")]

    @property
    def threads_pattern(self) -> str:
        """A SCAN pattern that matches one key per thread."""
        return f"{_glob_literal(self.prefix)}:{{*}}:thread"

    @property
    def thread_keys_pattern(self) -> str:
        """A SCAN pattern that matches every key of every thread (and nothing else: not the
        keys of another application, or of a store whose prefix starts with this one's)."""
        return f"{_glob_literal(self.prefix)}:{{*}}:*"

    @property
    def store_keys(self) -> tuple[str, ...]:
        """The store's keys that belong to no thread."""
        return (self.format_key, self.finished_key)

    @property
    def listing_key(self) -> str:
        """The listing's index of every thread: a ZSET of thread ids scored by their last
        write (SPEC SV1). Its hash tag, ``{listing}``, puts it and every owner's index
        (:meth:`owner_listing_key`) in one Redis Cluster slot, so one script keeps them
        together; a thread's own keys are in its own slot, so the index is written by a
        second script call beside the thread's script (see lua/listing.lua)."""
        return f"{self.prefix}:{{listing}}:all"

    def owner_listing_key(self, owner: str) -> str:
        """One owner's listing index (see :attr:`listing_key`); the owner by a digest, so any
        id is safe in a key."""
        return f"{self.prefix}:{{listing}}:owner:{self.tag(owner)}"

    @property
    def format_key(self) -> str:
        """The key that records the store's format generation (SPEC P6)."""
        return f"{self.prefix}:format"

    @property
    def finished_key(self) -> str:
        """The finished set: a ZSET of thread ids scored by their due time (SPEC RT2)."""
        return f"{self.prefix}:finished"


def _glob_literal(text: str) -> str:
    """``text`` as a SCAN pattern that matches only itself."""
    return "".join(f"\\{char}" if char in "*?[]\\" else char for char in text)
