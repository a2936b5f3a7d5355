"""The Postgres dialect: every statement the SQL programs run, as named constants.

Parameters are named (``%(name)s``, psycopg's form); a parameter that may be NULL is cast
so the server knows its type. No statement is ever built from values: the generated
constants only repeat placeholders or join other constants.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping

import orjson

from threadkeep.core.messages import LINK_PAGE
from threadkeep.core.program import Sql

NAME = "postgres"
PROBE_WIDTH = 32

# --- threads ------------------------------------------------------------------------------

# Serializes schema changes (the format gate, migrations) across every process.
LOCK_SCHEMA = "SELECT pg_advisory_xact_lock(7446327318420116991)"

# A write first makes sure its thread exists (owned by the writer if new) ...
INSERT_THREAD = """
INSERT INTO tk_threads (thread_id, owner, active_at) VALUES (%(thread_id)s, %(owner)s, %(now)s)
ON CONFLICT (thread_id) DO NOTHING
"""

# ... then locks its row (writers of one thread queue here; other threads run in parallel)
# and reads its owner. The row is not rewritten, nor deleted: NO KEY UPDATE, which a task's
# writes (below) do not wait for, as a delete's FOR UPDATE (LOCK_THREADS) makes them.
LOCK_THREAD = """
SELECT tid, owner FROM tk_threads WHERE thread_id = %(thread_id)s FOR NO KEY UPDATE
"""

# The head of the namespace a write continues, and whether its checkpoint is stored already.
# Its own statement, after the lock: a statement reads the snapshot it started with, and a
# writer that waited for the lock must see what the one before it committed (SPEC W2).
THREAD_HEAD = """
SELECT
    (SELECT c.checkpoint_id FROM tk_checkpoints AS c
     WHERE c.tid = t.tid AND c.checkpoint_ns = %(checkpoint_ns)s
     ORDER BY c.checkpoint_id DESC LIMIT 1),
    EXISTS (SELECT 1 FROM tk_checkpoints AS c
            WHERE c.tid = t.tid AND c.checkpoint_ns = %(checkpoint_ns)s
              AND c.checkpoint_id = %(checkpoint_id)s::text)
FROM tk_threads AS t WHERE t.thread_id = %(thread_id)s
"""

# For each channel a put leaves unchanged ({channel: version} in %(unchanged)s): whether the
# parent holds it at that version, and the parent's entry for it in vals if it has one.
# No rows when there is no parent.
PARENT_VALUES = """
SELECT u.key, coalesce(p.checkpoint -> 'channel_versions' ->> u.key = u.value, false),
       p.vals ->> u.key
FROM tk_checkpoints AS p CROSS JOIN jsonb_each_text(%(unchanged)s::jsonb) AS u
WHERE p.tid = (SELECT t.tid FROM tk_threads AS t WHERE t.thread_id = %(thread_id)s)
  AND p.checkpoint_ns = %(checkpoint_ns)s AND p.checkpoint_id = %(parent_id)s::text
"""

THREAD_FOR_READ = """
SELECT tid FROM tk_threads
WHERE thread_id = %(thread_id)s AND (%(owner)s::text IS NULL OR owner = %(owner)s::text)
"""

# --- put ---------------------------------------------------------------------------------

PROBE_LINKS = (
    "SELECT l.node FROM tk_message_links AS l JOIN tk_threads AS t ON l.tid = t.tid "
    "WHERE t.thread_id = %(thread_id)s AND l.node IN ("
    + ", ".join(f"%(n{i})s" for i in range(PROBE_WIDTH))
    + ")"
)

# Messages of a thread by digest (those its pending writes refer to), PROBE_WIDTH at a time.
SELECT_MESSAGES = (
    "SELECT digest, type, value FROM tk_messages WHERE tid = %(tid)s AND digest IN ("
    + ", ".join(f"%(d{i})s" for i in range(PROBE_WIDTH))
    + ")"
)

UPSERT_CHECKPOINT = """
INSERT INTO tk_checkpoints
    (tid, checkpoint_ns, checkpoint_id, parent_id, run_id, created_at, checkpoint, metadata, vals)
VALUES (%(tid)s, %(checkpoint_ns)s, %(checkpoint_id)s, %(parent_id)s, %(run_id)s, %(now)s,
        %(checkpoint)s::json, %(metadata)s::json, %(vals)s::jsonb)
ON CONFLICT (tid, checkpoint_ns, checkpoint_id) DO UPDATE SET
    parent_id = EXCLUDED.parent_id, run_id = EXCLUDED.run_id,
    checkpoint = EXCLUDED.checkpoint, metadata = EXCLUDED.metadata, vals = EXCLUDED.vals
"""

# Keep only the newest %(offset)s + 1 checkpoints of a namespace: delete the older ones, their
# writes, and the channel values no kept checkpoint refers to, in one statement. Every part
# reads the snapshot from before the deletes, so the values are matched against the kept
# checkpoints by id (all of them when there are no more than that many: cutoff is NULL).
KEEP_NEWEST: tuple[str, ...] = (
    """
WITH cutoff AS (
    SELECT (SELECT checkpoint_id FROM tk_checkpoints
            WHERE tid = %(tid)s AND checkpoint_ns = %(checkpoint_ns)s
            ORDER BY checkpoint_id DESC LIMIT 1 OFFSET %(offset)s) AS id
), writes AS (
    DELETE FROM tk_writes WHERE tid = %(tid)s AND checkpoint_ns = %(checkpoint_ns)s
      AND checkpoint_id < (SELECT id FROM cutoff)
), checkpoints AS (
    DELETE FROM tk_checkpoints WHERE tid = %(tid)s AND checkpoint_ns = %(checkpoint_ns)s
      AND checkpoint_id < (SELECT id FROM cutoff)
)
DELETE FROM tk_blobs
WHERE tid = %(tid)s AND checkpoint_ns = %(checkpoint_ns)s
  AND (channel, version) NOT IN (
      SELECT version.key, version.value
      FROM tk_checkpoints AS c, json_each_text(c.checkpoint -> 'channel_versions') AS version
      WHERE c.tid = %(tid)s AND c.checkpoint_ns = %(checkpoint_ns)s
        AND c.checkpoint_id >= coalesce((SELECT id FROM cutoff), ''))
""",
)

# KEEP_NEWEST after a put as one statement, in its transaction: the thread is the one whose
# head that put set to its checkpoint (and whose owner it may write), so a put whose claim
# failed deletes nothing (the locked put it falls back to keeps the limit itself).
_CLAIMED_THREAD = """(SELECT tid FROM tk_threads
     WHERE thread_id = %(thread_id)s AND head = %(checkpoint_id)s::text
       AND (%(required_owner)s::text IS NULL OR owner = %(required_owner)s::text))"""
_KEEP_NEWEST_OF_THREAD = tuple(statement.replace("%(tid)s", _CLAIMED_THREAD) for statement in KEEP_NEWEST)

# Channel values no checkpoint of the namespace refers to any more.
COLLECT_BLOBS = """
DELETE FROM tk_blobs
WHERE tid = %(tid)s AND checkpoint_ns = %(checkpoint_ns)s
  AND (channel, version) NOT IN (
      SELECT version.key, version.value
      FROM tk_checkpoints AS c, json_each_text(c.checkpoint -> 'channel_versions') AS version
      WHERE c.tid = %(tid)s AND c.checkpoint_ns = %(checkpoint_ns)s)
