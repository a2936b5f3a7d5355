"""The SQLite dialect: every statement the SQL programs run, as named constants.

Parameters are named (``:name``). No statement is ever built from values: the one generated
constant, :data:`PROBE_LINKS`, only repeats placeholders.
"""

from __future__ import annotations

from collections.abc import Mapping

import orjson

from threadkeep.core.program import SqlMany

NAME = "sqlite"
PROBE_WIDTH = 32

# --- threads ------------------------------------------------------------------------------

LOCK_SCHEMA = "SELECT 1"  # BEGIN IMMEDIATE already serializes schema changes

# A write first makes sure its thread exists (owned by the writer if new) ...
INSERT_THREAD = """
INSERT INTO tk_threads (thread_id, owner, active_at) VALUES (:thread_id, :owner, :now)
ON CONFLICT (thread_id) DO NOTHING
"""

# ... then reads its owner and the head of the namespace it writes; nothing is rewritten.
# (SQLite's write lock, taken by BEGIN IMMEDIATE, already serializes writers.)
LOCK_THREAD = "SELECT tid, owner FROM tk_threads WHERE thread_id = :thread_id"

THREAD_HEAD = """
SELECT
    (SELECT c.checkpoint_id FROM tk_checkpoints AS c
     WHERE c.tid = t.tid AND c.checkpoint_ns = :checkpoint_ns
     ORDER BY c.checkpoint_id DESC LIMIT 1),
    EXISTS (SELECT 1 FROM tk_checkpoints AS c
            WHERE c.tid = t.tid AND c.checkpoint_ns = :checkpoint_ns AND c.checkpoint_id = :checkpoint_id)
FROM tk_threads AS t WHERE t.thread_id = :thread_id
"""

# For each channel a put leaves unchanged ({channel: version} in :unchanged): whether the
# parent holds it at that version, and the parent's entry for it in vals if it has one.
# No rows when there is no parent.
PARENT_VALUES = """
SELECT u.key, coalesce(CAST(held.value AS TEXT) = u.value, 0), entry.value
FROM tk_checkpoints AS p CROSS JOIN json_each(:unchanged) AS u
LEFT JOIN json_each(p.checkpoint, '$.channel_versions') AS held ON held.key = u.key
LEFT JOIN json_each(p.vals) AS entry ON entry.key = u.key
WHERE p.tid = (SELECT t.tid FROM tk_threads AS t WHERE t.thread_id = :thread_id)
  AND p.checkpoint_ns = :checkpoint_ns AND p.checkpoint_id = :parent_id
"""

THREAD_FOR_READ = """
SELECT tid FROM tk_threads
WHERE thread_id = :thread_id AND (:owner IS NULL OR owner = :owner)
"""

# --- put ---------------------------------------------------------------------------------

PROBE_LINKS = (
    "SELECT l.node FROM tk_message_links AS l JOIN tk_threads AS t ON l.tid = t.tid "
    "WHERE t.thread_id = :thread_id AND l.node IN (" + ", ".join(f":n{i}" for i in range(PROBE_WIDTH)) + ")"
)

SELECT_MESSAGES = (
    "SELECT digest, type, value FROM tk_messages WHERE tid = :tid AND digest IN ("
    + ", ".join(f":d{i}" for i in range(PROBE_WIDTH))
    + ")"
)

INSERT_MESSAGE = """
INSERT INTO tk_messages (tid, digest, type, value) VALUES (:tid, :digest, :type, :value)
ON CONFLICT DO NOTHING
"""

INSERT_LINK = """
INSERT INTO tk_message_links (tid, node, prev, digest) VALUES (:tid, :node, :prev, :digest)
ON CONFLICT DO NOTHING
"""

UPSERT_BLOB = """
INSERT INTO tk_blobs (tid, checkpoint_ns, channel, version, type, value)
VALUES (:tid, :checkpoint_ns, :channel, :version, :type, :value)
ON CONFLICT (tid, checkpoint_ns, channel, version)
DO UPDATE SET type = excluded.type, value = excluded.value
"""

UPSERT_CHECKPOINT = """
INSERT INTO tk_checkpoints
    (tid, checkpoint_ns, checkpoint_id, parent_id, run_id, created_at, checkpoint, metadata, vals)
VALUES (:tid, :checkpoint_ns, :checkpoint_id, :parent_id, :run_id, :now, :checkpoint, :metadata,
        :vals)
ON CONFLICT (tid, checkpoint_ns, checkpoint_id) DO UPDATE SET
    parent_id = excluded.parent_id, run_id = excluded.run_id,
    checkpoint = excluded.checkpoint, metadata = excluded.metadata, vals = excluded.vals
"""

