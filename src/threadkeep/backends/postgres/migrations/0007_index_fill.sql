-- threadkeep Postgres schema, version 7: indexes whose keys grow at their end fill their pages.
-- A thread's checkpoint ids grow with time, so a step appends to tk_checkpoints_pkey and
-- tk_writes_pkey after its thread's last entry, as a new thread does to tk_threads_pkey.
-- Postgres splits a page filled that way leaving the left half at the index's fill factor:
-- the default, 90, keeps a tenth of each such page free for updates of keys that are never
-- updated. Indexes keyed by digests are filled at random; their fill factor does not matter.
-- Existing pages keep their fill until they split.
ALTER INDEX tk_threads_pkey SET (fillfactor = 100);
ALTER INDEX tk_checkpoints_pkey SET (fillfactor = 100);
ALTER INDEX tk_writes_pkey SET (fillfactor = 100);