"""

# --- put_writes --------------------------------------------------------------------------

THREAD_OWNER = "SELECT owner FROM tk_threads WHERE thread_id = %(thread_id)s"

# The newest checkpoint id of a namespace and how many pending writes it has: what the
# tiered cache checks an entry whose lease ran out against (docs/tiered.md). Two index
# probes: the newest key of the namespace, then its writes' keys.
NEWEST_VERSION = """
SELECT c.checkpoint_id,
       (SELECT coalesce(md5(string_agg(
                   w.task_id || chr(31) || w.idx::text || chr(31) || w.type || chr(31) || md5(w.value),
                   chr(30) ORDER BY w.task_id COLLATE "C", w.idx)), '')
        FROM tk_writes AS w
        WHERE w.tid = c.tid AND w.checkpoint_ns = c.checkpoint_ns AND w.checkpoint_id = c.checkpoint_id)
FROM tk_threads AS t JOIN tk_checkpoints AS c ON c.tid = t.tid
WHERE t.thread_id = %(thread_id)s AND (%(owner)s::text IS NULL OR t.owner = %(owner)s::text)
  AND c.checkpoint_ns = %(checkpoint_ns)s
ORDER BY c.checkpoint_id DESC LIMIT 1
"""

# The threads (and owners) that hold checkpoints of the given runs.
RUN_THREADS = """
SELECT DISTINCT t.thread_id, t.owner
FROM tk_checkpoints AS c JOIN tk_threads AS t ON t.tid = c.tid
WHERE c.run_id IN (SELECT jsonb_array_elements_text(%(run_ids)s::jsonb))
  AND (%(owner)s::text IS NULL OR t.owner = %(owner)s::text)
"""

# Rows go in as arrays: one statement however many rows a step has. Each kind: the table and
# its columns, the values every row shares, its array columns (their parameters named
# "{p}<column>", see _insert_rows), what a conflict does.
_ROWS = {
    "message": (
        "tk_messages (tid, digest, type, value)",
        "",
        "%({p}digest)b::bytea[], %({p}type)b::text[], %({p}value)b::bytea[]",
        "DO NOTHING",
    ),
    "link": (
        "tk_message_links (tid, node, prev, digest, page, page_prev)",
        "",
        "%({p}node)b::bytea[], %({p}prev)b::bytea[], %({p}digest)b::bytea[], %({p}page)b::bytea[],"
        " %({p}page_prev)b::bytea[]",
        "DO NOTHING",
    ),
    "blob": (
        "tk_blobs (tid, checkpoint_ns, channel, version, type, value)",
        "%(checkpoint_ns)s, ",
        "%({p}channel)b::text[], %({p}version)b::text[], %({p}type)b::text[], %({p}value)b::bytea[]",
        "(tid, checkpoint_ns, channel, version) DO UPDATE SET type = EXCLUDED.type, value = EXCLUDED.value",
    ),
}


def _insert_rows(kind: str, tid: str = "%(tid)s", source: str = "", prefix: str = "") -> str:
    """The INSERT of rows of ``kind`` for thread ``tid``, reading ``source`` first if any;
    its array parameters are named ``prefix`` + column."""
    table, shared, arrays, conflict = _ROWS[kind]
    return f"""
INSERT INTO {table}
SELECT {tid}, {shared}r.* FROM {source}unnest({arrays.format(p=prefix)}) AS r
ON CONFLICT {conflict}
"""


_MANY = {kind: _insert_rows(kind) for kind in _ROWS}

# --- put in one statement ------------------------------------------------------------------

# A locked put of the root namespace records the head it leaves: the newer of the head it
# read (%(head_id)s) and its own checkpoint.
# It also moves the thread's listed write time (active_at, migration 12) to the put's time
# once it is %(clock_step)s seconds behind (_CLOCK), and forgets an interrupt of a root
# checkpoint older than the head it leaves.
# _CLOCK: active_at is in the listing's indexes, so a put that moves it is not a HOT update
# and adds an entry to every index of tk_threads; moved at most once a step, most puts
# leave the indexed columns as they were (head and interrupt_at are not indexed; the
# listing's state expression changes only with an interrupt or a finished mark).
_CLOCK = "CASE WHEN %(now)s - {t}active_at >= %(clock_step)s THEN %(now)s ELSE {t}active_at END"
SET_HEAD = f"""
UPDATE tk_threads SET head = greatest(%(head_id)s::text, %(checkpoint_id)s::text),
    active_at = {_CLOCK.format(t="")},
    interrupt_at = CASE WHEN interrupt_at >= greatest(%(head_id)s::text, %(checkpoint_id)s::text)
                        THEN interrupt_at END
WHERE tid = %(tid)s
"""

# A put of a subgraph's namespace moves the thread's listed write time (migration 12) only,
# as _CLOCK does: no row version at all while it is less than a step behind.
TOUCH_THREAD = """
UPDATE tk_threads SET active_at = %(now)s
WHERE tid = %(tid)s AND %(now)s - active_at >= %(clock_step)s
"""

# A put that continues the head of its thread's root namespace, as one statement: it sets
# the head in the thread's row (tk_threads.head, migration 5) if it is still the parent, and
# only then writes. An UPDATE that waited for a concurrent writer re-checks its row as that
# writer left it, so two such puts, or one and a locked put (LOCK_THREAD), serialize as the
# lock does (SPEC W2). The condition also looks for a checkpoint newer than the parent
# that the head does not name (one a writer that does not keep the head committed). Every
# other guard the put's first round trip would check is part of the condition: the owner
# (W3), the parent holding each unchanged channel at its version (%(unchanged)s, so its
# entries can be carried), and the links the writer takes for stored (%(known)s, the last
# one of each list's known prefix). No row back: nothing was written, and the put runs as
# usual (a first put, a branch, a conflict, an unknown list).
CLAIM_HEAD = f"""
UPDATE tk_threads AS t SET head = %(checkpoint_id)s::text, active_at = {_CLOCK.format(t="t.")},
    interrupt_at = CASE WHEN t.interrupt_at >= %(checkpoint_id)s::text THEN t.interrupt_at END
WHERE t.thread_id = %(thread_id)s AND t.head = %(parent_id)s::text
  AND %(checkpoint_id)s::text > %(parent_id)s::text
  AND NOT EXISTS (
      SELECT 1 FROM tk_checkpoints AS c
      WHERE c.tid = t.tid AND c.checkpoint_ns = '' AND c.checkpoint_id > %(parent_id)s::text)
  AND (%(required_owner)s::text IS NULL OR t.owner = %(required_owner)s::text)
  AND NOT EXISTS (
      SELECT 1 FROM jsonb_each_text(%(unchanged)s::jsonb) AS u
      WHERE NOT EXISTS (
          SELECT 1 FROM tk_checkpoints AS p
          WHERE p.tid = t.tid AND p.checkpoint_ns = '' AND p.checkpoint_id = %(parent_id)s::text
            AND p.checkpoint -> 'channel_versions' ->> u.key = u.value))
  AND (SELECT count(*) FROM tk_message_links AS l
       WHERE l.tid = t.tid AND l.node = ANY(%(known)b::bytea[])) = cardinality(%(known)b::bytea[])
