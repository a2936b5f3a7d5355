"""The storage operations as programs, written once for every SQL dialect.

Each function here is a program (see :mod:`threadkeep.core.program`): it yields the
statements of one transaction, in order, and decides between them (:func:`upgrade`, of
several, each ended by ``END_TRANSACTION``). A dialect
(:class:`SqlDialect`) only supplies the statement texts and how list parameters are passed.
"""

from __future__ import annotations

import base64
import re
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from typing import Any, Final, Protocol

import orjson
from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import CheckpointTuple
from langgraph.checkpoint.serde.base import SerializerProtocol

from threadkeep.backends.sql.ledger import LedgerDialect
from threadkeep.core.identity import Actor
from threadkeep.core.listing import CLOCK_STEP, ThreadRow, ThreadScan
from threadkeep.core.messages import CHAIN_TYPE, ContentCache, EncodingMemo, MessageChain, chain_tail
from threadkeep.core.program import END_TRANSACTION, Batch, Program, Sql, SqlMany
from threadkeep.core.records import (
    EMPTY_TYPE,
    BlobRow,
    ListQuery,
    PutStep,
    StoredCheckpoint,
    Target,
    WritesStep,
    decode_structure,
    matches_filter,
)
from threadkeep.core.retention import ExpiredThread, Park, SweepPage, ThreadRetention
from threadkeep.core.rules import check_handover, check_head, check_owner, required_head, required_owner
from threadkeep.errors import CheckpointSerializationError, CheckpointStoreFormatError

_INFINITY: Final = float("inf")

__all__ = [
    "FORMAT_GENERATION",
    "INLINE_VALUE_BYTES",
    "READABLE_GENERATIONS",
    "SqlDialect",
    "apply_migration",
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
    "record_format",
    "record_park",
    "reset",
    "start_thread",
    "stats",
    "thread_retention",
    "thread_row",
    "thread_rows",
    "threads_named",
    "upgrade",
]

# The storage format this version writes. A store recording a generation it cannot read
# (or holding checkpoints with none recorded) is refused until `threadkeep store reset`.
# Generation 2 added pending writes of messages by reference (`ref`, `refs`) and `+zstd`
# values; a generation-1 store is read as it is and recorded as 2 on first open, so a
# version that reads only generation 1 refuses it from then on instead of failing on a value.
# Generation 3 keeps small channel values in their checkpoint's row (``vals``, below).
FORMAT_GENERATION = 3
READABLE_GENERATIONS = frozenset({"1", "2", "3"})
_FORMAT_KEY = "format_generation"

# A channel value this small is kept in the row of every checkpoint that holds it (``vals``)
# rather than once in ``tk_blobs``: a row of its own and an index entry cost more than
# copying it, and a read takes it with the checkpoint. Larger values are stored once.
INLINE_VALUE_BYTES: Final = 512
# The channel of LangGraph's interrupt writes (as INTERRUPTED reads it in each dialect).
_INTERRUPT: Final = "__interrupt__"
_TEXT_ENTRY: Final = re.compile(r"([^:=]*)=(.*)", re.DOTALL)


# A dialect's put as one statement (see _claimed): the parameters, the rows by kind, the
# history limit; the statements to run.
ClaimedPut = Callable[[dict[str, object], dict[str, list[dict[str, object]]], int | None], tuple[Sql, ...]]


class SqlDialect(LedgerDialect, Protocol):
    """What a SQL backend supplies: statement texts and list-parameter adapters.

    Every statement takes named parameters; the programs below (and the ledger's, in
    :mod:`threadkeep.backends.sql.ledger`) say which.
    """

    NAME: str
    PROBE_WIDTH: int
    LOCK_SCHEMA: str
    INSERT_THREAD: str
    LOCK_THREAD: str
    THREAD_HEAD: str
    PARENT_VALUES: str
    THREAD_FOR_READ: str
    PROBE_LINKS: str
    SELECT_MESSAGES: str
    UPSERT_CHECKPOINT: str
    KEEP_NEWEST: tuple[str, ...]
    COLLECT_BLOBS: str
    THREAD_OWNER: str
    RUN_THREADS: str
    SELECT_STATE_LATEST: str
    SELECT_STATE_AT: str
    SELECT_CHAIN: str
    LIST_THREAD: str
    LIST_ALL: str
    SELECT_RUN_CHECKPOINTS: str
    DELETE_CHECKPOINT: str
    DELETE_CHECKPOINT_WRITES: str
    SELECT_NAMESPACES: str
    COPY_THREAD: tuple[str, ...]
    SELECT_TABLES: str
    SELECT_META: str
    GATE_TABLES: str
    SELECT_GATE: str
    INSERT_META: str
    UPGRADE_META: str
    CHECKPOINT_TABLES: dict[str, str]
    CREATE_MIGRATIONS: str
    SELECT_MIGRATIONS: str
    RECORD_MIGRATION: str
    RESET: tuple[str, ...]
    STATS: str
    START_THREAD: str
    MARK_FINISHED: str
    THREAD_RETENTION: str
    FINISHED_PAGE: str
    WAITING_PAGE: str
    FINISHED_COUNT: str
    WAITING_COUNT: str
    LOCK_THREADS: str
    DELETE_NAMED: str
    DELETE_FINISHED: str
    DELETE_WAITING: str
    DELETE_THREAD_ROWS: tuple[str, ...]
    THREADS_NAMED: str
    LOCK_OWNED: str
    ASSIGN_OWNER: str
    RECORD_PARK: str
    CLEAR_PARK: str
    LIVE_PARKS: str
    INTERRUPTED: str
    TOUCH_THREAD: str
    MARK_INTERRUPT: str
    REFRESH_THREADS: str
    THREADS_PAGE: str
    THREADS_PAGE_OF_OWNER: str
    THREADS_PARKED: str
    THREAD_ROW: str

    # What only some dialects have (read-only, so a dialect may set them to None).
    @property
    def SET_HEAD(self) -> str | None: ...

    @property
    def CLEAR_HEADS(self) -> str | None: ...

    @property
    def claimed_put(self) -> ClaimedPut | None: ...

    def text_list(self, items: list[str]) -> object: ...

    def many(self, kind: str, common: dict[str, object], rows: list[dict[str, object]]) -> Sql | SqlMany:
        """Insert ``rows`` of ``kind`` (``message``, ``link``, ``blob``, ``write``,
        ``special_write`` or ``write_message``), each with the ``common`` parameters: one
        statement per row, or one statement for them all where the dialect can (Postgres
        arrays)."""
        ...

    def metadata_filter(self, wanted: Mapping[str, object]) -> object: ...


# --- writes ------------------------------------------------------------------------------


