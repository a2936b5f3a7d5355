-- threadkeep Postgres schema, version 4: smaller checkpoint rows.
-- vals maps a channel to its stored value, "type=text" or "type:base64", for every value of the checkpoint
-- no larger than INLINE_VALUE_BYTES (threadkeep.backends.sql.programs), changed in this step
-- or not; larger values stay in tk_blobs, once per version. NULL on checkpoints written
-- before this version: all their values are in tk_blobs.
ALTER TABLE tk_checkpoints ADD COLUMN vals JSONB;
-- The structure and metadata are read whole, channel_versions by key, metadata filtered by
-- containment after a cast (a list reads a page in order, not by an index on metadata): json
-- keeps them as written, smaller than jsonb. This rewrites the table once.
ALTER TABLE tk_checkpoints
    ALTER COLUMN checkpoint TYPE JSON USING checkpoint::text::json,
    ALTER COLUMN metadata TYPE JSON USING metadata::text::json;