RETURNING t.tid
"""

# The checkpoint of a claimed put: its own small values, and the parent's entries for the
# channels it left unchanged.
_CLAIMED_CHECKPOINT = """
INSERT INTO tk_checkpoints
    (tid, checkpoint_ns, checkpoint_id, parent_id, run_id, created_at, checkpoint, metadata, vals)
SELECT claim.tid, '', %(checkpoint_id)s, %(parent_id)s, %(run_id)s, %(now)s,
       %(checkpoint)s::json, %(metadata)s::json,
       nullif(coalesce(%(vals)s::jsonb, '{}') || coalesce((
           SELECT jsonb_object_agg(u.key, p.vals -> u.key)
           FROM tk_checkpoints AS p, jsonb_each_text(%(unchanged)s::jsonb) AS u
           WHERE p.tid = claim.tid AND p.checkpoint_ns = '' AND p.checkpoint_id = %(parent_id)s::text
             AND p.vals ? u.key), '{}'), '{}')
FROM claim
ON CONFLICT (tid, checkpoint_ns, checkpoint_id) DO UPDATE SET
    parent_id = EXCLUDED.parent_id, run_id = EXCLUDED.run_id,
    checkpoint = EXCLUDED.checkpoint, metadata = EXCLUDED.metadata, vals = EXCLUDED.vals
"""


@functools.lru_cache(maxsize=16)
def _claimed_put_sql(kinds: tuple[str, ...]) -> str:
    """CLAIM_HEAD, then the rows of ``kinds`` (their array parameters prefixed ``<kind>_``)
    and the checkpoint, each written only for the thread the claim returns."""
    rows = [f"{kind}s AS ({_insert_rows(kind, 'claim.tid', 'claim, ', f'{kind}_')})" for kind in kinds]
    parts = [f"claim AS ({CLAIM_HEAD})", *rows, f"checkpoint AS ({_CLAIMED_CHECKPOINT})"]
    return "WITH " + ",\n".join(parts) + "\nSELECT tid FROM claim"


def claimed_put(
    common: dict[str, object], rows: dict[str, list[dict[str, object]]], keep: int | None
) -> tuple[Sql, ...]:
    """A put as one statement (see CLAIM_HEAD), and under a history limit (``keep``) the
    statement that keeps the newest ``keep`` checkpoints of the thread it claimed (none if
    the claim failed). ``common`` holds CLAIM_HEAD's and the checkpoint's parameters (with
    ``checkpoint_ns``), ``rows`` the rows of each kind (``message``, ``link``, ``blob``) to
    write, as :func:`many` takes them."""
    kinds = tuple(kind for kind in _ROWS if rows.get(kind))
    params = dict(common)
    for kind in kinds:
        for column in rows[kind][0]:
            params[f"{kind}_{column}"] = [row[column] for row in rows[kind]]
    sql = _claimed_put_sql(kinds)
    claimed = Sql(sql, params)
    if keep is None:
        return (claimed,)
    limit = {name: common[name] for name in ("thread_id", "checkpoint_id", "required_owner")}
    limit.update(checkpoint_ns="", offset=keep - 1)
    return (claimed, *(Sql(statement, limit) for statement in _KEEP_NEWEST_OF_THREAD))


# A task's writes are stored only if the writer may write the thread (W3) and, under a
# history limit (%(offset)s set), their checkpoint was not pruned already (LangGraph may
# deliver writes late). Guarded so, they need no transaction: the statement is idempotent.
# It holds the thread's row with FOR KEY SHARE, which a step's put (LOCK_THREAD) does not
# wait for, and a delete (LOCK_THREADS) does: writes that read the thread before a delete
# are committed before it deletes what the thread holds, or they find no thread.
_WRITE_GUARD = """
WHERE t.thread_id = %(thread_id)s
  AND (%(required_owner)s::text IS NULL OR t.owner = %(required_owner)s::text)
  AND (%(offset)s::integer IS NULL
       OR EXISTS (SELECT 1 FROM tk_checkpoints AS c
                  WHERE c.tid = t.tid AND c.checkpoint_ns = %(checkpoint_ns)s
                    AND c.checkpoint_id = %(checkpoint_id)s)
       OR %(checkpoint_id)s::text >= coalesce(
              (SELECT c.checkpoint_id FROM tk_checkpoints AS c
               WHERE c.tid = t.tid AND c.checkpoint_ns = %(checkpoint_ns)s
               ORDER BY c.checkpoint_id DESC LIMIT 1 OFFSET %(offset)s), ''))
FOR KEY SHARE OF t
"""

_WRITES = (
    """
INSERT INTO tk_writes (tid, checkpoint_ns, checkpoint_id, task_id, idx, task_path, channel, type, value)
SELECT t.tid, %(checkpoint_ns)s, %(checkpoint_id)s, w.task_id, w.idx, w.task_path, w.channel, w.type, w.value
FROM tk_threads AS t,
     unnest(%(task_id)b::text[], %(idx)b::integer[], %(task_path)b::text[], %(channel)b::text[],
            %(type)b::text[], %(value)b::bytea[]) AS w (task_id, idx, task_path, channel, type, value)"""
    + _WRITE_GUARD
)

_MANY["write"] = _WRITES + "ON CONFLICT DO NOTHING"

# The messages a task's writes refer to, stored with the thread's others under the writes'
# own guard: a write refused (another user's thread, a pruned checkpoint) leaves none.
_MANY["write_message"] = (
    """
INSERT INTO tk_messages (tid, digest, type, value)
SELECT t.tid, m.digest, m.type, m.value
FROM tk_threads AS t,
     unnest(%(digest)b::bytea[], %(type)b::text[], %(value)b::bytea[]) AS m (digest, type, value)"""
    + _WRITE_GUARD
    + "ON CONFLICT DO NOTHING"
)
_MANY["special_write"] = (
    _WRITES
    + """ON CONFLICT (tid, checkpoint_ns, checkpoint_id, task_id, idx) DO UPDATE SET
    task_path = EXCLUDED.task_path, channel = EXCLUDED.channel,
    type = EXCLUDED.type, value = EXCLUDED.value"""
)

# A task's interrupt write on a root checkpoint names it in its thread's row (interrupt_at,
# migration 12), unless a newer root checkpoint is stored (a late write: LangGraph's rule
# reads the newest one only). Under the writes' owner guard. Sent only with such a write.
# The row's head is part of the test: a put that committed while this waited for the row
# is not in the statement's snapshot (READ COMMITTED), but the row it left is re-read.
MARK_INTERRUPT = """
UPDATE tk_threads AS t SET interrupt_at = greatest(coalesce(t.interrupt_at, ''), %(checkpoint_id)s::text)
WHERE t.thread_id = %(thread_id)s
  AND (%(required_owner)s::text IS NULL OR t.owner = %(required_owner)s::text)
  AND (t.head IS NULL OR t.head <= %(checkpoint_id)s::text)
  AND NOT EXISTS (SELECT 1 FROM tk_checkpoints AS c
                  WHERE c.tid = t.tid AND c.checkpoint_ns = '' AND c.checkpoint_id > %(checkpoint_id)s::text)
