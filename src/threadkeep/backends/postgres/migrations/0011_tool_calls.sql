-- threadkeep Postgres schema, version 11: the tool-call ledger (SPEC TM5).
-- One row per tool call of a thread, keyed by the assistant message that issued it and its
-- call id: started, then succeeded (type, value: the result as the saver's serde encoded it)
-- or failed (error). key is the call's idempotency key; claim, a random number drawn by the
-- begin_tool_call that recorded the row, tells that call (and its retries) the row is its
-- own; seq orders the rows begun at the same time.
CREATE TABLE tk_tool_calls (
    tid BIGINT NOT NULL,
    message_id TEXT NOT NULL,
    call_id TEXT NOT NULL,
    seq BIGINT GENERATED ALWAYS AS IDENTITY,
    tool TEXT NOT NULL,
    key TEXT NOT NULL,
    claim BIGINT NOT NULL,
    status TEXT NOT NULL,
    type TEXT,
    value BYTEA,
    error TEXT,
    started_at DOUBLE PRECISION NOT NULL,
    finished_at DOUBLE PRECISION,
    PRIMARY KEY (tid, message_id, call_id)
);