# The id below which a namespace's checkpoints are beyond the newest :offset + 1.
_CUTOFF = """(SELECT checkpoint_id FROM tk_checkpoints
     WHERE tid = :tid AND checkpoint_ns = :checkpoint_ns
     ORDER BY checkpoint_id DESC LIMIT 1 OFFSET :offset)"""

_DELETE_WRITES_BEYOND = (
    "DELETE FROM tk_writes WHERE tid = :tid AND checkpoint_ns = :checkpoint_ns AND checkpoint_id < " + _CUTOFF
)

_DELETE_CHECKPOINTS_BEYOND = (
    "DELETE FROM tk_checkpoints WHERE tid = :tid AND checkpoint_ns = :checkpoint_ns AND checkpoint_id < "
    + _CUTOFF
)

# Channel values no checkpoint of the namespace refers to any more.
COLLECT_BLOBS = """
DELETE FROM tk_blobs
WHERE tid = :tid AND checkpoint_ns = :checkpoint_ns
  AND (channel, version) NOT IN (
      SELECT version.key, CAST(version.value AS TEXT)
      FROM tk_checkpoints AS c, json_each(c.checkpoint, '$.channel_versions') AS version
      WHERE c.tid = :tid AND c.checkpoint_ns = :checkpoint_ns)
"""

# Keep only the newest :offset + 1 checkpoints of a namespace: the older ones, their writes,
# then the channel values no kept checkpoint refers to.
KEEP_NEWEST: tuple[str, ...] = (_DELETE_WRITES_BEYOND, _DELETE_CHECKPOINTS_BEYOND, COLLECT_BLOBS)

# One process writes a SQLite file at a time, and a put costs no round trips: SQLite keeps no
# head in the thread's row and has no one-statement put (see the Postgres dialect).
SET_HEAD = None
CLEAR_HEADS = None
claimed_put = None

# A put moves its thread's listed write time (active_at, migration 6) to its time once it is
# :clock_step seconds behind (listing.CLOCK_STEP: fewer index writes), and a root put forgets
# an interrupt of an older root checkpoint (interrupt_at). A put that changes neither leaves
# the row alone.
TOUCH_THREAD = """
UPDATE tk_threads SET active_at = CASE WHEN :now - active_at >= :clock_step THEN :now ELSE active_at END,
    interrupt_at = CASE WHEN :checkpoint_ns <> '' OR interrupt_at >= :checkpoint_id THEN interrupt_at END
WHERE tid = :tid
  AND (:now - active_at >= :clock_step OR (:checkpoint_ns = '' AND interrupt_at < :checkpoint_id))
"""

# --- put_writes --------------------------------------------------------------------------

THREAD_OWNER = "SELECT owner FROM tk_threads WHERE thread_id = :thread_id"

# The threads (and owners) that hold checkpoints of the given runs.
RUN_THREADS = """
SELECT DISTINCT t.thread_id, t.owner
FROM tk_checkpoints AS c JOIN tk_threads AS t ON t.tid = c.tid
WHERE c.run_id IN (SELECT value FROM json_each(:run_ids))
  AND (:owner IS NULL OR t.owner = :owner)
"""

# A write is stored only if the writer may write the thread (W3) and, under a history limit
# (:offset set), its checkpoint was not pruned already (LangGraph may deliver writes late).
# Guarded so, a task's writes need no transaction: every statement is idempotent.
_WRITE_GUARD = """
WHERE t.thread_id = :thread_id
  AND (:required_owner IS NULL OR t.owner = :required_owner)
  AND (:offset IS NULL
       OR EXISTS (SELECT 1 FROM tk_checkpoints AS c
                  WHERE c.tid = t.tid AND c.checkpoint_ns = :checkpoint_ns
                    AND c.checkpoint_id = :checkpoint_id)
       OR :checkpoint_id >= coalesce((SELECT c.checkpoint_id FROM tk_checkpoints AS c
                                      WHERE c.tid = t.tid AND c.checkpoint_ns = :checkpoint_ns
                                      ORDER BY c.checkpoint_id DESC LIMIT 1 OFFSET :offset), ''))
"""