"""

# --- reads -------------------------------------------------------------------------------

# One step of a walk from a link: the next node (the one before the link's page, if it has
# one) and the digests it covers, oldest first (its page, else its own message's).
_STEP = """CASE WHEN l.page IS NULL THEN l.prev ELSE l.page_prev END, coalesce(l.page, l.digest)"""
# The length of a list, from its reference (the tail node, then the length in 4 bytes, big
# endian: chain_ref); 0 for a reference of another size, which the reader refuses.
_LENGTH = """CASE WHEN octet_length(chains.ref) = 20 THEN (get_byte(chains.ref, 16)::bigint << 24)
    + (get_byte(chains.ref, 17) << 16) + (get_byte(chains.ref, 18) << 8) + get_byte(chains.ref, 19)
    ELSE 0 END"""

# A checkpoint (the newest of its namespace, or the one named), its channel values, its
# pending writes and (with %(walk)s) the messages of its message lists, in one statement, if
# the caller may see the thread (%(owner)s NULL: any thread). Rows: kind 0 the checkpoint, 1
# a channel value, 2 a pending write, 3 a message of a list, 4 a message a pending write
# refers to; columns: kind, tid, checkpoint_id, parent_id, checkpoint, metadata, channel,
# type, value, task_id, task_path, idx, tail, digest (kind 3: idx is the depth from the tail,
# tail the list's tail node).
#
# Every lookup in it is an index probe by key: the thread, then the checkpoint, then each
# channel value, link and message as a LATERAL lookup, LIMIT 1 so the planner cannot flatten
# it into a join (which would hash every row of the thread: it grows with history). So one
# plan suits every parameter: each connection plans it once (PLANNED_ONCE). A page is
# unpacked by generate_series(0, 31), filtered: constant bounds give the planner a row
# estimate. Rows go out as they are found, so the client reads the first while the server
# looks up the rest. Migration 6 had made this read the PL/pgSQL function tk_state, which
# keeps its plans for the session but gathers every row before it returns the first (about
# 0.5 ms of a 320-message read); it is the same read, and runs where statements are never
# prepared.
_STATE = f"""
WITH RECURSIVE cp AS (
    SELECT c.tid, c.checkpoint_id, c.parent_id, c.checkpoint, c.metadata, c.vals
    FROM tk_threads AS t CROSS JOIN LATERAL (
        SELECT c.tid, c.checkpoint_id, c.parent_id, c.checkpoint, c.metadata, c.vals
        FROM tk_checkpoints AS c
        WHERE c.tid = t.tid AND c.checkpoint_ns = %(checkpoint_ns)s {{checkpoint}}
    ) AS c
    WHERE t.thread_id = %(thread_id)s AND (%(owner)s::text IS NULL OR t.owner = %(owner)s::text)
),
vals AS (
    SELECT b.channel, b.type, b.value
    FROM cp CROSS JOIN json_each_text(cp.checkpoint -> 'channel_versions') AS version
    CROSS JOIN LATERAL (
        SELECT b.channel, b.type, b.value FROM tk_blobs AS b
        WHERE b.tid = cp.tid AND b.checkpoint_ns = %(checkpoint_ns)s
          AND b.channel = version.key AND b.version = version.value LIMIT 1
    ) AS b
    WHERE cp.vals IS NULL OR NOT cp.vals ? version.key
),
chains (ref) AS (
    SELECT vals.value FROM vals WHERE vals.type = 'chain'
    UNION ALL
    SELECT decode(split_part(entry.value, ':', 2), 'base64')
    FROM cp CROSS JOIN jsonb_each_text(cp.vals) AS entry WHERE starts_with(entry.value, 'chain:')
),
-- A row per single link or page: digests (oldest first) ending at depth (0 is the tail),
-- no deeper than the list's length, which its reference holds (a damaged link could loop).
walk (tail, depth, prev, digests, length) AS (
    SELECT link.node, 0, link.prev, link.digests, {_LENGTH}
    FROM cp CROSS JOIN chains CROSS JOIN LATERAL (
        SELECT l.node, {_STEP} FROM tk_message_links AS l
        WHERE l.tid = cp.tid AND l.node = substring(chains.ref FROM 1 FOR 16) LIMIT 1
    ) AS link (node, prev, digests)
    WHERE %(walk)s
    UNION ALL
    SELECT walk.tail, walk.depth + octet_length(walk.digests) / 16, link.prev, link.digests, walk.length
    FROM walk CROSS JOIN cp CROSS JOIN LATERAL (
        SELECT {_STEP} FROM tk_message_links AS l
        WHERE l.tid = cp.tid AND l.node = walk.prev LIMIT 1
    ) AS link (prev, digests)
    WHERE walk.depth + octet_length(walk.digests) / 16 < walk.length
),
walked (tail, depth, digest) AS (
    SELECT walk.tail, walk.depth + size.n - 1 - i, substring(walk.digests FROM i * 16 + 1 FOR 16)
    FROM walk CROSS JOIN LATERAL (SELECT octet_length(walk.digests) / 16 AS n) AS size
    CROSS JOIN generate_series(0, {LINK_PAGE - 1}) AS i
    WHERE i < size.n
)
SELECT 0, cp.tid, cp.checkpoint_id, cp.parent_id, cp.checkpoint::text, cp.metadata::text,
       NULL, NULL, convert_to(cp.vals::text, 'UTF8'), NULL, NULL, NULL::integer, NULL::bytea,
       NULL::bytea
FROM cp
UNION ALL
SELECT 1, NULL, NULL, NULL, NULL, NULL, vals.channel, vals.type, vals.value,
       NULL, NULL, NULL, NULL, NULL
FROM vals
UNION ALL
SELECT 2, NULL, NULL, NULL, NULL, NULL, w.channel, w.type, w.value, w.task_id, w.task_path,
       w.idx, NULL, NULL
FROM cp JOIN tk_writes AS w ON w.tid = cp.tid AND w.checkpoint_ns = %(checkpoint_ns)s
    AND w.checkpoint_id = cp.checkpoint_id
UNION ALL
SELECT 3, NULL, NULL, NULL, NULL, NULL, NULL, message.type, message.value,
       NULL, NULL, walked.depth, walked.tail, walked.digest
FROM walked CROSS JOIN cp CROSS JOIN LATERAL (
    SELECT m.type, m.value FROM tk_messages AS m
    WHERE m.tid = cp.tid AND m.digest = walked.digest LIMIT 1
) AS message
UNION ALL
SELECT 4, NULL, NULL, NULL, NULL, NULL, NULL, message.type, message.value,
       NULL, NULL, NULL, NULL, ref.digest
FROM cp JOIN tk_writes AS w ON w.tid = cp.tid AND w.checkpoint_ns = %(checkpoint_ns)s
    AND w.checkpoint_id = cp.checkpoint_id AND w.type IN ('ref', 'refs')
