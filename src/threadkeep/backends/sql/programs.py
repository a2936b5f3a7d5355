"""The storage operations as programs, written once for every SQL dialect.

Each function here is a program (see :mod:`threadkeep.core.program`): it yields the
statements of one transaction, in order, and decides between them. A dialect
(:class:`SqlDialect`) only supplies the statement texts and how list parameters are passed.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Protocol

from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import CheckpointTuple
from langgraph.checkpoint.serde.base import SerializerProtocol

from threadkeep.core.identity import Actor
from threadkeep.core.messages import CHAIN_TYPE, ContentCache, MessageChain, parse_chain_ref
from threadkeep.core.program import Program, Sql, SqlMany
from threadkeep.core.records import (
    EMPTY_TYPE,
    ListQuery,
    PutStep,
    Target,
    WritesStep,
    assemble,
    decode_structure,
    decode_value,
    matches_filter,
    version_key,
)
from threadkeep.core.rules import check_head, check_owner
from threadkeep.errors import CheckpointSerializationError, CheckpointStoreFormatError

__all__ = [
    "FORMAT_GENERATION",
    "SqlDialect",
    "apply_migration",
    "copy_thread",
    "delete_for_runs",
    "delete_thread",
    "ensure_format",
    "get_tuple",
    "list_page",
    "prune",
    "put",
    "put_writes",
    "record_format",
    "reset",
    "stats",
]

# The storage format this version reads and writes. A store recording another generation
# (or holding checkpoints with none recorded) is refused until `threadkeep store reset`.
FORMAT_GENERATION = 1
_FORMAT_KEY = "format_generation"


class SqlDialect(Protocol):
    """What a SQL backend supplies: statement texts and list-parameter adapters."""

    NAME: str
    PROBE_WIDTH: int
    INSERT_THREAD: str
    THREAD_FOR_WRITE: str
    THREAD_FOR_READ: str
    PROBE_LINKS: str
    INSERT_MESSAGE: str
    INSERT_LINK: str
    UPSERT_BLOB: str
    UPSERT_CHECKPOINT: str
    WRITES_TARGET_PRUNED: str
    INSERT_WRITE: str
    UPSERT_WRITE: str
    SELECT_LATEST: str
    SELECT_CHECKPOINT: str
    SELECT_VALUES: str
    SELECT_CHAIN: str
    LIST_THREAD: str
    LIST_ALL: str
    DELETE_THREAD: tuple[str, ...]
    SELECT_RUN_CHECKPOINTS: str
    DELETE_CHECKPOINT: str
    DELETE_CHECKPOINT_WRITES: str
    SELECT_NAMESPACES: str
    SELECT_KEEP_CUTOFF: str
    DELETE_CHECKPOINTS_BEFORE: str
    DELETE_WRITES_BEFORE: str
    SELECT_REFERENCED_VERSIONS: str
    SELECT_BLOB_KEYS: str
    DELETE_BLOB: str
    COPY_THREAD: tuple[str, ...]
    SELECT_TABLES: str
    SELECT_META: str
    INSERT_META: str
    CHECKPOINT_TABLES: dict[str, str]
    CREATE_MIGRATIONS: str
    SELECT_MIGRATIONS: str
    RECORD_MIGRATION: str
    RESET: tuple[str, ...]
    STATS: str

    def pairs(self, items: list[tuple[str, str]]) -> object: ...

    def text_list(self, items: list[str]) -> object: ...


# --- writes ------------------------------------------------------------------------------


def _thread_for_write(
    q: SqlDialect,
    thread_id: str,
    actor: Actor,
    now: float,
    *,
    checkpoint_ns: str = "",
    checkpoint_id: str | None = None,
) -> Program[tuple[int, str | None, bool]]:
    """Create the thread if new, lock it, check its owner (W3); return its key and the head
    of ``checkpoint_ns`` (W2), and whether ``checkpoint_id`` is stored already."""
    yield Sql(q.INSERT_THREAD, {"thread_id": thread_id, "owner": actor.user_id, "now": now})
    ((tid, owner, head_id, stored),) = yield Sql(
        q.THREAD_FOR_WRITE,
        {"thread_id": thread_id, "checkpoint_ns": checkpoint_ns, "checkpoint_id": checkpoint_id},
    )
    check_owner(thread_id=thread_id, owner=owner, user_id=actor.user_id, enforce=actor.checks_owner)
    return int(tid), head_id, bool(stored)


def put(q: SqlDialect, step: PutStep) -> Program[RunnableConfig]:
    """Store one checkpoint, its changed channels and its new messages (SPEC W1, W2, S1-S3)."""
    target = step.target
    ns = target.checkpoint_ns
    tid, head_id, stored = yield from _thread_for_write(
        q, target.thread_id, target.actor, step.now, checkpoint_ns=ns, checkpoint_id=step.checkpoint_id
    )
    check_head(
        thread_id=target.thread_id,
        checkpoint_ns=ns,
        parent_id=step.parent_id,
        checkpoint_id=step.checkpoint_id,
        head_id=head_id,
        already_stored=stored,
        source=step.source,
        branch_from=step.branch_from,
    )
    for chain in step.chains:
        yield from _store_chain(q, tid, chain)
    if step.blobs:
        yield SqlMany(
            q.UPSERT_BLOB,
            [
                {
                    "tid": tid,
                    "checkpoint_ns": ns,
                    "channel": blob.channel,
                    "version": blob.version,
                    "type": blob.type,
                    "value": blob.value,
                }
                for blob in step.blobs
            ],
        )
    yield Sql(
        q.UPSERT_CHECKPOINT,
        {
            "tid": tid,
            "checkpoint_ns": ns,
            "checkpoint_id": step.checkpoint_id,
            "parent_id": step.parent_id,
            "run_id": step.run_id,
            "now": step.now,
            "checkpoint": step.checkpoint.decode(),
            "metadata": step.metadata.decode(),
        },
    )
    if step.history_limit is not None:
        yield from _keep_newest(q, tid, ns, step.history_limit)
    return step.result_config()


def _store_chain(q: SqlDialect, tid: int, chain: MessageChain) -> Program[None]:
    known = yield from _stored_prefix(q, tid, chain.nodes)
    fresh = range(known, len(chain.nodes))
    if not fresh:
        return
    yield SqlMany(
        q.INSERT_MESSAGE,
        [
            {"tid": tid, "digest": chain.digests[i], "type": kind, "value": payload}
            for i in fresh
            for kind, payload in (chain.payload(i),)
        ],
    )
    yield SqlMany(
        q.INSERT_LINK,
        [
            {"tid": tid, "node": chain.nodes[i], "prev": chain.prev(i), "digest": chain.digests[i]}
            for i in fresh
        ],
    )


def _stored_prefix(q: SqlDialect, tid: int, nodes: Sequence[bytes]) -> Program[int]:
    """How many leading links of a chain are already stored.

    Stored links are prefix-closed, so the newest stored link found, probing back from the
    tail a window at a time, settles it; a step that appends a few messages needs one probe.
    """
    width = q.PROBE_WIDTH
    end = len(nodes)
    while end > 0:
        window = nodes[max(0, end - width) : end]
        params: dict[str, object] = {"tid": tid}
        for i in range(width):
            params[f"n{i}"] = window[min(i, len(window) - 1)]
        rows = yield Sql(q.PROBE_LINKS, params)
        found = {bytes(row[0]) for row in rows}
        for offset in range(len(window) - 1, -1, -1):
            if window[offset] in found:
                return end - len(window) + offset + 1
        end -= len(window)
    return 0


def put_writes(q: SqlDialect, step: WritesStep) -> Program[None]:
    """Store a task's writes: regular ones once, special ones (errors, interrupts) overwritten.

    LangGraph may deliver a task's writes after later checkpoints were stored; under a
    history limit, writes whose checkpoint was already pruned are dropped with it.
    """
    target = step.target
    tid, _, _ = yield from _thread_for_write(q, target.thread_id, target.actor, step.now)
    base = {"tid": tid, "checkpoint_ns": target.checkpoint_ns, "checkpoint_id": target.checkpoint_id}
    if step.history_limit is not None:
        ((pruned,),) = yield Sql(q.WRITES_TARGET_PRUNED, {**base, "offset": step.history_limit - 1})
        if pruned:
            return
    rows = [
        {
            **base,
            "task_id": row.task_id,
            "idx": row.idx,
            "task_path": row.task_path,
            "channel": row.channel,
            "type": row.type,
            "value": row.value,
            "special": row.special,
        }
        for row in step.rows
    ]
    regular = [{k: v for k, v in r.items() if k != "special"} for r in rows if not r["special"]]
    special = [{k: v for k, v in r.items() if k != "special"} for r in rows if r["special"]]
    if regular:
        yield SqlMany(q.INSERT_WRITE, regular)
    if special:
        yield SqlMany(q.UPSERT_WRITE, special)


# --- reads -------------------------------------------------------------------------------


def _thread_tid(q: SqlDialect, thread_id: str, owner: str | None) -> Program[int | None]:
    rows = yield Sql(q.THREAD_FOR_READ, {"thread_id": thread_id, "owner": owner})
    return int(rows[0][0]) if rows else None


def get_tuple(
    q: SqlDialect, target: Target, serde: SerializerProtocol, content: ContentCache
) -> Program[CheckpointTuple | None]:
    """The addressed checkpoint, or the newest of its namespace, with its pending writes."""
    params = {
        "thread_id": target.thread_id,
        "owner": target.actor.owner_filter,
        "checkpoint_ns": target.checkpoint_ns,
        "checkpoint_id": target.checkpoint_id,
    }
    rows = yield Sql(q.SELECT_LATEST if target.checkpoint_id is None else q.SELECT_CHECKPOINT, params)
    if not rows:
        return None
    tid, checkpoint_id, parent_id, structure, metadata = rows[0]
    return (
        yield from _load(
            q,
            serde,
            content,
            thread_id=target.thread_id,
            tid=int(tid),
            checkpoint_ns=target.checkpoint_ns,
            checkpoint_id=checkpoint_id,
            parent_id=parent_id,
            structure=decode_structure(structure, "checkpoint"),
            metadata=decode_structure(metadata, "metadata"),
            branch=target.checkpoint_id is not None,
        )
    )


def _load(
    q: SqlDialect,
    serde: SerializerProtocol,
    content: ContentCache,
    *,
    thread_id: str,
    tid: int,
    checkpoint_ns: str,
    checkpoint_id: str,
    parent_id: str | None,
    structure: dict[str, Any],
    metadata: dict[str, Any],
    branch: bool,
) -> Program[CheckpointTuple]:
    versions: Mapping[str, object] = structure.get("channel_versions") or {}
    pairs = [(channel, version_key(version)) for channel, version in versions.items()]
    rows = yield Sql(
        q.SELECT_VALUES,
        {
            "tid": tid,
            "checkpoint_ns": checkpoint_ns,
            "checkpoint_id": checkpoint_id,
            "pairs": q.pairs(pairs),
        },
    )
    values: dict[str, Any] = {}
    writes = []
    for is_write, channel, kind, payload, task_id, task_path, idx in rows:
        if is_write:
            writes.append((task_path, task_id, idx, channel, kind, payload))
            continue
        path = f"channel_values.{channel}"
        if kind == EMPTY_TYPE:
            continue
        if kind == CHAIN_TYPE:
            values[channel] = yield from _load_chain(
                q, serde, content, tid=tid, ref=bytes(payload), path=path
            )
        else:
            values[channel] = decode_value(serde, kind, payload, path)
    writes.sort(key=lambda write: write[:3])
    return assemble(
        thread_id=thread_id,
        checkpoint_ns=checkpoint_ns,
        checkpoint_id=checkpoint_id,
        parent_id=parent_id,
        structure=structure,
        metadata=metadata,
        channel_values=values,
        pending_writes=[
            (task_id, channel, decode_value(serde, kind, payload, f"pending_writes.{channel}"))
            for _, task_id, _, channel, kind, payload in writes
        ],
        branch=branch,
    )


def _load_chain(
    q: SqlDialect, serde: SerializerProtocol, content: ContentCache, *, tid: int, ref: bytes, path: str
) -> Program[list[Any]]:
    tail, count = parse_chain_ref(ref)
    messages = content.messages(tail)
    if messages is None or len(messages) != count:
        rows = yield Sql(q.SELECT_CHAIN, {"tid": tid, "tail": tail, "count": count})
        if len(rows) != count:
            raise CheckpointSerializationError(
                f"message history is incomplete: {len(rows)} of {count} messages are stored", path=path
            )
        rows.sort(key=lambda row: -row[0])
        content.keep(tail, [(bytes(digest), kind, bytes(payload)) for _, digest, kind, payload in rows])
        messages = [(kind, payload) for _, _, kind, payload in rows]
    return [decode_value(serde, kind, payload, f"{path}[{i}]") for i, (kind, payload) in enumerate(messages)]


def list_page(
    q: SqlDialect, query: ListQuery, serde: SerializerProtocol, content: ContentCache
) -> Program[tuple[list[CheckpointTuple], ListQuery | None]]:
    """One page of ``list``, newest first, and the query for the next page."""
    cursor_id, cursor_tid, cursor_ns = query.cursor or (None, None, None)
    params = {
        "thread_id": query.thread_id,
        "owner": query.owner,
        "checkpoint_ns": query.checkpoint_ns,
        "checkpoint_id": query.checkpoint_id,
        "before": query.before,
        "cursor_id": cursor_id,
        "cursor_tid": cursor_tid,
        "cursor_ns": cursor_ns,
        "page_size": query.page_size,
    }
    rows = yield Sql(q.LIST_THREAD if query.thread_id is not None else q.LIST_ALL, params)
    found: list[CheckpointTuple] = []
    for thread_id, tid, ns, checkpoint_id, parent_id, structure, metadata in rows:
        decoded_metadata = decode_structure(metadata, "metadata")
        if not matches_filter(decoded_metadata, query.filter):
            continue
        found.append(
            (
                yield from _load(
                    q,
                    serde,
                    content,
                    thread_id=thread_id,
                    tid=int(tid),
                    checkpoint_ns=ns,
                    checkpoint_id=checkpoint_id,
                    parent_id=parent_id,
                    structure=decode_structure(structure, "checkpoint"),
                    metadata=decoded_metadata,
                    branch=False,
                )
            )
        )
        if query.remaining is not None and len(found) >= query.remaining:
            break
    if not rows:
        return found, None
    last = rows[-1]
    return found, query.advanced((last[3], int(last[1]), last[2]), len(found), len(rows) < query.page_size)


# --- deletes, pruning, copies ----------------------------------------------------------------


def delete_thread(q: SqlDialect, thread_id: str, owner: str | None) -> Program[bool]:
    """Delete everything a thread holds; ``False`` when there was no such thread to see."""
    tid = yield from _thread_tid(q, thread_id, owner)
    if tid is None:
        return False
    for statement in q.DELETE_THREAD:
        yield Sql(statement, {"tid": tid})
    return True


def delete_for_runs(q: SqlDialect, run_ids: Sequence[str], owner: str | None) -> Program[int]:
    """Delete the checkpoints (and their writes) the given runs stored; returns how many."""
    rows = yield Sql(q.SELECT_RUN_CHECKPOINTS, {"run_ids": q.text_list(list(run_ids)), "owner": owner})
    touched: set[tuple[int, str]] = set()
    for tid, ns, checkpoint_id in rows:
        params = {"tid": tid, "checkpoint_ns": ns, "checkpoint_id": checkpoint_id}
        yield Sql(q.DELETE_CHECKPOINT, params)
        yield Sql(q.DELETE_CHECKPOINT_WRITES, params)
        touched.add((int(tid), ns))
    for tid, ns in sorted(touched):
        yield from _collect_blobs(q, tid, ns)
    return len(rows)


def prune(q: SqlDialect, thread_ids: Iterable[str], strategy: str, owner: str | None) -> Program[None]:
    """LangGraph's ``prune``: ``keep_latest`` per namespace, or ``delete`` every checkpoint."""
    if strategy not in ("keep_latest", "delete"):
        raise ValueError(f"prune strategy {strategy!r} is not 'keep_latest' or 'delete'")
    for thread_id in thread_ids:
        if strategy == "delete":
            yield from delete_thread(q, thread_id, owner)
            continue
        tid = yield from _thread_tid(q, thread_id, owner)
        if tid is None:
            continue
        namespaces = yield Sql(q.SELECT_NAMESPACES, {"tid": tid})
        for (ns,) in namespaces:
            yield from _keep_newest(q, tid, ns, 1)


