-- forget.lua: remove a tiered cache entry whole (SPEC T5), or a thread's keys.
-- KEYS: the nine keys of the entry (see _prelude.lua).
-- Returns how many keys existed.
return redis.call("UNLINK", unpack(KEYS))