def put(q: SqlDialect, step: PutStep) -> Program[RunnableConfig]:
    """Store one checkpoint, its changed channels and its new messages (SPEC W1, W2, S1-S3).

    Where the dialect can (Postgres), a put that continues its thread's head is first tried
    as one statement that writes only if the head is still its parent and every rule holds
    (:func:`_claimed`). Otherwise, or if that statement wrote nothing, two batches: the
    thread (locked), its owner and head, and a probe of each message list; then every row of
    the step. Nothing is written before both rules (W2, W3) have passed. A thread's first
    put creates it first.
    """
    target = step.target
    ns = target.checkpoint_ns
    changed = step.changed
    unchanged = {channel: version for channel, version in step.versions if channel not in changed}
    claimed = _claimed(q, step, unchanged)
    if claimed:
        written = (yield Batch(claimed, ends=True))[0]
        if written:  # the thread's tid: the put is stored
            return step.result_config()
    # The head is read by a statement of its own after the lock: one that waited for the lock
    # must see what the writer before it committed.
    lookup = (
        Sql(q.LOCK_THREAD, {"thread_id": target.thread_id}),
        Sql(
            q.THREAD_HEAD,
            {"thread_id": target.thread_id, "checkpoint_ns": ns, "checkpoint_id": step.checkpoint_id},
        ),
        Sql(
            q.PARENT_VALUES,
            {
                "thread_id": target.thread_id,
                "checkpoint_ns": ns,
                "parent_id": step.parent_id,
                "unchanged": json_text(unchanged),
            },
        ),
    )
    probes = tuple(_probe(q, target.thread_id, chain.nodes, len(chain.nodes)) for chain in step.chains)
    results = yield Batch((*lookup, *probes))
    if not results[0]:
        thread = {"thread_id": target.thread_id, "owner": target.actor.user_id, "now": step.now}
        results = (yield Batch((Sql(q.INSERT_THREAD, thread), *lookup, *probes)))[1:]
    ((tid, owner),), ((head_id, stored),) = results[0], results[1]
    check_owner(
        thread_id=target.thread_id,
        owner=owner,
        user_id=target.actor.user_id,
        enforce=target.actor.checks_owner,
    )
    check_head(
        thread_id=target.thread_id,
        checkpoint_ns=ns,
        parent_id=step.parent_id,
        checkpoint_id=step.checkpoint_id,
        head_id=head_id,
        already_stored=bool(stored),
        source=step.source,
        named=step.named,
        served_head=step.served_head,
    )
    rows: list[Sql | SqlMany] = []
    for chain, probed in zip(step.chains, results[3:], strict=True):
        known = yield from _stored_prefix(q, target.thread_id, chain.nodes, probed)
        rows.extend(_chain_rows(q, int(tid), chain, known))
    vals, blobs, carried = _layout(step, unchanged, results[2])
    for chain in carried:  # a list no stored checkpoint held: its rows, whatever is stored
        rows.extend(_chain_rows(q, int(tid), chain, 0))
    # The thread's row: its root head where the dialect keeps one, its listed write time (moved
    # once it is CLOCK_STEP behind), its interrupt (the listing's index, migration postgres 12
    # / sqlite 6); no round trip of its own.
    clock = {
        "tid": tid,
        "now": step.now,
        "clock_step": CLOCK_STEP,
        "checkpoint_ns": ns,
        "checkpoint_id": step.checkpoint_id,
    }
    if q.SET_HEAD is not None and ns == "":
        rows.append(Sql(q.SET_HEAD, {**clock, "head_id": head_id}))
    else:
        rows.append(Sql(q.TOUCH_THREAD, clock))
    if blobs:
        rows.append(q.many("blob", {"tid": tid, "checkpoint_ns": ns}, _blob_rows(blobs)))
    rows.append(
        Sql(
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
                "vals": json_text(vals) if vals else None,
            },
        )
    )
    yield Batch(tuple(rows), wanted=False, independent=True)
    if step.history_limit is not None:
        yield Batch(tuple(_keep_newest(q, int(tid), ns, step.history_limit)), wanted=False)
    return step.result_config()


def _layout(
    step: PutStep, unchanged: Mapping[str, str], parent: list[Any]
) -> tuple[dict[str, str], list[BlobRow], list[MessageChain]]:
    """Where a checkpoint's values go: the small ones, changed or not, into its own row
    (``vals``: entries by channel), the large changed ones into ``tk_blobs``.

    An unchanged channel the parent holds at the same version takes the parent's entry, or
    nothing if the parent's value is in ``tk_blobs``; otherwise (no parent, or one at another
    version) its value is encoded again, so every value the checkpoint names is stored (a
    message list with its chain, returned third, whose messages and links are written).
    A channel emptied in this step gets nothing: a version with no value in a transactional
    store can only be an empty channel.
    """
    vals, blobs = _changed_values(step)
    chains: list[MessageChain] = []

    def place(blob: BlobRow) -> None:
        entry = inline_entry(blob)
        if entry is None:
            blobs.append(blob)
        else:
            vals[blob.channel] = entry

    held = {channel: (same, entry) for channel, same, entry in parent}
    for channel in unchanged:
        same, entry = held.get(channel, (False, None))
        if same:
            if entry is not None:
                vals[channel] = entry
            continue
        current = None if step.encode is None else step.encode(channel)
        if current is not None:
            blob, chain = current
            place(blob)
            if chain is not None:
                chains.append(chain)
    return vals, blobs, chains


def _changed_values(step: PutStep) -> tuple[dict[str, str], list[BlobRow]]:
    """Where the values this step changed go: the small ones into its row's ``vals``, the
    large ones into ``tk_blobs``; a channel emptied in this step gets nothing."""
    vals: dict[str, str] = {}
    blobs: list[BlobRow] = []
    for blob in step.blobs:
        if blob.type == EMPTY_TYPE:
            continue
        entry = inline_entry(blob)
        if entry is None:
            blobs.append(blob)
        else:
            vals[blob.channel] = entry
    return vals, blobs


def _claimed(q: SqlDialect, step: PutStep, unchanged: Mapping[str, str]) -> tuple[Sql, ...]:
    """The put as one statement (the dialect's ``claimed_put``, with the history limit's
    deletes after it), or nothing where it cannot be one: the dialect has none, the put is
    in a subgraph's namespace, it does not continue the head (a first put, a branch), or a
    message list has more messages this process does not know to be stored than one probe's
    width (the locked put probes for them instead).

    The statement writes the messages after each list's known prefix (ON CONFLICT DO
    NOTHING) and requires that prefix's last link to be stored; it takes the unchanged
    channels' entries from the parent and requires the parent to hold each at its version.
    """
    target = step.target
    if q.claimed_put is None or target.checkpoint_ns != "":
        return ()
    required = required_head(
        checkpoint_ns=target.checkpoint_ns,
        parent_id=step.parent_id,
        source=step.source,
        named=step.named,
        served_head=step.served_head,
    )
    if required is None:
        return ()
    if any(len(chain.nodes) - chain.reused > q.PROBE_WIDTH for chain in step.chains):
        return ()
    vals, blobs = _changed_values(step)
    rows: dict[str, list[dict[str, object]]] = {"message": [], "link": [], "blob": _blob_rows(blobs)}
    for chain in step.chains:
        messages, links = _message_rows(chain, chain.reused)
        rows["message"] += messages
        rows["link"] += links
    common: dict[str, object] = {
        "thread_id": target.thread_id,
        "checkpoint_ns": "",
        "required_owner": required_owner(target.actor),
        "parent_id": step.parent_id,
        "checkpoint_id": step.checkpoint_id,
        "run_id": step.run_id,
        "now": step.now,
        "clock_step": CLOCK_STEP,
        "checkpoint": step.checkpoint.decode(),
        "metadata": step.metadata.decode(),
        "vals": json_text(vals) if vals else None,
        "unchanged": json_text(unchanged),
        "known": list(dict.fromkeys(chain.nodes[chain.reused - 1] for chain in step.chains if chain.reused)),
    }
    return q.claimed_put(common, rows, step.history_limit)