def _keep_newest(q: SqlDialect, tid: int, ns: str, keep: int) -> Program[None]:
    """Keep the newest ``keep`` checkpoints of a namespace; older ones go with their writes."""
    rows = yield Sql(q.SELECT_KEEP_CUTOFF, {"tid": tid, "checkpoint_ns": ns, "offset": keep - 1})
    if not rows:
        return
    params = {"tid": tid, "checkpoint_ns": ns, "cutoff": rows[0][0]}
    deleted = yield Sql(q.DELETE_CHECKPOINTS_BEFORE, params)
    yield Sql(q.DELETE_WRITES_BEFORE, params)
    if deleted:
        yield from _collect_blobs(q, tid, ns)


def _collect_blobs(q: SqlDialect, tid: int, ns: str) -> Program[None]:
    """Delete channel values no checkpoint of the namespace refers to any more.

    Messages are not collected here: they stay with their thread (SPEC S3).
    """
    params = {"tid": tid, "checkpoint_ns": ns}
    referenced = {
        (channel, version_key(version))
        for channel, version in (yield Sql(q.SELECT_REFERENCED_VERSIONS, params))
    }
    keys = yield Sql(q.SELECT_BLOB_KEYS, params)
    dead = [
        {**params, "channel": channel, "version": version}
        for channel, version in keys
        if (channel, version) not in referenced
    ]
    if dead:
        yield SqlMany(q.DELETE_BLOB, dead)