CROSS JOIN LATERAL (
    SELECT substring(w.value FROM i * 16 + 1 FOR 16) AS digest
    FROM generate_series(0, octet_length(w.value) / 16 - 1) AS i
) AS ref
CROSS JOIN LATERAL (
    SELECT m.type, m.value FROM tk_messages AS m
    WHERE m.tid = cp.tid AND m.digest = ref.digest LIMIT 1
) AS message
"""
SELECT_STATE_LATEST = _STATE.format(checkpoint="ORDER BY c.checkpoint_id DESC LIMIT 1")
SELECT_STATE_AT = _STATE.format(checkpoint="AND c.checkpoint_id = %(checkpoint_id)s LIMIT 1")
SELECT_STATE_BY_FUNCTION = """
SELECT * FROM tk_state(%(thread_id)s, %(owner)s, %(checkpoint_ns)s, %(checkpoint_id)s, %(walk)s)
"""
# Statements whose one plan suits every parameter, each with what runs instead on a
# connection that never prepares (PgBouncer's transaction mode before 1.21): the engine runs
# them as prepared statements on their generic plan (PlannedOnce).
PLANNED_ONCE = {SELECT_STATE_LATEST: SELECT_STATE_BY_FUNCTION, SELECT_STATE_AT: SELECT_STATE_BY_FUNCTION}
# The planner settings they are planned and run with, for their transaction only (the
# engine sends this just before them, in one implicit transaction): the generic plan from
# the first run, so a connection plans them once; no sequential scan, so a plan made on a
# table nearly empty (and analyzed then) still probes by key once the table has grown; no
# JIT, which costs more than any of these runs. Those tk_state sets for itself.
PLANNED_ONCE_SETTINGS = """
SELECT set_config('plan_cache_mode', 'force_generic_plan', true), set_config('enable_seqscan', 'off', true),
       set_config('jit', 'off', true)
"""

# Walks a message chain from its tail, a single link or a page (migration 6) at a time, as
# the state read does; depth 0 is the last message. %(count)s bounds the walk. Rows come back in
# any order; the program orders them by depth. The step is a LATERAL lookup so that each
# link costs one index probe: as a plain join, the planner scans every link of the thread at
# each step on a small or unanalyzed table, which is quadratic.
SELECT_CHAIN = f"""
WITH RECURSIVE walk (depth, prev, digests) AS (
    SELECT 0, {_STEP} FROM tk_message_links AS l WHERE l.tid = %(tid)s AND l.node = %(tail)s
    UNION ALL
    SELECT walk.depth + octet_length(walk.digests) / 16, link.prev, link.digests
    FROM walk CROSS JOIN LATERAL (
        SELECT {_STEP} FROM tk_message_links AS l
        WHERE l.tid = %(tid)s AND l.node = walk.prev LIMIT 1
    ) AS link (prev, digests)
    WHERE walk.depth + octet_length(walk.digests) / 16 < %(count)s
),
walked (depth, digest) AS (
    SELECT walk.depth + size.n - 1 - i, substring(walk.digests FROM i * 16 + 1 FOR 16)
    FROM walk CROSS JOIN LATERAL (SELECT octet_length(walk.digests) / 16 AS n) AS size
    CROSS JOIN generate_series(0, {LINK_PAGE - 1}) AS i
    WHERE i < size.n
)
SELECT walked.depth, walked.digest, message.type, message.value
FROM walked JOIN tk_messages AS message ON message.tid = %(tid)s AND message.digest = walked.digest
"""

# A page of checkpoints, newest first. The metadata filter narrows the page in SQL (jsonb
# containment); the program then keeps only exact matches. jsonb cannot hold a NUL character,
# which a filter or nested metadata may (LangGraph drops it only from top-level strings): both
# sides are compared with their \u0000 escapes read as U+FFFD, and the exact check tells the
# two apart.
_LIST_COLUMNS = """
SELECT t.thread_id, c.tid, c.checkpoint_ns, c.checkpoint_id, c.metadata::text
FROM tk_threads AS t JOIN tk_checkpoints AS c ON c.tid = t.tid
"""

_LIST_CONDITIONS = """
  AND (%(owner)s::text IS NULL OR t.owner = %(owner)s::text)
  AND (%(checkpoint_ns)s::text IS NULL OR c.checkpoint_ns = %(checkpoint_ns)s::text)
  AND (%(checkpoint_id)s::text IS NULL OR c.checkpoint_id = %(checkpoint_id)s::text)
  AND (%(before)s::text IS NULL OR c.checkpoint_id < %(before)s::text)
  AND (%(filter)s::text IS NULL
       OR replace(c.metadata::text, '\\u0000', '\\ufffd')::jsonb
          @> replace(%(filter)s::text, '\\u0000', '\\ufffd')::jsonb)
  AND (%(cursor_id)s::text IS NULL
       OR (c.checkpoint_id, c.tid, c.checkpoint_ns)
          < (%(cursor_id)s::text, %(cursor_tid)s::bigint, %(cursor_ns)s::text))
