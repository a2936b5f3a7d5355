-- threadkeep SQLite schema, version 6: the thread listing reads an index (SPEC SV1, SV3).
-- See the Postgres migration 0012: active_at becomes the thread's listed write time (a put
-- moves it, TOUCH_THREAD, in the put's transaction, once it is 60 s or more behind: fewer
-- index writes), interrupt_at names the newest root checkpoint while it holds an interrupt
-- write, and state (a virtual column: adding it rewrites nothing; the indexes store it)
-- folds it with finished_due: 2 interrupted, 1 finished, 0 waiting. The backfill reads
-- every checkpoint once, in the migration's write transaction.
ALTER TABLE tk_threads ADD COLUMN interrupt_at TEXT;
ALTER TABLE tk_threads ADD COLUMN state INTEGER GENERATED ALWAYS AS (
    CASE WHEN interrupt_at IS NOT NULL THEN 2 WHEN finished_due IS NOT NULL THEN 1 ELSE 0 END
) VIRTUAL;
UPDATE tk_threads SET active_at = max(active_at, coalesce(
    (SELECT max(c.created_at) FROM tk_checkpoints AS c WHERE c.tid = tk_threads.tid), 0));
UPDATE tk_threads SET interrupt_at = (
    SELECT c.checkpoint_id FROM tk_checkpoints AS c
    WHERE c.tid = tk_threads.tid AND c.checkpoint_ns = ''
      AND c.checkpoint_id = (SELECT max(n.checkpoint_id) FROM tk_checkpoints AS n
                             WHERE n.tid = tk_threads.tid AND n.checkpoint_ns = '')
      AND EXISTS (SELECT 1 FROM tk_writes AS w
                  WHERE w.tid = c.tid AND w.checkpoint_ns = '' AND w.checkpoint_id = c.checkpoint_id
                    AND w.channel = '__interrupt__'));
CREATE INDEX tk_threads_listing ON tk_threads (state, active_at DESC, thread_id DESC);
CREATE INDEX tk_threads_owner_listing ON tk_threads (owner, state, active_at DESC, thread_id DESC);
DROP INDEX tk_threads_owner;
CREATE INDEX tk_parks_deadline ON tk_parks (deadline);
