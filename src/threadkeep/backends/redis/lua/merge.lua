-- merge.lua: copy another thread's content (from read_all.lua) into this thread, creating it
-- for the writer if it is new (SPEC W3). Copied checkpoints, values, writes and tool-call
-- entries replace those of the same key; messages and links are content-addressed and kept
-- once.
-- KEYS: the ten keys of the target thread (see _prelude.lua).
-- ARGV[1] thread id   ARGV[2] writer   ARGV[3] required owner ("" = any)
-- ARGV[4] now (s)     ARGV[5] ttl (ms)
-- ARGV[6] nc, then nc pairs (cps); then nb pairs (blobs); then nw pairs (writes);
-- then nm pairs (msgs); then nl pairs (links); then nt pairs (calls) - each group preceded
-- by its count.
-- Returns {"ok"} or {"forbidden", owner}; errors (storing nothing) if Redis evicted part
-- of the thread (refuse_lost_thread, _prelude.lua).
refuse_lost_thread(ARGV[1])
local owner = redis.call("HGET", KEYS[1], "owner")
if owner and ARGV[3] ~= "" and owner ~= ARGV[3] then
    return {"forbidden", owner}
end
own(ARGV[1], ARGV[2], ARGV[4])
local at = 6
local function pairs_of(key, each)
    local n = tonumber(ARGV[at])
    for i = 1, n do
        each(key, ARGV[at + 2 * i - 1], ARGV[at + 2 * i])
    end
    at = at + 2 * n + 1
end
pairs_of(KEYS[2], function(key, member, record)
    redis.call("HSET", key, member, record)
    redis.call("ZADD", KEYS[3], 0, member)
    local split = string.find(member, NUL, 1, true)
    redis.call("ZADD", KEYS[4], 0, string.sub(member, split + 1) .. NUL .. string.sub(member, 1, split - 1))
end)
pairs_of(KEYS[5], function(key, field, value) redis.call("HSET", key, field, value) end)
pairs_of(KEYS[6], function(key, field, value)
    redis.call("HSET", key, field, value)
    redis.call("ZADD", KEYS[7], 0, field)
end)
pairs_of(KEYS[8], function(key, field, value) redis.call("HSETNX", key, field, value) end)
pairs_of(KEYS[9], function(key, field, value) redis.call("HSETNX", key, field, value) end)
pairs_of(KEYS[10], function(key, field, value)
    redis.call("HSET", key, field, value)
    redis.call("HINCRBY", KEYS[1], "calls", 1)
end)
touch(ARGV[5])
return {"ok"}