def inline_entry(blob: BlobRow) -> str | None:
    """A value's entry in its checkpoint's ``vals``: ``type=text`` for a value that is text
    (JSON), ``type:base64`` for bytes; None if it is too large (over ``INLINE_VALUE_BYTES``)
    to be copied into every checkpoint that holds it."""
    if len(blob.value) > INLINE_VALUE_BYTES or ":" in blob.type or "=" in blob.type:
        return None
    # A chain is always base64: Postgres walks it in SQL. JSON text in Postgres holds no NUL.
    if blob.type != CHAIN_TYPE and b"\0" not in blob.value:
        try:
            return f"{blob.type}={blob.value.decode()}"
        except UnicodeDecodeError:
            pass
    return f"{blob.type}:{base64.b64encode(blob.value).decode()}"


def inline_values(vals: str | bytes | None) -> list[tuple[str, str, bytes]]:
    """The (channel, type, value) of each entry of a checkpoint's ``vals``.

    Raises:
        CheckpointSerializationError: ``vals`` is not what :func:`inline_entry` writes.
    """
    if vals is None:
        return []
    try:
        found = []
        for channel, entry in orjson.loads(vals).items():
            text = _TEXT_ENTRY.match(entry)
            if text is not None:
                found.append((channel, text[1], text[2].encode()))
            else:
                kind, _, value = entry.partition(":")
                found.append((channel, kind, base64.b64decode(value, validate=True)))
    except (ValueError, AttributeError, TypeError) as error:
        raise CheckpointSerializationError(f"a checkpoint's stored values are unreadable ({error})") from None
    return found


def json_text(value: object) -> str:
    """``value`` as a JSON parameter."""
    return orjson.dumps(value).decode()


def _probe(q: SqlDialect, thread_id: str, nodes: Sequence[bytes], end: int) -> Sql:
    """Ask which of the ``PROBE_WIDTH`` links before position ``end`` are stored."""
    window = nodes[max(0, end - q.PROBE_WIDTH) : end]
    params: dict[str, object] = {"thread_id": thread_id}
    for i in range(q.PROBE_WIDTH):
        params[f"n{i}"] = window[min(i, len(window) - 1)]
    return Sql(q.PROBE_LINKS, params)


def _stored_prefix(q: SqlDialect, thread_id: str, nodes: Sequence[bytes], probed: list[Any]) -> Program[int]:
    """How many leading links of a chain are stored, given the probe of its last window.

    Stored links are prefix-closed, so the newest stored link in a window settles it; a
    step that appends a few messages needs only the probe its first batch already made.
    """
    end = len(nodes)
    while end > 0:
        window = nodes[max(0, end - q.PROBE_WIDTH) : end]
        found = {bytes(row[0]) for row in probed}
        for offset in range(len(window) - 1, -1, -1):
            if window[offset] in found:
                return end - len(window) + offset + 1
        end -= len(window)
        if end > 0:
            probed = yield _probe(q, thread_id, nodes, end)
    return 0


def _chain_rows(q: SqlDialect, tid: int, chain: MessageChain, known: int) -> list[Sql | SqlMany]:
    messages, links = _message_rows(chain, known)
    if not messages:
        return []
    return [q.many("message", {"tid": tid}, messages), q.many("link", {"tid": tid}, links)]


def _message_rows(chain: MessageChain, start: int) -> tuple[list[dict[str, object]], list[dict[str, object]]]:
    """The ``tk_messages`` and ``tk_message_links`` rows of a chain from position ``start``:
    a link closing a page (:meth:`MessageChain.page`) carries it, which a reader walks in
    one step."""
    messages: list[dict[str, object]] = []
    links: list[dict[str, object]] = []
    digests, nodes = chain.digests, chain.nodes
    for i in range(start, len(nodes)):
        kind, payload = chain.payload(i)
        messages.append({"digest": digests[i], "type": kind, "value": payload})
        page = chain.page(i)
        links.append(
            {
                "node": nodes[i],
                "prev": chain.prev(i),
                "digest": digests[i],
                "page": None if page is None else page[0],
                "page_prev": None if page is None else page[1],
            }
        )
    return messages, links


def _blob_rows(blobs: Sequence[BlobRow]) -> list[dict[str, object]]:
    """The ``tk_blobs`` rows of large values."""
    return [
        {"channel": blob.channel, "version": blob.version, "type": blob.type, "value": blob.value}
        for blob in blobs
    ]


def _keep_newest(q: SqlDialect, tid: int, ns: str, keep: int) -> list[Sql | SqlMany]:
    """Delete all but the newest ``keep`` checkpoints of a namespace, their writes, and the
    channel values no remaining checkpoint refers to. Messages stay with their thread."""
    params = {"tid": tid, "checkpoint_ns": ns, "offset": keep - 1}
    return [Sql(statement, params) for statement in q.KEEP_NEWEST]


