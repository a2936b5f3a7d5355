-- park.lua: record or clear a live park of a thread (SPEC RT5). A park lives in the thread's
-- hash, so it shares the thread's TTL and leaves with the thread.
-- KEYS: the nine keys of the thread (see _prelude.lua).
-- ARGV[1] "set" or "clear"   ARGV[2] park id   ARGV[3] deadline (s, for "set")
-- Returns 1, or 0 when "set" finds no thread.
local field = "park" .. NUL .. ARGV[2]
if ARGV[1] == "clear" then
    redis.call("HDEL", KEYS[1], field)
    return 1
end
if redis.call("HEXISTS", KEYS[1], "owner") == 0 then
    return 0
end
redis.call("HSET", KEYS[1], field, ARGV[3])
return 1
