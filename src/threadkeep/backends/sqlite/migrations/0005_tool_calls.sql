-- threadkeep SQLite schema, version 5: the tool-call ledger (SPEC TM5).
-- One row per tool call of a thread, keyed by the assistant message that issued it and its
-- call id: started, then succeeded (type, value: the result as the saver's serde encoded it)
-- or failed (error). key is the call's idempotency key; claim, a random number drawn by the
-- begin_tool_call that recorded the row, tells that call the row is its own.
CREATE TABLE tk_tool_calls (
    tid INTEGER NOT NULL,
    message_id TEXT NOT NULL,
    call_id TEXT NOT NULL,
    tool TEXT NOT NULL,
    key TEXT NOT NULL,
    claim INTEGER NOT NULL,
    status TEXT NOT NULL,
    type TEXT,
    value BLOB,
    error TEXT,
    started_at REAL NOT NULL,
    finished_at REAL,
    PRIMARY KEY (tid, message_id, call_id)
);
