-- threadkeep SQLite schema, version 3: a thread's row carries its activity clock.
-- tk_threads.created_at becomes active_at: set when the thread is created and moved forward
-- when a run starts on it. The waiting horizon counts from the newer of it and the thread's
-- newest checkpoint, so a run that resumes an idle thread is not swept before its first
-- checkpoint lands (SPEC RT3).
ALTER TABLE tk_threads RENAME COLUMN created_at TO active_at;
