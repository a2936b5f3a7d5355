-- threadkeep Postgres schema, version 5: a thread's row names the head of its root namespace.
-- head is the newest checkpoint id of the thread's root namespace, or NULL when not known
-- (threads written before this version, and after a delete by run or a copy onto them). A
-- put that continues the head sets it with a compare-and-set of the row, one statement in
-- all (CLAIM_HEAD in threadkeep.backends.postgres.queries); any other put locks the row,
-- reads the head from tk_checkpoints and sets it. The column is in no index, so setting it
-- is a HOT update. A tool that deletes checkpoints by hand must set it to NULL.
ALTER TABLE tk_threads ADD COLUMN head TEXT;
