"""The storage operations for Redis, as programs over the Lua scripts in ``lua/``.

Each step is one atomic script (SPEC W1, R1). The rules are decided here, in Python, and
the scripts enforce their answers server-side: the owner a write needs (W3) and the head a
put needs (:func:`~threadkeep.core.rules.required_head`, W2).
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping, Sequence
from typing import Any, Final

import orjson
from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import CheckpointTuple
from langgraph.checkpoint.serde.base import SerializerProtocol

from threadkeep.backends.redis.engine import Command, Pipeline, Scan, Script
from threadkeep.backends.redis.keys import KeySpace
from threadkeep.backends.sql.programs import FORMAT_GENERATION, READABLE_GENERATIONS
from threadkeep.core.identity import ANONYMOUS, Actor
from threadkeep.core.listing import SCAN_BOUND, ThreadRow, ThreadRows, ThreadScan
from threadkeep.core.messages import ContentCache, EncodingMemo, chain_tail, split_digests
from threadkeep.core.program import Program
from threadkeep.core.records import (
    ListQuery,
    PutStep,
    StoredCheckpoint,
    Target,
    WritesStep,
    decode_structure,
    matches_filter,
)
from threadkeep.core.retention import ExpiredThread, Park, SweepPage, ThreadRetention
from threadkeep.core.rules import check_handover, check_owner, required_head, required_owner
from threadkeep.errors import (
    CheckpointSerializationError,
    CheckpointStoreFormatError,
    StaleStateError,
    StorageError,
    StorageForbiddenError,
)
from threadkeep.threads import Cursor

__all__ = [
    "assign_owner",
    "clear_park",
    "copy_thread",
    "count_expired",
    "delete_for_runs",
    "delete_thread",
    "delete_threads",
    "ensure_format",
    "expired_page",
    "get_tuple",
    "interrupted",
    "list_page",
    "live_parks",
    "mark_finished",
    "prune",
    "put",
    "put_writes",
    "read_leased_state",
    "read_state",
    "record_format",
    "record_of",
    "record_park",
    "refuse_lost",
    "reset",
    "start_thread",
    "stats",
    "step_rows",
    "stored_prefix",
    "thread_retention",
    "thread_rows",
    "threads_named",
]

NUL = b"\0"
# What follows a link's node in the field of its page (a node is 16 bytes: no link's field).
PAGE_MARK = b"p"
# The message lists a load.lua entry carried, by tail: their digests (as the store holds
# them, and as their links lead to the tail) and their messages' stored forms.
_Carried = dict[bytes, tuple[list[bytes], list[tuple[str, bytes]]]]
# load.lua's, page.lua's and read_all.lua's answer where Redis evicted part of a thread, and
# what the error says of it.
_LOST = NUL + b"lost"
# read_all.lua's answer for another user's thread.
_FORBIDDEN = NUL + b"forbidden"
_EVICTED = (
    "an eviction by Redis (run Redis with maxmemory-policy noeviction); an operator can delete what is left"
)


def refuse_lost(thread_id: str, reply: Sequence[Any]) -> None:
    """Raise if ``reply`` is a script's answer for a thread Redis evicted part of (_LOST)."""
    if reply and reply[0] == _LOST:
        raise CheckpointSerializationError(f"{reply[1].decode()}: {_EVICTED}", path=f"thread {thread_id!r}")


# A put sends the messages after what the previous put of the list sent; when more than
# this many are new to this process, it first asks which the store holds.
_PROBE_AFTER = 32
_PUT_TRIES = 3


def _required_owner(actor: Actor) -> str:
    return required_owner(actor) or ""


def record_of(step: PutStep) -> bytes:
    """The checkpoint record a put stores (see lua/_prelude.lua)."""
    return orjson.dumps(
        {
            "p": step.parent_id,
            "r": step.run_id,
            "t": step.now,
            "c": step.checkpoint.decode(),
            "m": step.metadata.decode(),
            "v": [f"{channel}\0{version}" for channel, version in step.versions],
        }
    )


def _put_args(step: PutStep, ttl_ms: int, known: list[int]) -> list[object]:
    target = step.target
    required = required_head(
        checkpoint_ns=target.checkpoint_ns,
        parent_id=step.parent_id,
        source=step.source,
        named=step.named,
        served_head=step.served_head,
    )
    args: list[object] = [
        target.thread_id,
        target.actor.user_id,
        _required_owner(target.actor),
        step.now,
        ttl_ms,
        target.checkpoint_ns,
        step.checkpoint_id,
        required or "",
        record_of(step),
        step.history_limit or 0,
    ]
    sent = {blob.channel for blob in step.blobs}
    kept = [f"{channel}\0{version}" for channel, version in step.versions if channel not in sent]
    return [*args, *step_rows(step, known), *kept, len(kept)]


