-- threadkeep Postgres schema, version 6: message lists read by pages, and the state read as a
-- function with a cached plan.
--
-- A link at position p of its list (0 for the first message), p + 1 a multiple of 32, holds
-- its page: page is the digests of the messages at positions p-31 .. p, oldest first (32 x
-- 16 bytes), and page_prev the node at position p-32 (NULL for the first page). A node
-- determines its whole list, so its page is the same whoever writes it. A walk from a tail
-- takes single links until it meets a page, then a page at a time: 320 messages take 10 to
-- 41 steps instead of 320. Links without a page (written before this version, or by a writer
-- that does not write pages) are walked one at a time; nothing needs them.
ALTER TABLE tk_message_links ADD COLUMN page BYTEA, ADD COLUMN page_prev BYTEA;

-- tk_state returns a checkpoint (the newest of its namespace when p_checkpoint_id is NULL),
-- its channel values, its pending writes and (with p_walk) the messages of its message
-- lists, if the caller may see the thread (p_owner NULL: any thread). Rows: kind 0 the
-- checkpoint, 1 a channel value, 2 a pending write, 3 a message of a list, 4 a message a
-- pending write refers to; columns as declared below (kind 3: idx is the depth from the
-- tail, tail the list's tail node).
--
-- Why a function: parsing and planning the read took about as long as running it (1.3 ms
-- against 2 ms for a 320-message walk, 1.2 ms against 0.3 ms without one). PL/pgSQL keeps
-- each statement's plan for the session, and plan_cache_mode makes it the generic plan from
-- the first call on, so a connection plans the read once (again after an ANALYZE or a schema
-- change of a table it reads). The plan suits any parameters because every lookup in it is
-- an index probe by key: the thread, then the checkpoint, then each channel value, chain
-- link and message as a LATERAL lookup, LIMIT 1 so the planner cannot flatten it into a join
-- (which would hash every row of the thread: it grows with history). enable_seqscan = off
-- keeps them probes when the plan is made on a table nearly empty, which may grow long
-- before its next ANALYZE. p_walk is a one-time filter of the plan. jit = off: compiling a
-- plan of probes costs far more than running it, and JIT code is not cached with the plan.
-- A page is unpacked by generate_series(0, 31), filtered: constant bounds give the planner a
-- row estimate (a computed bound estimates 1000 rows a page, and costs to match).
CREATE FUNCTION tk_state(
    p_thread_id TEXT, p_owner TEXT, p_checkpoint_ns TEXT, p_checkpoint_id TEXT, p_walk BOOLEAN
) RETURNS TABLE (
    kind INTEGER, tid BIGINT, checkpoint_id TEXT, parent_id TEXT, checkpoint TEXT,
    metadata TEXT, channel TEXT, type TEXT, value BYTEA, task_id TEXT, task_path TEXT,
    idx INTEGER, tail BYTEA, digest BYTEA
) LANGUAGE plpgsql STABLE
SET plan_cache_mode = force_generic_plan SET enable_seqscan = off SET jit = off AS $state$
#variable_conflict use_column
DECLARE
    v_tid BIGINT;
    v_id TEXT;
BEGIN
    SELECT t.tid INTO v_tid FROM tk_threads AS t
    WHERE t.thread_id = p_thread_id AND (p_owner IS NULL OR t.owner = p_owner);
    IF p_checkpoint_id IS NULL THEN
        SELECT c.checkpoint_id INTO v_id FROM tk_checkpoints AS c
        WHERE c.tid = v_tid AND c.checkpoint_ns = p_checkpoint_ns
        ORDER BY c.checkpoint_id DESC LIMIT 1;
    ELSE
        v_id := p_checkpoint_id;
    END IF;
    RETURN QUERY WITH RECURSIVE cp AS (
        SELECT c.tid, c.checkpoint_id, c.parent_id, c.checkpoint, c.metadata, c.vals
        FROM tk_checkpoints AS c
        WHERE c.tid = v_tid AND c.checkpoint_ns = p_checkpoint_ns AND c.checkpoint_id = v_id
    ),
    vals AS (
        SELECT b.channel, b.type, b.value
        FROM cp CROSS JOIN json_each_text(cp.checkpoint -> 'channel_versions') AS version
        CROSS JOIN LATERAL (
            SELECT b.channel, b.type, b.value FROM tk_blobs AS b
            WHERE b.tid = cp.tid AND b.checkpoint_ns = p_checkpoint_ns
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
    -- A row per single link or page: digests (oldest first) ending at depth (0 is the tail).
    walk (tail, depth, prev, digests) AS (
        SELECT link.node, 0, link.next, link.digests
        FROM cp CROSS JOIN chains CROSS JOIN LATERAL (
            SELECT l.node, CASE WHEN l.page IS NULL THEN l.prev ELSE l.page_prev END AS next,
                   coalesce(l.page, l.digest) AS digests
            FROM tk_message_links AS l
            WHERE l.tid = cp.tid AND l.node = substring(chains.ref FROM 1 FOR 16) LIMIT 1
        ) AS link
        WHERE p_walk
        UNION ALL
        SELECT walk.tail, walk.depth + octet_length(walk.digests) / 16, link.next, link.digests
        FROM walk CROSS JOIN cp CROSS JOIN LATERAL (
            SELECT CASE WHEN l.page IS NULL THEN l.prev ELSE l.page_prev END AS next,
                   coalesce(l.page, l.digest) AS digests
            FROM tk_message_links AS l
            WHERE l.tid = cp.tid AND l.node = walk.prev LIMIT 1
        ) AS link
    ),
    walked (tail, depth, digest) AS (
        SELECT walk.tail, walk.depth + size.n - 1 - i, substring(walk.digests FROM i * 16 + 1 FOR 16)
        FROM walk CROSS JOIN LATERAL (SELECT octet_length(walk.digests) / 16 AS n) AS size
        CROSS JOIN generate_series(0, 31) AS i
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
    FROM cp JOIN tk_writes AS w ON w.tid = cp.tid AND w.checkpoint_ns = p_checkpoint_ns
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
    FROM cp JOIN tk_writes AS w ON w.tid = cp.tid AND w.checkpoint_ns = p_checkpoint_ns
        AND w.checkpoint_id = cp.checkpoint_id AND w.type IN ('ref', 'refs')
    CROSS JOIN LATERAL (
        SELECT substring(w.value FROM i * 16 + 1 FOR 16) AS digest
        FROM generate_series(0, octet_length(w.value) / 16 - 1) AS i
    ) AS ref
    CROSS JOIN LATERAL (
        SELECT m.type, m.value FROM tk_messages AS m
        WHERE m.tid = cp.tid AND m.digest = ref.digest LIMIT 1
    ) AS message;
END
$state$;
