-- threadkeep SQLite schema, version 2: retention (SPEC RT1-RT5).
-- A thread's declared retention (NULL: the platform's) is recorded when a run starts on it;
-- finished_due is set when its owner marks it finished (NULL: waiting). Its waiting clock is
-- its newest checkpoint's created_at (a read never moves it).
ALTER TABLE tk_threads ADD COLUMN waiting_minutes INTEGER;
ALTER TABLE tk_threads ADD COLUMN finished_minutes INTEGER;
ALTER TABLE tk_threads ADD COLUMN finished_due REAL;
CREATE INDEX tk_threads_finished_due ON tk_threads (finished_due) WHERE finished_due IS NOT NULL;

-- Live parks: a run waiting on an answer until its deadline (SPEC RT5).
CREATE TABLE tk_parks (
    tid INTEGER NOT NULL,
    park_id TEXT NOT NULL,
    deadline REAL NOT NULL,
    PRIMARY KEY (tid, park_id)
);