def step_rows(step: PutStep, known: Sequence[int]) -> list[object]:
    """The rows of a put as put.lua (and cache_put.lua) read them: each message list's
    known prefix, the channel values, then the messages and links after the prefixes. The
    link closing a page (:meth:`MessageChain.page`) comes with it, as field ``<node>p``:
    its digests, then the node before them, if any; load.lua reads it in one step instead
    of a link at a time."""
    prefixes = [chain.nodes[count - 1] for chain, count in zip(step.chains, known, strict=True) if count]
    args: list[object] = [len(prefixes), *prefixes]
    args.append(len(step.blobs))
    for blob in step.blobs:
        args += [f"{blob.channel}\0{blob.version}", blob.type.encode() + NUL + blob.value]
    messages: list[object] = []
    links: list[object] = []
    for chain, count in zip(step.chains, known, strict=True):
        for i in range(count, len(chain.nodes)):
            kind, payload = chain.payload(i)
            messages += [chain.digests[i], kind.encode() + NUL + payload]
            links += [chain.nodes[i], chain.digests[i] + (chain.prev(i) or b"")]
            page = chain.page(i)
            if page is not None:
                links += [chain.nodes[i] + PAGE_MARK, page[0] + (page[1] or b"")]
    return [*args, len(messages) // 2, *messages, len(links) // 2, *links]


def stored_prefix(flags: Sequence[int]) -> int:
    """Stored links are prefix-closed: the newest stored one settles the prefix."""
    for position in range(len(flags) - 1, -1, -1):
        if flags[position]:
            return position + 1
    return 0


def put(space: KeySpace, step: PutStep, ttl_ms: int) -> Program[RunnableConfig]:
    """Store one checkpoint step with one script (SPEC W1), in one round trip when the
    message lists continue what this process put before.

    The listing's index (:func:`_listed`, in another Cluster slot) is written in the same
    round trip, beside the script, not inside it: the thread is listed under its writer,
    who owns it unless an operator writes another user's thread (then a second round trip
    moves it to its owner's index). A put that is refused (another user's thread, a stale
    head) gives the index back what it held (:func:`_unlist`); one that fails on the way (a
    dropped connection, the process gone) may leave the thread listed at the failed write's
    time, or a thread never stored listed, which a listing drops where it meets it."""
    target = step.target
    keys = space.thread(target.thread_id)
    writer = target.actor.user_id
    known = [chain.reused for chain in step.chains]
    for position, chain in enumerate(step.chains):
        if len(chain.nodes) - known[position] > _PROBE_AFTER:
            known[position] = stored_prefix((yield Script("probe", keys, chain.nodes)))
    held: list[bytes] | None = None  # what the index held before this put listed the thread
    tries = 0
    while tries < _PUT_TRIES:
        request = Script("put", keys, _put_args(step, ttl_ms, known))
        if held is None:
            listed = _listed(space, target.thread_id, writer, step.now, ttl_ms)
            reply, held = yield Pipeline((request, listed))
        else:
            reply = yield request
        status = reply[0]
        if status == b"ok":
            owner = reply[1].decode()
            if owner != writer:  # an operator's write of another user's thread
                yield Pipeline(
                    (
                        _listed(space, target.thread_id, owner, step.now, ttl_ms),
                        _unlist(space, target.thread_id, writer, step.now, held, owner_only=True),
                    )
                )
            return step.result_config()
        if status == b"forbidden":
            yield _unlist(space, target.thread_id, writer, step.now, held)
            raise StorageForbiddenError(target.thread_id, writer)
        if status == b"stale":
            yield _unlist(space, target.thread_id, writer, step.now, held)
            raise StaleStateError(
                target.thread_id, target.checkpoint_ns, step.parent_id, reply[1].decode() or None
            )
        if status == b"whole":
            # A value the checkpoint keeps from its parent is gone (put.lua): send every value
            # (not a try; a step that sends every value is never answered so).
            if step.whole is None:
                yield _unlist(space, target.thread_id, writer, step.now, held)
                raise StorageError(f"thread {target.thread_id!r} lost a value a put sent whole; try again")
            step = step.whole()
            known = [chain.reused for chain in step.chains]
            continue
        # "resend": a list's prefix is not stored (deleted, or never committed): ask which is.
        tries += 1
        for position, chain in enumerate(step.chains):
            known[position] = stored_prefix((yield Script("probe", keys, chain.nodes)))
    if held is not None:
        yield _unlist(space, target.thread_id, writer, step.now, held)
    raise StorageError(f"thread {target.thread_id!r} kept changing under a put; try again")


def put_writes(space: KeySpace, step: WritesStep, ttl_ms: int, *, keys: Sequence[str] = ()) -> Program[None]:
    """Store a task's writes with one script. Given ``keys`` (a tiered cache entry), only
    against a checkpoint those keys hold."""
    target = step.target
    args: list[object] = [
        target.thread_id,
        target.actor.user_id,
        _required_owner(target.actor),
        step.now,
        ttl_ms,
        target.checkpoint_ns,
        target.checkpoint_id,
        step.history_limit or 0,
        "1" if keys else "0",
        len(step.rows),
    ]
    for row in step.rows:
        args += [
            f"{row.task_id}\0{row.idx}",
            NUL.join((row.task_path.encode(), row.channel.encode(), row.type.encode(), row.value)),
            "1" if row.special else "0",
        ]
    reply = yield Script("put_writes", keys or space.thread(target.thread_id), args)
    if reply[0] == b"forbidden":
        raise StorageForbiddenError(target.thread_id, target.actor.user_id)


# --- reads -------------------------------------------------------------------------------


def _stored(thread_id: str, ns: str, entry: list[Any]) -> tuple[StoredCheckpoint, _Carried]:
    """Decode one entry of load.lua's reply; returns it and the message lists it carried."""
    checkpoint_id, record_bytes, blobs, writes, *lists = entry
    record = orjson.loads(record_bytes)
    stored = StoredCheckpoint(
        thread_id=thread_id,
        checkpoint_ns=ns,
        checkpoint_id=checkpoint_id.decode(),
        parent_id=record["p"],
        structure=decode_structure(record["c"], "checkpoint"),
        metadata=decode_structure(record["m"], "metadata"),
    )
    for i in range(0, len(blobs), 2):
        channel = blobs[i].split(NUL, 1)[0].decode()
        kind, value = blobs[i + 1].split(NUL, 1)
        stored.values.append((channel, kind.decode(), value))
    # A put stores a value for every channel it versions (an empty one too): one missing
    # was removed by Redis (an eviction), and the checkpoint is not returned without it.
    missing = stored.missing_channels()
    if missing:
        raise CheckpointSerializationError(
            f"checkpoint {stored.checkpoint_id} lost the values of {', '.join(missing)}: {_EVICTED}",
            path=f"thread {thread_id!r}",
        )
    for i in range(0, len(writes), 2):
        task_id, idx = writes[i].split(NUL, 1)
        path, channel, kind, value = writes[i + 1].split(NUL, 3)
        stored.writes.append(
            (path.decode(), task_id.decode(), int(idx), channel.decode(), kind.decode(), value)
        )
    carried: _Carried = {}
    for tail, joined, *messages in lists:
        if any(not message for message in messages):
            raise CheckpointSerializationError(
                "message history is incomplete: a message of the list is not stored",
                path=f"thread {thread_id!r}",
            )
        digests = split_digests(joined)
        if len(digests) != len(messages) or chain_tail(digests) != tail:
            raise CheckpointSerializationError(
                "message history is inconsistent: its links do not lead to the list's tail",
                path=f"thread {thread_id!r}",
            )
        carried[bytes(tail)] = (digests, [_split(message) for message in messages])
    return stored, carried


def _split(message: bytes) -> tuple[str, bytes]:
    kind, payload = message.split(NUL, 1)
    return kind.decode(), payload


def _resolve(
    stored: StoredCheckpoint, carried: _Carried, content: ContentCache
) -> dict[bytes, list[tuple[str, bytes]]]:
    """Every list the checkpoint needs: carried by the reply (and cached), or held already."""
    lists: dict[bytes, list[tuple[str, bytes]]] = {}
    for tail, count in stored.chains():
        if tail in carried:
            _, messages = carried[tail]
            if len(messages) != count:
                raise CheckpointSerializationError(
                    f"message history holds {len(messages)} of {count} messages"
                )
            lists[tail] = messages
            continue
        held = content.messages(tail)
        if held is None:
            raise StorageError("a message list left the content cache during a read; read again")
        lists[tail] = held
    return lists


def _remember(stored: StoredCheckpoint, carried: _Carried, content: ContentCache) -> None:
    for tail, (digests, messages) in carried.items():
        content.keep(tail, digests, messages, stored.thread_id)


def _load(
    space: KeySpace,
    thread_id: str,
    owner: str | None,
    wanted: Sequence[tuple[str, str]],
    content: ContentCache,
    *,
    keys: Sequence[str] = (),
    lease: bool = False,
) -> Program[tuple[list[tuple[StoredCheckpoint, _Carried] | None], list[int]]]:
    """The entries ``wanted`` names; with ``lease`` (a tiered cache entry), also load.lua's
    lease answer: the Redis time (ms), then 1 or 0 per entry (within its lease or not)."""
    held = b"".join(content.recent_tails(thread_id))
    args: list[object] = [owner or "", held, len(wanted)]
    for ns, checkpoint_id in wanted:
        args += [ns, checkpoint_id]
    if lease:
        args.append("lease")
    reply = yield Script("load", keys or space.thread(thread_id), args)
    out: list[tuple[StoredCheckpoint, _Carried] | None] = []
    for (ns, _), entry in zip(wanted, reply[: len(wanted)], strict=True):
        refuse_lost(thread_id, entry)
        out.append(_stored(thread_id, ns, entry) if entry else None)
    return out, [int(value) for value in reply[len(wanted)]] if lease else []


def read_state(
    space: KeySpace,
    target: Target,
    content: ContentCache,
    *,
    keys: Sequence[str] = (),
) -> Program[tuple[StoredCheckpoint, dict[bytes, list[tuple[str, bytes]]]] | None]:
    """The addressed checkpoint (or the newest of its namespace) as stored, with the stored
    form of every message of its lists, in one round trip. Given ``keys`` (a tiered cache
    entry), read those instead of the thread's own."""
    found, _ = yield from _read_state(space, target, content, keys=keys, lease=False)
    return found


def read_leased_state(
    space: KeySpace, target: Target, content: ContentCache, *, keys: Sequence[str]
) -> Program[tuple[tuple[StoredCheckpoint, dict[bytes, list[tuple[str, bytes]]]] | None, int, bool]]:
    """:func:`read_state` of a tiered cache entry (its ``keys``), in the same round trip as
    its lease: the state (``None``: none), the Redis time of the read (ms), and whether the
    state is within its lease (docs/tiered.md)."""
    found, (read_at, valid) = yield from _read_state(space, target, content, keys=keys, lease=True)
    return found, read_at, bool(valid)


def _read_state(
    space: KeySpace, target: Target, content: ContentCache, *, keys: Sequence[str], lease: bool
) -> Program[tuple[tuple[StoredCheckpoint, dict[bytes, list[tuple[str, bytes]]]] | None, list[int]]]:
    (found,), leases = yield from _load(
        space,
        target.thread_id,
        target.actor.owner_filter,
        [(target.checkpoint_ns, target.checkpoint_id or "")],
        content,
        keys=keys,
        lease=lease,
    )
    if found is None:
        return None, leases
    stored, carried = found
    lists = _resolve(stored, carried, content)
    _remember(stored, carried, content)
    return (stored, lists), leases


def get_tuple(
    space: KeySpace,
    target: Target,
    serde: SerializerProtocol,
    content: ContentCache,
    memo: EncodingMemo | None = None,
) -> Program[CheckpointTuple | None]:
    """The addressed checkpoint, or the newest of its namespace, in one round trip."""
    found = yield from read_state(space, target, content)
    if found is None:
        return None
    stored, lists = found
    return stored.to_tuple(serde, lists, content, memo)


def list_page(
    space: KeySpace, query: ListQuery, serde: SerializerProtocol, content: ContentCache
) -> Program[tuple[list[CheckpointTuple], ListQuery | None]]:
    """One page of ``list``: newest first within each thread; threads one after another.

    ``query.cursor`` is ``(thread ids left, cursor in the current thread)``.
    """
    if query.cursor is None:
        if query.thread_id is not None:
            threads: tuple[str, ...] = (query.thread_id,)
        else:
            keys = yield Scan(space.threads_pattern)
            threads = tuple((yield from _thread_ids(space, keys)))
        inner = ""
    else:
        threads, inner = query.cursor  # type: ignore[misc]
    if not threads:
        return [], None
    thread_id = threads[0]
    args = [
        query.owner or "",
        "1" if query.checkpoint_ns is not None else "0",
        query.checkpoint_ns or "",
        query.before or "",
        inner,
        query.page_size,
        query.checkpoint_id or "",
    ]
    reply = yield Script("page", space.thread(thread_id), args)
    refuse_lost(thread_id, reply)
    next_inner = reply[0].decode()
    chosen: list[tuple[str, str]] = []
    for i in range(1, len(reply), 3):
        metadata = decode_structure(reply[i + 2], "metadata")
        if matches_filter(metadata, query.filter):
            chosen.append((reply[i + 1].decode(), reply[i].decode()))
            if query.remaining is not None and len(chosen) >= query.remaining:
                break
    found: list[CheckpointTuple] = []
    if chosen:
        loaded, _ = yield from _load(space, thread_id, query.owner, chosen, content)
        for item in loaded:
            if item is None:
                continue
            stored, carried = item
            lists = _resolve(stored, carried, content)
            _remember(stored, carried, content)
            found.append(stored.to_tuple(serde, lists))
    cursor = (threads, next_inner) if next_inner else (threads[1:], "")
    exhausted = not cursor[0]
    return found, query.advanced(cursor, len(found), exhausted)  # type: ignore[arg-type]


def _thread_ids(space: KeySpace, keys: Iterable[bytes]) -> Program[list[str]]:
    ids = []
    for key in keys:
        thread_id = yield Command(("HGET", key, "id"))
        if thread_id is not None:
            ids.append(thread_id.decode())
    return ids


# --- deletes, pruning, copies ----------------------------------------------------------------
#
# A thread the store does not hold is passed by, as LangGraph's savers do; another user's is
# refused with StorageForbiddenError (SPEC W3), by the script that would act on it. A call on
# several threads (prune, delete_for_runs) first checks them all, so a refusal changes
# nothing; only an owner change between that check and a thread's script (assign_owner)
# refuses midway, after the threads before it.

# delete.lua's answer for another user's thread; prune.lua's and delete_runs.lua's.
_NOT_YOURS = -2
_REFUSED = -1


def owner_of(space: KeySpace, thread_id: str) -> Program[str | None]:
    """The user who owns ``thread_id``, or ``None`` if the store has no such thread."""
    found = yield Command(("HGET", space.thread(thread_id)[0], "owner"))
    return None if found is None else bytes(found).decode()


def delete_thread(space: KeySpace, thread_id: str, owner: str | None) -> Program[bool]:
    """Delete everything a thread holds, in one script (``delete.lua`` deletes its keys at
    once), and its finished mark. What a writer stores after that belongs to a run that
    started after the delete: a new thread, which stays (its puts were acknowledged).

    Raises:
        StorageForbiddenError: the thread belongs to another user than ``owner``.
    """
    keys = space.thread(thread_id)
    # the owner as the delete finds it, read in its round trip: the thread leaves its index
    delete = Script("delete", keys, [owner or "", ""])
    held, deleted = yield Pipeline((Command(("HGET", keys[0], "owner")), delete))
    if deleted == _NOT_YOURS:
        raise StorageForbiddenError(thread_id, owner or "", action="delete")
    if not deleted and owner is not None:
        return False
    yield Command(("ZREM", space.finished_key, thread_id))  # its finished mark (SW5); an
    # operator's delete also drops a mark whose keys expired
    yield _unlisted(space, thread_id, owner or (None if held is None else bytes(held).decode()))
    return bool(deleted)


def delete_for_runs(
    space: KeySpace,
    run_ids: Sequence[str],
    owner: str | None,
    spare: Mapping[str, Collection[tuple[str, str]]] | None = None,
) -> Program[int]:
    """Delete the checkpoints the given runs stored, in every thread, but the (namespace,
    checkpoint id) ``spare`` names per thread.

    Raises:
        StorageForbiddenError: a run stored checkpoints on a thread of another user than
            ``owner``; nothing is deleted (checked on every thread first).
    """
    if not run_ids:
        return 0
    spared = {
        space.tag(thread_id): [f"{ns}\0{cid}" for ns, cid in kept]
        for thread_id, kept in (spare or {}).items()
    }
    tags = [space.tag_of_key(key.decode()) for key in (yield Scan(space.threads_pattern))]
    passes = ("1",) if owner is None else ("0", "1")  # a user's: check every thread first
    removed = 0
    for mode in passes:
        for tag in tags:
            keys = space.of_tag(tag)
            args = [owner or "", mode, str(len(run_ids)), *run_ids, *spared.get(tag, ())]
            found = int((yield Script("delete_runs", keys, args)))
            if found == _REFUSED:
                thread_id = (yield Command(("HGET", keys[0], "id"))) or b"?"
                raise StorageForbiddenError(thread_id.decode(), owner or "", action="delete runs on")
            removed += found if mode == "1" else 0
    return removed


def _check_owners(
    space: KeySpace, thread_ids: Sequence[str], owner: str | None, action: str
) -> Program[None]:
    """Refuse ``action`` on ``thread_ids`` if one belongs to another user than ``owner``."""
    if owner is None:
        return
    for thread_id in thread_ids:
        found = yield Command(("HGET", space.thread(thread_id)[0], "owner"))
        if found is not None:
            check_owner(thread_id=thread_id, owner=found.decode(), user_id=owner, enforce=True, action=action)


def prune(
    space: KeySpace,
    thread_ids: Iterable[str],
    strategy: str,
    owner: str | None,
    keep: Mapping[str, Mapping[str, int]] | None = None,
) -> Program[None]:
    """LangGraph's ``prune``: ``keep_latest`` per namespace (the newest ``keep[thread][ns]``
    checkpoints, 1 unless named), or ``delete`` every checkpoint.

    Raises:
        StorageForbiddenError: one of the threads belongs to another user than ``owner``;
            no thread is pruned (checked on every thread first).
    """
    if strategy not in ("keep_latest", "delete"):
        raise ValueError(f"prune strategy {strategy!r} is not 'keep_latest' or 'delete'")
    ids = list(dict.fromkeys(thread_ids))
    yield from _check_owners(space, ids, owner, "prune")
    for thread_id in ids:
        if strategy == "delete":
            yield from delete_thread(space, thread_id, owner)
        else:
            counts = [str(part) for item in (keep or {}).get(thread_id, {}).items() for part in item]
            if (yield Script("prune", space.thread(thread_id), [owner or "", *counts])) == _REFUSED:
                raise StorageForbiddenError(thread_id, owner or "", action="prune")


def copy_thread(
    space: KeySpace, source: str, target: str, actor: Actor, *, now: float, ttl_ms: int
) -> Program[bool]:
    """Copy every checkpoint, write and message of ``source`` onto ``target``; ``False``
    (and nothing created) when the store holds no ``source``.

    The two threads live on different slots of a cluster, so the copy is a read of one and
    a write of the other, each atomic.

    Raises:
        StorageForbiddenError: ``source`` or ``target`` belongs to another user.
    """
    groups = yield Script("read_all", space.thread(source), [actor.owner_filter or ""])
    if not groups:
        return False
    if groups[0] == _FORBIDDEN:
        raise StorageForbiddenError(source, actor.user_id, action="copy")
    refuse_lost(source, groups)
    args: list[object] = [target, actor.user_id, _required_owner(actor), now, ttl_ms]
    for group in groups:
        args += [len(group) // 2, *group]
    reply = yield Script("merge", space.thread(target), args)
    if reply[0] == b"forbidden":
        raise StorageForbiddenError(target, actor.user_id, action="copy onto")
    owner = yield Command(("HGET", space.thread(target)[0], "owner"))
    if owner is not None:
        yield _listed(space, target, owner.decode(), now, ttl_ms)
    return True


def assign_owner(
    space: KeySpace, thread_ids: Sequence[str], user: str, force: bool, ttl_ms: int
) -> Program[dict[str, str | None]]:
    """Hand ``thread_ids`` to ``user``, each in one script; returns each thread's owner before
    (``None``: the store holds no such thread). The listing's index moves the thread from
    its owner's index to ``user``'s in the script's round trip (its owner as read before;
    when the script finds another, or refuses, a second call sets the index right).

    Raises:
        StorageForbiddenError: without ``force``, a thread belongs to another user than the
            anonymous owner or ``user``: checked on every thread first, so no thread changes
            owner (unless an owner changes between the check and the script).
    """
    wanted = list(dict.fromkeys(thread_ids))
    owners = {}
    for thread_id in wanted:
        found = yield Command(("HGET", space.thread(thread_id)[0], "owner"))
        if found is not None:
            owners[thread_id] = found.decode()
    check_handover(owners, user, force)
    before: dict[str, str | None] = {}
    for thread_id in wanted:
        assign = Script("assign", space.thread(thread_id), [user, "1" if force else "0", ANONYMOUS])
        expected = owners.get(thread_id)
        if expected is None:  # no such thread when checked: nothing to move
            reply = yield assign
        else:
            reply, _ = yield Pipeline((assign, _moved(space, thread_id, expected, user, ttl_ms)))
        if reply[0] == b"refused":
            # its owner changed since the check: the index's move was not the owner's
            if expected is not None:
                yield _unlisted(space, thread_id, user, owner_only=True)
            check_handover({thread_id: reply[1].decode()}, user, force)  # raises
            before[thread_id] = None
            continue
        if reply[0] != b"ok":
            before[thread_id] = None
            if expected is not None:  # gone since the check
                yield _unlisted(space, thread_id, user)
            continue
        before[thread_id] = reply[1].decode()
        if before[thread_id] != expected:  # another owner than checked: move from theirs
            yield _moved(space, thread_id, reply[1].decode(), user, ttl_ms)
    return before


def stats(space: KeySpace, thread_id: str | None = None) -> Program[dict[str, int]]:
    """What the store (or one thread) holds."""
    if thread_id is not None:
        tags = [space.tag(thread_id)]
    else:
        tags = [space.tag_of_key(key.decode()) for key in (yield Scan(space.threads_pattern))]
    totals = {
        "threads": 0,
        "checkpoints": 0,
        "channel_values": 0,
        "writes": 0,
        "messages": 0,
        "payload_bytes": 0,
    }
    for tag in tags:
        checkpoints, values, writes, messages, payload = yield Script("stats", space.of_tag(tag), [])
        totals["threads"] += 1 if checkpoints or writes else 0
        totals["checkpoints"] += int(checkpoints)
        totals["channel_values"] += int(values)
        totals["writes"] += int(writes)
        totals["messages"] += int(messages)
        totals["payload_bytes"] += int(payload)
    return totals


# --- format gate, maintenance ----------------------------------------------------------------


def _format_error(found: str | None) -> CheckpointStoreFormatError:
    return CheckpointStoreFormatError(
        f"the redis checkpoint store holds data written in another format (generation "
        f"{found or 'none'}, this version writes {FORMAT_GENERATION}); reset the checkpoint store "
        "before starting this version: threadkeep store reset",
        context={"provider": "redis", "found": found, "expected": FORMAT_GENERATION},
    )


def ensure_format(space: KeySpace) -> Program[None]:
    """Refuse a store of another format generation, or threads with none recorded (P6)."""
    recorded = yield Command(("GET", space.format_key))
    if recorded is None:
        if (yield Scan(space.threads_pattern)):
            raise _format_error(None)
    elif recorded.decode() not in READABLE_GENERATIONS:
        raise _format_error(recorded.decode())


def record_format(space: KeySpace) -> Program[None]:
    """Record this format generation (a readable older one is upgraded); concurrent first
    uses converge on one record."""
    yield Command(("SET", space.format_key, str(FORMAT_GENERATION), "NX"))
    recorded = yield Command(("GET", space.format_key))
    if recorded is not None and recorded.decode() in READABLE_GENERATIONS:
        yield Command(("SET", space.format_key, str(FORMAT_GENERATION)))
        recorded = str(FORMAT_GENERATION).encode()
    if recorded is None or recorded.decode() != str(FORMAT_GENERATION):
        raise _format_error(None if recorded is None else recorded.decode())


def reset(space: KeySpace) -> Program[None]:
    """Delete every key of the store, and no other key."""
    for key in (yield Scan(space.thread_keys_pattern)):
        yield Command(("DEL", key))
    for key in space.store_keys:
        yield Command(("DEL", key))


# --- retention (SPEC RT1-RT5, SW2; the waiting horizon is the keys' TTL, R2) ---------------

_PARK = b"park\0"


def start_thread(
    space: KeySpace, thread_id: str, actor: Actor, declared: ThreadRetention, *, ttl_ms: int, now: float
) -> Program[None]:
    """A run starts on ``thread_id``: no longer finished; its declared waiting becomes its
    keys' TTL. ``retain.lua`` checks the owner and clears the thread's own ``finished_due``
    in one script; only then is the thread taken out of the finished set (another key, in
    another Cluster slot), so another user's start never touches a mark. A failure between
    the two leaves a running thread listed in the set, which the sweep does not delete
    (``delete.lua`` reads the thread's own ``finished_due``) and drops with the thread."""
    reply = yield Script(
        "retain",
        space.thread(thread_id),
        [
            thread_id,
            actor.user_id,
            now,
            _required_owner(actor),
            "" if declared.waiting_minutes is None else declared.waiting_minutes * 60_000,
            "" if declared.finished_minutes is None else declared.finished_minutes,
            ttl_ms,
        ],
    )
    if reply[0] == b"forbidden":
        raise StorageForbiddenError(thread_id, actor.user_id)
    yield Command(("ZREM", space.finished_key, thread_id))
    yield _listed(space, thread_id, reply[1].decode(), now, ttl_ms)


def thread_retention(
    space: KeySpace, thread_id: str, owner: str | None
) -> Program[tuple[ThreadRetention, float | None] | None]:
    """A thread's declared retention and its finished due time (``None``: waiting), read in
    one command from its own hash (the finished set follows it); ``None`` when there is no
    such thread of ``owner`` (``None``: any owner)."""
    held, waiting_ms, finished, due = yield Command(
        ("HMGET", space.thread(thread_id)[0], "owner", "waiting_ms", "finished_m", "finished_due")
    )
    if held is None or (owner is not None and held.decode() != owner):
        return None
    declared = ThreadRetention(
        None if waiting_ms is None else int(waiting_ms) // 60_000, None if finished is None else int(finished)
    )
    return declared, (float(due) if due else None)


def mark_finished(
    space: KeySpace, thread_ids: Sequence[str], actor: Actor, platform_finished: int, now: float
) -> Program[dict[str, float]]:
    """Add threads to the finished set, due the finished retention in force now (declared,
    else the platform's capped at the declared waiting), which ``finish.lua`` computes and
    records, after checking the owner, in the thread's own hash. A thread another user
    owns is refused when it is reached (the threads before it stay marked: each thread is
    its own script, in its own Cluster slot)."""
    marked: dict[str, float] = {}
    for thread_id in dict.fromkeys(thread_ids):
        reply = yield Script(
            "finish", space.thread(thread_id), [now, platform_finished, _required_owner(actor)]
        )
        if reply[0] == b"forbidden":
            raise StorageForbiddenError(thread_id, actor.user_id)
        if reply[0] == b"ok":
            marked[thread_id] = float(reply[1])
            yield Command(("ZADD", space.finished_key, marked[thread_id], thread_id))
    return marked


def expired_page(space: KeySpace, page: SweepPage) -> Program[list[ExpiredThread]]:
    """Finished threads past due, skipping the ``spared`` ones still in the set (the waiting
    horizon is the keys' TTL: nothing to page)."""
    if page.horizon == "waiting":
        return []
    ids = yield Command(
        ("ZRANGEBYSCORE", space.finished_key, "-inf", page.now, "LIMIT", page.spared, page.limit)
    )
    found = []
    for raw in ids:
        thread_id = raw.decode()
        owner = yield Command(("HGET", space.thread(thread_id)[0], "owner"))
        found.append(ExpiredThread(0, thread_id, "" if owner is None else owner.decode()))
    return found


def count_expired(space: KeySpace, page: SweepPage) -> Program[int]:
    if page.horizon == "waiting":
        return 0
    return int((yield Command(("ZCOUNT", space.finished_key, "-inf", page.now))))


def delete_threads(
    space: KeySpace, threads: Sequence[ExpiredThread], page: SweepPage | None = None
) -> Program[list[str]]:
    """Delete each thread (one script) and its finished mark; with a sweep's ``page``, only
    threads still past due and not parked, as ``delete.lua``
    checks in the script that deletes."""
    deleted = []
    for thread in threads:
        if page is not None:
            due = yield Command(("ZSCORE", space.finished_key, thread.thread_id))
            if due is None or float(due) > page.now:
                continue  # a run started on it since the page was read
        now = "" if page is None else page.now
        if (yield Script("delete", space.thread(thread.thread_id), ["", now])) == -1:
            continue  # a run started or parked on it since
        yield Command(("ZREM", space.finished_key, thread.thread_id))
        yield _unlisted(space, thread.thread_id, thread.owner or None)
        deleted.append(thread.thread_id)
    return deleted


def threads_named(space: KeySpace, thread_ids: Sequence[str]) -> Program[list[ExpiredThread]]:
    found = []
    for thread_id in thread_ids:
        owner = yield Command(("HGET", space.thread(thread_id)[0], "owner"))
        if owner is not None:
            found.append(ExpiredThread(0, thread_id, owner.decode()))
    return found


def record_park(space: KeySpace, park: Park, ttl_ms: int) -> Program[None]:
    """Record a live park, creating the thread for its user if its first checkpoint is still
    on its way (as put.lua would)."""
    args = [
        "set",
        park.park_id,
        park.deadline,
        park.thread_id,
        park.user,
        park.now,
        park.required_owner or "",
    ]
    reply = yield Script("park", space.thread(park.thread_id), [*args, ttl_ms])
    if reply[0] == b"forbidden":
        raise StorageForbiddenError(park.thread_id, park.user)


def clear_park(space: KeySpace, thread_id: str, park_id: str, actor: Actor) -> Program[None]:
    """Remove a park; ``park.lua`` refuses it on a thread another user owns."""
    reply = yield Script("park", space.thread(thread_id), ["clear", park_id, _required_owner(actor)])
    if reply[0] == b"forbidden":
        raise StorageForbiddenError(thread_id, actor.user_id)


def live_parks(
    space: KeySpace, thread_ids: Sequence[str], now: float, owner: str | None
) -> Program[set[str]]:
    """Which of ``thread_ids`` (of ``owner``; ``None``: any) hold a live park: one read of
    each thread's hash, its owner and parks together."""
    live = set()
    for thread_id in thread_ids:
        fields = dict(_pairs((yield Command(("HGETALL", space.thread(thread_id)[0])))))
        if owner is not None and fields.get(b"owner") != owner.encode():
            continue
        if any(key.startswith(_PARK) and float(value) > now for key, value in fields.items()):
            live.add(thread_id)
    return live


def _pairs(reply: Any) -> list[tuple[bytes, bytes]]:
    if isinstance(reply, dict):
        return list(reply.items())
    return list(zip(reply[::2], reply[1::2], strict=True))


def interrupted(space: KeySpace, thread_ids: Sequence[str], since: float | None) -> Program[set[str]]:
    """Which threads' newest root checkpoint holds an interrupt write (LangGraph's rule) and,
    with ``since``, was stored at or after it (its record's ``t``)."""
    waiting = set()
    for thread_id in thread_ids:
        keys = space.thread(thread_id)
        top = yield Command(("ZREVRANGEBYLEX", keys[2], b"(\1", b"[\0", "LIMIT", 0, 1))  # namespace ""
        if not top:
            continue
        member = bytes(top[0])
        if since is not None:
            record = yield Command(("HGET", keys[1], member))
            if record is None or orjson.loads(record)["t"] < since:
                continue
        fields = yield Command(("ZRANGEBYLEX", keys[6], b"[" + member + NUL, b"(" + member + b"\1"))
        if not fields:
            continue
        values = yield Command(("HMGET", keys[5], *fields))
        if any(value is not None and value.split(NUL, 2)[1] == b"__interrupt__" for value in values):
            waiting.add(thread_id)
    return waiting


# --- the thread listing (SPEC SV1, SV3; lua/listing.lua) ----------------------------------------
#
# The index is a ZSET of every thread and one per owner, scored by the last write, in the one
# Cluster slot of the "{listing}" hash tag (KeySpace.listing_key). A thread's keys are in its
# own slot, so no script can write both: the index is written by a second call with each
# write that moves a thread's clock (a put, in the same round trip; a run's start, a copy,
# after it), and an entry may outlive its thread or precede it (keys expire on their TTL,
# SPEC R2; a process may stop, or a connection drop, between the two calls). A listing reads
# the rows' threads (summary.lua, every row of a page in one round trip) and drops, from the
# index too, the entries whose thread is gone or has another owner. What no listing meets
# leaves with the platform's waiting horizon: each write drops the entries older than it and
# re-arms the index keys' TTL to it (listing.lua "add"). The index's time is the waiting
# clock (a put, a run's start), as the SQL sweep counts it: a thread whose keys a later
# put_writes, park or tool call kept alive (a step's length after its last put) leaves the
# index that much before its keys expire.

# A ZSET bound for an unbounded side (Lua's tonumber does not read "inf" everywhere).
_FAR: Final = 1e300


def _listed(space: KeySpace, thread_id: str, owner: str, written_at: float, horizon_ms: int) -> Script:
    """List the thread at ``written_at`` in every thread's index and ``owner``'s; the indexes
    drop what was written longer than ``horizon_ms`` (the platform's waiting retention, the
    longest any thread's keys live without a write) before, and live that long (SPEC R2)."""
    keys = (space.listing_key, space.owner_listing_key(owner))
    return Script("listing", keys, ["add", thread_id, repr(float(written_at)), horizon_ms])


def _moved(space: KeySpace, thread_id: str, owner: str, user: str, horizon_ms: int) -> Script:
    """Move the thread from ``owner``'s index to ``user``'s, at its place in every thread's."""
    keys = (space.listing_key, space.owner_listing_key(owner), space.owner_listing_key(user))
    return Script("listing", keys, ["move", thread_id, horizon_ms])


def _unlist(
    space: KeySpace,
    thread_id: str,
    writer: str,
    written_at: float,
    held: Sequence[bytes],
    *,
    owner_only: bool = False,
) -> Script:
    """Give the indexes the scores ``held`` that :func:`_listed` (``writer``, ``written_at``)
    answered, where the thread is still at ``written_at`` (no write listed it since);
    ``owner_only``: only ``writer``'s index."""
    owned = space.owner_listing_key(writer)
    keys = (owned, owned) if owner_only else (space.listing_key, owned)
    before = (held[1], held[1]) if owner_only else (held[0], held[1])
    return Script("listing", keys, ["restore", thread_id, repr(float(written_at)), *before])


def _unlisted(space: KeySpace, thread_id: str, owner: str | None, *, owner_only: bool = False) -> Script:
    """Drop the thread from every thread's index and ``owner``'s (``None``: not known, only
    from every thread's; its owner's entry leaves with the horizon, see :func:`_listed`);
    ``owner_only``: from ``owner``'s only (the thread lives on, another user's)."""
    owned = space.owner_listing_key(owner) if owner else space.listing_key
    every = owned if owner_only else space.listing_key
    return Script("listing", (every, owned), ["remove", thread_id])


def _bound(value: float) -> str:
    return repr(max(-_FAR, min(_FAR, value)))


def thread_rows(space: KeySpace, scan: ThreadScan) -> Program[list[ThreadRow]]:
    """The threads after the scan's cursor, newest write first: a page of the owner's (or
    every thread's) index, then the rows' threads (one summary.lua each, all in one round
    trip) for what the listing shows. Entries whose thread is gone are dropped from the
    index (every thread's, and the owner's when the owner's is read) with the next page's
    read (or after the last); an entry of a thread another owner holds now, from the owner's
    index only. The status is not indexed on Redis: rows of every status come back, and the
    listing filters them. At most :data:`SCAN_BOUND` entries are read (``scan.limit`` if
    more): past them, the rows come back short, as :class:`ThreadRows` naming the last."""
    index = space.listing_key if scan.owner is None else space.owner_listing_key(scan.owner)
    bound = max(SCAN_BOUND, scan.limit)
    rows: list[ThreadRow] = []
    stale: list[Script] = []  # entries of threads gone, or handed to another owner
    at, after_id = scan.at, scan.after_id
    read = 0
    while len(rows) < scan.limit:
        if read >= bound:
            if stale:
                yield Pipeline(tuple(stale))
            return ThreadRows(rows, Cursor(at, after_id))
        wanted = scan.limit - len(rows)
        # past entries of threads gone, read more at once: as many as read so far
        size = min(bound - read, max(wanted, read))
        args = ["page", _bound(at), after_id, _bound(scan.written_after), _bound(scan.written_before), size]
        *_, reply = yield Pipeline((*stale, Script("listing", (index, index), args)))
        stale = []
        entries = [(reply[i].decode(), float(reply[i + 1])) for i in range(0, len(reply), 2)]
        summaries = yield Pipeline(
            tuple(Script("summary", space.thread(thread_id), [scan.now]) for thread_id, _ in entries)
        )
        for (thread_id, written_at), found in zip(entries, summaries, strict=True):
            if len(rows) == scan.limit:  # read beyond the rows wanted: the next scan reads it
                break
            read += 1
            at, after_id = written_at, thread_id
            if not found:
                stale.append(_unlisted(space, thread_id, scan.owner))
                continue
            if scan.owner is not None and found[0].decode() != scan.owner:
                stale.append(_unlisted(space, thread_id, scan.owner, owner_only=True))
                continue
            owner, due, waiting_ms, until, interrupted, record, ttl = found
            rows.append(
                ThreadRow(
                    thread_id=thread_id,
                    owner=owner.decode(),
                    written_at=written_at,
                    waiting_minutes=int(waiting_ms) // 60_000 if waiting_ms else None,
                    finished_due=float(due) if due else None,
                    interrupted=interrupted == b"1",
                    parked_until=float(until) if until else None,
                    metadata=orjson.loads(record)["m"] if record else None,
                    expires_at=scan.now + int(ttl) / 1000 if int(ttl) >= 0 else None,
                )
            )
        if len(entries) < size:
            break
    if stale:
        yield Pipeline(tuple(stale))
    return rows