def copy_thread(q: SqlDialect, source: str, target: str, actor: Actor, now: float) -> Program[bool]:
    """Copy every checkpoint, write and message of ``source`` onto ``target``."""
    source_tid = yield from _thread_tid(q, source, actor.owner_filter)
    if source_tid is None:
        return False
    target_tid, _, _ = yield from _thread_for_write(q, target, actor, now)
    for statement in q.COPY_THREAD:
        yield Sql(statement, {"source": source_tid, "target": target_tid})
    return True


# --- format gate, migrations, maintenance ---------------------------------------------------


def ensure_format(q: SqlDialect) -> Program[None]:
    """Refuse a store that holds checkpoints of another format, or with none recorded (P6)."""
    tables = {row[0] for row in (yield Sql(q.SELECT_TABLES, {}))}
    recorded: str | None = None
    if "tk_meta" in tables:
        rows = yield Sql(q.SELECT_META, {"key": _FORMAT_KEY})
        recorded = rows[0][0] if rows else None
    if recorded is None:
        for table, probe in q.CHECKPOINT_TABLES.items():
            if table in tables and (yield Sql(probe, {}))[0][0]:
                raise _format_error(q, None, table)
    elif recorded != str(FORMAT_GENERATION):
        raise _format_error(q, recorded, "tk_meta")