_INSERT_WRITE = (
    """
INSERT INTO tk_writes (tid, checkpoint_ns, checkpoint_id, task_id, idx, task_path, channel, type, value)
SELECT t.tid, :checkpoint_ns, :checkpoint_id, :task_id, :idx, :task_path, :channel, :type, :value
FROM tk_threads AS t"""
    + _WRITE_GUARD
)

INSERT_WRITE = _INSERT_WRITE + "ON CONFLICT DO NOTHING"

# under the writes' own guard: a write refused leaves no message behind
INSERT_WRITE_MESSAGE = (
    """
INSERT INTO tk_messages (tid, digest, type, value)
SELECT t.tid, :digest, :type, :value FROM tk_threads AS t"""
    + _WRITE_GUARD
    + "ON CONFLICT DO NOTHING"
)

UPSERT_WRITE = (
    _INSERT_WRITE
    + """ON CONFLICT (tid, checkpoint_ns, checkpoint_id, task_id, idx) DO UPDATE SET
    task_path = excluded.task_path, channel = excluded.channel,
    type = excluded.type, value = excluded.value"""
)

# A task's interrupt write on a root checkpoint names it in its thread's row (interrupt_at,
# migration 6), unless a newer root checkpoint is stored. Sent only with such a write.
MARK_INTERRUPT = """
UPDATE tk_threads AS t SET interrupt_at = max(coalesce(t.interrupt_at, ''), :checkpoint_id)
WHERE t.thread_id = :thread_id
  AND (:required_owner IS NULL OR t.owner = :required_owner)
  AND NOT EXISTS (SELECT 1 FROM tk_checkpoints AS c
                  WHERE c.tid = t.tid AND c.checkpoint_ns = '' AND c.checkpoint_id > :checkpoint_id)
"""

# --- reads -------------------------------------------------------------------------------

# A checkpoint, its channel values and its pending writes in one statement, if the caller
# may see the thread. Rows: kind 0 the checkpoint (value: its vals), 1 a channel value in
# tk_blobs, 2 a pending write; columns: kind, tid, checkpoint_id, parent_id, checkpoint,
# metadata, channel, type, value, task_id, task_path, idx, tail, digest.
# The last two belong to the messages Postgres walks in the same statement (kind 3); an
# embedded store has no round trip to save, so :walk is ignored and SELECT_CHAIN walks.
_STATE = """
SELECT 0, cp.tid, cp.checkpoint_id, cp.parent_id, cp.checkpoint, cp.metadata,
       NULL, NULL, cp.vals, NULL, NULL, NULL, NULL, NULL
FROM cp
UNION ALL
SELECT 1, NULL, NULL, NULL, NULL, NULL, b.channel, b.type, b.value, NULL, NULL, NULL, NULL, NULL
FROM cp CROSS JOIN json_each(cp.checkpoint, '$.channel_versions') AS version
CROSS JOIN tk_blobs AS b  -- CROSS JOIN keeps this order: one primary-key lookup per channel
WHERE b.tid = cp.tid AND b.checkpoint_ns = :checkpoint_ns
  AND b.channel = version.key AND b.version = CAST(version.value AS TEXT)
  AND NOT EXISTS (SELECT 1 FROM json_each(cp.vals) AS entry WHERE entry.key = version.key)
UNION ALL
SELECT 2, NULL, NULL, NULL, NULL, NULL, w.channel, w.type, w.value, w.task_id, w.task_path, w.idx,
       NULL, NULL
FROM cp JOIN tk_writes AS w ON w.tid = cp.tid AND w.checkpoint_ns = :checkpoint_ns
    AND w.checkpoint_id = cp.checkpoint_id
"""

SELECT_STATE_LATEST = (
    """WITH cp AS (
    SELECT c.tid, c.checkpoint_id, c.parent_id, c.checkpoint, c.metadata, c.vals
    FROM tk_threads AS t JOIN tk_checkpoints AS c ON c.tid = t.tid
    WHERE t.thread_id = :thread_id AND (:owner IS NULL OR t.owner = :owner)
      AND c.checkpoint_ns = :checkpoint_ns
    ORDER BY c.checkpoint_id DESC LIMIT 1)"""
    + _STATE
)

SELECT_STATE_AT = (
    """WITH cp AS (
    SELECT c.tid, c.checkpoint_id, c.parent_id, c.checkpoint, c.metadata, c.vals
    FROM tk_threads AS t JOIN tk_checkpoints AS c ON c.tid = t.tid
    WHERE t.thread_id = :thread_id AND (:owner IS NULL OR t.owner = :owner)
      AND c.checkpoint_ns = :checkpoint_ns AND c.checkpoint_id = :checkpoint_id)"""
    + _STATE
)

