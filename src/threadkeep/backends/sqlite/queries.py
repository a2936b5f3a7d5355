"""The SQLite dialect: every statement the SQL programs run, as named constants.

Parameters are named (``:name``). No statement is ever built from values: the one generated
constant, :data:`PROBE_LINKS`, only repeats placeholders.
"""

from __future__ import annotations

import orjson

NAME = "sqlite"
PROBE_WIDTH = 32

# --- threads -----------------------------------------------------------------------------

# A write first makes sure its thread exists (owned by the writer if new) ...
INSERT_THREAD = """
INSERT INTO tk_threads (thread_id, owner, created_at) VALUES (:thread_id, :owner, :now)
ON CONFLICT (thread_id) DO NOTHING
"""

# ... then reads its owner and the head of the namespace it writes; nothing is rewritten.
# (SQLite's write lock, taken by BEGIN IMMEDIATE, already serializes writers.)
THREAD_FOR_WRITE = """
SELECT t.tid, t.owner,
    (SELECT c.checkpoint_id FROM tk_checkpoints AS c
     WHERE c.tid = t.tid AND c.checkpoint_ns = :checkpoint_ns
     ORDER BY c.checkpoint_id DESC LIMIT 1),
    EXISTS (SELECT 1 FROM tk_checkpoints AS c
            WHERE c.tid = t.tid AND c.checkpoint_ns = :checkpoint_ns AND c.checkpoint_id = :checkpoint_id)
FROM tk_threads AS t WHERE t.thread_id = :thread_id
"""

THREAD_FOR_READ = """
SELECT tid FROM tk_threads
WHERE thread_id = :thread_id AND (:owner IS NULL OR owner = :owner)
"""

# --- put ---------------------------------------------------------------------------------