ORDER BY c.checkpoint_id DESC, c.tid DESC, c.checkpoint_ns DESC
LIMIT %(page_size)s
"""

LIST_THREAD = _LIST_COLUMNS + "WHERE t.thread_id = %(thread_id)s" + _LIST_CONDITIONS
LIST_ALL = _LIST_COLUMNS + "WHERE true" + _LIST_CONDITIONS

# --- deletes, pruning, copies --------------------------------------------------------------

# Every owner's: a delete by run refuses runs on another user's threads (W3).
SELECT_RUN_CHECKPOINTS = """
SELECT c.tid, c.checkpoint_ns, c.checkpoint_id, t.thread_id, t.owner
FROM tk_checkpoints AS c JOIN tk_threads AS t ON t.tid = c.tid
WHERE c.run_id IN (SELECT jsonb_array_elements_text(%(run_ids)s::jsonb))
"""

DELETE_CHECKPOINT = """
DELETE FROM tk_checkpoints
WHERE tid = %(tid)s AND checkpoint_ns = %(checkpoint_ns)s AND checkpoint_id = %(checkpoint_id)s
"""

DELETE_CHECKPOINT_WRITES = """
DELETE FROM tk_writes
WHERE tid = %(tid)s AND checkpoint_ns = %(checkpoint_ns)s AND checkpoint_id = %(checkpoint_id)s
"""

SELECT_NAMESPACES = "SELECT DISTINCT checkpoint_ns FROM tk_checkpoints WHERE tid = %(tid)s"

COPY_THREAD: tuple[str, ...] = (
    """
    INSERT INTO tk_checkpoints
        (tid, checkpoint_ns, checkpoint_id, parent_id, run_id, created_at, checkpoint, metadata, vals)
    SELECT %(target)s, checkpoint_ns, checkpoint_id, parent_id, run_id, created_at, checkpoint,
           metadata, vals
    FROM tk_checkpoints WHERE tid = %(source)s
    ON CONFLICT (tid, checkpoint_ns, checkpoint_id) DO UPDATE SET
        parent_id = EXCLUDED.parent_id, run_id = EXCLUDED.run_id,
        checkpoint = EXCLUDED.checkpoint, metadata = EXCLUDED.metadata, vals = EXCLUDED.vals
    """,
    """
    INSERT INTO tk_blobs (tid, checkpoint_ns, channel, version, type, value)
    SELECT %(target)s, checkpoint_ns, channel, version, type, value FROM tk_blobs WHERE tid = %(source)s
    ON CONFLICT (tid, checkpoint_ns, channel, version)
    DO UPDATE SET type = EXCLUDED.type, value = EXCLUDED.value
    """,
    """
    INSERT INTO tk_writes
        (tid, checkpoint_ns, checkpoint_id, task_id, idx, task_path, channel, type, value)
    SELECT %(target)s, checkpoint_ns, checkpoint_id, task_id, idx, task_path, channel, type, value
    FROM tk_writes WHERE tid = %(source)s
    ON CONFLICT (tid, checkpoint_ns, checkpoint_id, task_id, idx) DO UPDATE SET
        task_path = EXCLUDED.task_path, channel = EXCLUDED.channel,
        type = EXCLUDED.type, value = EXCLUDED.value
    """,
    """
    INSERT INTO tk_messages (tid, digest, type, value)
    SELECT %(target)s, digest, type, value FROM tk_messages WHERE tid = %(source)s
    ON CONFLICT DO NOTHING
    """,
    """
    INSERT INTO tk_message_links (tid, node, prev, digest, page, page_prev)
    SELECT %(target)s, node, prev, digest, page, page_prev FROM tk_message_links WHERE tid = %(source)s
    ON CONFLICT DO NOTHING
    """,  # the tool-call ledger (SPEC TM5): a copied entry is the same call, and keeps its key
    """
    INSERT INTO tk_tool_calls
        (tid, message_id, call_id, tool, key, claim, status, type, value, error, started_at, finished_at)
    SELECT %(target)s, message_id, call_id, tool, key, claim, status, type, value, error, started_at,
           finished_at
    FROM tk_tool_calls WHERE tid = %(source)s ORDER BY started_at, seq
    ON CONFLICT (tid, message_id, call_id) DO UPDATE SET
        tool = EXCLUDED.tool, key = EXCLUDED.key, claim = EXCLUDED.claim, status = EXCLUDED.status,
        type = EXCLUDED.type, value = EXCLUDED.value, error = EXCLUDED.error,
        started_at = EXCLUDED.started_at, finished_at = EXCLUDED.finished_at
    """,
)

# --- format gate, migrations, reset -------------------------------------------------------

SELECT_TABLES = "SELECT tablename FROM pg_tables WHERE schemaname = current_schema()"
SELECT_META = "SELECT value FROM tk_meta WHERE key = %(key)s"
# The format gate's quick check: whether both of its tables exist (a name lookup, not a read
# of the catalog's views), then, in one statement, the recorded format and migrations.
GATE_TABLES = "SELECT to_regclass('tk_meta') IS NOT NULL AND to_regclass('tk_migrations') IS NOT NULL"
SELECT_GATE = """
SELECT 'meta', value FROM tk_meta WHERE key = %(key)s
UNION ALL SELECT 'migration', version::text FROM tk_migrations
"""
INSERT_META = "INSERT INTO tk_meta (key, value) VALUES (%(key)s, %(value)s) ON CONFLICT DO NOTHING"
# A setting recorded with a value this version reads (%(readable)s) takes this version's.
UPGRADE_META = """
UPDATE tk_meta SET value = %(value)s
WHERE key = %(key)s AND value IN (SELECT jsonb_array_elements_text(%(readable)s::jsonb))
"""

# Only threadkeep's own tables are the store: a database is often shared with other
# applications, LangGraph's own savers included, whose tables are left alone.
CHECKPOINT_TABLES: dict[str, str] = {
    "tk_checkpoints": "SELECT EXISTS (SELECT 1 FROM tk_checkpoints)",
}

CREATE_MIGRATIONS = """
CREATE TABLE IF NOT EXISTS tk_migrations (version INTEGER PRIMARY KEY, applied_at DOUBLE PRECISION NOT NULL)
"""
SELECT_MIGRATIONS = "SELECT version FROM tk_migrations ORDER BY version"
RECORD_MIGRATION = "INSERT INTO tk_migrations (version, applied_at) VALUES (%(version)s, %(now)s)"

RESET: tuple[str, ...] = (
    "DROP FUNCTION IF EXISTS tk_state",
    "DROP TABLE IF EXISTS tk_flush",
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

# What the store holds; %(tid)s restricts it to one thread (NULL: the whole store). Channel
# values are the rows of tk_blobs and the entries of checkpoints' vals. A message link counts
# 48 bytes (its node, previous node and digest) and its page, if any.
STATS = """
SELECT
    (SELECT count(*) FROM tk_threads WHERE %(tid)s::bigint IS NULL OR tid = %(tid)s::bigint),
    (SELECT count(*) FROM tk_checkpoints WHERE %(tid)s::bigint IS NULL OR tid = %(tid)s::bigint),
    (SELECT count(*) FROM tk_blobs WHERE %(tid)s::bigint IS NULL OR tid = %(tid)s::bigint)
    + (SELECT count(*) FROM tk_checkpoints AS c CROSS JOIN jsonb_object_keys(c.vals) AS v
       WHERE %(tid)s::bigint IS NULL OR c.tid = %(tid)s::bigint),
    (SELECT count(*) FROM tk_writes WHERE %(tid)s::bigint IS NULL OR tid = %(tid)s::bigint),
    (SELECT count(*) FROM tk_messages WHERE %(tid)s::bigint IS NULL OR tid = %(tid)s::bigint),
    (SELECT coalesce(sum(octet_length(checkpoint::text) + octet_length(metadata::text)
                         + coalesce(octet_length(vals::text), 0)), 0)
     FROM tk_checkpoints WHERE %(tid)s::bigint IS NULL OR tid = %(tid)s::bigint)
    + (SELECT coalesce(sum(octet_length(value)), 0) FROM tk_blobs
       WHERE %(tid)s::bigint IS NULL OR tid = %(tid)s::bigint)
    + (SELECT coalesce(sum(octet_length(value)), 0) FROM tk_writes
       WHERE %(tid)s::bigint IS NULL OR tid = %(tid)s::bigint)
    + (SELECT coalesce(sum(octet_length(value)), 0) FROM tk_messages
       WHERE %(tid)s::bigint IS NULL OR tid = %(tid)s::bigint)
    + (SELECT count(*) * 48 + coalesce(sum(octet_length(page) + coalesce(octet_length(page_prev), 0)), 0)
       FROM tk_message_links WHERE %(tid)s::bigint IS NULL OR tid = %(tid)s::bigint)