def put_writes(q: SqlDialect, step: WritesStep) -> Program[None]:
    """Store a task's writes: regular ones once, special ones (errors, interrupts) overwritten.

    One batch, which needs no transaction: every statement is idempotent, and the inserts
    are guarded in SQL by the owner rule (W3) and, under a history limit, by whether the
    checkpoint was pruned already (LangGraph may deliver a task's writes late). A refused
    writer learns it from the owner read back, and nothing of theirs was stored. Writes that
    arrive before their thread's first put create the thread, in a second batch.
    """
    target = step.target
    common: dict[str, object] = {
        "thread_id": target.thread_id,
        "checkpoint_ns": target.checkpoint_ns,
        "checkpoint_id": target.checkpoint_id,
        "required_owner": required_owner(target.actor),
        "offset": None if step.history_limit is None else step.history_limit - 1,
    }
    requests: list[Sql | SqlMany] = [Sql(q.THREAD_OWNER, {"thread_id": target.thread_id})]
    # Messages go first: a write never refers to a message that is not stored yet.
    messages = {digest: (kind, payload) for write in step.rows for digest, kind, payload in write.messages}
    if messages:
        stored: list[dict[str, object]] = [
            {"digest": digest, "type": kind, "value": payload} for digest, (kind, payload) in messages.items()
        ]
        requests.append(q.many("write_message", common, stored))
    for kind, special in (("write", False), ("special_write", True)):
        rows: list[dict[str, object]] = [
            {
                "task_id": write.task_id,
                "idx": write.idx,
                "task_path": write.task_path,
                "channel": write.channel,
                "type": write.type,
                "value": write.value,
            }
            for write in step.rows
            if write.special is special
        ]
        if rows:
            requests.append(q.many(kind, common, rows))
    # An interrupt names its checkpoint in the thread's row (the listing's index). Not in one
    # statement with the writes (Postgres runs an independent batch as one): their guard locks
    # the row (FOR KEY SHARE), and a lock skips a row its own statement updates, writes and
    # all. Only a batch holding an interrupt runs as separate statements.
    interrupts = target.checkpoint_ns == "" and any(
        write.special and write.channel == _INTERRUPT for write in step.rows
    )
    if interrupts:
        requests.append(Sql(q.MARK_INTERRUPT, common))
    results = yield Batch(tuple(requests), independent=not interrupts)
    if not results[0]:
        thread = {"thread_id": target.thread_id, "owner": target.actor.user_id, "now": step.now}
        results = (yield Batch((Sql(q.INSERT_THREAD, thread), *requests)))[1:]
    ((owner,),) = results[0]
    check_owner(
        thread_id=target.thread_id,
        owner=owner,
        user_id=target.actor.user_id,
        enforce=target.actor.checks_owner,
    )


# --- reads -------------------------------------------------------------------------------


def _thread_tid(q: SqlDialect, thread_id: str, owner: str | None) -> Program[int | None]:
    rows = yield Sql(q.THREAD_FOR_READ, {"thread_id": thread_id, "owner": owner})
    return int(rows[0][0]) if rows else None


def _lock_threads(q: SqlDialect, tids: set[int]) -> Sql:
    """The statement that locks the threads ``tids``, in tid order (SQLite: the transaction
    holds the database already): a write in flight on one of them ends first, and the
    statements after this one see it."""
    return Sql(q.LOCK_THREADS, {"tids": q.text_list([str(tid) for tid in sorted(tids)])})


# Where a message's depth, digest, type and payload are in a row of a chain walk
# (SELECT_CHAIN), and in a walked message's row (kind 3) of a state statement.
_CHAIN_COLUMNS: Final = (0, 1, 2, 3)
_STATE_COLUMNS: Final = (11, 13, 7, 8)
# Where a walked message's row holds the tail of its list.
_TAIL_COLUMN: Final = 12


def _stored(
    thread_id: str, checkpoint_ns: str, rows: list[Any]
) -> tuple[StoredCheckpoint, dict[bytes, list[Any]]]:
    """The rows of one SELECT_STATE statement: a checkpoint, its values and pending writes,
    and the rows of the messages the statement walked, by list tail (``_STATE_COLUMNS``)."""
    stored = StoredCheckpoint(thread_id=thread_id, checkpoint_ns=checkpoint_ns)
    walked: dict[bytes, list[Any]] = {}
    for row in rows:
        if row[0] == 3:  # most rows: a message of a list, placed by _walked_list
            tail = row[_TAIL_COLUMN]
            of_list = walked.get(tail)
            if of_list is None:
                of_list = walked[bytes(tail)] = []
            of_list.append(row)
            continue
        (
            kind,
            tid,
            checkpoint_id,
            parent_id,
            structure,
            metadata,
            channel,
            vtype,
            value,
            task_id,
            path,
            idx,
            tail,
            digest,
        ) = row
        if kind == 0:
            stored.key = int(tid)
            stored.checkpoint_id = checkpoint_id
            stored.parent_id = parent_id
            stored.structure = decode_structure(structure, "checkpoint")
            stored.metadata = decode_structure(metadata, "metadata")
            stored.values.extend(inline_values(value))
        elif kind == 1:
            stored.values.append((channel, vtype, bytes(value)))
        elif kind == 2:
            stored.writes.append((path, task_id, idx, channel, vtype, bytes(value)))
        else:  # 4
            stored.messages[bytes(digest)] = (vtype, bytes(value))
    return stored, walked


def _message_lists(
    q: SqlDialect,
    content: ContentCache,
    states: Sequence[StoredCheckpoint],
    walked: Mapping[bytes, list[Any]] | None = None,
) -> Program[dict[bytes, list[tuple[str, bytes]]]]:
    """The (type, payload) of every message of the lists ``states`` refer to: from what the
    state statement already walked, else from the content cache, else walked in the store,
    all walks in one batch."""
    lists: dict[bytes, list[tuple[str, bytes]]] = {}
    walks: list[tuple[str, bytes, int]] = []
    requests: list[Sql | SqlMany] = []
    for state in states:
        for tail, count in state.chains():
            if tail in lists:
                continue
            if walked and tail in walked:
                lists[tail] = _walked_list(
                    content, state.thread_id, tail, count, walked[tail], columns=_STATE_COLUMNS
                )
                continue
            cached = content.messages(tail)
            if cached is not None and len(cached) == count:
                lists[tail] = cached
            elif (state.thread_id, tail, count) not in walks:
                walks.append((state.thread_id, tail, count))
                requests.append(Sql(q.SELECT_CHAIN, {"tid": state.key, "tail": tail, "count": count}))
    if requests:
        results = yield Batch(tuple(requests))
        for (thread_id, tail, count), rows in zip(walks, results, strict=True):
            lists[tail] = _walked_list(content, thread_id, tail, count, rows)
    return lists


def _referenced_messages(
    q: SqlDialect, content: ContentCache, states: Sequence[StoredCheckpoint]
) -> Program[None]:
    """Fill in the messages the states' pending writes refer to that the state statement did
    not return: from the content cache, else from the store, all reads in one batch."""
    wanted: list[tuple[StoredCheckpoint, list[bytes]]] = []
    for state in states:
        missing = []
        for digest in state.referenced() - state.messages.keys():
            cached = content.payload(digest)
            if cached is None:
                missing.append(digest)
            else:
                state.messages[digest] = cached
        for start in range(0, len(missing), q.PROBE_WIDTH):
            wanted.append((state, missing[start : start + q.PROBE_WIDTH]))
    if not wanted:
        return
    requests = []
    for state, digests in wanted:
        params: dict[str, object] = {"tid": state.key}
        for i in range(q.PROBE_WIDTH):
            params[f"d{i}"] = digests[min(i, len(digests) - 1)]
        requests.append(Sql(q.SELECT_MESSAGES, params))
    results = yield Batch(tuple(requests))
    for (state, _), rows in zip(wanted, results, strict=True):
        for digest, kind, payload in rows:
            state.messages[bytes(digest)] = (kind, bytes(payload))


