-- threadkeep Postgres schema, version 12: the thread listing reads an index (SPEC SV1, SV3).
--
-- active_at becomes the thread's waiting clock itself: every put moves it to its checkpoint's
-- time (in the statement that already writes the thread's row, CLAIM_HEAD or SET_HEAD, or
-- TOUCH_THREAD for a subgraph's put), as a run's start did. The sweep's waiting horizon (the
-- newer of it and the newest checkpoint) is unchanged, and now always equals active_at, so a
-- listing reads each thread's last write and due time from its row. Backfilled below.
--
-- interrupt_at: the id of the newest root checkpoint when it holds an interrupt write
-- (LangGraph's rule, as INTERRUPTED reads it), set by the put_writes that stores one, cleared
-- by the next root put; NULL otherwise. state folds it with finished_due into what the index
-- orders by: 2 interrupted, 1 finished, 0 waiting (parks are live until a deadline, so the
-- listing asks tk_parks for them at read time).
--
-- Cost: a put that used to leave the row's indexes alone (a HOT update of head) now moves an
-- indexed column, so each put adds an entry to the row's indexes (bench/threads.py measures
-- the listing; bench/calls.py the put).
ALTER TABLE tk_threads ADD COLUMN interrupt_at TEXT;
ALTER TABLE tk_threads ADD COLUMN state SMALLINT GENERATED ALWAYS AS (
    CASE WHEN interrupt_at IS NOT NULL THEN 2 WHEN finished_due IS NOT NULL THEN 1 ELSE 0 END
) STORED;
UPDATE tk_threads AS t SET active_at = c.newest
FROM (SELECT tid, max(created_at) AS newest FROM tk_checkpoints GROUP BY tid) AS c
WHERE c.tid = t.tid AND c.newest > t.active_at;
UPDATE tk_threads AS t SET interrupt_at = c.checkpoint_id
FROM tk_threads AS s
CROSS JOIN LATERAL (SELECT n.checkpoint_id FROM tk_checkpoints AS n
                    WHERE n.tid = s.tid AND n.checkpoint_ns = ''
                    ORDER BY n.checkpoint_id DESC LIMIT 1) AS c
WHERE s.tid = t.tid AND EXISTS (
    SELECT 1 FROM tk_writes AS w
    WHERE w.tid = s.tid AND w.checkpoint_ns = '' AND w.checkpoint_id = c.checkpoint_id
      AND w.channel = '__interrupt__');
-- A page is one range of one of these, newest write first (keyset by active_at, thread_id):
-- per state for the operator, per owner and state for a user. The owner index they replace
-- is their prefix.
CREATE INDEX tk_threads_listing ON tk_threads (state, active_at DESC, thread_id DESC);
CREATE INDEX tk_threads_owner_listing ON tk_threads (owner, state, active_at DESC, thread_id DESC);
DROP INDEX tk_threads_owner;
-- Live parks by deadline: the parked threads a listing shows first are found from here.
CREATE INDEX tk_parks_deadline ON tk_parks (deadline);
