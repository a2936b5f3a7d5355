-- threadkeep SQLite schema, version 1.
-- tid is a thread's surrogate key: every other table repeats 8 bytes, not the thread id.
-- A step never rewrites its thread's row: a thread's last write is its newest checkpoint.
CREATE TABLE tk_threads (
    tid INTEGER PRIMARY KEY,
    thread_id TEXT NOT NULL UNIQUE,
    owner TEXT NOT NULL,
    created_at REAL NOT NULL
);
CREATE INDEX tk_threads_owner ON tk_threads (owner);

-- One row per checkpoint; its channel values live in tk_blobs (only channels that changed).
CREATE TABLE tk_checkpoints (
    tid INTEGER NOT NULL,
    checkpoint_ns TEXT NOT NULL,
    checkpoint_id TEXT NOT NULL,
    parent_id TEXT,
    run_id TEXT,
    created_at REAL NOT NULL,
    checkpoint TEXT NOT NULL,
    metadata TEXT NOT NULL,
    PRIMARY KEY (tid, checkpoint_ns, checkpoint_id)
) WITHOUT ROWID;
CREATE INDEX tk_checkpoints_run ON tk_checkpoints (run_id) WHERE run_id IS NOT NULL;

CREATE TABLE tk_blobs (
    tid INTEGER NOT NULL,
    checkpoint_ns TEXT NOT NULL,
    channel TEXT NOT NULL,
    version TEXT NOT NULL,
    type TEXT NOT NULL,
    value BLOB NOT NULL,
    PRIMARY KEY (tid, checkpoint_ns, channel, version)
);

CREATE TABLE tk_writes (
    tid INTEGER NOT NULL,
    checkpoint_ns TEXT NOT NULL,
    checkpoint_id TEXT NOT NULL,
    task_id TEXT NOT NULL,
    idx INTEGER NOT NULL,
    task_path TEXT NOT NULL,
    channel TEXT NOT NULL,
    type TEXT NOT NULL,
    value BLOB NOT NULL,
    PRIMARY KEY (tid, checkpoint_ns, checkpoint_id, task_id, idx)
);

-- Messages of message-list channels, stored once per thread by digest (SPEC S1) ...
CREATE TABLE tk_messages (
    tid INTEGER NOT NULL,
    digest BLOB NOT NULL,
    type TEXT NOT NULL,
    value BLOB NOT NULL,
    PRIMARY KEY (tid, digest)
);
-- ... and the links that chain them into lists (see threadkeep.core.messages).
CREATE TABLE tk_message_links (
    tid INTEGER NOT NULL,
    node BLOB NOT NULL,
    prev BLOB,
    digest BLOB NOT NULL,
    PRIMARY KEY (tid, node)
) WITHOUT ROWID;

CREATE TABLE tk_meta (
    key TEXT PRIMARY KEY,
    value TEXT NOT NULL
) WITHOUT ROWID;