def record_format(q: SqlDialect) -> Program[None]:
    """Record this format generation; concurrent first uses converge on one record."""
    yield Sql(q.INSERT_META, {"key": _FORMAT_KEY, "value": str(FORMAT_GENERATION)})
    rows = yield Sql(q.SELECT_META, {"key": _FORMAT_KEY})
    if rows[0][0] != str(FORMAT_GENERATION):
        raise _format_error(q, rows[0][0], "tk_meta")


def _format_error(q: SqlDialect, found: str | None, table: str) -> CheckpointStoreFormatError:
    return CheckpointStoreFormatError(
        f"the {q.NAME} checkpoint store holds data written in another format (generation "
        f"{found or 'none'}, this version writes {FORMAT_GENERATION}; found in table {table!r}); "
        "reset the checkpoint store before starting this version: threadkeep store reset",
        context={"provider": q.NAME, "found": found, "expected": FORMAT_GENERATION, "table": table},
    )


def apply_migration(q: SqlDialect, version: int, statements: Sequence[str], now: float) -> Program[bool]:
    """Apply one numbered migration unless it is recorded; ``True`` if it ran."""
    yield Sql(q.CREATE_MIGRATIONS, {})
    applied = {int(row[0]) for row in (yield Sql(q.SELECT_MIGRATIONS, {}))}
    if version in applied:
        return False
    for statement in statements:
        yield Sql(statement, {})
    yield Sql(q.RECORD_MIGRATION, {"version": version, "now": now})
    return True


def reset(q: SqlDialect) -> Program[None]:
    """Drop every table threadkeep owns, and the checkpoint tables of other formats."""
    for statement in q.RESET:
        yield Sql(statement, {})


STAT_NAMES = ("threads", "checkpoints", "channel_values", "writes", "messages", "payload_bytes")


def stats(q: SqlDialect, thread_id: str | None = None) -> Program[dict[str, int]]:
    """What the store (or one thread) holds: counts of rows, and their payload bytes."""
    tid = None
    if thread_id is not None:
        tid = yield from _thread_tid(q, thread_id, None)
        if tid is None:
            return dict.fromkeys(STAT_NAMES, 0)
    (row,) = yield Sql(q.STATS, {"tid": tid})
    return dict(zip(STAT_NAMES, map(int, row), strict=True))
