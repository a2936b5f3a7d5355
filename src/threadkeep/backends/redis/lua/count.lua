-- count.lua: how many checkpoints and pending writes a thread holds (the delete loop of
-- SPEC R3 compares these between rounds). Reads only.
-- KEYS: the nine keys of the thread (see _prelude.lua).
-- Returns {checkpoints, writes}.
return {redis.call("HLEN", KEYS[2]), redis.call("HLEN", KEYS[6])}