# Walks a message chain from its tail; depth 0 is the last message. :count bounds the walk.
# Rows come back in any order; the program orders them by depth (cheaper than a SQL sort).
SELECT_CHAIN = """
WITH RECURSIVE walk (depth, prev, digest) AS (
    SELECT 0, prev, digest FROM tk_message_links WHERE tid = :tid AND node = :tail
    UNION ALL
    SELECT walk.depth + 1, link.prev, link.digest
    FROM walk JOIN tk_message_links AS link ON link.tid = :tid AND link.node = walk.prev
    WHERE walk.depth + 1 < :count
)
SELECT walk.depth, walk.digest, message.type, message.value
FROM walk JOIN tk_messages AS message ON message.tid = :tid AND message.digest = walk.digest
"""

# A page of checkpoints, newest first (the metadata filter is applied by the program).
_LIST_COLUMNS = """
SELECT t.thread_id, c.tid, c.checkpoint_ns, c.checkpoint_id, c.metadata
FROM tk_threads AS t JOIN tk_checkpoints AS c ON c.tid = t.tid
"""

_LIST_CONDITIONS = """
  AND (:owner IS NULL OR t.owner = :owner)
  AND (:checkpoint_ns IS NULL OR c.checkpoint_ns = :checkpoint_ns)
  AND (:checkpoint_id IS NULL OR c.checkpoint_id = :checkpoint_id)
  AND (:before IS NULL OR c.checkpoint_id < :before)
  AND (:cursor_id IS NULL
       OR (c.checkpoint_id, c.tid, c.checkpoint_ns) < (:cursor_id, :cursor_tid, :cursor_ns))
ORDER BY c.checkpoint_id DESC, c.tid DESC, c.checkpoint_ns DESC
LIMIT :page_size
"""

LIST_THREAD = _LIST_COLUMNS + "WHERE t.thread_id = :thread_id" + _LIST_CONDITIONS
LIST_ALL = _LIST_COLUMNS + "WHERE 1 = 1" + _LIST_CONDITIONS

# --- deletes, pruning, copies --------------------------------------------------------------

# Every owner's: a delete by run refuses runs on another user's threads (W3).
SELECT_RUN_CHECKPOINTS = """
SELECT c.tid, c.checkpoint_ns, c.checkpoint_id, t.thread_id, t.owner
FROM tk_checkpoints AS c JOIN tk_threads AS t ON t.tid = c.tid
WHERE c.run_id IN (SELECT value FROM json_each(:run_ids))
"""

DELETE_CHECKPOINT = """
DELETE FROM tk_checkpoints
WHERE tid = :tid AND checkpoint_ns = :checkpoint_ns AND checkpoint_id = :checkpoint_id
"""

DELETE_CHECKPOINT_WRITES = """
DELETE FROM tk_writes
WHERE tid = :tid AND checkpoint_ns = :checkpoint_ns AND checkpoint_id = :checkpoint_id
"""

SELECT_NAMESPACES = "SELECT DISTINCT checkpoint_ns FROM tk_checkpoints WHERE tid = :tid"