def _walked_list(
    content: ContentCache,
    thread_id: str,
    tail: bytes,
    count: int,
    rows: list[Any],
    *,
    columns: tuple[int, int, int, int] = _CHAIN_COLUMNS,
) -> list[tuple[str, bytes]]:
    """A list from the rows of a chain walk, in any order, each holding a message's depth,
    digest, type and payload at ``columns``. A depth may come twice: two channels holding
    one list walk it twice.

    Raises:
        CheckpointSerializationError: the rows are not the list ending at ``tail``: a depth
            out of range or missing, or digests that do not lead to the tail.
    """
    depth_at, digest_at, kind_at, payload_at = columns
    digests: list[Any] = [None] * count
    entries: list[Any] = [None] * count
    last = count - 1
    for row in rows:
        depth = row[depth_at]
        if not 0 <= depth < count:  # corrupt links
            raise CheckpointSerializationError(
                f"message history is inconsistent: a message at depth {depth} of a {count}-message list"
            )
        at = last - depth
        digests[at] = row[digest_at]
        entries[at] = (row[kind_at], row[payload_at])
    if None in digests:
        raise CheckpointSerializationError(
            f"message history is incomplete: {count - digests.count(None)} of {count} messages are stored"
        )
    # Every row of a result has the same column types: bytes from the drivers threadkeep
    # sets up, maybe a buffer from a pool an application configured. Converting each value
    # when it is bytes already cost half the time of placing them.
    if digests and (type(digests[0]) is not bytes or type(entries[0][1]) is not bytes):
        digests = [bytes(digest) for digest in digests]
        entries = [(kind, bytes(payload)) for kind, payload in entries]
    # A page is read in place of the links it closes, and each link names the one before:
    # one damaged (by hand, by a bug) could name other messages, or the right ones out of
    # order. The list's tail is a digest of every message in order, so the walk's digests
    # must lead to it (one BLAKE2b over 32 bytes a message) before the list is read or kept.
    if chain_tail(digests) != tail:
        raise CheckpointSerializationError(
            "message history is inconsistent: its links do not lead to the list's tail",
            path=f"thread {thread_id!r}",
        )
    content.keep(tail, digests, entries, thread_id)
    return entries


def get_stored(
    q: SqlDialect,
    target: Target,
    content: ContentCache,
) -> Program[tuple[StoredCheckpoint, dict[bytes, list[tuple[str, bytes]]]] | None]:
    """The addressed checkpoint (or the newest of its namespace) as stored, with the stored
    form of every message of its lists."""
    # A reader holding none of the thread's lists (a new process, a cold thread) walks
    # them in the same statement; one that holds them skips the walk.
    walk = not content.holds_lists_of(target.thread_id)
    params = {
        "thread_id": target.thread_id,
        "owner": target.actor.owner_filter,
        "checkpoint_ns": target.checkpoint_ns,
        "checkpoint_id": target.checkpoint_id,
        "walk": walk,
    }
    sql = q.SELECT_STATE_LATEST if target.checkpoint_id is None else q.SELECT_STATE_AT
    rows = yield Sql(sql, params)
    if not rows:
        return None
    state, walked = _stored(target.thread_id, target.checkpoint_ns, rows)
    lists = yield from _message_lists(q, content, [state], walked)
    yield from _referenced_messages(q, content, [state])
    return state, lists


def get_tuple(
    q: SqlDialect,
    target: Target,
    serde: SerializerProtocol,
    content: ContentCache,
    memo: EncodingMemo | None = None,
) -> Program[CheckpointTuple | None]:
    """The addressed checkpoint, or the newest of its namespace, with its pending writes."""
    found = yield from get_stored(q, target, content)
    if found is None:
        return None
    state, lists = found
    return state.to_tuple(serde, lists, content, memo)


def owner_of(q: SqlDialect, thread_id: str) -> Program[str | None]:
    """The user who owns ``thread_id``, or ``None`` if the store has no such thread."""
    rows = yield Sql(q.THREAD_OWNER, {"thread_id": thread_id})
    return str(rows[0][0]) if rows else None


def run_threads(q: SqlDialect, run_ids: Sequence[str], owner: str | None) -> Program[list[tuple[str, str]]]:
    """The (thread id, owner) of every thread holding checkpoints of ``run_ids``."""
    rows = yield Sql(q.RUN_THREADS, {"run_ids": q.text_list(list(run_ids)), "owner": owner})
    return [(str(thread_id), str(thread_owner)) for thread_id, thread_owner in rows]


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
        "filter": None if not query.filter else q.metadata_filter(query.filter),
        "cursor_id": cursor_id,
        "cursor_tid": cursor_tid,
        "cursor_ns": cursor_ns,
        "page_size": query.page_size,
    }
    rows = yield Sql(q.LIST_THREAD if query.thread_id is not None else q.LIST_ALL, params)
    chosen = []
    for thread_id, _, ns, checkpoint_id, metadata in rows:
        if matches_filter(decode_structure(metadata, "metadata"), query.filter):
            chosen.append((thread_id, ns, checkpoint_id))
            if query.remaining is not None and len(chosen) >= query.remaining:
                break
    results = []
    if chosen:
        results = yield Batch(
            tuple(
                Sql(
                    q.SELECT_STATE_AT,
                    {
                        "thread_id": t,
                        "owner": query.owner,
                        "checkpoint_ns": ns,
                        "checkpoint_id": c,
                        "walk": False,
                    },
                )
                for t, ns, c in chosen
            )
        )
    states = [
        _stored(thread_id, ns, state_rows)[0]
        for (thread_id, ns, _), state_rows in zip(chosen, results, strict=True)
        if state_rows  # deleted between the two statements of another page: skip it
    ]
    lists = yield from _message_lists(q, content, states)
    yield from _referenced_messages(q, content, states)
    found = [state.to_tuple(serde, lists) for state in states]
    if not rows:
        return found, None
    last = rows[-1]
    return found, query.advanced((last[3], int(last[1]), last[2]), len(found), len(rows) < query.page_size)


# --- deletes, pruning, copies ----------------------------------------------------------------
#
# Each first locks the threads it names and reads their owners (LOCK_OWNED), then checks
# them, then acts, in one transaction: a thread the store does not hold is passed by (as
# LangGraph's savers do), another user's is refused with StorageForbiddenError before
# anything changes (SPEC W3), never passed by in silence.


def _locked(q: SqlDialect, thread_ids: Sequence[str]) -> Program[dict[str, tuple[int, str]]]:
    """Lock the threads of ``thread_ids`` the store holds; their tids and owners by id."""
    rows = yield Sql(q.LOCK_OWNED, {"thread_ids": q.text_list(list(dict.fromkeys(thread_ids)))})
    return {str(thread_id): (int(tid), str(owner)) for tid, thread_id, owner in rows}


def _owned(
    q: SqlDialect, thread_ids: Sequence[str], owner: str | None, action: str
) -> Program[dict[str, int]]:
    """Lock the threads of ``thread_ids`` the store holds; their tids by thread id.

    Raises:
        StorageForbiddenError: one belongs to another user than ``owner`` (``None``: any
            owner may act); ``action`` says what was refused.
    """
    found = yield from _locked(q, thread_ids)
    for thread_id, (_, thread_owner) in found.items():
        _check(thread_id, thread_owner, owner, action)
    return {thread_id: tid for thread_id, (tid, _) in found.items()}


