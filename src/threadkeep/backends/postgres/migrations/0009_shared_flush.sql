-- threadkeep Postgres schema, version 9: the rows a shared pipeline's closing flush updates.
--
-- The writes of a shared pipeline (several calls' round trips on one connection) commit
-- without waiting for their WAL to reach disk, and the pipeline ends with one round trip
-- that does: an update of one of these rows, committed as the session's synchronous_commit
-- says. A commit waits for every WAL record before its own, so once that round trip is
-- answered every write before it is on disk, and only then are their calls answered. Before,
-- each write waited for a flush of its own, one after another. One row per slot of
-- mod(pg_backend_pid(), 16), so that concurrent pipelines seldom update the same row; no index
-- (16 rows), so every update is a HOT update.
CREATE TABLE tk_flush (slot INTEGER NOT NULL, flushes BIGINT NOT NULL);
INSERT INTO tk_flush (slot, flushes) SELECT slot, 0 FROM generate_series(0, 15) AS slot;
