-- retain.lua: a run starts on a thread (SPEC RT3): record its declared retention and give
-- its keys the declared waiting retention as TTL (a later start replaces both); it is no
-- longer finished.
-- KEYS: the ten keys of the thread (see _prelude.lua).
-- ARGV[1] thread id   ARGV[2] writer   ARGV[3] now (s)   ARGV[4] required owner ("" any)
-- ARGV[5] declared waiting (ms, "" none)   ARGV[6] declared finished (minutes, "" none)
-- ARGV[7] the platform's waiting retention (ms)
-- Returns {"ok", owner} or {"forbidden", owner}; errors (storing nothing) if Redis evicted part
-- of the thread (refuse_lost_thread, _prelude.lua).
refuse_lost_thread(ARGV[1])
local owner = own(ARGV[1], ARGV[2], ARGV[3])
if ARGV[4] ~= "" and owner ~= ARGV[4] then
    return {"forbidden", owner}
end
-- Running again: not finished (delete.lua keeps a thread whose "finished_due" is empty).
redis.call("HSET", KEYS[1], "finished_due", "")
if ARGV[5] == "" then
    redis.call("HDEL", KEYS[1], "waiting_ms")
else
    redis.call("HSET", KEYS[1], "waiting_ms", ARGV[5])
end
if ARGV[6] == "" then
    redis.call("HDEL", KEYS[1], "finished_m")
else
    redis.call("HSET", KEYS[1], "finished_m", ARGV[6])
end
local ttl = tonumber(ARGV[7])
local declared = tonumber(ARGV[5])
if declared then
    ttl = declared -- may be longer than what the keys had: the thread's new declaration
end
expire_all(ttl)
return {"ok", owner}