def _check(thread_id: str, thread_owner: str, owner: str | None, action: str) -> None:
    check_owner(
        thread_id=thread_id, owner=thread_owner, user_id=owner or "", enforce=owner is not None, action=action
    )


def delete_thread(q: SqlDialect, thread_id: str, owner: str | None) -> Program[bool]:
    """Delete everything a thread holds; ``False`` when the store holds no such thread.

    Raises:
        StorageForbiddenError: the thread belongs to another user than ``owner``.
    """
    tids = yield from _owned(q, [thread_id], owner, "delete")
    if not tids:
        return False
    yield from delete_threads(q, [ExpiredThread(tids[thread_id], thread_id, "")])
    return True


def delete_for_runs(
    q: SqlDialect,
    run_ids: Sequence[str],
    owner: str | None,
    spare: Mapping[str, Collection[tuple[str, str]]] | None = None,
) -> Program[int]:
    """Delete the checkpoints (and their writes) the given runs stored, but the (namespace,
    checkpoint id) ``spare`` names per thread; returns how many.

    The threads concerned are locked first and the runs' checkpoints read again: a put in
    flight on one of them may reuse a value only those checkpoints refer to, and the values
    left unreferenced are collected only once that put's checkpoint can be seen.

    Raises:
        StorageForbiddenError: a run stored checkpoints on a thread of another user than
            ``owner``; nothing is deleted.
    """
    query = {"run_ids": q.text_list(list(run_ids))}
    rows = yield Sql(q.SELECT_RUN_CHECKPOINTS, query)
    if not rows:
        return 0
    _check_run_owners(rows, owner)
    locked = {int(row[0]) for row in rows}
    yield _lock_threads(q, locked)
    rows = [row for row in (yield Sql(q.SELECT_RUN_CHECKPOINTS, query)) if int(row[0]) in locked]
    _check_run_owners(rows, owner)  # under the lock: no owner changes now
    spare = spare or {}
    rows = [row for row in rows if (row[1], row[2]) not in spare.get(row[3], ())]
    statements: list[Sql | SqlMany] = []
    touched: set[tuple[int, str]] = set()
    for tid, ns, checkpoint_id, _, _ in rows:
        params = {"tid": tid, "checkpoint_ns": ns, "checkpoint_id": checkpoint_id}
        statements += [Sql(q.DELETE_CHECKPOINT, params), Sql(q.DELETE_CHECKPOINT_WRITES, params)]
        touched.add((int(tid), ns))
    statements += [Sql(q.COLLECT_BLOBS, {"tid": tid, "checkpoint_ns": ns}) for tid, ns in sorted(touched)]
    if rows:
        tids = {"tids": q.text_list(sorted({str(tid) for tid, _ in touched}))}
        if q.CLEAR_HEADS is not None:
            statements.append(Sql(q.CLEAR_HEADS, tids))
        statements.append(Sql(q.REFRESH_THREADS, tids))
    if statements:
        yield Batch(tuple(statements))
    return len(rows)


def _check_run_owners(rows: Sequence[Any], owner: str | None) -> None:
    """Refuse a delete by run whose runs stored checkpoints on another user's thread."""
    for _, _, _, thread_id, thread_owner in rows:
        _check(thread_id, thread_owner, owner, "delete runs on")


def prune(
    q: SqlDialect,
    thread_ids: Iterable[str],
    strategy: str,
    owner: str | None,
    keep: Mapping[str, Mapping[str, int]] | None = None,
) -> Program[None]:
    """LangGraph's ``prune``: ``keep_latest`` per namespace (the newest ``keep[thread][ns]``
    checkpoints, 1 unless named), or ``delete`` every checkpoint.

    Raises:
        StorageForbiddenError: one of the threads belongs to another user than ``owner``;
            no thread is pruned.
    """
    if strategy not in ("keep_latest", "delete"):
        raise ValueError(f"prune strategy {strategy!r} is not 'keep_latest' or 'delete'")
    tids = yield from _owned(q, list(thread_ids), owner, "prune")
    if strategy == "delete":
        doomed = [ExpiredThread(tid, thread_id, "") for thread_id, tid in tids.items()]
        if doomed:
            yield from delete_threads(q, doomed)
        return
    for thread_id, tid in tids.items():  # locked: after any put in flight, as delete_for_runs
        namespaces = yield Sql(q.SELECT_NAMESPACES, {"tid": tid})
        counts = (keep or {}).get(thread_id, {})
        statements = [
            statement for (ns,) in namespaces for statement in _keep_newest(q, tid, ns, counts.get(ns, 1))
        ]
        if statements:
            yield Batch(tuple(statements))


def copy_thread(q: SqlDialect, source: str, target: str, actor: Actor, now: float) -> Program[bool]:
    """Copy every checkpoint, write and message of ``source`` onto ``target``; ``False``
    (and nothing created) when the store holds no ``source``.

    Both threads are locked (in one statement, in tid order, so two crossing copies cannot
    deadlock) before their owners are checked and the copy statements run: a prune or a put
    of the source cannot commit between the copy of its checkpoints and the copy of their
    values.

    Raises:
        StorageForbiddenError: ``source`` or ``target`` belongs to another user.
    """
    found = yield from _locked(q, [source, target])
    if source not in found:
        return False
    source_tid, source_owner = found[source]
    _check(source, source_owner, actor.owner_filter, "copy")
    if target in found:
        target_tid, owner = found[target]
    else:
        results = yield Batch(
            (
                Sql(q.INSERT_THREAD, {"thread_id": target, "owner": actor.user_id, "now": now}),
                Sql(q.THREAD_FOR_READ, {"thread_id": target, "owner": None}),
                Sql(q.THREAD_OWNER, {"thread_id": target}),
            )
        )
        ((target_tid,),), ((owner,),) = results[1], results[2]
    _check(target, owner, actor.owner_filter, "copy onto")
    params = {"source": source_tid, "target": target_tid}
    lock = _lock_threads(q, {source_tid, int(target_tid)})
    copies = [Sql(statement, params) for statement in q.COPY_THREAD]
    if q.CLEAR_HEADS is not None:
        copies.append(Sql(q.CLEAR_HEADS, {"tids": q.text_list([str(target_tid)])}))
    copies.append(Sql(q.REFRESH_THREADS, {"tids": q.text_list([str(target_tid)])}))
    yield Batch((lock, *copies))
    return True