"""


def many(kind: str, common: dict[str, object], rows: list[dict[str, object]]) -> Sql:
    """One statement for all ``rows``: each column goes in as one array."""
    columns = {name: [row[name] for row in rows] for name in rows[0]}
    return Sql(_MANY[kind], {**common, **columns})


def text_list(items: list[str]) -> object:
    """A list of strings as one parameter (``jsonb_array_elements_text`` reads it)."""
    return orjson.dumps(items).decode()


def metadata_filter(wanted: Mapping[str, object]) -> str | None:
    """The ``%(filter)s`` parameter, for ``@>``: the wanted metadata, already in the form
    it is stored in (``records.filter_as_stored``). None (no narrowing in SQL; the program's
    exact check does it all) for a filter with a key starting with ``~``: metadata holding
    only that key is stored as the codec's escaped form of such a dict, which containment
    would not find."""
    if any(key[:1] == "~" for key in wanted):
        return None
    return orjson.dumps(wanted).decode()


# --- retention (SPEC RT1-RT5, SW1-SW8) ---------------------------------------------------------

_IDS = "(SELECT jsonb_array_elements_text(%(thread_ids)s::jsonb))"
_TIDS = "(SELECT jsonb_array_elements_text(%(tids)s::jsonb)::bigint)"

# A run starts on a thread: it leaves the finished set and its declared retention is
# recorded (NULL: the platform's), and its waiting clock moves to now. The thread is created
# for its owner if it is new.
START_THREAD = """
INSERT INTO tk_threads (thread_id, owner, active_at, waiting_minutes, finished_minutes)
VALUES (%(thread_id)s, %(owner)s, %(now)s, %(waiting)s, %(finished)s)
ON CONFLICT (thread_id) DO UPDATE SET
    finished_due = NULL, waiting_minutes = EXCLUDED.waiting_minutes,
    finished_minutes = EXCLUDED.finished_minutes,
    active_at = GREATEST(tk_threads.active_at, EXCLUDED.active_at)
WHERE %(required_owner)s::text IS NULL OR tk_threads.owner = %(required_owner)s::text
RETURNING owner
"""

# The finished retention in force at the mark: the thread's declared one, else the
# platform's capped at the thread's declared waiting.
MARK_FINISHED = (
    """
UPDATE tk_threads SET finished_due = %(now)s + 60 * COALESCE(
    finished_minutes, LEAST(%(finished)s, COALESCE(waiting_minutes, %(finished)s)))
WHERE thread_id IN """
    + _IDS
    + """
  AND (%(required_owner)s::text IS NULL OR owner = %(required_owner)s::text)
RETURNING thread_id, finished_due
"""
)

THREAD_RETENTION = """
SELECT waiting_minutes, finished_minutes, finished_due FROM tk_threads
WHERE thread_id = %(thread_id)s AND (%(owner)s::text IS NULL OR owner = %(owner)s::text)
"""

# Pages of threads past a horizon, in tid order from %(after)s (keyset paging: each page is
# one short index range, whatever the store's size).
_FINISHED = "t.finished_due <= %(now)s"
# A thread's waiting clock: its newest checkpoint, or its row's active_at if newer (created, a
# copy, a run started).
_WAITING = """t.finished_due IS NULL
  AND GREATEST((SELECT max(c.created_at) FROM tk_checkpoints AS c WHERE c.tid = t.tid), t.active_at)
      < %(now)s - 60 * COALESCE(t.waiting_minutes, %(waiting)s)"""
_PAGE = """
SELECT t.tid, t.thread_id, t.owner FROM tk_threads AS t
WHERE t.tid > %(after)s AND {past}
ORDER BY t.tid LIMIT %(limit)s
"""
FINISHED_PAGE = _PAGE.format(past=_FINISHED)
WAITING_PAGE = _PAGE.format(past=_WAITING)
# How many threads a sweep will find (for its progress bar).
FINISHED_COUNT = f"SELECT count(*) FROM tk_threads AS t WHERE {_FINISHED}"
WAITING_COUNT = f"SELECT count(*) FROM tk_threads AS t WHERE {_WAITING}"

# A delete first locks the threads' rows: a writer that holds one (LOCK_THREAD) commits
# first, and the statements after the lock see what it wrote; a writer that comes later waits,
# then finds the thread gone and starts a new one (the sweep's next round deletes it again).
LOCK_THREADS = f"SELECT tid FROM tk_threads WHERE tid IN {_TIDS} ORDER BY tid FOR UPDATE"

# The same lock, by thread id, with each thread's owner: a delete, prune, copy or owner change
# checks the owner it read under the lock, so no change of owner (nor a delete and a new
# thread of the same id) comes between its check and its act (W3).
LOCK_OWNED = f"SELECT tid, thread_id, owner FROM tk_threads WHERE thread_id IN {_IDS} ORDER BY tid FOR UPDATE"

# Hands threads to another owner (threadkeep.ThreadkeepSaver.assign_owner).
ASSIGN_OWNER = f"UPDATE tk_threads SET owner = %(owner)s WHERE tid IN {_TIDS}"

# Threads whose root namespace's head (tk_threads.head) is no longer known: a delete by run
# or a copy onto them moved it. Their next put locks the row and sets it again.
CLEAR_HEADS = f"UPDATE tk_threads SET head = NULL WHERE tid IN {_TIDS}"

# The threads' rows go first, and a sweep's only if they are still past the horizon and not
# parked (a run may have started on one since the page was read); the statements after it
# delete what the deleted threads held.
_LIVE_PARK = "EXISTS (SELECT 1 FROM tk_parks AS p WHERE p.tid = t.tid AND p.deadline > %(now)s)"
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
SELECT tid, %(park_id)s, %(deadline)s FROM tk_threads
WHERE thread_id = %(thread_id)s AND (%(required_owner)s::text IS NULL OR owner = %(required_owner)s::text)
FOR KEY SHARE
ON CONFLICT (tid, park_id) DO UPDATE SET deadline = EXCLUDED.deadline
RETURNING tid
"""

# A park is removed only from a thread of the required owner (W3): the filter is in the
# statement that deletes, so no other user's park can go, whatever runs meanwhile.
CLEAR_PARK = """
DELETE FROM tk_parks
WHERE park_id = %(park_id)s AND tid = (
    SELECT tid FROM tk_threads
    WHERE thread_id = %(thread_id)s
      AND (%(required_owner)s::text IS NULL OR owner = %(required_owner)s::text))
RETURNING tid
"""

LIVE_PARKS = (
    """
SELECT DISTINCT t.thread_id FROM tk_parks AS p JOIN tk_threads AS t ON t.tid = p.tid
WHERE t.thread_id IN """
    + _IDS
    + """ AND p.deadline > %(now)s
  AND (%(owner)s::text IS NULL OR t.owner = %(owner)s::text)
"""
)

# LangGraph's rule: a thread waits on an interrupt while its newest root checkpoint holds an
# interrupt write. With %(since)s, only if that checkpoint was stored at or after it (the
# interrupt horizon: one waiting longer is no longer counted).
INTERRUPTED = (
    """
SELECT t.thread_id FROM tk_threads AS t
CROSS JOIN LATERAL (SELECT n.checkpoint_id, n.created_at FROM tk_checkpoints AS n
                    WHERE n.tid = t.tid AND n.checkpoint_ns = ''
                    ORDER BY n.checkpoint_id DESC LIMIT 1) AS c
WHERE t.thread_id IN """
    + _IDS
    + """
  AND (%(since)s::double precision IS NULL OR c.created_at >= %(since)s::double precision)
  AND EXISTS (
    SELECT 1 FROM tk_writes AS w
    WHERE w.tid = t.tid AND w.checkpoint_ns = '' AND w.checkpoint_id = c.checkpoint_id
      AND w.channel = '__interrupt__')
"""
)

# --- the tool-call ledger (SPEC TM5; backends/sql/ledger.py) ----------------------------------