COPY_THREAD: tuple[str, ...] = (
    """
    INSERT INTO tk_checkpoints
        (tid, checkpoint_ns, checkpoint_id, parent_id, run_id, created_at, checkpoint, metadata, vals)
    SELECT :target, checkpoint_ns, checkpoint_id, parent_id, run_id, created_at, checkpoint,
           metadata, vals
    FROM tk_checkpoints WHERE tid = :source
    ON CONFLICT (tid, checkpoint_ns, checkpoint_id) DO UPDATE SET
        parent_id = excluded.parent_id, run_id = excluded.run_id,
        checkpoint = excluded.checkpoint, metadata = excluded.metadata, vals = excluded.vals
    """,
    """
    INSERT INTO tk_blobs (tid, checkpoint_ns, channel, version, type, value)
    SELECT :target, checkpoint_ns, channel, version, type, value FROM tk_blobs WHERE tid = :source
    ON CONFLICT (tid, checkpoint_ns, channel, version)
    DO UPDATE SET type = excluded.type, value = excluded.value
    """,
    """
    INSERT INTO tk_writes
        (tid, checkpoint_ns, checkpoint_id, task_id, idx, task_path, channel, type, value)
    SELECT :target, checkpoint_ns, checkpoint_id, task_id, idx, task_path, channel, type, value
    FROM tk_writes WHERE tid = :source
    ON CONFLICT (tid, checkpoint_ns, checkpoint_id, task_id, idx) DO UPDATE SET
        task_path = excluded.task_path, channel = excluded.channel,
        type = excluded.type, value = excluded.value
    """,
    """
    INSERT INTO tk_messages (tid, digest, type, value)
    SELECT :target, digest, type, value FROM tk_messages WHERE tid = :source
    ON CONFLICT DO NOTHING
    """,
    """
    INSERT INTO tk_message_links (tid, node, prev, digest)
    SELECT :target, node, prev, digest FROM tk_message_links WHERE tid = :source
    ON CONFLICT DO NOTHING
    """,  # the tool-call ledger (SPEC TM5): a copied entry is the same call, and keeps its key
    """
    INSERT INTO tk_tool_calls
        (tid, message_id, call_id, tool, key, claim, status, type, value, error, started_at, finished_at)
    SELECT :target, message_id, call_id, tool, key, claim, status, type, value, error, started_at,
           finished_at
    FROM tk_tool_calls WHERE tid = :source ORDER BY started_at, rowid
    ON CONFLICT (tid, message_id, call_id) DO UPDATE SET
        tool = excluded.tool, key = excluded.key, claim = excluded.claim, status = excluded.status,
        type = excluded.type, value = excluded.value, error = excluded.error,
        started_at = excluded.started_at, finished_at = excluded.finished_at
    """,
)

# --- format gate, migrations, reset -------------------------------------------------------

SELECT_TABLES = "SELECT name FROM sqlite_master WHERE type = 'table'"
SELECT_META = "SELECT value FROM tk_meta WHERE key = :key"
# The format gate's quick check: whether both of its tables exist, then, in one statement,
# the recorded format and migrations.
GATE_TABLES = (
    "SELECT count(*) = 2 FROM sqlite_master WHERE type = 'table' AND name IN ('tk_meta', 'tk_migrations')"
)
SELECT_GATE = """
SELECT 'meta', value FROM tk_meta WHERE key = :key
UNION ALL SELECT 'migration', CAST(version AS TEXT) FROM tk_migrations
"""
INSERT_META = "INSERT INTO tk_meta (key, value) VALUES (:key, :value) ON CONFLICT DO NOTHING"
UPGRADE_META = (
    "UPDATE tk_meta SET value = :value WHERE key = :key AND value IN (SELECT value FROM json_each(:readable))"
)

# Only threadkeep's own tables are the store: a file may also hold another application's
# tables, LangGraph's own SqliteSaver's (checkpoints, writes) included, which are left alone.
CHECKPOINT_TABLES: dict[str, str] = {
    "tk_checkpoints": "SELECT EXISTS (SELECT 1 FROM tk_checkpoints)",
}

CREATE_MIGRATIONS = """
CREATE TABLE IF NOT EXISTS tk_migrations (version INTEGER PRIMARY KEY, applied_at REAL NOT NULL)
"""
SELECT_MIGRATIONS = "SELECT version FROM tk_migrations ORDER BY version"
RECORD_MIGRATION = "INSERT INTO tk_migrations (version, applied_at) VALUES (:version, :now)"

RESET: tuple[str, ...] = (
    "DROP TABLE IF EXISTS tk_tool_calls",
    "DROP TABLE IF EXISTS tk_parks",
    "DROP TABLE IF EXISTS tk_message_links",
    "DROP TABLE IF EXISTS tk_messages",
    "DROP TABLE IF EXISTS tk_writes",
    "DROP TABLE IF EXISTS tk_blobs",
    "DROP TABLE IF EXISTS tk_checkpoints",
    "DROP TABLE IF EXISTS tk_threads",
    "DROP TABLE IF EXISTS tk_meta",
    "DROP TABLE IF EXISTS tk_migrations",
)

