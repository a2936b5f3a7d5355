-- threadkeep Postgres schema, version 8: the state read's walk stops at the list's length.
--
-- A list's reference (a checkpoint's value of a message channel) holds its tail node and its
-- length. The walk from the tail followed each link's prev (or a page's page_prev) until none
-- was left: a link damaged (by hand, by a bug) to name a later node of its list made a loop,
-- which the walk followed until the command timeout, at every try. It now stops once it has
-- as many messages as the list's length; the reader then finds the digests do not lead to the
-- tail, and refuses the state. tk_state is the same read as in version 6 otherwise (see
-- there); the statement the engine prepares instead changed with it (queries._STATE).
CREATE OR REPLACE FUNCTION tk_state(
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
    -- A row per single link or page: digests (oldest first) ending at depth (0 is the tail),
    -- no deeper than the list's length, which its reference holds (a damaged link could loop).
    walk (tail, depth, prev, digests, length) AS (
        SELECT link.node, 0, link.next, link.digests,
               CASE WHEN octet_length(chains.ref) = 20 THEN (get_byte(chains.ref, 16)::bigint << 24)
                   + (get_byte(chains.ref, 17) << 16) + (get_byte(chains.ref, 18) << 8)
                   + get_byte(chains.ref, 19) ELSE 0 END
        FROM cp CROSS JOIN chains CROSS JOIN LATERAL (
            SELECT l.node, CASE WHEN l.page IS NULL THEN l.prev ELSE l.page_prev END AS next,
                   coalesce(l.page, l.digest) AS digests
            FROM tk_message_links AS l
            WHERE l.tid = cp.tid AND l.node = substring(chains.ref FROM 1 FOR 16) LIMIT 1
        ) AS link
        WHERE p_walk
        UNION ALL
        SELECT walk.tail, walk.depth + octet_length(walk.digests) / 16, link.next, link.digests,
               walk.length
        FROM walk CROSS JOIN cp CROSS JOIN LATERAL (
            SELECT CASE WHEN l.page IS NULL THEN l.prev ELSE l.page_prev END AS next,
                   coalesce(l.page, l.digest) AS digests
            FROM tk_message_links AS l
            WHERE l.tid = cp.tid AND l.node = walk.prev LIMIT 1
        ) AS link
        WHERE walk.depth + octet_length(walk.digests) / 16 < walk.length
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