# Holds the thread's row FOR KEY SHARE while it inserts, as a park does: never waits for a
# put, and a delete or the sweep (FOR UPDATE) waits for it, or it finds no thread.
BEGIN_CALL = """
INSERT INTO tk_tool_calls (tid, message_id, call_id, tool, key, claim, status, started_at)
SELECT tid, %(message_id)s, %(call_id)s, %(tool)s, %(key)s, %(claim)s, 'started', %(now)s
FROM tk_threads
WHERE thread_id = %(thread_id)s AND (%(required_owner)s::text IS NULL OR owner = %(required_owner)s::text)
FOR KEY SHARE
ON CONFLICT (tid, message_id, call_id) DO NOTHING
"""

# Its own statement after BEGIN_CALL (under READ COMMITTED, a new snapshot): it sees the
# entry a concurrent begin of the same call committed while BEGIN_CALL waited for it.
SELECT_CALL = """
SELECT t.owner, c.tool, c.key, c.claim, c.status, c.type, c.value, c.error, c.started_at, c.finished_at
FROM tk_threads AS t
LEFT JOIN tk_tool_calls AS c
  ON c.tid = t.tid AND c.message_id = %(message_id)s AND c.call_id = %(call_id)s
WHERE t.thread_id = %(thread_id)s
"""

# Two ends of one call: the second waits for the first's row lock, then finds the status
# it left and changes nothing.
END_CALL = """
UPDATE tk_tool_calls
SET status = %(status)s, type = %(type)s::text, value = %(value)s::bytea, error = %(error)s::text,
    finished_at = %(now)s
WHERE tid = (SELECT tid FROM tk_threads
             WHERE thread_id = %(thread_id)s
               AND (%(required_owner)s::text IS NULL OR owner = %(required_owner)s::text))
  AND message_id = %(message_id)s AND call_id = %(call_id)s AND status = 'started'
RETURNING tid
"""

# Oldest first: by when each was begun, then in the order they were recorded.
LIST_CALLS = """
SELECT c.message_id, c.call_id, c.tool, c.key, c.claim, c.status, c.type, c.value, c.error,
       c.started_at, c.finished_at
FROM tk_tool_calls AS c JOIN tk_threads AS t ON t.tid = c.tid
WHERE t.thread_id = %(thread_id)s AND (%(owner)s::text IS NULL OR t.owner = %(owner)s::text)
ORDER BY c.started_at, c.seq
"""


# --- the thread listing (SPEC SV1, SV3; threadkeep.core.listing) --------------------------------

# Threads after the cursor (%(at)s, %(id)s) in (active_at, thread_id) descending order, from
# the listing indexes of migration 12: one range per state (0 waiting, 1 finished, 2
# interrupted; %(state)s NULL: each, merged), each at most %(limit)s rows, so a page reads
# no more than three short index ranges however many threads the store holds (bench/
# threads.py). %(unparked)s (a status filter) leaves out threads with a live park: they are
# listed as parked. Then, for the page's rows only, an index probe each: the newest root
# checkpoint (its id tells whether interrupt_at is current; its metadata is shown) and the
# latest live park.
_LISTED = """(SELECT t.tid, t.thread_id, t.owner, t.active_at, t.waiting_minutes, t.finished_due,
        t.interrupt_at
 FROM tk_threads AS t
 WHERE {where}
   AND (t.active_at, t.thread_id) < (%(at)s::double precision, %(id)s::text)
   AND t.active_at >= %(after)s::double precision AND t.active_at < %(before)s::double precision
   AND NOT (%(unparked)s::boolean AND EXISTS (
       SELECT 1 FROM tk_parks AS p WHERE p.tid = t.tid AND p.deadline > %(now)s::double precision))
 ORDER BY t.active_at DESC, t.thread_id DESC LIMIT %(limit)s)"""
# The listing indexes' leading state (migration 12), as they spell it: 2 interrupted, 1
# finished, 0 waiting.
_STATE = "(CASE WHEN t.interrupt_at IS NOT NULL THEN 2 WHEN t.finished_due IS NOT NULL THEN 1 ELSE 0 END)"
_STATE_RANGE = _STATE + " = {state} AND (%(state)s::smallint IS NULL OR %(state)s::smallint = {state})"
_DETAILS = """
SELECT l.thread_id, l.owner, l.active_at, l.waiting_minutes, l.finished_due, l.interrupt_at,
       c.checkpoint_id, c.metadata::text, p.until
FROM (SELECT * FROM ({listed}) AS u ORDER BY u.active_at DESC, u.thread_id DESC LIMIT %(limit)s) AS l
LEFT JOIN LATERAL (SELECT n.checkpoint_id, n.metadata FROM tk_checkpoints AS n
                   WHERE n.tid = l.tid AND n.checkpoint_ns = ''
                   ORDER BY n.checkpoint_id DESC LIMIT 1) AS c ON true
LEFT JOIN LATERAL (SELECT max(p.deadline) AS until FROM tk_parks AS p
                   WHERE p.tid = l.tid AND p.deadline > %(now)s::double precision) AS p ON true
ORDER BY l.active_at DESC, l.thread_id DESC
"""


def _by_state(owner: str) -> str:
    return "\nUNION ALL\n".join(
        _LISTED.format(where=owner + _STATE_RANGE.format(state=state)) for state in (0, 1, 2)
    )


THREADS_PAGE = _DETAILS.format(listed=_by_state(""))
THREADS_PAGE_OF_OWNER = _DETAILS.format(listed=_by_state("t.owner = %(owner)s::text AND "))
# The parked threads: found from the live parks (few; tk_parks_deadline), %(owner)s NULL: any.
THREADS_PARKED = _DETAILS.format(
    listed=_LISTED.format(
        where="t.tid IN (SELECT p.tid FROM tk_parks AS p WHERE p.deadline > %(now)s::double precision)"
        " AND (%(owner)s::text IS NULL OR t.owner = %(owner)s::text)"
    )
)
# One thread's listing row (the retention view's due time and status, as the listing shows
# them), by its id: the primary key, then the same probes as a page's rows.
THREAD_ROW = _DETAILS.format(
    listed=_LISTED.format(
        where="t.thread_id = %(thread_id)s::text AND (%(owner)s::text IS NULL OR t.owner = %(owner)s::text)"
    )
)

# After a delete by run or a copy: each thread's waiting clock is at least its newest
# checkpoint's time, and interrupt_at names its newest root checkpoint if that holds an
# interrupt write (the statements that moved them did not keep them).
REFRESH_THREADS = f"""
UPDATE tk_threads AS t SET
    active_at = greatest(t.active_at, coalesce(
        (SELECT max(c.created_at) FROM tk_checkpoints AS c WHERE c.tid = t.tid), t.active_at)),
    interrupt_at = (
        SELECT n.checkpoint_id FROM (SELECT c.checkpoint_id FROM tk_checkpoints AS c
                                     WHERE c.tid = t.tid AND c.checkpoint_ns = ''
                                     ORDER BY c.checkpoint_id DESC LIMIT 1) AS n
        WHERE EXISTS (SELECT 1 FROM tk_writes AS w
                      WHERE w.tid = t.tid AND w.checkpoint_ns = '' AND w.checkpoint_id = n.checkpoint_id
                        AND w.channel = '__interrupt__'))
WHERE t.tid IN {_TIDS}
"""