def assign_owner(
    q: SqlDialect, thread_ids: Sequence[str], user: str, force: bool
) -> Program[dict[str, str | None]]:
    """Hand ``thread_ids`` to ``user``, in one transaction; returns each thread's owner
    before (``None``: the store holds no such thread).

    Raises:
        StorageForbiddenError: without ``force``, a thread belongs to another user than the
            anonymous owner or ``user``; no thread changes owner.
    """
    wanted = list(dict.fromkeys(thread_ids))
    rows = yield Sql(q.LOCK_OWNED, {"thread_ids": q.text_list(wanted)})
    before = {str(thread_id): str(owner) for _, thread_id, owner in rows}
    check_handover(before, user, force)
    moved = [str(tid) for tid, _, owner in rows if owner != user]
    if moved:
        yield Sql(q.ASSIGN_OWNER, {"tids": q.text_list(moved), "owner": user})
    return {thread_id: before.get(thread_id) for thread_id in wanted}


# --- format gate, migrations, maintenance ---------------------------------------------------


def ensure_format(q: SqlDialect) -> Program[None]:
    """Refuse a store that holds checkpoints of another format, or with none recorded (P6)."""
    yield Sql(q.LOCK_SCHEMA, {})
    tables = {row[0] for row in (yield Sql(q.SELECT_TABLES, {}))}
    recorded: str | None = None
    if "tk_meta" in tables:
        rows = yield Sql(q.SELECT_META, {"key": _FORMAT_KEY})
        recorded = rows[0][0] if rows else None
    if recorded is None:
        for table, probe in q.CHECKPOINT_TABLES.items():
            if table in tables and (yield Sql(probe, {}))[0][0]:
                raise _format_error(q, None, table)
    elif recorded not in READABLE_GENERATIONS:
        raise _format_error(q, recorded, "tk_meta")


def record_format(q: SqlDialect) -> Program[None]:
    """Record this format generation (a readable older one is upgraded); concurrent first
    uses converge on one record."""
    yield Sql(q.LOCK_SCHEMA, {})
    yield Sql(q.INSERT_META, {"key": _FORMAT_KEY, "value": str(FORMAT_GENERATION)})
    yield Sql(
        q.UPGRADE_META,
        {
            "key": _FORMAT_KEY,
            "value": str(FORMAT_GENERATION),
            "readable": q.text_list(sorted(READABLE_GENERATIONS)),
        },
    )
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


def is_current(q: SqlDialect, versions: Sequence[int]) -> Program[bool]:
    """Whether the store is in this format generation with exactly ``versions`` applied:
    then opening it needs nothing more (no lock, no write), the common case."""
    if not (yield Sql(q.GATE_TABLES, {}))[0][0]:
        return False
    rows = yield Sql(q.SELECT_GATE, {"key": _FORMAT_KEY})
    recorded = [value for kind, value in rows if kind == "meta"]
    applied = {int(value) for kind, value in rows if kind == "migration"}
    return recorded == [str(FORMAT_GENERATION)] and applied == set(versions)


def apply_migration(q: SqlDialect, version: int, statements: Sequence[str], now: float) -> Program[bool]:
    """Apply one numbered migration unless it is recorded; ``True`` if it ran."""
    yield Sql(q.LOCK_SCHEMA, {})
    yield Sql(q.CREATE_MIGRATIONS, {})
    applied = {int(row[0]) for row in (yield Sql(q.SELECT_MIGRATIONS, {}))}
    if version in applied:
        return False
    for statement in statements:
        yield Sql(statement, {})
    yield Sql(q.RECORD_MIGRATION, {"version": version, "now": now})
    return True


def upgrade(q: SqlDialect, migrations: Sequence[tuple[int, Sequence[str]]], now: float) -> Program[None]:
    """Bring a store that is not up to date to this format, on one connection: check its
    format (:func:`ensure_format`), apply each numbered migration of ``migrations`` it lacks
    (:func:`apply_migration`), refuse a schema a newer version migrated further
    (:func:`check_schema`), and record the format (:func:`record_format`).

    Each step is a transaction of its own, ended by :data:`END_TRANSACTION`, that takes the
    schema lock first and reads what is recorded under it: processes that open a new store
    at once take turns step by step, each skipping what another has applied."""
    steps: list[Program[Any]] = [ensure_format(q)]
    steps += [apply_migration(q, version, statements, now) for version, statements in migrations]
    steps += [check_schema(q, max((version for version, _ in migrations), default=0)), record_format(q)]
    for step in steps:
        yield from step
        yield END_TRANSACTION


def check_schema(q: SqlDialect, newest: int) -> Program[None]:
    """Refuse a store whose schema a newer threadkeep has migrated past ``newest`` (the last
    migration this version knows): its statements would name columns that are not there."""
    applied = [int(row[0]) for row in (yield Sql(q.SELECT_MIGRATIONS, {}))]
    if applied and max(applied) > newest:
        raise CheckpointStoreFormatError(
            f"the {q.NAME} checkpoint store's schema is at migration {max(applied)}, and this "
            f"version of threadkeep knows migrations up to {newest}; run a threadkeep version "
            "at least as new as the one that migrated the store",
            context={"provider": q.NAME, "found": max(applied), "expected": newest, "table": "tk_migrations"},
        )


def reset(q: SqlDialect) -> Program[None]:
    """Drop every table threadkeep owns, and nothing else."""
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


# --- retention (SPEC RT1-RT5, SW1-SW8) ------------------------------------------------------


def start_thread(
    q: SqlDialect, thread_id: str, actor: Actor, declared: ThreadRetention, now: float
) -> Program[None]:
    """A run starts on ``thread_id``: out of the finished set, its declared retention recorded
    (creating the thread for ``actor`` if it is new)."""
    params = {
        "thread_id": thread_id,
        "owner": actor.user_id,
        "now": now,
        "waiting": declared.waiting_minutes,
        "finished": declared.finished_minutes,
        "required_owner": required_owner(actor),
    }
    if not (yield Sql(q.START_THREAD, params)):
        ((owner,),) = yield Sql(q.THREAD_OWNER, {"thread_id": thread_id})
        check_owner(thread_id=thread_id, owner=owner, user_id=actor.user_id, enforce=True)


def mark_finished(
    q: SqlDialect, thread_ids: Sequence[str], actor: Actor, finished_minutes: int, now: float
) -> Program[dict[str, float]]:
    """Mark threads finished; returns each marked thread's due time. The mark itself is
    restricted to ``actor``'s threads; if it missed any, another user's among them is
    refused (raising rolls the whole mark back)."""
    wanted = list(dict.fromkeys(thread_ids))
    rows = yield Sql(
        q.MARK_FINISHED,
        {
            "thread_ids": q.text_list(wanted),
            "required_owner": required_owner(actor),
            "finished": finished_minutes,
            "now": now,
        },
    )
    marked = {thread_id: float(due) for thread_id, due in rows}
    if actor.checks_owner and len(marked) < len(wanted):
        missed = [thread_id for thread_id in wanted if thread_id not in marked]
        for _, thread_id, owner in (yield Sql(q.THREADS_NAMED, {"thread_ids": q.text_list(missed)})):
            check_owner(thread_id=thread_id, owner=owner, user_id=actor.user_id, enforce=True)
    return marked


