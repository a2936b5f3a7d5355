-- threadkeep SQLite schema, version 4: small channel values live in their checkpoint's row.
-- vals (JSON text) maps a channel to its stored value, "type=text" or "type:base64", for every value of the
-- checkpoint no larger than INLINE_VALUE_BYTES (threadkeep.backends.sql.programs), changed in
-- this step or not; larger values stay in tk_blobs, once per version. NULL on checkpoints
-- written before this version: all their values are in tk_blobs.
ALTER TABLE tk_checkpoints ADD COLUMN vals TEXT;