# What the store holds; :tid restricts it to one thread (NULL: the whole store). Channel
# values are the rows of tk_blobs and the entries of checkpoints' vals. A message link counts
# 48 bytes: its node, previous node and digest.
STATS = """
SELECT
    (SELECT count(*) FROM tk_threads WHERE :tid IS NULL OR tid = :tid),
    (SELECT count(*) FROM tk_checkpoints WHERE :tid IS NULL OR tid = :tid),
    (SELECT count(*) FROM tk_blobs WHERE :tid IS NULL OR tid = :tid)
    + (SELECT count(*) FROM tk_checkpoints AS c CROSS JOIN json_each(c.vals)
       WHERE :tid IS NULL OR c.tid = :tid),
    (SELECT count(*) FROM tk_writes WHERE :tid IS NULL OR tid = :tid),
    (SELECT count(*) FROM tk_messages WHERE :tid IS NULL OR tid = :tid),
    (SELECT coalesce(sum(length(checkpoint) + length(metadata) + coalesce(length(vals), 0)), 0)
     FROM tk_checkpoints
     WHERE :tid IS NULL OR tid = :tid)
    + (SELECT coalesce(sum(length(value)), 0) FROM tk_blobs WHERE :tid IS NULL OR tid = :tid)
    + (SELECT coalesce(sum(length(value)), 0) FROM tk_writes WHERE :tid IS NULL OR tid = :tid)
    + (SELECT coalesce(sum(length(value)), 0) FROM tk_messages WHERE :tid IS NULL OR tid = :tid)
    + (SELECT count(*) * 48 FROM tk_message_links WHERE :tid IS NULL OR tid = :tid)
"""


_MANY = {
    "message": INSERT_MESSAGE,
    "link": INSERT_LINK,
    "blob": UPSERT_BLOB,
    "write": INSERT_WRITE,
    "special_write": UPSERT_WRITE,
    "write_message": INSERT_WRITE_MESSAGE,
}


def many(kind: str, common: dict[str, object], rows: list[dict[str, object]]) -> SqlMany:
    """In process, one statement per row costs nothing extra."""
    return SqlMany(_MANY[kind], [{**common, **row} for row in rows])


def text_list(items: list[str]) -> object:
    """A list of strings as one parameter (``json_each`` reads it)."""
    return orjson.dumps(items).decode()


def metadata_filter(wanted: Mapping[str, object]) -> object:
    """SQLite lists filter metadata in the program only; no parameter is needed."""
    return None


# --- retention (SPEC RT1-RT5, SW1-SW8); see the Postgres dialect for what each does ---------

_IDS = "(SELECT value FROM json_each(:thread_ids))"
_TIDS = "(SELECT value FROM json_each(:tids))"

START_THREAD = """
INSERT INTO tk_threads (thread_id, owner, active_at, waiting_minutes, finished_minutes)
VALUES (:thread_id, :owner, :now, :waiting, :finished)
ON CONFLICT (thread_id) DO UPDATE SET
    finished_due = NULL, waiting_minutes = excluded.waiting_minutes,
    finished_minutes = excluded.finished_minutes,
    active_at = max(tk_threads.active_at, excluded.active_at)
WHERE :required_owner IS NULL OR tk_threads.owner = :required_owner
RETURNING owner
"""

MARK_FINISHED = (
    """
UPDATE tk_threads SET finished_due = :now + 60 * COALESCE(
    finished_minutes, min(:finished, COALESCE(waiting_minutes, :finished)))
WHERE thread_id IN """
    + _IDS
    + """
  AND (:required_owner IS NULL OR owner = :required_owner)
RETURNING thread_id, finished_due
"""
)

THREAD_RETENTION = """
SELECT waiting_minutes, finished_minutes, finished_due FROM tk_threads
WHERE thread_id = :thread_id AND (:owner IS NULL OR owner = :owner)
"""

_FINISHED = "t.finished_due <= :now"
_WAITING = """t.finished_due IS NULL
  AND max(COALESCE((SELECT max(c.created_at) FROM tk_checkpoints AS c WHERE c.tid = t.tid), 0), t.active_at)
      < :now - 60 * COALESCE(t.waiting_minutes, :waiting)"""
_PAGE = """
SELECT t.tid, t.thread_id, t.owner FROM tk_threads AS t
WHERE t.tid > :after AND {past}
ORDER BY t.tid LIMIT :limit
"""
FINISHED_PAGE = _PAGE.format(past=_FINISHED)
WAITING_PAGE = _PAGE.format(past=_WAITING)
FINISHED_COUNT = f"SELECT count(*) FROM tk_threads AS t WHERE {_FINISHED}"
WAITING_COUNT = f"SELECT count(*) FROM tk_threads AS t WHERE {_WAITING}"

LOCK_THREADS = "SELECT 1"  # the transaction (BEGIN IMMEDIATE) already excludes writers

# The named threads with their owners, for a delete, prune, copy or owner change to check
# the owner of before it acts (the transaction holds the database: nothing changes between).
LOCK_OWNED = "SELECT tid, thread_id, owner FROM tk_threads WHERE thread_id IN " + _IDS + " ORDER BY tid"