def thread_retention(
    q: SqlDialect, thread_id: str, owner: str | None
) -> Program[tuple[ThreadRetention, float | None] | None]:
    """A thread's declared retention and its finished due time (``None``: waiting); ``None``
    when there is no such thread of ``owner`` (``None``: any owner)."""
    rows = yield Sql(q.THREAD_RETENTION, {"thread_id": thread_id, "owner": owner})
    if not rows:
        return None
    ((waiting, finished, due),) = rows
    return ThreadRetention(waiting, finished), (None if due is None else float(due))


def expired_page(q: SqlDialect, page: SweepPage) -> Program[list[ExpiredThread]]:
    """The next ``page.limit`` threads past the page's horizon, in key order after its key."""
    statement = q.FINISHED_PAGE if page.horizon == "finished" else q.WAITING_PAGE
    rows = yield Sql(
        statement,
        {"now": page.now, "waiting": page.waiting_minutes, "after": page.after, "limit": page.limit},
    )
    return [ExpiredThread(int(tid), thread_id, owner) for tid, thread_id, owner in rows]


def count_expired(q: SqlDialect, page: SweepPage) -> Program[int]:
    """How many threads are past the page's horizon."""
    statement = q.FINISHED_COUNT if page.horizon == "finished" else q.WAITING_COUNT
    ((count,),) = yield Sql(statement, {"now": page.now, "waiting": page.waiting_minutes})
    return int(count)


def delete_threads(
    q: SqlDialect, threads: Sequence[ExpiredThread], page: SweepPage | None = None
) -> Program[list[str]]:
    """Delete everything ``threads`` hold, in one transaction; with a sweep's ``page``, only
    the threads still past its horizon and not parked. Returns the ids deleted."""
    tids = q.text_list([str(thread.key) for thread in threads])
    yield Sql(q.LOCK_THREADS, {"tids": tids})
    if page is None:
        rows = yield Sql(q.DELETE_NAMED, {"tids": tids})
    else:
        statement = q.DELETE_FINISHED if page.horizon == "finished" else q.DELETE_WAITING
        rows = yield Sql(statement, {"tids": tids, "now": page.now, "waiting": page.waiting_minutes})
    gone = [int(row[0]) for row in rows]
    if gone:
        params = {"tids": q.text_list([str(tid) for tid in gone])}
        yield Batch(tuple(Sql(statement, params) for statement in q.DELETE_THREAD_ROWS), wanted=False)
    names = {thread.key: thread.thread_id for thread in threads}
    return [names[tid] for tid in gone]


def threads_named(q: SqlDialect, thread_ids: Sequence[str]) -> Program[list[ExpiredThread]]:
    """Which of ``thread_ids`` the store holds."""
    rows = yield Sql(q.THREADS_NAMED, {"thread_ids": q.text_list(list(thread_ids))})
    return [ExpiredThread(int(tid), thread_id, owner) for tid, thread_id, owner in rows]


def record_park(q: SqlDialect, park: Park) -> Program[None]:
    """Record a live park. The thread's first checkpoint may still be on its way (LangGraph's
    default durability writes it while the next step runs): the park then creates the
    thread for its user, as that put would have."""
    params = {
        "thread_id": park.thread_id,
        "park_id": park.park_id,
        "deadline": park.deadline,
        "required_owner": park.required_owner,
    }
    if (yield Sql(q.RECORD_PARK, params)):
        return
    yield Sql(q.INSERT_THREAD, {"thread_id": park.thread_id, "owner": park.user, "now": park.now})
    if not (yield Sql(q.RECORD_PARK, params)):
        ((owner,),) = yield Sql(q.THREAD_OWNER, {"thread_id": park.thread_id})
        check_owner(thread_id=park.thread_id, owner=owner, user_id=park.user, enforce=True)


def clear_park(q: SqlDialect, thread_id: str, park_id: str, actor: Actor) -> Program[None]:
    """Remove a park of one of ``actor``'s threads; a thread another user owns is refused
    (the delete itself is restricted to the owner's threads)."""
    params = {"thread_id": thread_id, "park_id": park_id, "required_owner": required_owner(actor)}
    if (yield Sql(q.CLEAR_PARK, params)) or not actor.checks_owner:
        return
    for (owner,) in (yield Sql(q.THREAD_OWNER, {"thread_id": thread_id})):
        check_owner(thread_id=thread_id, owner=owner, user_id=actor.user_id, enforce=True)


def live_parks(q: SqlDialect, thread_ids: Sequence[str], now: float, owner: str | None) -> Program[set[str]]:
    """Which of ``thread_ids`` (of ``owner``; ``None``: any) have a park whose deadline has
    not passed."""
    params = {"thread_ids": q.text_list(list(thread_ids)), "now": now, "owner": owner}
    rows = yield Sql(q.LIVE_PARKS, params)
    return {row[0] for row in rows}


def interrupted(q: SqlDialect, thread_ids: Sequence[str], since: float | None) -> Program[set[str]]:
    """Which of ``thread_ids`` wait on an interrupt (LangGraph's rule: the newest root
    checkpoint holds an interrupt write), since ``since`` or later (``None``: any time)."""
    rows = yield Sql(q.INTERRUPTED, {"thread_ids": q.text_list(list(thread_ids)), "since": since})
    return {row[0] for row in rows}


# --- the thread listing (SPEC SV1, SV3) ---------------------------------------------------------


def thread_rows(q: SqlDialect, scan: ThreadScan) -> Program[list[ThreadRow]]:
    """The threads after the scan's cursor, newest write first, read from the listing
    indexes (one statement: see THREADS_PAGE)."""
    if scan.status == "parked":
        statement = q.THREADS_PARKED
    elif scan.owner is None:
        statement = q.THREADS_PAGE
    else:
        statement = q.THREADS_PAGE_OF_OWNER
    rows = yield Sql(statement, scan.params())
    return _thread_rows(rows)


def thread_row(q: SqlDialect, thread_id: str, owner: str | None, now: float) -> Program[ThreadRow | None]:
    """One thread's listing row, as :func:`thread_rows` reads it; ``None``: no such thread
    of ``owner`` (``None``: any owner)."""
    unbounded = ThreadScan(owner, None, -_INFINITY, _INFINITY, _INFINITY, "", now, 1)
    rows = yield Sql(q.THREAD_ROW, {**unbounded.params(), "thread_id": thread_id})
    found = _thread_rows(rows)
    return found[0] if found else None


def _thread_rows(rows: Sequence[Sequence[Any]]) -> list[ThreadRow]:
    return [
        ThreadRow(
            thread_id=str(thread_id),
            owner=str(owner),
            written_at=float(written_at),
            waiting_minutes=None if waiting is None else int(waiting),
            finished_due=None if due is None else float(due),
            # interrupt_at is current only while it names the newest root checkpoint
            interrupted=interrupt_at is not None and interrupt_at == newest,
            parked_until=None if until is None else float(until),
            metadata=metadata,
        )
        for thread_id, owner, written_at, waiting, due, interrupt_at, newest, metadata, until in rows
    ]
