-- threadkeep Postgres schema, version 12: the thread listing reads an index (SPEC SV1, SV3).
--
-- active_at becomes the thread's listed write time: a put moves it to its checkpoint's time
-- once it is 60 s or more behind (in the statement that already writes the thread's row,
-- CLAIM_HEAD or SET_HEAD, or TOUCH_THREAD for a subgraph's put), as a run's start does. So
-- the listing's order and its "last write" are those of the puts to within a minute. The
-- sweep's waiting horizon still counts from the newer of it and the newest checkpoint, so
-- due times stay exact. Backfilled below.
--
-- interrupt_at: the id of the newest root checkpoint when it holds an interrupt write
-- (LangGraph's rule, as INTERRUPTED reads it), set by the put_writes that stores one, cleared
-- by the next root put; NULL otherwise. The listing's indexes lead with a state folding it
-- with finished_due (2 interrupted, 1 finished, 0 waiting; parks are live until a deadline,
-- so the listing asks tk_parks for them at read time): an expression, not a column, so
-- adding it rewrites no table and no statement has to keep it.
--
-- Cost of a put: active_at is indexed, so a put that moves it is not a HOT update and adds an
-- entry to each index of tk_threads; moving it at most once a minute keeps most puts HOT
-- (docs/operations.md, "Upgrading to the thread listing").
--
-- Cost of the upgrade: ADD COLUMN (nullable, no default) only changes the catalog, but its
-- ACCESS EXCLUSIVE lock on tk_threads is held until this migration commits: every read and
-- write of the store waits for the backfill (one scan of tk_checkpoints, one index probe per
-- thread) and the two index builds.
ALTER TABLE tk_threads ADD COLUMN interrupt_at TEXT;
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
-- is their prefix. The state expression is the listing queries' _STATE, word for word.
CREATE INDEX tk_threads_listing ON tk_threads (
    (CASE WHEN interrupt_at IS NOT NULL THEN 2 WHEN finished_due IS NOT NULL THEN 1 ELSE 0 END),
    active_at DESC, thread_id DESC);
CREATE INDEX tk_threads_owner_listing ON tk_threads (
    owner, (CASE WHEN interrupt_at IS NOT NULL THEN 2 WHEN finished_due IS NOT NULL THEN 1 ELSE 0 END),
    active_at DESC, thread_id DESC);
DROP INDEX tk_threads_owner;
-- Live parks by deadline: the parked threads a listing shows first are found from here.
CREATE INDEX tk_parks_deadline ON tk_parks (deadline);