# Hands threads to another owner (threadkeep.ThreadkeepSaver.assign_owner).
ASSIGN_OWNER = "UPDATE tk_threads SET owner = :owner WHERE tid IN " + _TIDS

# The threads' rows go first, and a sweep's only if they are still past the horizon and not
# parked (a run may have started on one since the page was read); the statements after it
# delete what the deleted threads held.
_LIVE_PARK = "EXISTS (SELECT 1 FROM tk_parks AS p WHERE p.tid = t.tid AND p.deadline > :now)"
_DELETE_ROWS = (
    "DELETE FROM tk_threads WHERE tid IN "
    "(SELECT t.tid FROM tk_threads AS t WHERE t.tid IN {_TIDS}{past}) RETURNING tid"
)
DELETE_NAMED = _DELETE_ROWS.format(_TIDS=_TIDS, past="")
DELETE_FINISHED = _DELETE_ROWS.format(_TIDS=_TIDS, past=f" AND {_FINISHED} AND NOT {_LIVE_PARK}")
DELETE_WAITING = _DELETE_ROWS.format(_TIDS=_TIDS, past=f" AND {_WAITING} AND NOT {_LIVE_PARK}")
DELETE_THREAD_ROWS: tuple[str, ...] = tuple(
    f"DELETE FROM {table} WHERE tid IN {_TIDS}"
    for table in (
        "tk_checkpoints",
        "tk_blobs",
        "tk_writes",
        "tk_messages",
        "tk_message_links",
        "tk_parks",
        "tk_tool_calls",
    )
)

THREADS_NAMED = "SELECT tid, thread_id, owner FROM tk_threads WHERE thread_id IN " + _IDS

RECORD_PARK = """
INSERT INTO tk_parks (tid, park_id, deadline)
SELECT tid, :park_id, :deadline FROM tk_threads
WHERE thread_id = :thread_id AND (:required_owner IS NULL OR owner = :required_owner)
ON CONFLICT (tid, park_id) DO UPDATE SET deadline = excluded.deadline
RETURNING tid
"""

CLEAR_PARK = """
DELETE FROM tk_parks
WHERE park_id = :park_id AND tid = (
    SELECT tid FROM tk_threads
    WHERE thread_id = :thread_id AND (:required_owner IS NULL OR owner = :required_owner))
RETURNING tid
"""

LIVE_PARKS = (
    """
SELECT DISTINCT t.thread_id FROM tk_parks AS p JOIN tk_threads AS t ON t.tid = p.tid
WHERE t.thread_id IN """
    + _IDS
    + """ AND p.deadline > :now AND (:owner IS NULL OR t.owner = :owner)
"""
)

# With :since, only a thread whose newest root checkpoint was stored at or after it (see
# the postgres twin).
INTERRUPTED = (
    """
SELECT t.thread_id FROM tk_threads AS t
JOIN tk_checkpoints AS c ON c.tid = t.tid AND c.checkpoint_ns = ''
  AND c.checkpoint_id = (SELECT n.checkpoint_id FROM tk_checkpoints AS n
                         WHERE n.tid = t.tid AND n.checkpoint_ns = ''
                         ORDER BY n.checkpoint_id DESC LIMIT 1)
WHERE t.thread_id IN """
    + _IDS
    + """
  AND (:since IS NULL OR c.created_at >= :since)
  AND EXISTS (
    SELECT 1 FROM tk_writes AS w
    WHERE w.tid = t.tid AND w.checkpoint_ns = '' AND w.checkpoint_id = c.checkpoint_id
      AND w.channel = '__interrupt__')
"""
)

# --- the tool-call ledger (SPEC TM5; backends/sql/ledger.py) ----------------------------------

BEGIN_CALL = """
INSERT INTO tk_tool_calls (tid, message_id, call_id, tool, key, claim, status, started_at)
SELECT tid, :message_id, :call_id, :tool, :key, :claim, 'started', :now FROM tk_threads
WHERE thread_id = :thread_id AND (:required_owner IS NULL OR owner = :required_owner)
ON CONFLICT (tid, message_id, call_id) DO NOTHING
"""

SELECT_CALL = """
SELECT t.owner, c.tool, c.key, c.claim, c.status, c.type, c.value, c.error, c.started_at, c.finished_at
FROM tk_threads AS t
LEFT JOIN tk_tool_calls AS c ON c.tid = t.tid AND c.message_id = :message_id AND c.call_id = :call_id
WHERE t.thread_id = :thread_id
"""

