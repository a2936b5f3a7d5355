-- threadkeep Postgres schema, version 1. Tables are prefixed tk_ so they can share a
-- database (or schema) with other applications, LangGraph's own savers included.
-- tid is a thread's surrogate key: every other table repeats 8 bytes, not the thread id.
-- A step never rewrites its thread's row: a thread's last write is its newest checkpoint.
CREATE TABLE tk_threads (
    tid BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    thread_id TEXT NOT NULL UNIQUE,
    owner TEXT NOT NULL,
    created_at DOUBLE PRECISION NOT NULL
);
CREATE INDEX tk_threads_owner ON tk_threads (owner);

-- One row per checkpoint; its channel values live in tk_blobs (only channels that changed).
CREATE TABLE tk_checkpoints (
    tid BIGINT NOT NULL,
    checkpoint_ns TEXT NOT NULL,
    checkpoint_id TEXT NOT NULL,
    parent_id TEXT,
    run_id TEXT,
    created_at DOUBLE PRECISION NOT NULL,
    checkpoint JSONB NOT NULL,
    metadata JSONB NOT NULL,
    PRIMARY KEY (tid, checkpoint_ns, checkpoint_id)
);
CREATE INDEX tk_checkpoints_run ON tk_checkpoints (run_id) WHERE run_id IS NOT NULL;

CREATE TABLE tk_blobs (
    tid BIGINT NOT NULL,
    checkpoint_ns TEXT NOT NULL,
    channel TEXT NOT NULL,
    version TEXT NOT NULL,
    type TEXT NOT NULL,
    value BYTEA NOT NULL,
    PRIMARY KEY (tid, checkpoint_ns, channel, version)
);

CREATE TABLE tk_writes (
    tid BIGINT NOT NULL,
    checkpoint_ns TEXT NOT NULL,
    checkpoint_id TEXT NOT NULL,
    task_id TEXT NOT NULL,
    idx INTEGER NOT NULL,
    task_path TEXT NOT NULL,
    channel TEXT NOT NULL,
    type TEXT NOT NULL,
    value BYTEA NOT NULL,
    PRIMARY KEY (tid, checkpoint_ns, checkpoint_id, task_id, idx)
);

-- Messages of message-list channels, stored once per thread by digest (SPEC S1) ...
CREATE TABLE tk_messages (
    tid BIGINT NOT NULL,
    digest BYTEA NOT NULL,
    type TEXT NOT NULL,
    value BYTEA NOT NULL,
    PRIMARY KEY (tid, digest)
);
-- ... and the links that chain them into lists (see threadkeep.core.messages).
CREATE TABLE tk_message_links (
    tid BIGINT NOT NULL,
    node BYTEA NOT NULL,
    prev BYTEA,
    digest BYTEA NOT NULL,
    PRIMARY KEY (tid, node)
);

CREATE TABLE tk_meta (
    key TEXT PRIMARY KEY,
    value TEXT NOT NULL
);