PROBE_LINKS = (
    "SELECT node FROM tk_message_links WHERE tid = :tid AND node IN ("
    + ", ".join(f":n{i}" for i in range(PROBE_WIDTH))
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
    (tid, checkpoint_ns, checkpoint_id, parent_id, run_id, created_at, checkpoint, metadata)
VALUES (:tid, :checkpoint_ns, :checkpoint_id, :parent_id, :run_id, :now, :checkpoint, :metadata)
ON CONFLICT (tid, checkpoint_ns, checkpoint_id) DO UPDATE SET
    parent_id = excluded.parent_id, run_id = excluded.run_id,
    checkpoint = excluded.checkpoint, metadata = excluded.metadata
"""

# --- put_writes --------------------------------------------------------------------------

# Whether writes target a checkpoint the history limit already pruned (they arrived late).
WRITES_TARGET_PRUNED = """
SELECT NOT EXISTS (SELECT 1 FROM tk_checkpoints
                   WHERE tid = :tid AND checkpoint_ns = :checkpoint_ns AND checkpoint_id = :checkpoint_id)
   AND :checkpoint_id < (SELECT checkpoint_id FROM tk_checkpoints
                         WHERE tid = :tid AND checkpoint_ns = :checkpoint_ns
                         ORDER BY checkpoint_id DESC LIMIT 1 OFFSET :offset)
"""

INSERT_WRITE = """
INSERT INTO tk_writes (tid, checkpoint_ns, checkpoint_id, task_id, idx, task_path, channel, type, value)
VALUES (:tid, :checkpoint_ns, :checkpoint_id, :task_id, :idx, :task_path, :channel, :type, :value)
ON CONFLICT DO NOTHING
"""

UPSERT_WRITE = """
INSERT INTO tk_writes (tid, checkpoint_ns, checkpoint_id, task_id, idx, task_path, channel, type, value)
VALUES (:tid, :checkpoint_ns, :checkpoint_id, :task_id, :idx, :task_path, :channel, :type, :value)
ON CONFLICT (tid, checkpoint_ns, checkpoint_id, task_id, idx) DO UPDATE SET
    task_path = excluded.task_path, channel = excluded.channel,
    type = excluded.type, value = excluded.value
"""

# --- reads -------------------------------------------------------------------------------

# The addressed checkpoint (or the newest of the namespace), if the caller may see its thread.
SELECT_LATEST = """
SELECT c.tid, c.checkpoint_id, c.parent_id, c.checkpoint, c.metadata
FROM tk_threads AS t JOIN tk_checkpoints AS c ON c.tid = t.tid
WHERE t.thread_id = :thread_id AND (:owner IS NULL OR t.owner = :owner)
  AND c.checkpoint_ns = :checkpoint_ns
ORDER BY c.checkpoint_id DESC LIMIT 1
"""

SELECT_CHECKPOINT = """
SELECT c.tid, c.checkpoint_id, c.parent_id, c.checkpoint, c.metadata
FROM tk_threads AS t JOIN tk_checkpoints AS c ON c.tid = t.tid
WHERE t.thread_id = :thread_id AND (:owner IS NULL OR t.owner = :owner)
  AND c.checkpoint_ns = :checkpoint_ns AND c.checkpoint_id = :checkpoint_id
"""

# A checkpoint's channel values (kind 0) and its pending writes (kind 1), in one statement.
# The program puts the writes in LangGraph's order (task_path, task_id, idx).
SELECT_VALUES = """
SELECT 0, channel, type, value, NULL, NULL, NULL FROM tk_blobs
WHERE tid = :tid AND checkpoint_ns = :checkpoint_ns
  AND (channel, version) IN (SELECT value ->> 0, value ->> 1 FROM json_each(:pairs))
UNION ALL
SELECT 1, channel, type, value, task_id, task_path, idx FROM tk_writes
WHERE tid = :tid AND checkpoint_ns = :checkpoint_ns AND checkpoint_id = :checkpoint_id
"""

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

_LIST_COLUMNS = """
SELECT t.thread_id, c.tid, c.checkpoint_ns, c.checkpoint_id, c.parent_id, c.checkpoint, c.metadata
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

DELETE_THREAD: tuple[str, ...] = (
    "DELETE FROM tk_checkpoints WHERE tid = :tid",
    "DELETE FROM tk_blobs WHERE tid = :tid",
    "DELETE FROM tk_writes WHERE tid = :tid",
    "DELETE FROM tk_messages WHERE tid = :tid",
    "DELETE FROM tk_message_links WHERE tid = :tid",
    "DELETE FROM tk_threads WHERE tid = :tid",
)

SELECT_RUN_CHECKPOINTS = """
SELECT c.tid, c.checkpoint_ns, c.checkpoint_id
FROM tk_checkpoints AS c JOIN tk_threads AS t ON t.tid = c.tid
WHERE c.run_id IN (SELECT value FROM json_each(:run_ids))
  AND (:owner IS NULL OR t.owner = :owner)
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

SELECT_KEEP_CUTOFF = """
SELECT checkpoint_id FROM tk_checkpoints
WHERE tid = :tid AND checkpoint_ns = :checkpoint_ns
ORDER BY checkpoint_id DESC LIMIT 1 OFFSET :offset
"""

DELETE_CHECKPOINTS_BEFORE = """
DELETE FROM tk_checkpoints
WHERE tid = :tid AND checkpoint_ns = :checkpoint_ns AND checkpoint_id < :cutoff
RETURNING checkpoint_id
"""

DELETE_WRITES_BEFORE = """
DELETE FROM tk_writes
WHERE tid = :tid AND checkpoint_ns = :checkpoint_ns AND checkpoint_id < :cutoff
"""

SELECT_REFERENCED_VERSIONS = """
SELECT DISTINCT version.key, version.value
FROM tk_checkpoints AS c, json_each(c.checkpoint, '$.channel_versions') AS version
WHERE c.tid = :tid AND c.checkpoint_ns = :checkpoint_ns
"""

SELECT_BLOB_KEYS = """
SELECT channel, version FROM tk_blobs WHERE tid = :tid AND checkpoint_ns = :checkpoint_ns
"""

DELETE_BLOB = """
DELETE FROM tk_blobs
WHERE tid = :tid AND checkpoint_ns = :checkpoint_ns AND channel = :channel AND version = :version
"""

COPY_THREAD: tuple[str, ...] = (
    """
    INSERT INTO tk_checkpoints
        (tid, checkpoint_ns, checkpoint_id, parent_id, run_id, created_at, checkpoint, metadata)
    SELECT :target, checkpoint_ns, checkpoint_id, parent_id, run_id, created_at, checkpoint, metadata
    FROM tk_checkpoints WHERE tid = :source
    ON CONFLICT (tid, checkpoint_ns, checkpoint_id) DO UPDATE SET
        parent_id = excluded.parent_id, run_id = excluded.run_id,
        checkpoint = excluded.checkpoint, metadata = excluded.metadata
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
    """,
)

# --- format gate, migrations, reset -------------------------------------------------------

SELECT_TABLES = "SELECT name FROM sqlite_master WHERE type = 'table'"
SELECT_META = "SELECT value FROM tk_meta WHERE key = :key"
INSERT_META = "INSERT INTO tk_meta (key, value) VALUES (:key, :value) ON CONFLICT DO NOTHING"

# A table that holds checkpoints of any format, and the probe that says whether it has rows.
CHECKPOINT_TABLES: dict[str, str] = {
    "tk_checkpoints": "SELECT EXISTS (SELECT 1 FROM tk_checkpoints)",
    "checkpoints": "SELECT EXISTS (SELECT 1 FROM checkpoints)",
    "writes": "SELECT EXISTS (SELECT 1 FROM writes)",
}

CREATE_MIGRATIONS = """
CREATE TABLE IF NOT EXISTS tk_migrations (version INTEGER PRIMARY KEY, applied_at REAL NOT NULL)
"""
SELECT_MIGRATIONS = "SELECT version FROM tk_migrations ORDER BY version"
RECORD_MIGRATION = "INSERT INTO tk_migrations (version, applied_at) VALUES (:version, :now)"

RESET: tuple[str, ...] = (
    "DROP TABLE IF EXISTS tk_message_links",
    "DROP TABLE IF EXISTS tk_messages",
    "DROP TABLE IF EXISTS tk_writes",
    "DROP TABLE IF EXISTS tk_blobs",
    "DROP TABLE IF EXISTS tk_checkpoints",
    "DROP TABLE IF EXISTS tk_threads",
    "DROP TABLE IF EXISTS tk_meta",
    "DROP TABLE IF EXISTS tk_migrations",
    # LangGraph SqliteSaver's tables: checkpoints of another format.
    "DROP TABLE IF EXISTS checkpoints",
    "DROP TABLE IF EXISTS writes",
)

# What the store holds; :tid restricts it to one thread (NULL: the whole store). A message
# link counts 48 bytes: its node, previous node and digest.
STATS = """
SELECT
    (SELECT count(*) FROM tk_threads WHERE :tid IS NULL OR tid = :tid),
    (SELECT count(*) FROM tk_checkpoints WHERE :tid IS NULL OR tid = :tid),
    (SELECT count(*) FROM tk_blobs WHERE :tid IS NULL OR tid = :tid),
    (SELECT count(*) FROM tk_writes WHERE :tid IS NULL OR tid = :tid),
    (SELECT count(*) FROM tk_messages WHERE :tid IS NULL OR tid = :tid),
    (SELECT coalesce(sum(length(checkpoint) + length(metadata)), 0) FROM tk_checkpoints
     WHERE :tid IS NULL OR tid = :tid)
    + (SELECT coalesce(sum(length(value)), 0) FROM tk_blobs WHERE :tid IS NULL OR tid = :tid)
    + (SELECT coalesce(sum(length(value)), 0) FROM tk_writes WHERE :tid IS NULL OR tid = :tid)
    + (SELECT coalesce(sum(length(value)), 0) FROM tk_messages WHERE :tid IS NULL OR tid = :tid)
    + (SELECT count(*) * 48 FROM tk_message_links WHERE :tid IS NULL OR tid = :tid)
"""


def pairs(items: list[tuple[str, str]]) -> object:
    """The ``:pairs`` parameter of :data:`SELECT_VALUES`: (channel, version) pairs."""
    return orjson.dumps(items).decode()


def text_list(items: list[str]) -> object:
    """A list of strings as one parameter (``json_each`` reads it)."""
    return orjson.dumps(items).decode()