END_CALL = """
UPDATE tk_tool_calls
SET status = :status, type = :type, value = :value, error = :error, finished_at = :now
WHERE tid = (SELECT tid FROM tk_threads
             WHERE thread_id = :thread_id AND (:required_owner IS NULL OR owner = :required_owner))
  AND message_id = :message_id AND call_id = :call_id AND status = 'started'
RETURNING tid
"""

# Oldest first: by when each was begun, then in the order they were recorded.
LIST_CALLS = """
SELECT c.message_id, c.call_id, c.tool, c.key, c.claim, c.status, c.type, c.value, c.error,
       c.started_at, c.finished_at
FROM tk_tool_calls AS c JOIN tk_threads AS t ON t.tid = c.tid
WHERE t.thread_id = :thread_id AND (:owner IS NULL OR t.owner = :owner)
ORDER BY c.started_at, c.rowid
"""


# --- the thread listing (SPEC SV1, SV3; see the postgres twin) ----------------------------------

_LISTED = """SELECT * FROM (SELECT t.tid, t.thread_id, t.owner, t.active_at, t.waiting_minutes,
        t.finished_due, t.interrupt_at
 FROM tk_threads AS t
 WHERE {where}
   AND (t.active_at, t.thread_id) < (:at, :id)
   AND t.active_at >= :after AND t.active_at < :before
   AND NOT (:unparked AND EXISTS (
       SELECT 1 FROM tk_parks AS p WHERE p.tid = t.tid AND p.deadline > :now))
 ORDER BY t.active_at DESC, t.thread_id DESC LIMIT :limit)"""
_STATE_RANGE = "t.state = {state} AND (:state IS NULL OR :state = {state})"
_DETAILS = """
SELECT l.thread_id, l.owner, l.active_at, l.waiting_minutes, l.finished_due, l.interrupt_at,
       c.checkpoint_id, c.metadata,
       (SELECT max(p.deadline) FROM tk_parks AS p WHERE p.tid = l.tid AND p.deadline > :now)
FROM (SELECT * FROM ({listed}) ORDER BY active_at DESC, thread_id DESC LIMIT :limit) AS l
LEFT JOIN tk_checkpoints AS c ON c.tid = l.tid AND c.checkpoint_ns = ''
  AND c.checkpoint_id = (SELECT max(n.checkpoint_id) FROM tk_checkpoints AS n
                         WHERE n.tid = l.tid AND n.checkpoint_ns = '')
ORDER BY l.active_at DESC, l.thread_id DESC
"""


def _by_state(owner: str) -> str:
    return "\nUNION ALL\n".join(
        _LISTED.format(where=owner + _STATE_RANGE.format(state=state)) for state in (0, 1, 2)
    )


THREADS_PAGE = _DETAILS.format(listed=_by_state(""))
THREADS_PAGE_OF_OWNER = _DETAILS.format(listed=_by_state("t.owner = :owner AND "))
THREADS_PARKED = _DETAILS.format(
    listed=_LISTED.format(
        where="t.tid IN (SELECT p.tid FROM tk_parks AS p WHERE p.deadline > :now)"
        " AND (:owner IS NULL OR t.owner = :owner)"
    )
)
THREAD_ROW = _DETAILS.format(
    listed=_LISTED.format(where="t.thread_id = :thread_id AND (:owner IS NULL OR t.owner = :owner)")
)

REFRESH_THREADS = f"""
UPDATE tk_threads SET
    active_at = max(active_at, coalesce(
        (SELECT max(c.created_at) FROM tk_checkpoints AS c WHERE c.tid = tk_threads.tid), 0)),
    interrupt_at = (
        SELECT c.checkpoint_id FROM tk_checkpoints AS c
        WHERE c.tid = tk_threads.tid AND c.checkpoint_ns = ''
          AND c.checkpoint_id = (SELECT max(n.checkpoint_id) FROM tk_checkpoints AS n
                                 WHERE n.tid = tk_threads.tid AND n.checkpoint_ns = '')
          AND EXISTS (SELECT 1 FROM tk_writes AS w
                      WHERE w.tid = c.tid AND w.checkpoint_ns = '' AND w.checkpoint_id = c.checkpoint_id
                        AND w.channel = '__interrupt__'))
WHERE tid IN {_TIDS}
"""
