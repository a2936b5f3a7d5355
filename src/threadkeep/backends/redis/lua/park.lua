-- park.lua: record or clear a live park of a thread (SPEC RT5). A park lives in the thread's
-- hash, so it shares the thread's TTL and leaves with the thread.
-- Either way the caller must be allowed to write the thread (SPEC W3).
-- KEYS: the ten keys of the thread (see _prelude.lua).
-- ARGV[1] "set" or "clear"   ARGV[2] park id
-- for "set": ARGV[3] deadline (s)   ARGV[4] thread id   ARGV[5] user   ARGV[6] now (s)
--            ARGV[7] required owner ("" any)   ARGV[8] the waiting retention (ms)
-- for "clear": ARGV[3] required owner ("" any)
-- Returns {"ok"} or {"forbidden", owner} (nothing written). "set" creates the thread for its
-- user when its first checkpoint is still on its way, as put.lua would; errors (storing
-- nothing) if Redis evicted part of the thread (refuse_lost_thread, _prelude.lua). "clear"
-- of a park, or a thread, that is not there does nothing.
local field = "park" .. NUL .. ARGV[2]
if ARGV[1] == "clear" then
    local holder = redis.call("HGET", KEYS[1], "owner")
    if holder and ARGV[3] ~= "" and holder ~= ARGV[3] then
        return {"forbidden", holder}
    end
    redis.call("HDEL", KEYS[1], field)
    return {"ok"}
end
refuse_lost_thread(ARGV[4])
local owner = own(ARGV[4], ARGV[5], ARGV[6])
if ARGV[7] ~= "" and owner ~= ARGV[7] then
    return {"forbidden", owner}
end
redis.call("HSET", KEYS[1], field, ARGV[3])
touch(ARGV[8])
return {"ok"}
